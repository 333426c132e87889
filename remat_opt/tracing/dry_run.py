"""The dry run: what Thunder does with a computation trace after the pre-prologue hook (`dce`,
autodiff, the executors' passes with Thunder's own fusion-pair rematerialization, the split into
forward and backward), run on an **isolated copy** so that the real compilation is left untouched:
bound symbols are copied recursively with fresh tag sets, the names set is copied, and every
proxy's tags are restored afterwards.

Saved tensors are mapped back to the pre-autodiff proxies that a `RECOMPUTE_IN_BACKWARD` tag would
have to go on through *origin markers* (`Origin`): before the dry run every pre-autodiff proxy and
bound symbol gets a marker in its tags; Thunder carries proxy tags over to replacement proxies and
bound-symbol tags over to decompositions and grad-rule outputs, so each saved tensor still names
its origin (read by `remat_opt.tracing.extract`).
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass

from remat_opt import _compat  # noqa: F401  (before thunder)
from thunder.common import transform_for_execution  # noqa: E402
from thunder.core.proxies import FutureTensorProxy, Proxy, TensorProxy  # noqa: E402
from thunder.core.symbol import BoundSymbol  # noqa: E402
from thunder.core.trace import TraceCtx, from_trace  # noqa: E402
from thunder.core.transform_common import dce  # noqa: E402
from thunder.transforms.autodiff import grad_transform_on_trace, split_into_forward_and_backward  # noqa: E402

from remat_opt.distributed.regather_order import order_fsdp_collectives  # noqa: E402
from remat_opt.tracing.op_semantics import draws_random_itself  # noqa: E402


@dataclass(frozen=True, slots=True)
class Origin:
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


def markers(tags) -> list[Origin]:
    return [t for t in tags if isinstance(t, Origin)]


# A collective's future (`FutureTensorProxy`, not a TensorProxy) is a tensor of the graph: it holds
# the collective's output buffer from the call to its `wait`, which returns that buffer.
GRAPH_TENSORS = (TensorProxy, FutureTensorProxy)


def tensor_outs(bsym: BoundSymbol) -> list[TensorProxy]:
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
    outs = [o for o in tensor_outs(bsym) if o.name not in arg_names]
    shared = [inherited[o.name] for o in outs if o.name in inherited]
    unit = shared[0] if shared else (outs[0].name if outs else None)
    child_inherited = {**inherited, **{o.name: unit for o in outs}} if unit else inherited
    children = [_copy_marked(s, depth + 1, child_inherited) for s in bsym.subsymbols]
    copy = bsym.from_bsym(subsymbols=[c for c, _ in children], tags=set(bsym.tags))
    random = draws_random_itself(bsym) or any(r for _, r in children)
    copy.tags.add(Origin(None, bsym.sym.name, depth, unit, random))
    for o in outs:
        o.tags.add(Origin(o.name, bsym.sym.name, depth, inherited.get(o.name, unit), random))
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

    Autodiff does not depend on the executors: the latest autodiff of each computation trace is
    kept with its tags (`_JointCache`), so a second dry run with the same tags and other executors
    (CostRemat's: with and without the fusion executors) runs only the executors' passes.

    Returns:
        The final forward and backward traces (before `del` insertion), with origin markers.
    """
    proxies = _all_proxies(computation_trace)
    saved_tags = {key: set(p.tags) for key, p in proxies.items()}
    try:
        trace = _JOINT.joint(computation_trace, proxies)
        trace = _sort_waits_as_thunder_does(trace, executors_list)
        with _regions_built_at_first_call():
            trace = transform_for_execution(trace, executors_list=executors_list, use_del_last_used=False)[-1]
        forward, backward = split_into_forward_and_backward(trace)
        forward = order_fsdp_collectives(forward, collectives_in_flight)  # as CostRemat does
        return forward, backward if backward is None else order_fsdp_collectives(backward, collectives_in_flight)
    finally:
        for key, p in proxies.items():
            p.tags.clear()
            p.tags.update(saved_tags[key])


