"""Thunder traces -> `JointGraph`: the only module that walks Thunder traces.

`GraphCapture` is a Thunder transform whose pre-prologue hook (the point where `CostRemat` will
plan) runs, on an **isolated copy** of the computation trace, what Thunder itself does next:
`dce`, autodiff (`grad_transform_on_trace`), the executors' passes (`transform_for_execution`,
including Thunder's own fusion-pair rematerialization) and `split_into_forward_and_backward`.
The real compilation is left untouched: bound symbols are copied recursively with fresh tag sets,
the names set is copied, and every proxy's tags are restored afterwards.

Saved tensors are mapped back to the pre-autodiff proxies that a `RECOMPUTE_IN_BACKWARD` tag would
have to go on through *origin markers*: before the dry run every pre-autodiff proxy and bound symbol
gets a marker in its tags; Thunder carries proxy tags over to replacement proxies and bound-symbol
tags over to decompositions and grad-rule outputs, so each saved tensor still names its origin.

Storage identity (which tensors alias which memory) is found by running every op of the final
traces on the meta device, where torch decides exactly as on a real device whether an op returns a
view (`reshape` of a non-contiguous tensor copies, of a contiguous one does not). Fusion regions,
which cannot run on meta, are taken to allocate fresh outputs.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from remat_opt import _compat  # noqa: F401  (before thunder)

warnings.filterwarnings("ignore", message="transformer_engine module not found")

import thunder  # noqa: E402
import torch  # noqa: E402
from thunder.common import transform_for_execution  # noqa: E402
from thunder.core import prims  # noqa: E402
from thunder.core.proxies import FutureTensorProxy, NumberProxy, Proxy, TensorProxy  # noqa: E402
from thunder.core.pytree import tree_iter  # noqa: E402
from thunder.core.symbol import BoundSymbol  # noqa: E402
from thunder.core.trace import TraceCtx, from_trace  # noqa: E402
from thunder.core.transform_common import Transform, dce  # noqa: E402

from costmodels.interconnect import staging_bytes  # noqa: E402
from costmodels.formulas import (  # noqa: E402
    ANNOTATION_PREFIX,
    COLLECTIVE_KINDS,
    COUNTED_FLOPS_ATTR,
    WAIT_SYMBOLS,
    WORLD_SIZE_ATTR,
)
from remat_opt.core import graph as g  # noqa: E402
from remat_opt.distributed.regather_order import order_fsdp_collectives  # noqa: E402
from remat_opt.tracing.op_semantics import FallbackWork, draws_random_itself, fallback_work, is_random  # noqa: E402
from remat_opt.tracing.storage import StorageTracker, member_workspace_bytes, proxy_bytes  # noqa: E402

TORCH_FUNCTION_ATTR = ANNOTATION_PREFIX + "torch_function"  # the torch function behind a fallback op

# Bound symbols that only move values between Python containers; they are not ops of the graph.
STRUCTURAL_SYMBOLS = frozenset(
    {
        "unpack_trivial",
        "unpack_sequence",
        "unpack_key",
        "unpack_attr",
        "python_return",
        "python_del",
        "del",
        "clear_mutable_collection",
        "comment",
    }
)


@dataclass(frozen=True, slots=True)
class _Origin:
    """Marker carried in tags: which pre-autodiff bound symbol (or proxy) a value came from.

    Identity-hashed, so markers never collide with Thunder's own tags.
    """

    proxy_name: str | None  # the pre-autodiff proxy (None on a bound-symbol marker)
    symbol: str
    depth: int  # 0 for top-level bound symbols, 1 for their subsymbols, ...
    unit: str | None  # the proxy whose tag recomputes this bound symbol (see `_copy_marked`)
    is_random: bool
    __hash__ = object.__hash__
    __eq__ = object.__eq__


class _CaptureDone(Exception):
    """Raised by `GraphCapture(stop=True)` to end a compilation once the graph is captured."""


# A collective's future (`FutureTensorProxy`, not a TensorProxy) is a tensor of the graph: it holds
# the collective's output buffer from the call to its `wait`, which returns that buffer.
GRAPH_TENSORS = (TensorProxy, FutureTensorProxy)
# Collectives whose Thunder implementation (`thunder/executors/torchex.py`) hands its input tensor to
# the backend, which reads it until the wait; an all-reduce hands over a clone (its output) instead.
HANDS_INPUT_TO_BACKEND = ("all_gather", "reduce_scatter")


def _tensor_outs(bsym: BoundSymbol) -> list[TensorProxy]:
    return [o for o in bsym.flat_proxy_outs if isinstance(o, GRAPH_TENSORS)]


def _copy_marked(bsym: BoundSymbol, depth: int, inherited: dict[str, str] | None = None) -> tuple[BoundSymbol, bool]:
    """Copies `bsym` recursively with fresh tag sets and adds origin markers to the copy; returns the
    copy and whether its value depends on the RNG (decided bottom-up, each op checked once).

    A tag on a proxy makes autodiff recompute the *shallowest* bound symbol that outputs it (with
    its whole decomposition). So the unit a bound symbol is recomputed with is named by its first
    new output, unless an ancestor also outputs one of its outputs: then it is the ancestor's unit.

    Args:
        bsym: the pre-autodiff bound symbol.
        depth: 0 for top-level bound symbols.
        inherited: proxy name -> unit, for the outputs of the ancestors.
    """
    inherited = inherited or {}
    arg_names = {a.name for a in bsym.flat_proxy_args}
    outs = [o for o in _tensor_outs(bsym) if o.name not in arg_names]
    shared = [inherited[o.name] for o in outs if o.name in inherited]
    unit = shared[0] if shared else (outs[0].name if outs else None)
    child_inherited = {**inherited, **{o.name: unit for o in outs}} if unit else inherited
    children = [_copy_marked(s, depth + 1, child_inherited) for s in bsym.subsymbols]
    copy = bsym.from_bsym(subsymbols=[c for c, _ in children], tags=set(bsym.tags))
    random = draws_random_itself(bsym) or any(r for _, r in children)
    copy.tags.add(_Origin(None, bsym.sym.name, depth, unit, random))
    for o in outs:
        o.tags.add(_Origin(o.name, bsym.sym.name, depth, inherited.get(o.name, unit), random))
    return copy, random


def _all_proxies(trace: TraceCtx) -> dict[int, Proxy]:
    found: dict[int, Proxy] = {}

    def visit(bsyms):
        for bsym in bsyms:
            for p in (*bsym.flat_proxy_args, *bsym.flat_proxy_outs):
                found[id(p)] = p
            visit(bsym.subsymbols)

    visit(trace.bound_symbols)
    return found


def dry_run(computation_trace: TraceCtx, executors_list, collectives_in_flight: int | None = None,
            ) -> tuple[TraceCtx, TraceCtx | None]:
    """Runs autodiff, the executors' passes and the split on an isolated, marked copy.

    Must be called inside a Thunder compilation (a pre-prologue hook): executor grad rules are
    looked up through the compile context. FSDP's collectives are placed as CostRemat places them
    (`remat_opt.distributed.regather_order`): backward re-gathers before first use; with `collectives_in_flight`,
    at most that many all-gathers or reduce-scatters in flight (None: Thunder's order).

    Returns:
        The final forward and backward traces (before `del` insertion), with origin markers.
    """
    from thunder.transforms.autodiff import grad_transform_on_trace, split_into_forward_and_backward

    proxies = _all_proxies(computation_trace)
    saved_tags = {key: set(p.tags) for key, p in proxies.items()}
    try:
        trace = from_trace(computation_trace)
        trace.names = set(computation_trace.names)
        trace.bound_symbols = [_copy_marked(b, 0)[0] for b in computation_trace.bound_symbols]
        trace = dce(trace)
        trace = grad_transform_on_trace(trace)
        trace = _sort_waits_as_thunder_does(trace, executors_list)
        trace = transform_for_execution(trace, executors_list=executors_list, use_del_last_used=False)[-1]
        forward, backward = split_into_forward_and_backward(trace)
        forward = order_fsdp_collectives(forward, collectives_in_flight)  # as CostRemat does
        return forward, backward if backward is None else order_fsdp_collectives(backward, collectives_in_flight)
    finally:
        for key, p in proxies.items():
            p.tags.clear()
            p.tags.update(saved_tags[key])


def _sort_waits_as_thunder_does(joint_trace: TraceCtx, executors_list) -> TraceCtx:
    """What Thunder 0.2.6 does between autodiff and the executors' passes when the trace has
    collectives (FSDP, DDP: ``thunder/__init__.py``): claim ops for the executors, then move each
    ``wait`` as late as possible (`thunder.distributed.utils.sort_waits`). Without it, DDP's gradient
    bucketing fails on the joint trace, and the order of all-gathers and waits differs from the run."""
    from thunder.distributed.utils import maybe_sort_waits
    from thunder.executors.passes import _transform_for_operator_executor_execution

    claimed = _transform_for_operator_executor_execution(joint_trace, executors_list)
    is_sorted, claimed = maybe_sort_waits(claimed)
    return claimed if is_sorted else joint_trace


def needs_backward(computation_trace: TraceCtx) -> bool:
    """Whether Thunder will build a backward for this computation trace: as Thunder 0.2.6 decides
    (``thunder/__init__.py``), some tensor argument requires grad and torch autograd support is on
    (and grad is enabled: a call under ``torch.no_grad`` builds none). A function that switches
    grad on inside may still get no backward: the dry run's result is the last word."""
    from thunder.core.compile_data import get_compile_data

    compile_data = get_compile_data()
    if compile_data is not None and (compile_data.disable_torch_autograd_support or not compile_data.is_grad_enabled):
        return False
    return any(isinstance(a, TensorProxy) and a.requires_grad for a in computation_trace.args)


def _markers(tags) -> list[_Origin]:
    return [t for t in tags if isinstance(t, _Origin)]


def _attrs(bsym: BoundSymbol) -> tuple[tuple[str, object], ...]:
    """Non-tensor arguments, kept when they are plain values (numbers, bools, strings, dtypes)."""
    pairs = [(f"arg{i}", a) for i, a in enumerate(bsym.args)] + list(bsym.kwargs.items())
    kept = []
    for key, value in pairs:
        if isinstance(value, Proxy) and not isinstance(value, TensorProxy):
            value = getattr(value, "value", None)
        if isinstance(value, (bool, int, float, str)) or value is None:
            kept.append((key, value))
        elif isinstance(value, (tuple, list)) and all(isinstance(v, (bool, int, float)) for v in value):
            kept.append((key, tuple(value)))
        elif type(value).__name__ in {"dtype", "floating", "bfloat16_", "float32_"} or "dtypes" in type(
            value
        ).__module__:
            kept.append((key, str(value)))
    return tuple(kept)


def _op_tags(bsym: BoundSymbol, work: FallbackWork | None) -> frozenset[str]:
    tags = set()
    sym_tags = bsym.sym.tags or ()
    random = work.random if work is not None else is_random(bsym)  # the fallback op's run, reused
    if random or any(m.is_random for m in _markers(bsym.tags)):  # executors may hide the draw
        tags.add("random")
    if work is not None:
        tags.add("fallback" if work.known else "fallback_unknown")
    if prims.OpTags.DONT_RECOMPUTE_IN_BACKWARD in sym_tags:
        tags.add("dont_recompute")
    if prims.OpTags.MATMUL_OP in sym_tags:
        tags.add("matmul")
    if bsym.sym.is_fusion:
        tags.add("fusion")
    if bsym.sym.name in COLLECTIVE_KINDS or bsym.sym.name in WAIT_SYMBOLS:
        tags.add("collective")
        if COLLECTIVE_KINDS.get(bsym.sym.name) in HANDS_INPUT_TO_BACKEND and any(
                isinstance(o, FutureTensorProxy) for o in bsym.flat_proxy_outs):
            tags.add("holds_inputs")  # the backend reads its input until the future's wait
        # FSDP's all-gather of a weight (and its wait), from a pre-autodiff `synchronize`: re-gathering
        # it in the backward is the one recomputation of a collective that is allowed
        if COLLECTIVE_KINDS.get(bsym.sym.name, "all_gather") == "all_gather" and any(
                m.symbol == "synchronize" for m in _markers(bsym.tags)):
            tags.add("regather")
    return frozenset(tags)


def _process_group(bsym: BoundSymbol):
    """The process group a collective op runs over (None: not a collective)."""
    from torch.distributed import ProcessGroup

    return next((a for a in (*bsym.args, *bsym.kwargs.values()) if isinstance(a, ProcessGroup)), None)


def _world_size(bsym: BoundSymbol) -> int | None:
    """Ranks in the process group a collective op runs over (None: not a collective)."""
    group = _process_group(bsym)
    return group.size() if group is not None else None


def _staging_bytes(bsym: BoundSymbol) -> int:
    """What the process group's backend allocates for itself while a collective runs (gloo's flat
    copy of the full tensor: an all-gather's output, a reduce-scatter's input); 0 for other ops."""
    group, kind = _process_group(bsym), COLLECTIVE_KINDS.get(bsym.sym.name)
    if group is None or kind is None:
        return 0
    full = bsym.flat_proxy_outs[0] if kind == "all_gather" else bsym.flat_proxy_args[0]
    return staging_bytes(torch.distributed.get_backend(group), kind, proxy_bytes(full))


def _tag_units(bsym: BoundSymbol) -> tuple[str, ...]:
    """Tag targets whose recomputation re-runs `bsym` (its pre-autodiff ancestors), shallowest first."""
    marks = sorted((m for m in _markers(bsym.tags) if m.unit is not None), key=lambda m: m.depth)
    return tuple(dict.fromkeys(m.unit for m in marks))


def _op_node(bsym: BoundSymbol, name: str, is_backward: bool, index: int, members=()) -> g.OpNode:
    work = fallback_work(bsym)
    attrs = _attrs(bsym)
    if work is not None and work.known:
        attrs = (*attrs, (TORCH_FUNCTION_ATTR, work.torch_function), (COUNTED_FLOPS_ATTR, work.flops))
    if (world_size := _world_size(bsym)) is not None:
        attrs = (*attrs, (WORLD_SIZE_ATTR, world_size))
    return g.OpNode(
        name=name,
        symbol=bsym.sym.name,
        is_backward=is_backward,
        index=index,
        inputs=tuple(p.name for p in bsym.flat_proxy_args if isinstance(p, GRAPH_TENSORS)),
        outputs=tuple(p.name for p in _tensor_outs(bsym)),
        attrs=attrs,
        members=tuple(members),
        op_tags=_op_tags(bsym, work),
        tag_units=() if is_backward else _tag_units(bsym),
        workspace_bytes=work.workspace_bytes if work is not None else _region_workspace_bytes(bsym) + _staging_bytes(bsym),
    )


def _region_workspace_bytes(bsym: BoundSymbol) -> int:
    """What a fusion region allocates for itself while it runs, where its members run one by one
    (the nvFuser stand-in on a CPU trace); 0 for real fusions and on meta (nvFuser keeps them in
    registers)."""
    run = (getattr(bsym, "_call_ctx", None) or {}).get(bsym.sym.name) if bsym.sym.is_fusion else None
    trace = getattr(run, "member_trace", None)
    on_cpu = any(isinstance(p, TensorProxy) and p.device.type == "cpu" for p in bsym.flat_proxy_args)
    return member_workspace_bytes(trace) if trace is not None and on_cpu else 0


def _fusion_members(bsym: BoundSymbol, prefix: str, is_backward: bool) -> list[g.OpNode]:
    return [_op_node(s, f"{prefix}.{i}", is_backward, i) for i, s in enumerate(bsym.subsymbols)]


def _graph_ops(trace: TraceCtx, is_backward: bool) -> list[tuple[BoundSymbol, g.OpNode]]:
    ops = []
    for bsym in trace.bound_symbols:
        if bsym.sym.name in STRUCTURAL_SYMBOLS:
            continue
        name = f"{'bwd' if is_backward else 'fwd'}{len(ops)}"
        members = _fusion_members(bsym, name, is_backward) if bsym.sym.is_fusion else ()
        ops.append((bsym, _op_node(bsym, name, is_backward, len(ops), members)))
    return ops


def _saved_proxies(forward_trace: TraceCtx) -> list[TensorProxy]:
    return_bsym = forward_trace.bound_symbols[-1]
    saved_tensors = return_bsym.args[1][0]
    return [p for p in saved_tensors if isinstance(p, TensorProxy)]


def _forward_outputs(forward_trace: TraceCtx) -> list[TensorProxy]:
    out = forward_trace.bound_symbols[-1].args[0]["output"]
    return [p for p in tree_iter(out) if isinstance(p, TensorProxy)]


def _classify_saved(
    proxy: TensorProxy, producer: BoundSymbol | None, input_names: set[str], output_names: set[str]
) -> g.TensorOrigin:
    """Finds the tag target of a saved tensor, or why there is none."""
    if proxy.name in input_names:
        return g.TensorOrigin(proxy.name, None, None, False, g.REASON_INPUT)
    proxy_marks = sorted(_markers(proxy.tags), key=lambda m: m.depth)
    if proxy_marks:
        origin, reason = proxy_marks[0], "activation"
    else:
        bsym_marks = sorted(_markers(producer.tags), key=lambda m: -m.depth) if producer else []
        if not bsym_marks or bsym_marks[0].unit is None:
            return g.TensorOrigin(proxy.name, None, None, False, g.REASON_NO_ORIGIN)
        origin, reason = bsym_marks[0], g.REASON_AUXILIARY
    target = origin.unit
    if any(m.is_random for m in proxy_marks) or origin.is_random:
        return g.TensorOrigin(proxy.name, target, origin.symbol, False, g.REASON_RANDOM)
    if proxy.name in output_names:
        return g.TensorOrigin(proxy.name, target, origin.symbol, False, g.REASON_FORWARD_OUTPUT)
    return g.TensorOrigin(proxy.name, target, origin.symbol, True, reason)


def build_joint_graph(
    forward_trace: TraceCtx, backward_trace: TraceCtx, executors: tuple[str, ...] = ()
) -> g.JointGraph:
    """Builds the pure data model from the final forward and backward traces of `dry_run`."""
    fwd_ops = _graph_ops(forward_trace, is_backward=False)
    bwd_ops = _graph_ops(backward_trace, is_backward=True)
    input_proxies = [p for p in forward_trace.args if isinstance(p, TensorProxy)]
    input_names = {p.name for p in input_proxies}
    saved = _saved_proxies(forward_trace)
    outputs = _forward_outputs(forward_trace)
    output_names = {p.name for p in outputs}

    tracker = StorageTracker()
    for p in input_proxies:
        tracker.add_input(p, kind="input")
    forward_ctx = forward_trace.python_ctx()
    for bsym, _ in fwd_ops:
        tracker.run(bsym, kind="forward", trace_ctx=forward_ctx)
    for p in _cotangents(backward_trace):
        tracker.add_input(p, kind="cotangent")
    backward_ctx = backward_trace.python_ctx()
    for bsym, _ in bwd_ops:
        tracker.run(bsym, kind="backward", trace_ctx=backward_ctx)

    producer_bsyms = {p.name: (bsym, p) for bsym, _ in fwd_ops for p in _tensor_outs(bsym)}
    origins = {
        name: _classify_saved(proxy, bsym, input_names, output_names) for name, (bsym, proxy) in producer_bsyms.items()
    }
    saved_nodes = tuple(origins.get(p.name) or _classify_saved(p, None, input_names, output_names) for p in saved)
    notes = {**tracker.notes, **{note: 1 for note, _ in fallback_notes([op for _, op in fwd_ops + bwd_ops])}}
    graph = g.JointGraph(
        ops=tuple(op for _, op in fwd_ops + bwd_ops),
        tensors=tracker.tensor_nodes(),
        saved=saved_nodes,
        origins=origins,
        input_names=tuple(p.name for p in input_proxies),
        forward_output_names=tuple(p.name for p in outputs),
        executors=executors,
        notes=tuple(f"{note} (x{count})" if count > 1 else note for note, count in notes.items()),
    )
    _register_region_calls(graph, fwd_ops + bwd_ops)
    return graph


@dataclass(frozen=True, slots=True)
class TensorArg:
    """An argument of a `RegionCall` that is a tensor of the graph, by name."""

    name: str


@dataclass(frozen=True, slots=True)
class RegionCall:
    """One fusion region as its executor built it at compile time: the callable the executed trace
    calls (``TorchCompileN``: the torch.compile'd region; ``nvFusionN``: nvFuser's fusion
    definition, or the stand-in's region) and its arguments in order, graph tensors as `TensorArg`
    and any other value as it is. The data model cannot rebuild a region (its members are prims
    whose permutations, lists and pad widths the graph does not keep), so the profiler runs this."""

    fn: Callable
    arguments: tuple


# id(graph) -> op name -> RegionCall, for the graphs `build_joint_graph` made in this process; an
# entry leaves with its graph. A side table keeps the data model free of Thunder's callables (a
# graph can be pickled, deepened or compared).
_REGION_CALLS: dict[int, dict[str, RegionCall]] = {}


def region_calls(graph: g.JointGraph) -> dict[str, RegionCall]:
    """Op name -> `RegionCall` of each fusion region of `graph`; empty for a graph `build_joint_graph`
    did not make in this process (loaded from the graph cache, deepened, recorded elsewhere)."""
    return _REGION_CALLS.get(id(graph), {})


def _region_argument(value):
    if isinstance(value, GRAPH_TENSORS):
        return TensorArg(value.name)
    return value.value if isinstance(value, NumberProxy) else value


def _register_region_calls(graph: g.JointGraph, ops: list[tuple[BoundSymbol, g.OpNode]]) -> None:
    calls = {}
    for bsym, op in ops:
        fn = (getattr(bsym, "_call_ctx", None) or {}).get(bsym.sym.name) if bsym.sym.is_fusion else None
        if fn is not None:
            calls[op.name] = RegionCall(fn=fn, arguments=tuple(_region_argument(a) for a in bsym.args))
    if calls:
        _REGION_CALLS[id(graph)] = calls
        weakref.finalize(graph, _REGION_CALLS.pop, id(graph), None)


def fallback_notes(ops) -> list[tuple[str, bool]]:
    """What the plan cannot see in ops Thunder runs through its generic torch fallback: one
    ``(note, warn)`` per such op; `warn` when the plan or the gradient cannot be trusted there."""
    notes = []
    for op in ops:
        function = dict(op.attrs).get(TORCH_FUNCTION_ATTR, op.symbol)
        where = f"{op.name} ({op.symbol})"
        if "fallback_unknown" in op.op_tags:
            notes.append((
                f"{where} runs through Thunder's torch fallback and could not be run on fake tensors: "
                "its cost is a guess, its workspace unknown, and it is never recomputed",
                True,
            ))
        elif "fallback" in op.op_tags and op.is_backward and "random" in op.op_tags:
            notes.append((
                f"{where}: Thunder's fallback vjp re-runs random {function} in the backward and draws "
                "new numbers: its gradient can differ from eager and the RNG state moves on, whatever the "
                "plan (a Thunder limitation)",
                True,
            ))
        elif "fallback" in op.op_tags and op.is_backward:
            notes.append((
                f"{where}: Thunder's fallback vjp re-runs {function} in the backward "
                f"({op.workspace_bytes:,} B workspace, counted in the peak)",
                False,
            ))
    return notes


def _cotangents(backward_trace: TraceCtx) -> list[TensorProxy]:
    """The incoming gradients: tensors the backward unpacks from its `cotangents` argument."""
    found = []
    for bsym in backward_trace.bound_symbols:
        if bsym.sym.name == "unpack_sequence" and bsym.args and getattr(bsym.args[0], "name", "") == "cotangents":
            found.extend(o for o in bsym.flat_proxy_outs if isinstance(o, TensorProxy))
    return found


class GraphCapture(Transform):
    """Captures the `JointGraph` of each compilation in the pre-prologue hook.

    Args:
        stop: end the compilation once the graph is captured (used by `analyze`, which never runs
            the model). With False the compilation proceeds, unchanged.
    """

    def __init__(self, *, stop: bool = False, collectives_in_flight: int | None = None):
        self.stop, self.collectives_in_flight = stop, collectives_in_flight
        self.graph: g.JointGraph | None = None
        self.computation_trace: TraceCtx | None = None  # the pre-autodiff trace that tags go on
        self.forward_trace: TraceCtx | None = None
        self.backward_trace: TraceCtx | None = None

    def transform_traces_pre_prologue(self, prologue_trace, computation_trace, epilogue_trace, **kwargs):
        executors_list = kwargs.get("executors_list") or thunder.get_default_executors()
        self.computation_trace = computation_trace
        if needs_backward(computation_trace):
            self.forward_trace, self.backward_trace = dry_run(computation_trace, executors_list, self.collectives_in_flight)
        if self.backward_trace is None:
            raise ValueError("no backward: no input or parameter requires grad, nothing is saved for backward")
        names = tuple(ex.name for ex in executors_list if not ex.name.startswith("__ad_hoc"))
        self.graph = build_joint_graph(self.forward_trace, self.backward_trace, names)
        if self.stop:
            raise _CaptureDone
        return prologue_trace, computation_trace, epilogue_trace


def analyze(fn, *example_inputs, executors=None, transforms=(), collectives_in_flight: int | None = None,
            **example_kwargs) -> g.JointGraph:
    """The joint forward-backward graph of `fn` as Thunder would compile it, without running it.

    Works with inputs and parameters on ``torch.device("meta")``.

    Args:
        fn: a ``torch.nn.Module`` or a function of tensors.
        *example_inputs: inputs as the step will see them (at least one input or parameter must
            require grad).
        executors: Thunder executors, in priority order (Thunder's defaults when None).
        transforms: Thunder transforms to run first (FSDPTransform, DDPTransform: the graph is one rank's).
        collectives_in_flight: FSDP's all-gathers and reduce-scatters in flight at most, as
            ``CostRemat(collectives_in_flight=...)`` runs them (None: Thunder's order).
        **example_kwargs: keyword inputs.

    Returns:
        The `JointGraph`.
    """
    capture = GraphCapture(stop=True, collectives_in_flight=collectives_in_flight)
    jitted = thunder.jit(fn, transforms=[*transforms, capture], executors=executors)
    try:
        jitted(*example_inputs, **example_kwargs)
    except _CaptureDone:
        return capture.graph
    except Exception as e:  # the model's own failure, reported in one line
        raise ModelTraceError(f"tracing {_describe(fn)} failed: {type(e).__name__}: {e}") from e
    raise RuntimeError("the compilation finished without reaching the capture hook")


class ModelTraceError(RuntimeError):
    """The model could not be traced by Thunder (its forward raised, or inputs were invalid)."""


def _describe(fn) -> str:
    return type(fn).__name__ if isinstance(fn, torch.nn.Module) else getattr(fn, "__name__", repr(fn))
