"""Thunder traces -> `JointGraph`: the forward and backward traces of a dry run
(`remat_opt.tracing.dry_run`) read op by op into the data model (`build_joint_graph`).

Saved tensors name the pre-autodiff proxies a tag would go on through the dry run's origin markers.
Storage identity (which tensors alias which memory) is found by running every op of the final
traces on the meta device, where torch decides exactly as on a real device whether an op returns a
view (`reshape` of a non-contiguous tensor copies, of a contiguous one does not). Fusion regions,
which cannot run on meta, are taken to allocate fresh outputs; the callables Thunder built for them
are kept beside the graph (`remat_opt.tracing.regions`).
"""

from __future__ import annotations

from remat_opt import _compat  # noqa: F401  (before thunder)
from thunder.core import prims  # noqa: E402
import torch  # noqa: E402
from thunder.core.proxies import FutureTensorProxy, Proxy, TensorProxy  # noqa: E402
from thunder.core.pytree import tree_iter  # noqa: E402
from thunder.core.symbol import BoundSymbol  # noqa: E402
from thunder.core.trace import TraceCtx  # noqa: E402

from costmodels.interconnect import staging_bytes  # noqa: E402
from costmodels.formulas import (  # noqa: E402
    ANNOTATION_PREFIX,
    COLLECTIVE_KINDS,
    COUNTED_FLOPS_ATTR,
    WAIT_SYMBOLS,
    WORLD_SIZE_ATTR,
)
from remat_opt.core import graph as g  # noqa: E402
from remat_opt.tracing.dry_run import GRAPH_TENSORS, markers, tensor_outs  # noqa: E402
from remat_opt.tracing.op_semantics import FallbackWork, fallback_work, is_random  # noqa: E402
from remat_opt.tracing.regions import register_region_calls  # noqa: E402
from remat_opt.tracing.storage import StorageTracker, proxy_bytes  # noqa: E402

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


# Collectives whose Thunder implementation (`thunder/executors/torchex.py`) hands its input tensor to
# the backend, which reads it until the wait; an all-reduce hands over a clone (its output) instead.
HANDS_INPUT_TO_BACKEND = ("all_gather", "reduce_scatter")


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
    if random or any(m.is_random for m in markers(bsym.tags)):  # executors may hide the draw
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
                m.symbol == "synchronize" for m in markers(bsym.tags)):
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
    marks = sorted((m for m in markers(bsym.tags) if m.unit is not None), key=lambda m: m.depth)
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
        outputs=tuple(p.name for p in tensor_outs(bsym)),
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
    on_cpu = any(isinstance(p, TensorProxy) and p.device.type == "cpu" for p in bsym.flat_proxy_args)
    # the stand-in's regions know it (`member_workspace_bytes`, once per region structure)
    return getattr(run, "workspace_bytes", 0) if on_cpu else 0


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
    proxy_marks = sorted(markers(proxy.tags), key=lambda m: m.depth)
    if proxy_marks:
        origin, reason = proxy_marks[0], "activation"
    else:
        bsym_marks = sorted(markers(producer.tags), key=lambda m: -m.depth) if producer else []
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

    producer_bsyms = {p.name: (bsym, p) for bsym, _ in fwd_ops for p in tensor_outs(bsym)}
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
    register_region_calls(graph, fwd_ops + bwd_ops)
    return graph


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