class _JointCache:
    """The latest marked, autodiffed copy of a computation trace (one: a large model's is large), with
    the trace and the tags its proxies carried (what autodiff reads) as the key, and the tags every
    proxy of the copy had and the names taken right after autodiff: a dry run that reuses the copy
    puts them back first (the dry run before restored the computation trace's proxies to their tags
    without markers, and its passes took new names)."""

    def __init__(self):
        # (weak reference to the computation trace, key, joint trace, tags and names after autodiff)
        self._latest = None

    def joint(self, computation_trace: TraceCtx, proxies: dict[int, Proxy]) -> TraceCtx:
        key = tuple(sorted((p.name, tuple(sorted(map(repr, p.tags)))) for p in proxies.values() if p.tags))
        if self._latest is not None and self._latest[0]() is computation_trace and self._latest[1] == key:
            _, _, joint, tags_after, names_after = self._latest
            for p, tags in tags_after:
                p.tags.clear()
                p.tags.update(tags)
            joint.names.clear()  # the passes' traces share this set (`from_trace`): the same new names again
            joint.names.update(names_after)
            return joint
        self._latest = None
        trace = from_trace(computation_trace)
        trace.names = set(computation_trace.names)
        trace.bound_symbols = [_copy_marked(b, 0)[0] for b in computation_trace.bound_symbols]
        joint = grad_transform_on_trace(dce(trace))
        tags_after = [(p, set(p.tags)) for p in {**proxies, **_all_proxies(joint)}.values()]
        self._latest = (weakref.ref(computation_trace, self._drop), key, joint, tags_after, set(joint.names))
        return joint

    def _drop(self, dead_reference) -> None:
        """The computation trace is gone (its compilation is over): so is its copy."""
        if self._latest is not None and self._latest[0] is dead_reference:
            self._latest = None


_JOINT = _JointCache()


def _sort_waits_as_thunder_does(joint_trace: TraceCtx, executors_list) -> TraceCtx:
    """What Thunder 0.2.6 does between autodiff and the executors' passes when the trace has
    collectives (FSDP, DDP: ``thunder/__init__.py``): claim ops for the executors, then move each
    ``wait`` as late as possible (`thunder.distributed.utils.sort_waits`). Without it, DDP's gradient
    bucketing fails on the joint trace, and the order of all-gathers and waits differs from the run."""
    from thunder.distributed.utils import maybe_sort_waits
    from thunder.executors.passes import _transform_for_operator_executor_execution

    if not _has_distributed_prims(joint_trace.bound_symbols):  # no wait to sort (claiming costs ~0.1 s)
        return joint_trace
    claimed = _transform_for_operator_executor_execution(joint_trace, executors_list)
    is_sorted, claimed = maybe_sort_waits(claimed)
    return claimed if is_sorted else joint_trace


def _has_distributed_prims(bsyms) -> bool:
    """Whether any bound symbol, or any of their subsymbols, is one of Thunder's distributed prims
    (all-gather, wait, ...): only those are claimed as ``wait_prim_impl``, what Thunder sorts."""
    from thunder.distributed.prims import PrimIDs

    return any(isinstance(b.sym.id, PrimIDs) or _has_distributed_prims(b.subsymbols) for b in bsyms)


@contextmanager
def _regions_built_at_first_call():
    """Thunder's torch.compile executor builds each region's Python program when it fuses it (twice per
    region: the fusion pass and `update_fusion_call_ctx`); a dry run's regions are never called, except
    by `cost_table="auto"`'s region profiling. Inside this context the program is built at the first
    call instead (nvFuser's own executor and the nvFuser stand-in do so always): the same callable,
    about a fifth of a dry run's time saved with the torch.compile executor."""
    from thunder.executors import torch_compile

    eager = torch_compile.make_compiled

    def lazy(*args, **kwargs):
        built = []

        def run(*call_args):
            if not built:
                built.append(eager(*args, **kwargs))
            return built[0](*call_args)

        return run

    torch_compile.make_compiled = lazy
    try:
        yield
    finally:
        torch_compile.make_compiled = eager


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
