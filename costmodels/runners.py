"""Executing one op of a `JointGraph` with torch, from its symbol, input tensors and attributes.

The profiler times ops on the current device without Thunder: `make_call` turns an op (its
`OpArgs` and real input tensors) into a zero-argument callable. Thunder prints every torch-executor
op as a call ``module.name(*args, **kwargs)`` (``torch.add``, ``torch.nn.functional.linear``,
``Tensor.expand``, ``torch.ops.aten.embedding_backward``) whose positional non-tensor arguments the
graph keeps as ``argN`` attributes, so the call is rebuilt by putting tensors into the positions no
attribute fills. Thunder's own implementations (``torch_pad_prim_impl``, ``torch_slice_prim_impl``,
the fused SDPA kernels, ...) are mirrored here.

What cannot be executed from the data model gets a reason instead (`skip_reason`): fusion regions
(their compiled kernel is not in the graph; the profiler leaves them to the roofline) and symbols
without a runner. Where the graph dropped an argument, the runner reconstructs an equivalent call
and says so in `approximation` (e.g. ``torch_pad_prim_impl``: the pad widths come from the shapes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from costmodels.formulas import ANNOTATION_PREFIX, OpArgs, SDPA_FORMS, is_fusion_symbol

Builder = Callable[[OpArgs, list, dict, str], Callable[[], Any]]

# Printed as torch.nn.functional.NAME / Tensor.NAME by Thunder's torch executor.
_FUNCTIONAL = {"linear", "silu", "gelu", "relu", "embedding", "log_softmax", "layer_norm", "softplus", "dropout",
               "scaled_dot_product_attention", "leaky_relu", "mish", "hardtanh", "pad", "one_hot", "rms_norm",
               "group_norm", "batch_norm", "cross_entropy", "nll_loss"}  # fmt: skip
_TENSOR_METHODS = {"bool", "expand", "expand_as", "to", "view", "view_as", "contiguous", "float", "half",
                   "bfloat16", "double", "int", "long", "type_as", "masked_fill", "repeat"}  # fmt: skip
_FACTORIES = {"full", "ones", "zeros", "arange", "empty", "rand", "randn", "randint", "tensor", "scalar_tensor"}
_REGISTRY: dict[str, Builder] = {}  # symbol -> builder of its call (when not plain module.name(...))
_RAW: set[str] = set()  # builders that take the tensor list itself (calls not in the argN layout)
_APPROXIMATE: dict[str, str] = {}  # symbol -> how its runner differs from the exact call


def _register(*symbols: str):
    def register(builder: Builder) -> Builder:
        for symbol in symbols:
            if symbol in _REGISTRY:
                raise ValueError(f"runner for {symbol!r} already registered")
            _REGISTRY[symbol] = builder
        return builder

    return register


def _torch_value(value: Any) -> Any:
    """Attribute values as torch wants them: dtype names become torch dtypes."""
    if isinstance(value, str) and value.startswith(("torch.", "thunder.dtypes.")):
        candidate = getattr(torch, value.rsplit(".", 1)[-1].rstrip("_"), None)
        if isinstance(candidate, torch.dtype):
            return candidate
    return value


def split_attrs(args: OpArgs, tensors: list) -> tuple[list, dict]:
    """Positional and keyword arguments of the original call: attrs fill ``argN``, tensors the rest."""
    attrs = [(k, v) for k, v in args.attrs if not k.startswith(ANNOTATION_PREFIX)]
    positional = {int(k[3:]): v for k, v in attrs if k.startswith("arg") and k[3:].isdigit()}
    kwargs = {k: _torch_value(v) for k, v in attrs if not (k.startswith("arg") and k[3:].isdigit())}
    rest = iter(tensors)
    remaining = len(tensors)
    call_args: list = []
    position = 0
    while remaining or position <= max(positional, default=-1):
        if position in positional:
            call_args.append(_torch_value(positional[position]))
        else:
            if not remaining:
                raise ValueError(f"{args.symbol}: argument {position} is neither a tensor nor a kept attribute")
            call_args.append(next(rest))
            remaining -= 1
        position += 1
    return call_args, kwargs


def _resolve(symbol: str) -> Callable | None:
    if symbol.startswith("torch.ops.aten."):
        return getattr(torch.ops.aten, symbol.removeprefix("torch.ops.aten."), None)
    if symbol in _FUNCTIONAL:
        return getattr(F, symbol, None)
    if symbol in _TENSOR_METHODS:
        return getattr(torch.Tensor, symbol, None)
    fn = getattr(torch, symbol, None)
    return fn if callable(fn) else None


def skip_reason(symbol: str) -> str | None:
    """Why an op with `symbol` cannot be executed from the data model, or None if it can."""
    if is_fusion_symbol(symbol):
        return "fusion region: its compiled kernel is not in the graph; costed by the roofline of its members"
    if symbol in _REGISTRY or _resolve(symbol) is not None:
        return None
    return f"no torch runner for symbol {symbol!r}; costed by its formula"


def approximation(symbol: str) -> str:
    """A note when the runner of `symbol` times an equivalent rather than the exact call ("" if exact)."""
    return _APPROXIMATE.get(symbol, "")


def make_call(args: OpArgs, tensors: list, device: str) -> Callable[[], Any]:
    """A zero-argument callable running the op `args` on `tensors` (its inputs, in order).

    Raises:
        ValueError: the symbol cannot be executed (see `skip_reason`).
    """
    reason = skip_reason(args.symbol)
    if reason is not None:
        raise ValueError(reason)
    builder = _REGISTRY.get(args.symbol)
    if args.symbol in _RAW:
        return builder(args, tensors, {}, device)
    call_args, kwargs = split_attrs(args, tensors)
    if builder is not None:
        return builder(args, call_args, kwargs, device)
    fn = _resolve(args.symbol)
    if args.symbol in _FACTORIES:
        kwargs["device"] = device
    return lambda: fn(*call_args, **kwargs)


def _raw(*symbols: str):
    """Registers a builder that receives ``(args, tensors, {}, device)`` instead of the rebuilt call."""
    _RAW.update(symbols)
    return _register(*symbols)


@_register("torch_prims_reshape_impl")
def _reshape(args, call_args, kwargs, device):
    return lambda: torch.reshape(*call_args)


@_register("shallow_copy")
def _alias(args, call_args, kwargs, device):
    return lambda: call_args[0]


@_raw("update_aliases")
def _update_aliases(args, tensors, kwargs, device):
    return lambda: tuple(tensors)


@_register("torch_slice_prim_impl", "slice_prim")
def _slice(args, call_args, kwargs, device):
    a, start, end = call_args[0], call_args[1], call_args[2]
    strides = call_args[3] if len(call_args) > 3 and call_args[3] is not None else [1] * len(start)
    key = tuple(slice(s, e, st) for s, e, st in zip(start, end, strides))
    return lambda: a[key]


@_register("torch_div_prim_impl")
def _div(args, call_args, kwargs, device):
    a, b = call_args[0], call_args[1]

    def exact(x):
        return isinstance(x, (int, bool)) or (isinstance(x, torch.Tensor) and not x.dtype.is_floating_point)

    if exact(a) and exact(b):
        return lambda: torch.div(a, b, rounding_mode="trunc")
    return lambda: torch.true_divide(a, b)


@_raw("torch_pad_prim_impl")
def _pad(args, tensors, kwargs, device):
    # The padding config (a list of (low, high, interior) tuples) is not kept in the graph; padding
    # every dimension at its end to the output shape writes the same bytes.
    a = tensors[0]
    value = _torch_value(args.attr("arg1", 0.0))
    out_shape = args.outputs[0].shape
    widths = [w for size, out in zip(reversed(a.shape), reversed(out_shape)) for w in (0, out - size)]
    return lambda: F.pad(a, widths, value=value)


_APPROXIMATE["torch_pad_prim_impl"] = "pad widths rebuilt from shapes (all padding at the end)"


@_raw("copy_with_setitem_impl")
def _copy_with_setitem(args, tensors, kwargs, device):
    # The index key is not kept in the graph: clone, then write the value everywhere (an upper bound).
    a = tensors[0]
    value = tensors[1] if len(tensors) > 1 else _torch_value(args.attr("arg2", 0.0))

    def run():
        c = a.clone()
        c[...] = value
        return c

    return run


_APPROXIMATE["copy_with_setitem_impl"] = "index key not in the graph: clone + fill of the whole tensor"


@_raw("cat", "stack")
def _concatenate(args, tensors, kwargs, device):
    # The tensors arrive as one list argument; the dimension is the next positional argument.
    fn = torch.cat if args.symbol == "cat" else torch.stack
    dim = args.attr("arg1", args.attr("dim", 0))
    return lambda: fn(tensors, dim)


@_register("copy_")
def _copy(args, call_args, kwargs, device):
    src, dst = call_args[0], call_args[1]
    return lambda: dst.copy_(src)


@_register("uniform")
def _uniform(args, call_args, kwargs, device):
    shape, low, high = call_args[0], call_args[1], call_args[2]
    dtype = kwargs.get("dtype", torch.float32)
    return lambda: torch.empty(shape, device=device, dtype=dtype).uniform_(low, high)


@_register("torch_nll_loss_backward_impl", "nll_loss_backward")
def _nll_loss_backward(args, call_args, kwargs, device):
    g, a, target, weight, reduction, ignore_index, total_weight = call_args[:7]
    code = {"none": 0, "mean": 1, "sum": 2}[reduction]
    if total_weight is None:
        total_weight = torch.tensor(0.0, dtype=a.dtype, device=a.device)
    return lambda: torch.ops.aten.nll_loss_backward(g, a, target, weight, code, ignore_index, total_weight.to(a.dtype))


def _unit_last_stride(a: torch.Tensor) -> torch.Tensor:
    # The CPU flash kernels need a unit stride in the last dimension (as remat_opt's executor ensures).
    return a if a.ndim == 0 or a.stride(-1) == 1 else a.contiguous()


@_register("remat_sdpa_cpu_fwd")
def _sdpa_cpu_fwd(args, call_args, kwargs, device):
    q, k, v, dropout_p, is_causal = call_args[:5]
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    scale = kwargs.get("scale")
    return lambda: op(*map(_unit_last_stride, (q, k, v)), dropout_p, is_causal, attn_mask=None, scale=scale)


@_register("remat_sdpa_cpu_bwd")
def _sdpa_cpu_bwd(args, call_args, kwargs, device):
    grad, q, k, v, out, lse, dropout_p, is_causal = call_args[:8]
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    scale = kwargs.get("scale")
    tensors = [_unit_last_stride(t) for t in (grad, q, k, v, out)]
    return lambda: op(*tensors, lse, dropout_p, is_causal, attn_mask=None, scale=scale)


@_register("sdpaex_grad_forward_scaled_dot_product_efficient_attention")
def _sdpa_efficient_fwd(args, call_args, kwargs, device):
    q, k, v, mask, dropout_p, is_causal = call_args[:6]
    op = torch.ops.aten._scaled_dot_product_efficient_attention
    return lambda: op(q, k, v, mask, True, dropout_p, is_causal, scale=kwargs.get("scale"))


@_register("sdpafx_grad_forward_scaled_dot_product_efficient_attention")
def _sdpa_flash_fwd(args, call_args, kwargs, device):
    q, k, v, dropout_p, is_causal = call_args[:5]
    op = torch.ops.aten._scaled_dot_product_flash_attention
    return lambda: op(q, k, v, dropout_p, is_causal, return_debug_mask=False, scale=kwargs.get("scale"))


@_register("sdpaex_scaled_dot_product_efficient_attention_backward")
def _sdpa_efficient_bwd(args, call_args, kwargs, device):
    grad, q, k, v, mask, out, lse, seed, offset, dropout_p, is_causal = call_args[:11]
    op = torch.ops.aten._scaled_dot_product_efficient_attention_backward
    needs, scale = [True, True, True, mask is not None], kwargs.get("scale")
    return lambda: op(grad, q, k, v, mask, out, lse, seed, offset, dropout_p, needs, is_causal, scale=scale)


@_register("sdpafx_scaled_dot_product_efficient_attention_backward")
def _sdpa_flash_bwd(args, call_args, kwargs, device):
    grad, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, dropout_p, is_causal, seed, offset = call_args[:14]
    op = torch.ops.aten._scaled_dot_product_flash_attention_backward
    scale = kwargs.get("scale")
    rest = (cum_q, cum_k, max_q, max_k, dropout_p, is_causal, seed, offset)
    return lambda: op(grad, q, k, v, out, lse, *rest, scale=scale)


def index_bound(args: OpArgs, position: int) -> int | None:
    """Exclusive upper bound for the integer input at `position` when it is an index, else None.

    The profiler draws valid indices from it (an out-of-range index would raise or time garbage).
    """
    inputs = args.inputs
    if args.symbol == "embedding" and position == 0:
        return inputs[1].shape[0]
    if args.symbol in ("embedding_backward", "torch.ops.aten.embedding_backward") and position == 1:
        return int(args.attr("arg2", 1))
    if args.symbol in ("take_along_dim", "take_along_axis", "gather") and position == 1:
        dim = int(args.attr("arg2", args.attr("dim", -1)))
        return inputs[0].shape[dim]
    if args.symbol == "index_select" and position == 1:
        return inputs[0].shape[int(args.attr("arg1", 0))]
    if args.symbol in ("torch_nll_loss_backward_impl", "nll_loss_backward", "nll_loss") and position in (1, 2):
        logits = inputs[1] if args.symbol != "nll_loss" else inputs[0]
        return logits.shape[1] if len(logits.shape) > 1 else logits.shape[0]
    return None


def fused_sdpa_symbols() -> frozenset[str]:
    """Fused attention symbols that have a runner here (the rest need their own executor's library)."""
    return frozenset(s for s in SDPA_FORMS if s in _REGISTRY)
