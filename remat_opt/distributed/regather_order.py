"""Where FSDP's all-gathers run: backward re-gathers just before first use, forward ones a few ahead.

A plan that re-gathers an FSDP weight tags its `synchronize` output; Thunder then clones the
all-gather and its wait into the backward, and its wait sorting (`thunder.distributed.utils.
sort_waits`, which prefers communication over everything else) issues every re-gather at the very
start of the backward: all re-gathered weights are alive at once, and re-gathering saves little
memory at the backward's peak. `place_regathers_before_use` moves each re-gather's all-gather and
wait to just before the first op that reads the weight, which is the step the peak simulation
(`remat_opt.core.simulation.simulate_step`) predicts, and lets the weight be freed after its last use as
before. Every rank runs the same pass, so the ranks still issue their collectives in one order.

With `collectives_in_flight`, `limit_collectives_in_flight` first orders the forward's all-gathers
and the backward's reduce-scatters by `remat_opt.distributed.collective_order` (at most that many in flight).
Thunder's own remedy for the forward, `thunder.distributed.utils.limit_in_flight_allgathers`, is
unused by its FSDP in 0.2.6 and pairs all-gathers with waits by position, not by their future.
"""

from __future__ import annotations

from remat_opt import _compat  # noqa: F401  (before thunder)

from thunder.core import prims  # noqa: E402
from thunder.core.symbol import BoundSymbol  # noqa: E402
from thunder.core.trace import TraceCtx, TraceProvenance, TraceTag, from_trace  # noqa: E402
from thunder.executors.passes import del_last_used  # noqa: E402
from thunder.executors.pythonex import clear_mutable_collection  # noqa: E402

from remat_opt.distributed.collective_order import ALL_GATHER, async_pairs, check_in_flight, in_flight_order  # noqa: E402

# what `del_last_used` writes, and writes again after the reordering
BOOKKEEPING = (prims.PrimIDs.DEL, clear_mutable_collection.id)
_BSYM = dict(symbol=lambda b: b.sym.name, inputs=lambda b: [p.name for p in b.flat_proxy_args],
             outputs=lambda b: [p.name for p in b.flat_proxy_outs])


def _regathers(bsyms: list[BoundSymbol]) -> dict[str, tuple[BoundSymbol, BoundSymbol]]:
    """The unsharded weight's name -> (its all-gather, its wait), for every async all-gather."""
    return {wait.flat_proxy_outs[0].name: (gather, wait) for gather, wait in async_pairs(bsyms, ALL_GATHER, **_BSYM)}


def limit_collectives_in_flight(trace: TraceCtx, in_flight: int | None) -> TraceCtx:
    """A forward or backward with at most `in_flight` FSDP all-gathers (forward) or reduce-scatters
    (backward) in flight beside the one in use (`remat_opt.distributed.collective_order`); `del`s written again
    where the trace had them. The trace itself for None (Thunder's order) or nothing to move."""
    if check_in_flight(in_flight) is None:
        return trace
    backward = TraceTag.BACKWARD in trace.tags
    bsyms = [b for b in trace.bound_symbols if b.sym.id not in BOOKKEEPING]
    ordered = in_flight_order(bsyms, in_flight, backward=backward, **_BSYM)
    if ordered is None:
        return trace
    reordered = from_trace(trace)
    reordered.bound_symbols = ordered
    if len(bsyms) < len(trace.bound_symbols):
        reordered = del_last_used(reordered, clear_mutable_collections=backward)
    what = "reduce-scatters waited for" if backward else "all-gathers issued"
    reordered.set_provenance(TraceProvenance(f"CostRemat: FSDP {what} with at most {in_flight} in flight"))
    return reordered


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


def order_fsdp_collectives(trace: TraceCtx, in_flight: int | None) -> TraceCtx:
    """A forward or backward with FSDP's collectives where CostRemat's plans have them (at most
    `in_flight` in flight, then backward re-gathers before first use): what CostRemat's
    post-optimization pass runs and what its dry runs predict, so that the two cannot drift."""
    return place_regathers_before_use(limit_collectives_in_flight(trace, in_flight))
