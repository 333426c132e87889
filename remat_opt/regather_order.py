"""Where FSDP's all-gathers run: backward re-gathers just before first use, forward ones a few ahead.

A plan that re-gathers an FSDP weight tags its `synchronize` output; Thunder then clones the
all-gather and its wait into the backward, and its wait sorting (`thunder.distributed.utils.
sort_waits`, which prefers communication over everything else) issues every re-gather at the very
start of the backward: all re-gathered weights are alive at once, and re-gathering saves little
memory at the backward's peak. `place_regathers_before_use` moves each re-gather's all-gather and
wait to just before the first op that reads the weight, which is the step the peak simulation
(`remat_opt.plan.simulate_step`) predicts, and lets the weight be freed after its last use as
before. Every rank runs the same pass, so the ranks still issue their collectives in one order.

Thunder's order also sets a floor no plan goes below: the wait sorting issues every FSDP all-gather
at the forward's start (every unsharded weight is alive before the first layer runs) and waits for
every gradient's reduce-scatter at the backward's end (every unsharded gradient is held by its
future until then); Llama-2-70b on 8 ranks: 138 GB of either per rank, whatever is recomputed.
`limit_collectives_in_flight(trace, k)` keeps at most `k` of them in flight beside the one in use:
the forward issues each all-gather `k` weights ahead of its wait, the backward waits for each
reduce-scatter before issuing the `k`-th after it (0: no overlap). Thunder's own remedy for the
forward, `thunder.distributed.utils.limit_in_flight_allgathers`, is unused by its FSDP in 0.2.6
and pairs all-gathers with waits by position, not by the future they share.
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
REDUCE_SCATTER = "torch_reduce_scatter_prim_impl"
WAIT = "torch_wait_prim_impl"
# what `del_last_used` writes, and writes again after the reordering
BOOKKEEPING = (prims.PrimIDs.DEL, clear_mutable_collection.id)


def _async_pairs(bsyms: list[BoundSymbol], collective: str) -> list[tuple[BoundSymbol, BoundSymbol]]:
    """(issue, wait) of every async `collective` whose future a wait in `bsyms` takes, in issue order."""
    waits = {b.flat_proxy_args[0].name: b for b in bsyms if b.sym.name == WAIT}
    pairs = []
    for bsym in bsyms:
        future = next((o for o in bsym.flat_proxy_outs if isinstance(o, FutureTensorProxy)), None)
        if bsym.sym.name == collective and future is not None and future.name in waits:
            pairs.append((bsym, waits[future.name]))
    return pairs


def _regathers(bsyms: list[BoundSymbol]) -> dict[str, tuple[BoundSymbol, BoundSymbol]]:
    """The unsharded weight's name -> (its all-gather, its wait), for every async all-gather."""
    return {wait.flat_proxy_outs[0].name: (gather, wait) for gather, wait in _async_pairs(bsyms, ALL_GATHER)}


def check_in_flight(in_flight: int | None) -> int | None:
    """`in_flight` if it is None or an integer >= 0; else `ValueError` saying what works."""
    if in_flight is not None and (isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 0):
        raise ValueError("collectives_in_flight must be None (Thunder's order: every forward all-gather at the "
                         "forward's start, every reduce-scatter waited for at the backward's end) or an integer >= 0 "
                         f"(FSDP collectives in flight beside the one in use), got {in_flight!r}")
    return in_flight


def _forward_moves(bsyms: list[BoundSymbol], k: int) -> dict[int, tuple[int, bool]]:
    """All-gathers in the order of their waits: the j-th right after the (j - k)-th wait (the first k
    stay at the start), or right before its own wait when k is 0."""
    position = {id(b): i for i, b in enumerate(bsyms)}
    pairs = sorted(_async_pairs(bsyms, ALL_GATHER), key=lambda pair: position[id(pair[1])])
    if k == 0:
        return {id(gather): (id(wait), False) for gather, wait in pairs}
    return {id(pairs[j][0]): (id(pairs[j - k][1]), True) for j in range(k, len(pairs))}


def _backward_moves(bsyms: list[BoundSymbol], k: int) -> dict[int, tuple[int, bool]]:
    """Reduce-scatters in issue order: the j-th one's wait right before the (j + k)-th is issued (the
    last k's stay at the end), or right after its own when k is 0."""
    pairs = _async_pairs(bsyms, REDUCE_SCATTER)
    if k == 0:
        return {id(wait): (id(scatter), True) for scatter, wait in pairs}
    return {id(pairs[j][1]): (id(pairs[j + k][0]), False) for j in range(len(pairs) - k)}


def _moved(bsyms: list[BoundSymbol], moves: dict[int, tuple[int, bool]]) -> list[BoundSymbol]:
    """`bsyms` with each moved one (by id) right before or after its anchor, in their own order."""
    beside: dict[tuple[int, bool], list[BoundSymbol]] = {}
    for bsym in (b for b in bsyms if id(b) in moves):
        beside.setdefault(moves[id(bsym)], []).append(bsym)
    ordered: list[BoundSymbol] = []
    for bsym in (b for b in bsyms if id(b) not in moves):
        ordered.extend(beside.get((id(bsym), False), ()))
        ordered.append(bsym)
        ordered.extend(beside.get((id(bsym), True), ()))
    _check_defined_before_use(ordered)
    return ordered


def _check_defined_before_use(bsyms: list[BoundSymbol]) -> None:
    """Raises `ValueError` naming the op that would read a tensor before the op making it."""
    defined = set()
    made = {p.name for b in bsyms for p in b.flat_proxy_outs}
    for bsym in bsyms:
        missing = [p.name for p in bsym.flat_proxy_args if p.name in made and p.name not in defined]
        if missing:
            raise ValueError(f"reordering FSDP collectives would run {bsym.sym.name} before {missing[0]} is made")
        defined.update(p.name for p in bsym.flat_proxy_outs)


def limit_collectives_in_flight(trace: TraceCtx, in_flight: int | None) -> TraceCtx:
    """A forward or backward with at most `in_flight` FSDP all-gathers (forward) or reduce-scatters
    (backward) in flight beside the one in use (see the module docstring); `del`s written again
    where the trace had them. The trace itself for None (Thunder's order) or nothing to move."""
    if check_in_flight(in_flight) is None:
        return trace
    backward = TraceTag.BACKWARD in trace.tags
    had_dels = any(b.sym.id in BOOKKEEPING for b in trace.bound_symbols)
    bsyms = [b for b in trace.bound_symbols if b.sym.id not in BOOKKEEPING]
    moves = (_backward_moves if backward else _forward_moves)(bsyms, in_flight)
    if not moves:
        return trace
    reordered = from_trace(trace)
    reordered.bound_symbols = _moved(bsyms, moves)
    if had_dels:
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
