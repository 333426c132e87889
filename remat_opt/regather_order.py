"""Where Thunder's backward issues FSDP re-gathers: each one just before the first op that reads it.

A plan that re-gathers an FSDP weight tags its `synchronize` output; Thunder then clones the
all-gather and its wait into the backward, and its wait sorting (`thunder.distributed.utils.
sort_waits`, which prefers communication over everything else) issues every re-gather at the very
start of the backward: all re-gathered weights are alive at once, and re-gathering saves little
memory at the backward's peak. `place_regathers_before_use` moves each re-gather's all-gather and
wait to just before the first op that reads the weight, which is the step the peak simulation
(`remat_opt.plan.simulate_step`) predicts, and lets the weight be freed after its last use as
before. Every rank runs the same pass, so the ranks still issue their collectives in one order.
"""

from __future__ import annotations

from remat_opt import _compat  # noqa: F401  (before thunder)

from thunder.core import prims  # noqa: E402
from thunder.core.proxies import FutureTensorProxy  # noqa: E402
from thunder.core.symbol import BoundSymbol  # noqa: E402
from thunder.core.trace import TraceCtx, TraceProvenance, TraceTag, from_trace  # noqa: E402
from thunder.executors.passes import del_last_used  # noqa: E402
from thunder.executors.pythonex import clear_mutable_collection  # noqa: E402

ALL_GATHER = "torch_all_gather_prim_impl"
WAIT = "torch_wait_prim_impl"
# what `del_last_used` writes, and writes again after the reordering
BOOKKEEPING = (prims.PrimIDs.DEL, clear_mutable_collection.id)


def _regathers(bsyms: list[BoundSymbol]) -> dict[str, tuple[BoundSymbol, BoundSymbol]]:
    """The unsharded weight's name -> (its all-gather, its wait), for every async all-gather."""
    waits = {b.flat_proxy_args[0].name: b for b in bsyms if b.sym.name == WAIT}
    found = {}
    for bsym in bsyms:
        future = next((o for o in bsym.flat_proxy_outs if isinstance(o, FutureTensorProxy)), None)
        if bsym.sym.name == ALL_GATHER and future is not None and future.name in waits:
            wait = waits[future.name]
            found[wait.flat_proxy_outs[0].name] = (bsym, wait)
    return found


def place_regathers_before_use(backward_trace: TraceCtx) -> TraceCtx:
    """`backward_trace` with each re-gather (all-gather and wait) just before the first op that reads
    the weight, and `del`s written again; the trace itself when it has none."""
    if TraceTag.BACKWARD not in backward_trace.tags:
        return backward_trace
    bsyms = [b for b in backward_trace.bound_symbols if b.sym.id not in BOOKKEEPING]
    regathers = _regathers(bsyms)
    if not regathers:
        return backward_trace
    moved = {id(b) for pair in regathers.values() for b in pair}
    ordered: list[BoundSymbol] = []
    for bsym in (b for b in bsyms if id(b) not in moved):
        for name in dict.fromkeys(p.name for p in bsym.flat_proxy_args):
            ordered.extend(regathers.pop(name, ()))
        ordered.append(bsym)
    if regathers:  # a weight nothing reads (cannot happen in a backward Thunder made): keep it before the return
        ordered[-1:-1] = [b for pair in regathers.values() for b in pair]
    reordered = from_trace(backward_trace)
    reordered.bound_symbols = ordered
    reordered = del_last_used(reordered, clear_mutable_collections=True)
    reordered.set_provenance(TraceProvenance("CostRemat: FSDP re-gathers placed just before their first use"))
    return reordered
