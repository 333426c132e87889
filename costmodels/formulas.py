"""One registry of per-op cost formulas: FLOPs, bytes read and bytes written from shapes and dtypes.

Units (fixed for the whole project):
    * A FLOP is one multiply or one add; a multiply-add is 2 FLOPs, as ``torch.utils.flop_counter``
      counts (fvcore counts one). Elementwise and reduction ops count one FLOP per arithmetic or
      transcendental operation of their reference decomposition (``exp`` counts 1); comparisons,
      selections, casts and data movement count 0. torch's counter counts only matmul-like ops.
      ``transcendentals`` says how many of those FLOPs are transcendental evaluations (exp, log,
      tanh, erf, rsqrt, ...), which run on slower units (a GPU's special-function units); time
      estimates use it.
    * Bytes are bytes of storage: a view produces nothing (0 bytes written); reading a broadcast
      (``expand``) view reads its base's storage once.

A formula is a pure function of an `OpArgs` (symbol, input and output `TensorMeta`, non-tensor
arguments) returning an `OpCost`. Formulas are registered by Thunder symbol name with
`register_cost`, which rejects duplicates; families (elementwise, reduction, view, ...) share
factories. Fusion regions (``nvFusionN``, ``TorchCompileN``) cost the FLOPs of their members and the
bytes at the region boundary. A symbol without a formula gets `fallback_cost` (an elementwise guess
over its boundary bytes), marked ``formula="fallback"`` so a coverage report can list it.

Attention: ``flops`` counts the full score matrix also for causal attention, as torch's counter does
(``sdpa_flop_count`` ignores ``is_causal``). The FLOPs that a fused kernel really executes (masked
blocks skipped) are in ``matrix_flops``/``effective_flops`` and are what time estimates use.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

# Bytes per element of the dtype names that `remat_opt.core.graph.TensorNode.dtype` uses.
ITEMSIZE = {
    "float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16,
}  # fmt: skip

FUSION_PATTERN = re.compile(r"^(nvFusion|TorchCompile)\d+$")


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """What a formula knows about one tensor.

    Attributes:
        shape: sizes.
        dtype: dtype name, e.g. ``"bfloat16"``.
        nbytes: bytes of its elements (numel * itemsize).
        storage_bytes: bytes of the storage it lives in (0 when unknown or never materialized).
        is_view: it aliases a tensor that existed before the op (the op wrote no data for it).
        name: tensor name in the graph ("" when built by hand); repeated inputs are read once.
    """

    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    storage_bytes: int = 0
    is_view: bool = False
    name: str = ""

    @staticmethod
    def of(shape: Iterable[int], dtype: str, *, is_view: bool = False, name: str = "") -> TensorMeta:
        """A contiguous tensor of `shape` and `dtype` (its own storage)."""
        shape = tuple(int(s) for s in shape)
        if dtype not in ITEMSIZE:
            raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(ITEMSIZE))}")
        nbytes = math.prod(shape) * ITEMSIZE[dtype]
        return TensorMeta(shape=shape, dtype=dtype, nbytes=nbytes, storage_bytes=nbytes, is_view=is_view, name=name)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def read_bytes(self) -> int:
        """Bytes an op reads for this input: a slice reads its elements, a broadcast its base."""
        return min(self.nbytes, self.storage_bytes) if self.storage_bytes > 0 else self.nbytes

    @property
    def write_bytes(self) -> int:
        """Bytes an op writes for this output: none for a view."""
        return 0 if self.is_view else self.nbytes


@dataclass(frozen=True, slots=True)
class OpArgs:
    """The input of a formula: one op's symbol, tensors and non-tensor arguments.

    Attributes:
        symbol: Thunder symbol name (``"linear"``, ``"cudnn_sdpa_fwd"``, ``"nvFusion0"``).
        inputs: tensor inputs in argument order (repeats kept).
        outputs: tensor outputs.
        attrs: non-tensor arguments as ``(key, value)`` pairs (``"arg3"`` or a keyword name), and
            annotations of the graph builder (keys starting with ``"@"``, e.g. `COUNTED_FLOPS_ATTR`).
        members: for fusion regions, the member ops.
    """

    symbol: str
    inputs: tuple[TensorMeta, ...] = ()
    outputs: tuple[TensorMeta, ...] = ()
    attrs: tuple[tuple[str, Any], ...] = ()
    members: tuple[OpArgs, ...] = ()

    def attr(self, key: str, default: Any = None) -> Any:
        """The value of a non-tensor argument by key (``"arg4"``, ``"is_causal"``), or `default`."""
        for k, v in self.attrs:
            if k == key:
                return v
        return default


@dataclass(frozen=True, slots=True)
class OpCost:
    """Cost of one op (or a chain of ops).

    Attributes:
        flops: FLOPs as torch's flop counter counts them (full matrix for causal attention).
        bytes_read: bytes of storage read.
        bytes_written: bytes of storage written.
        matrix_flops: FLOPs executed on matrix units (tensor cores, BLAS); masked causal blocks
            excluded. Time estimates use it with the device's matrix peak.
        vector_flops: other FLOPs executed (elementwise, reductions), with the vector peak.
        transcendentals: how many of `vector_flops` are transcendental evaluations (exp, log,
            tanh, erf, rsqrt, ...), timed at the device's special-function rate.
        kernels: kernels launched (0 for a pure view: metadata only).
        dtype: dtype that selects the device's peak (the first input's, else the first output's).
        formula: registry entry that produced it (``"matmul"``, ``"fusion"``, ``"fallback"``, ...).
        time_s: predicted or measured time in seconds (None until a cost model sets it).
        source: where `time_s` comes from, one of `TIME_SOURCES`: ``"formula"`` (roofline over
            this cost), ``"measured"`` (a cost-table entry for this op), ``"measured region"`` (a
            fusion region timed whole, as its executor runs it) or ``"region share"`` (an unfused
            op priced by its share of a region measured whole; see `remat_opt.costing.graph_costs`).
        network_bytes: bytes this rank sends over the interconnect (collectives; 0 otherwise).
        collective_calls: collective calls issued (each pays the link's latency); an op with any
            is timed by the interconnect, not the roofline.
        views: views an op without kernels makes (``split`` into three: 3), each paying the
            dispatcher's view overhead.
        gemm_shapes: ``(batch, M, N, K)`` of each matrix product whose FLOPs (``2*batch*M*N*K``)
            are in `matrix_flops` (a fusion region: its members'), so that a device's roofline can
            price each one at its achievable rate (`costmodels.devices.gemm_efficiency`); matrix
            FLOPs without a shape (attention, counted fallbacks) are priced without one.
    """

    flops: int
    bytes_read: int
    bytes_written: int
    matrix_flops: int = 0
    vector_flops: int = 0
    transcendentals: int = 0
    kernels: int = 1
    dtype: str = "float32"
    formula: str = ""
    time_s: float | None = None
    source: str = "formula"
    network_bytes: int = 0
    collective_calls: int = 0
    views: int = 1
    gemm_shapes: tuple[tuple[int, int, int, int], ...] = ()

    @property
    def effective_flops(self) -> int:
        """FLOPs really executed (causal attention skips masked blocks)."""
        return self.matrix_flops + self.vector_flops

    @property
    def bytes_total(self) -> int:
        return self.bytes_read + self.bytes_written


CostFormula = Callable[[OpArgs], OpCost]

# The one registry: Thunder symbol name -> formula.
_REGISTRY: dict[str, CostFormula] = {}


def register_cost(*symbols: str) -> Callable[[CostFormula], CostFormula]:
    """Decorator registering a formula under one or more Thunder symbol names.

    Raises:
        ValueError: a symbol already has a formula (each symbol has exactly one).
    """

    def register(formula: CostFormula) -> CostFormula:
        for symbol in symbols:  # check them all first: a failed call registers nothing
            if symbol in _REGISTRY:
                raise ValueError(
                    f"cost formula for {symbol!r} already registered ({_formula_name(_REGISTRY[symbol])}); "
                    f"cannot register {_formula_name(formula)} too"
                )
        _REGISTRY.update(dict.fromkeys(symbols, formula))
        return formula

    return register


def _formula_name(formula: CostFormula) -> str:
    return getattr(formula, "formula_name", getattr(formula, "__name__", repr(formula)))


def registered_symbols() -> frozenset[str]:
    """Every symbol name with a formula (fusion regions are recognised by name instead)."""
    return frozenset(_REGISTRY)


def is_fusion_symbol(symbol: str) -> bool:
    """Whether `symbol` names a fusion region (``nvFusion3``, ``TorchCompile0``)."""
    return FUSION_PATTERN.match(symbol) is not None


def has_formula(symbol: str) -> bool:
    """Whether `symbol` gets a formula rather than the fallback."""
    return symbol in _REGISTRY or is_fusion_symbol(symbol)


def formula_cost(args: OpArgs) -> OpCost:
    """The cost of one op from its formula, the fusion rule, or the fallback."""
    if args.members or is_fusion_symbol(args.symbol):
        return fusion_cost(args)
    formula = _REGISTRY.get(args.symbol)
    return formula(args) if formula is not None else fallback_cost(args)


# ---------------------------------------------------------------------------------------------
# Helpers shared by the families
# ---------------------------------------------------------------------------------------------


def _read(tensors: Iterable[TensorMeta]) -> int:
    """Bytes read for `tensors`, a named tensor counted once however often it is passed."""
    seen: set[str] = set()
    total = 0
    for t in tensors:
        if t.name and t.name in seen:
            continue
        seen.add(t.name)
        total += t.read_bytes
    return total


def _written(tensors: Iterable[TensorMeta]) -> int:
    return sum(t.write_bytes for t in tensors)


def _dtype(args: OpArgs) -> str:
    tensors = args.inputs or args.outputs
    return tensors[0].dtype if tensors else "float32"


def _largest_numel(args: OpArgs) -> int:
    return max((t.numel for t in (*args.outputs, *args.inputs)), default=0)


def _cost(args: OpArgs, name: str, *, flops: int = 0, matrix: bool = False, **overrides) -> OpCost:
    """An `OpCost` reading every input and writing every output, all FLOPs on one unit."""
    fields = dict(
        flops=int(flops),
        bytes_read=_read(args.inputs),
        bytes_written=_written(args.outputs),
        matrix_flops=int(flops) if matrix else 0,
        vector_flops=0 if matrix else int(flops),
        kernels=1,
        dtype=_dtype(args),
        formula=name,
    )
    fields.update(overrides)
    return OpCost(**fields)


def _named(formula: CostFormula, name: str) -> CostFormula:
    formula.formula_name = name  # type: ignore[attr-defined]
    return formula


# ---------------------------------------------------------------------------------------------
# Factories for op families
# ---------------------------------------------------------------------------------------------


def elementwise_cost(
    flops_per_elem: int = 1, name: str = "elementwise", transcendentals_per_elem: int = 0
) -> CostFormula:
    """Elementwise ops: `flops_per_elem` per element of the (broadcast) output, of which
    `transcendentals_per_elem` are transcendental evaluations."""

    def formula(args: OpArgs) -> OpCost:
        numel = _largest_numel(args)
        return _cost(args, name, flops=flops_per_elem * numel, transcendentals=transcendentals_per_elem * numel)

    return _named(formula, name)


def reduction_cost(flops_per_elem: int = 1, name: str = "reduction", transcendentals_per_elem: int = 0) -> CostFormula:
    """Reductions and normalisations: `flops_per_elem` per element of the largest input (of which
    `transcendentals_per_elem` are transcendental evaluations)."""

    def formula(args: OpArgs) -> OpCost:
        numel = max((t.numel for t in args.inputs), default=0)
        return _cost(args, name, flops=flops_per_elem * numel, transcendentals=transcendentals_per_elem * numel)

    return _named(formula, name)


def view_cost(name: str = "view") -> CostFormula:
    """Shape ops: free when every output is a view, else a copy of the outputs."""

    def formula(args: OpArgs) -> OpCost:
        if all(t.is_view for t in args.outputs):
            return _cost(args, name, bytes_read=0, bytes_written=0, kernels=0, views=max(1, len(args.outputs)))
        copied = sum(t.nbytes for t in args.outputs if not t.is_view)
        return _cost(args, name, bytes_read=copied, bytes_written=copied)

    return _named(formula, name)


def movement_cost(name: str = "movement") -> CostFormula:
    """Data movement (copies, casts, concatenation, padding, gathers): no FLOPs; free if it aliases."""

    def formula(args: OpArgs) -> OpCost:
        if args.outputs and all(t.is_view for t in args.outputs):
            return _cost(args, name, bytes_read=0, bytes_written=0, kernels=0)
        return _cost(args, name)

    return _named(formula, name)


def factory_cost(name: str = "factory") -> CostFormula:
    """Tensor factories (full, arange, random draws): write their outputs, read nothing."""
    return _named(lambda args: _cost(args, name, bytes_read=0), name)


def metadata_cost(name: str) -> CostFormula:
    """Ops that move no data and launch no kernel. ``"free"``: Thunder bookkeeping that makes no torch
    call; any other name: a torch call without a kernel (an allocation), priced as a view."""
    return _named(lambda args: _cost(args, name, bytes_read=0, bytes_written=0, kernels=0), name)


# ---------------------------------------------------------------------------------------------
# Family registrations
# ---------------------------------------------------------------------------------------------

# One arithmetic operation per element (transcendentals count one, as noted in the module docstring).
UNARY_ARITHMETIC = (
    "neg", "abs", "reciprocal", "sign", "sgn", "floor", "ceil", "round", "trunc", "relu", "square",
)  # fmt: skip
TRANSCENDENTAL = (
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh",
    "sinh", "cosh", "asin", "acos", "atan", "erf", "erfc", "erfinv", "torch_erfcinv_impl", "lgamma", "digamma",
)  # fmt: skip
BINARY_ARITHMETIC = (
    "add", "sub", "mul", "div", "true_divide", "torch_div_prim_impl", "pow", "maximum", "minimum",
    "remainder", "fmod", "floor_divide", "atan2", "rsub", "clamp", "clamp_min", "clamp_max", "lerp",
    "masked_fill",
)  # fmt: skip
COMPARISONS = (
    "eq", "ne", "lt", "le", "gt", "ge", "where", "logical_and", "logical_or", "logical_not", "logical_xor",
    "bitwise_and", "bitwise_or", "bitwise_not", "bitwise_xor", "isfinite", "isnan", "isinf", "signbit",
)  # fmt: skip
# Compound activations: (operations, transcendentals) of their reference decomposition.
ACTIVATIONS = {"silu": (4, 1), "sigmoid": (3, 1), "softplus": (3, 2), "gelu": (8, 1), "mish": (6, 3),
               "leaky_relu": (2, 0), "hardtanh": (2, 0)}  # fmt: skip
VIEWS = (
    "reshape", "torch_prims_reshape_impl", "view", "view_as", "permute", "transpose", "t", "expand",
    "expand_as", "broadcast_in_dim", "unsqueeze", "squeeze", "flatten", "unflatten", "split", "chunk",
    "tensor_split", "unbind", "torch_slice_prim_impl", "slice_prim", "narrow", "select", "getitem",
    "__getitem__", "detach", "alias", "movedim", "swapaxes", "real", "imag",
    "torch_stride_order_prim_impl", "stride_order", "contiguous",
)  # fmt: skip
MOVEMENT = (
    "cat", "stack", "pad", "torch_pad_prim_impl", "flip", "roll", "clone", "to", "type_as", "bool",
    "float", "half", "bfloat16", "double", "int", "long", "convert_element_type",
    "copy_with_setitem_impl", "copy_with_setitem", "tril", "triu", "repeat", "tile",
    "repeat_interleave", "take_along_dim", "take_along_axis", "gather", "index_select", "take",
    "index_copy", "scatter", "device_put", "masked_select",
)  # fmt: skip
FACTORIES = (
    "full", "full_like", "zeros", "zeros_like", "ones", "ones_like", "arange", "iota", "tensor",
    "scalar_tensor", "uniform", "uniform_philox", "rand", "rand_like", "randn", "randn_like", "randint",
    "multinomial", "ops.rngprims.philox_rand",
)  # fmt: skip
# Thunder-level bookkeeping that calls no torch op (``shallow_copy`` returns its input).
FREE = ("shallow_copy", "update_aliases", "get_and_update_rng_state_impl", "get_and_update_rng_state")
ALLOCATIONS = ("empty", "empty_like", "new_empty")
# Reductions: operations per input element.
REDUCTIONS = {
    "sum": 1, "mean": 1, "amax": 1, "amin": 1, "max": 1, "min": 1, "prod": 1, "argmax": 1, "argmin": 1,
    "cumsum": 1, "logsumexp": 4, "var": 3, "std": 4, "var_mean": 4, "std_mean": 5, "vector_norm": 2,
    "all": 0, "any": 0,
}  # fmt: skip
# Softmax family: max, subtract, exp, sum, divide (log_softmax: log and subtract instead of divide).
SOFTMAX = {"softmax": (5, 1), "_softmax": (5, 1), "log_softmax": (5, 1), "_log_softmax": (5, 1)}
# Softmax backward: grad * y, row sum, subtract, multiply (log_softmax: exp, sum, multiply, subtract).
SOFTMAX_BACKWARD = {
    "_softmax_backward_data": (4, 0), "torch.ops.aten._softmax_backward_data": (4, 0),
    "_log_softmax_backward_data": (4, 1), "torch.ops.aten._log_softmax_backward_data": (4, 1),
}  # fmt: skip
# Norms over the last dimension. layer_norm: mean, subtract, square, sum, scale, affine (2).
NORMS = {
    "layer_norm": 7, "native_layer_norm": 7, "cudnn_layernorm": 7, "cudnn_layernorm_aug_fwd": 7,
    "rms_norm": 4, "apex_fused_rms_norm_forward_affine": 4,
    "apex_fused_rms_norm_forward_affine_mixed_dtypes": 4, "group_norm": 7, "batch_norm": 7,
    "native_batch_norm": 7, "instance_norm": 7,
    # backward: recompute the normalised input, two row reductions, the input gradient, weight grads
    "native_layer_norm_backward": 10, "layer_norm_backward": 10, "cudnn_layernorm_bwd": 10,
    "apex_fused_rms_norm_backward_affine": 7, "rms_norm_backward": 7,
}  # fmt: skip

register_cost(*UNARY_ARITHMETIC)(elementwise_cost(1, "elementwise"))
register_cost(*TRANSCENDENTAL)(elementwise_cost(1, "transcendental", transcendentals_per_elem=1))
register_cost(*BINARY_ARITHMETIC)(elementwise_cost(1, "elementwise"))
register_cost(*COMPARISONS)(elementwise_cost(0, "comparison"))
for _symbol, (_n, _t) in ACTIVATIONS.items():
    register_cost(_symbol)(elementwise_cost(_n, "activation", transcendentals_per_elem=_t))
register_cost(*VIEWS)(view_cost())
register_cost(*MOVEMENT)(movement_cost())
register_cost(*FACTORIES)(factory_cost())
register_cost(*FREE)(metadata_cost("free"))
register_cost(*ALLOCATIONS)(metadata_cost("allocation"))
for _symbol, _n in REDUCTIONS.items():
    register_cost(_symbol)(reduction_cost(_n, "reduction"))
for _symbol, _n in NORMS.items():
    register_cost(_symbol)(reduction_cost(_n, "norm"))
for _table, _name in ((SOFTMAX, "softmax"), (SOFTMAX_BACKWARD, "softmax_backward")):
    for _symbol, (_n, _t) in _table.items():
        register_cost(_symbol)(reduction_cost(_n, _name, transcendentals_per_elem=_t))


@register_cost("copy_")
def inplace_copy_cost(args: OpArgs) -> OpCost:
    """``copy_(src, dst)``: reads the source, writes the destination (the output aliases it)."""
    src = args.inputs[0]
    return _cost(args, "copy", bytes_read=src.read_bytes, bytes_written=sum(t.nbytes for t in args.outputs))


# ---------------------------------------------------------------------------------------------
# Matrix products
# ---------------------------------------------------------------------------------------------


def gemm_flops(shape: tuple[int, int, int, int]) -> int:
    """FLOPs of one ``(batch, M, N, K)`` matrix product: a multiply and an add per term."""
    batch, m, n, k = shape
    return 2 * batch * m * n * k


@register_cost("matmul", "mm", "bmm", "torch.linalg.matmul")
def matmul_cost(args: OpArgs) -> OpCost:
    """``a @ b`` with torch's broadcasting: each output element is a dot product of length ``k``."""
    shape = _matmul_shape(args.inputs[0].shape, args.inputs[1].shape)
    batch, m, n, k = shape
    out_numel = args.outputs[0].numel if args.outputs else batch * m * n
    return _cost(args, "matmul", flops=2 * out_numel * k, matrix=True, gemm_shapes=(shape,))


def _matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, int, int, int]:
    """``(batch, M, N, K)`` of ``a @ b`` (torch's broadcasting; a 1-D operand gives M or N = 1)."""
    m = a[-2] if len(a) > 1 else 1
    n = b[-1] if len(b) > 1 else 1
    a_batch, b_batch = a[:-2], b[:-2]
    width = max(len(a_batch), len(b_batch))
    a_batch = (1,) * (width - len(a_batch)) + tuple(a_batch)
    b_batch = (1,) * (width - len(b_batch)) + tuple(b_batch)
    return math.prod(max(x, y) for x, y in zip(a_batch, b_batch)), m, n, a[-1]


@register_cost("linear", "te_functional_linear_fwd")
def linear_cost(args: OpArgs) -> OpCost:
    """``x @ w.T (+ b)``: 2 * rows * in * out FLOPs; the bias add is not counted (as torch's addmm)."""
    x, w = args.inputs[0], args.inputs[1]
    shape = (1, math.prod(x.shape[:-1]), w.shape[0], w.shape[-1])
    return _cost(args, "linear", flops=gemm_flops(shape), matrix=True, gemm_shapes=(shape,))


@register_cost("addmm", "baddbmm")
def addmm_cost(args: OpArgs) -> OpCost:
    """``c + a @ b``: the product's FLOPs only, as torch counts."""
    a, b = args.inputs[1], args.inputs[2]
    return _cost(args, "matmul", flops=2 * args.outputs[0].numel * a.shape[-1], matrix=True,
                 gemm_shapes=(_matmul_shape(a.shape, b.shape),))


@register_cost("te_functional_linear_bwd")
def linear_backward_cost(args: OpArgs) -> OpCost:
    """Input and weight gradients of ``linear``: two products of the forward's size."""
    grad, x = args.inputs[0], args.inputs[1]
    rows, n_out, n_in = math.prod(grad.shape[:-1]), grad.shape[-1], x.shape[-1]
    # input gradient grad @ w: [rows, out] x [out, in]; weight gradient grad.T @ x: [out, rows] x [rows, in]
    shapes = ((1, rows, n_in, n_out), (1, n_out, n_in, rows))
    return _cost(args, "linear_backward", flops=sum(map(gemm_flops, shapes)), matrix=True, gemm_shapes=shapes)


# ---------------------------------------------------------------------------------------------
# Attention, in every form it takes in Thunder traces
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SdpaForm:
    """Where a fused attention symbol keeps its operands.

    Attributes:
        backward: it computes the gradients (takes ``grad_out`` first).
        causal_arg: position of ``is_causal`` among all the call's arguments (attrs key ``argN``).
        heads_first: layout ``[B, H, S, D]`` (Thunder, torch); False for ``[B, S, H, D]`` (flash-attn 3).
    """

    backward: bool
    causal_arg: int
    heads_first: bool = True


# Thunder 0.2.6 symbols (thunder/executors/sdpaex.py, cudnn_sdpa.py, fa3ex.py) and remat_opt's CPU
# executor (remat_opt/executors/sdpa_cpu.py). Decomposed SDPA is costed op by op (matmul, softmax).
SDPA_FORMS = {
    "scaled_dot_product_attention": SdpaForm(backward=False, causal_arg=5),
    "remat_sdpa_cpu_fwd": SdpaForm(backward=False, causal_arg=4),
    "remat_sdpa_cpu_bwd": SdpaForm(backward=True, causal_arg=7),
    "sdpaex_grad_forward_scaled_dot_product_efficient_attention": SdpaForm(backward=False, causal_arg=5),
    "sdpafx_grad_forward_scaled_dot_product_efficient_attention": SdpaForm(backward=False, causal_arg=4),
    "sdpaex_scaled_dot_product_efficient_attention_backward": SdpaForm(backward=True, causal_arg=10),
    "sdpafx_scaled_dot_product_efficient_attention_backward": SdpaForm(backward=True, causal_arg=11),
    "cudnn_sdpa_fwd": SdpaForm(backward=False, causal_arg=5),
    "cudnn_sdpa_bwd": SdpaForm(backward=True, causal_arg=6),
    "fa3_fwd": SdpaForm(backward=False, causal_arg=3, heads_first=False),
    "fa3_bwd": SdpaForm(backward=True, causal_arg=6, heads_first=False),
}


def sdpa_is_causal(args: OpArgs) -> bool:
    """Whether a fused attention call masks causally (keyword or positional ``is_causal``)."""
    form = SDPA_FORMS[args.symbol]
    for key in ("is_causal", "causal", f"arg{form.causal_arg}"):
        value = args.attr(key)
        if value is not None:
            return bool(value)
    return False


def causal_fraction(q_len: int, kv_len: int) -> float:
    """Share of the ``q_len x kv_len`` score matrix a top-left causal mask keeps."""
    if q_len <= kv_len:
        kept = q_len * (q_len + 1) // 2
    else:
        kept = kv_len * (kv_len + 1) // 2 + (q_len - kv_len) * kv_len
    return kept / (q_len * kv_len)


def sdpa_flops(q_shape, k_shape, v_shape, *, backward: bool) -> int:
    """FLOPs of attention exactly as ``torch.utils.flop_counter`` counts them (causal ignored).

    Forward: ``q @ k.T`` and ``p @ v``. Backward: the scores again, ``dO @ v.T``, ``p.T @ dO``,
    ``dS @ k`` and ``dS.T @ q``. Grouped-query attention counts the query heads (the kernel
    broadcasts k and v).
    """
    batch, heads, q_len, d_qk = q_shape
    kv_len, d_v = k_shape[2], v_shape[3]
    per_score = (3 * d_qk + 2 * d_v) if backward else (d_qk + d_v)
    return 2 * batch * heads * q_len * kv_len * per_score


def _bhsd(t: TensorMeta, heads_first: bool) -> tuple[int, int, int, int]:
    b, x, y, d = t.shape
    return (b, x, y, d) if heads_first else (b, y, x, d)


@register_cost(*SDPA_FORMS)
def sdpa_cost(args: OpArgs) -> OpCost:
    """Fused attention forward or backward; softmax work (5 or 4 per score, one exp) goes to vector FLOPs.

    No `OpCost.gemm_shapes`: a fused kernel tiles the score matrix its own way, so its matrix FLOPs
    are priced at the device's large-GEMM rate (see `costmodels.devices.matrix_time_s`).
    """
    form = SDPA_FORMS[args.symbol]
    first = 1 if form.backward else 0
    q, k, v = (_bhsd(t, form.heads_first) for t in args.inputs[first : first + 3])
    flops = sdpa_flops(q, k, v, backward=form.backward)
    kept = causal_fraction(q[2], k[2]) if sdpa_is_causal(args) else 1.0
    scores = q[0] * q[1] * q[2] * k[2]
    vector = (4 if form.backward else 5) * scores
    return _cost(
        args,
        "sdpa_backward" if form.backward else "sdpa",
        flops=flops,
        matrix_flops=round(flops * kept),
        vector_flops=round(vector * kept),
        transcendentals=round(scores * kept),
    )


# ---------------------------------------------------------------------------------------------
# Embedding, cross-entropy, dropout
# ---------------------------------------------------------------------------------------------


@register_cost("embedding")
def embedding_cost(args: OpArgs) -> OpCost:
    """Row gather: reads the indices and the rows it gathers (not the whole table)."""
    indices = args.inputs[0]
    gathered = sum(t.nbytes for t in args.outputs)
    return _cost(args, "embedding", bytes_read=indices.read_bytes + gathered)


@register_cost("embedding_backward", "torch.ops.aten.embedding_backward")
def embedding_backward_cost(args: OpArgs) -> OpCost:
    """Zero a ``[num_weights, D]`` gradient, then scatter-add one row per index (one add per element)."""
    grad, indices = args.inputs[0], args.inputs[1]
    return _cost(
        args,
        "embedding_backward",
        flops=grad.numel,
        bytes_read=grad.read_bytes + indices.read_bytes + grad.nbytes,
        bytes_written=_written(args.outputs) + grad.nbytes,
    )


@register_cost("cross_entropy", "triton_crossentropy", "apex_cross_entropy")
def cross_entropy_cost(args: OpArgs) -> OpCost:
    """Log-softmax over the class dimension (5 per logit), then a gather and a mean."""
    logits = args.inputs[0]
    return _cost(args, "cross_entropy", flops=5 * logits.numel, transcendentals=logits.numel)


@register_cost("cross_entropy_backward", "apex_cross_entropy_backward")
def cross_entropy_backward_cost(args: OpArgs) -> OpCost:
    """``softmax(x) - onehot(target)`` scaled by the incoming gradient: 4 per logit."""
    logits = max(args.inputs, key=lambda t: t.numel)
    return _cost(args, "cross_entropy_backward", flops=4 * logits.numel, transcendentals=logits.numel)


@register_cost("nll_loss")
def nll_loss_cost(args: OpArgs) -> OpCost:
    """Gather one log-probability per target and reduce."""
    target = args.inputs[1]
    gathered = target.numel * ITEMSIZE.get(args.inputs[0].dtype, 4)
    return _cost(args, "nll_loss", flops=target.numel, bytes_read=target.read_bytes + gathered)


@register_cost("nll_loss_backward", "torch_nll_loss_backward_impl")
def nll_loss_backward_cost(args: OpArgs) -> OpCost:
    """Zero-filled ``[N, C]`` gradient with one value scattered per target."""
    target = min(args.inputs[1:3], key=lambda t: t.numel) if len(args.inputs) > 2 else args.inputs[-1]
    return _cost(args, "nll_loss_backward", flops=target.numel, bytes_read=target.read_bytes)


register_cost("dropout", "native_dropout", "alpha_dropout", "feature_dropout")(elementwise_cost(2, "dropout"))


# torch's multi_tensor_apply (ATen/native/cuda/MultiTensorApply.cuh): 65,536 elements per chunk and
# at most 320 blocks (chunks) and 36 tensors of each of the 4 lists per launch (depth 4: params,
# grads, exp_avg, exp_avg_sq).
ADAMW_CHUNK_ELEMENTS, ADAMW_CHUNKS_PER_LAUNCH, ADAMW_TENSORS_PER_LAUNCH = 65_536, 320, 36


@register_cost("_fused_adamw_", "fused_adamw")
def fused_adamw_cost(args: OpArgs) -> OpCost:
    """``torch._fused_adamw_`` over lists of params, grads, exp_avg and exp_avg_sq (inputs in that
    order, one quarter each): reads all four, writes params and both moments in place (no new
    tensors). About 20 vector FLOPs per element (moments, bias corrections, sqrt, decay, update),
    one of them a sqrt."""
    per_list = len(args.inputs) // 4
    params = args.inputs[:per_list]
    numel = sum(t.numel for t in params)
    chunks = sum(math.ceil(t.numel / ADAMW_CHUNK_ELEMENTS) for t in params)
    kernels = max(math.ceil(chunks / ADAMW_CHUNKS_PER_LAUNCH), math.ceil(per_list / ADAMW_TENSORS_PER_LAUNCH), 1)
    written = sum(t.nbytes for i, t in enumerate(args.inputs) if i // per_list != 1)  # all but the grads
    return _cost(args, "fused_adamw", flops=20 * numel, transcendentals=numel, bytes_read=_read(args.inputs),
                 bytes_written=written, kernels=kernels)


# ---------------------------------------------------------------------------------------------
# Fusion regions and the fallback
# ---------------------------------------------------------------------------------------------


def fusion_cost(args: OpArgs) -> OpCost:
    """A fusion region: its members' FLOPs and GEMM shapes, bytes only at the region boundary.

    Matrix products inside a region (torch.compile calls them as extern kernels) launch kernels of
    their own; everything else is taken to fuse into one kernel.
    """
    members = [formula_cost(m) for m in args.members]
    matrix_members = [m for m in members if m.matrix_flops]
    heaviest = max(matrix_members, key=lambda m: m.matrix_flops, default=None)
    return _cost(
        args,
        "fusion",
        flops=sum(m.flops for m in members),
        matrix_flops=sum(m.matrix_flops for m in members),
        vector_flops=sum(m.vector_flops for m in members),
        transcendentals=sum(m.transcendentals for m in members),
        kernels=1 + len(matrix_members),
        dtype=heaviest.dtype if heaviest else _dtype(args),
        gemm_shapes=tuple(shape for m in members for shape in m.gemm_shapes),
    )


# Attributes whose key starts with "@" are annotations of the graph builder, not call arguments.
ANNOTATION_PREFIX = "@"
# On an op the graph builder could count by running it (an op Thunder runs through its generic torch
# fallback): the matrix FLOPs torch's flop counter found (0 for none).
COUNTED_FLOPS_ATTR = "@counted_flops"


def fallback_cost(args: OpArgs) -> OpCost:
    """An op without a formula: its counted matrix FLOPs when the graph has them, plus one FLOP per
    element of its largest tensor (the guess for the rest), over its boundary bytes."""
    counted = args.attr(COUNTED_FLOPS_ATTR)
    if counted is None:
        return _cost(args, "fallback", flops=_largest_numel(args))
    vector = _largest_numel(args)
    return _cost(
        args, "counted", flops=counted + vector, matrix_flops=int(counted), vector_flops=vector
    )


def missing_formulas(args: OpArgs) -> list[str]:
    """Symbols of `args` and of its members that fall back uncounted (an empty list when covered)."""
    covered = has_formula(args.symbol) or args.attr(COUNTED_FLOPS_ATTR) is not None
    missing = [] if covered else [args.symbol]
    for member in args.members:
        missing.extend(missing_formulas(member))
    return missing


# Where an op's time comes from (`OpCost.source`); all but "formula" come from measurements.
TIME_SOURCES = ("formula", "measured", "measured region", "region share")


def is_measured(source: str) -> bool:
    """Whether a time with this `OpCost.source` comes from a measurement on the device."""
    return source != "formula"


def with_time(cost: OpCost, time_s: float, source: str) -> OpCost:
    """`cost` with its time and where the time came from (one of `TIME_SOURCES`)."""
    if source not in TIME_SOURCES:
        raise ValueError(f"source must be one of {', '.join(map(repr, TIME_SOURCES))}, got {source!r}")
    return replace(cost, time_s=float(time_s), source=source)


# ---------------------------------------------------------------------------------------------
# Collectives (Thunder's distributed prims and their torch implementations)
# ---------------------------------------------------------------------------------------------

# On a collective op: ranks in its process group (the graph builder reads it off the group).
WORLD_SIZE_ATTR = "@world_size"
# Collective kinds by symbol; their time is the interconnect's (`costmodels.interconnect`).
COLLECTIVE_KINDS = {
    "torch_all_gather_prim_impl": "all_gather", "all_gather": "all_gather",
    "torch_reduce_scatter_prim_impl": "reduce_scatter", "reduce_scatter": "reduce_scatter",
    "torch_all_reduce_prim_impl": "all_reduce", "all_reduce": "all_reduce",
}  # fmt: skip
WAIT_SYMBOLS = ("torch_wait_prim_impl", "wait")


def collective_cost(args: OpArgs) -> OpCost:
    """A ring collective over its first input: an all-gather's input is this rank's shard (the full
    tensor is world_size times it), a reduce-scatter's and an all-reduce's the full tensor."""
    from costmodels.interconnect import ring_bytes_per_rank

    kind = COLLECTIVE_KINDS[args.symbol]
    world_size = int(args.attr(WORLD_SIZE_ATTR, 1))
    first = args.inputs[0].nbytes if args.inputs else 0
    full_bytes = first * world_size if kind == "all_gather" else first
    written = full_bytes if kind == "all_gather" else full_bytes // world_size if kind == "reduce_scatter" else first
    return _cost(args, f"collective:{kind}", bytes_read=first, bytes_written=written,
                 network_bytes=ring_bytes_per_rank(kind, full_bytes, world_size), collective_calls=1)


register_cost(*COLLECTIVE_KINDS)(_named(collective_cost, "collective"))
# waiting returns the collective's buffer: its time is the collective's
register_cost(*WAIT_SYMBOLS)(metadata_cost("free"))
