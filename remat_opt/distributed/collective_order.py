"""At most k FSDP collectives in flight: the order, for a trace's bound symbols or a graph's ops.

Thunder 0.2.6's wait sorting issues every FSDP all-gather at the forward's start and waits for every
gradient's reduce-scatter at the backward's end, so every unsharded weight, then every unsharded
gradient, is alive at once: a floor no recompute plan goes below (Llama-2-70b on 8 ranks: 138 GB
per rank). `in_flight_order` keeps at most `k` of them in flight beside the one in use:

* forward: each all-gather's wait right before the first op that reads the weight; then the
  all-gathers, in the order of their waits: the j-th is issued right after the (j - k)-th wait (the
  first k stay where they are, at the start), or right before its own wait when k is 0 (no overlap);
* backward: each reduce-scatter, with the op that divides its gradient by the world size, right
  after the op that makes the gradient (Thunder appends them all after the backward's last compute,
  so every unsharded gradient of the model waits at once: 143 GB per rank for Llama-3-70B on 8);
  then, in the order they are issued, the j-th one's wait moves to right before the (j + k)-th is
  issued (the last k stay at the end), or right after its own issue when k is 0.

The same function orders a trace's bound symbols (`remat_opt.distributed.regather_order`, which CostRemat runs
as a post-optimization pass and in its dry runs) and a joint graph's ops (`reorder_graph`: a graph
traced in Thunder's order and extended by `remat_opt.core.deepen`, then put in the order the pass gives;
the two are checked equal in the tests). Pure: no Thunder, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from remat_opt.core.graph import JointGraph, OpNode

ALL_GATHER = "torch_all_gather_prim_impl"
REDUCE_SCATTER = "torch_reduce_scatter_prim_impl"
WAIT = "torch_wait_prim_impl"

Item = TypeVar("Item")


def check_in_flight(in_flight: int | None) -> int | None:
    """`in_flight` if it is None or an integer >= 0; else `ValueError` saying what works."""
    if in_flight is not None and (isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 0):
        raise ValueError("collectives_in_flight must be None (Thunder's order: every forward all-gather at the "
                         "forward's start, every reduce-scatter waited for at the backward's end) or an integer >= 0 "
                         f"(FSDP collectives in flight beside the one in use), got {in_flight!r}")
    return in_flight


class _Accessors:
    def __init__(self, symbol: Callable, inputs: Callable, outputs: Callable):
        self.symbol, self.inputs, self.outputs = symbol, inputs, outputs


def async_pairs(items: Sequence[Item], collective: str, symbol, inputs, outputs) -> list[tuple[Item, Item]]:
    """(issue, wait) of every async `collective` whose future a wait in `items` takes, in issue order."""
    waits = {inputs(item)[0]: item for item in items if symbol(item) == WAIT}
    pairs = []
    for item in items:
        if symbol(item) == collective:
            wait = next((waits[name] for name in outputs(item) if name in waits), None)
            if wait is not None:
                pairs.append((item, wait))
    return pairs


def _waits_before_first_use(items: Sequence[Item], at: _Accessors) -> dict[int, tuple[int, bool]]:
    """Each all-gather's wait right before the first op that reads its output (Thunder's sort leaves
    many waits tied and early: before the embedding, all of them)."""
    pairs = async_pairs(items, ALL_GATHER, at.symbol, at.inputs, at.outputs)
    waited = {at.outputs(wait)[0]: wait for _, wait in pairs}
    moves = {}
    for item in items:
        for name in at.inputs(item):
            wait = waited.pop(name, None)
            if wait is not None:
                moves[id(wait)] = (id(item), False)
    return moves


def _scatters_after_their_gradients(items: Sequence[Item], at: _Accessors) -> dict[int, tuple[int, bool]]:
    """Each reduce-scatter, with the op before it that only it reads (FSDP's division by the world
    size), right after the op that makes the last of their inputs (Thunder appends them all after
    the backward's last compute, where every unsharded gradient is alive at once)."""
    position = {id(item): i for i, item in enumerate(items)}
    producer = {name: item for item in items for name in at.outputs(item)}
    readers: dict[str, int] = {}
    for item in items:
        for name in at.inputs(item):
            readers[name] = readers.get(name, 0) + 1
    moves: dict[int, tuple[int, bool]] = {}
    for scatter, _ in async_pairs(items, REDUCE_SCATTER, at.symbol, at.inputs, at.outputs):
        group = [producer[name] for name in at.inputs(scatter) if name in producer
                 and at.symbol(producer[name]) not in (WAIT, REDUCE_SCATTER, ALL_GATHER)
                 and all(readers.get(out, 0) == 1 for out in at.outputs(producer[name]))]
        group = sorted({id(item): item for item in (*group, scatter)}.values(), key=lambda item: position[id(item)])
        made = {name for item in group for name in at.outputs(item)}
        anchors = [producer[name] for item in group for name in at.inputs(item) if name in producer and name not in made]
        if not anchors:
            continue
        anchor = max(anchors, key=lambda item: position[id(item)])
        if id(anchor) in moves:
            continue  # after an op that moves itself (no FSDP backward has one)
        moves.update({id(item): (id(anchor), True) for item in group})
    return moves


def _moves(items: Sequence[Item], k: int, backward: bool, at: _Accessors) -> dict[int, tuple[int, bool]]:
    """id(item to move) -> (id of the item it goes beside, whether after it); forward: the items
    already in the order `_waits_before_first_use` gives."""
    if backward:
        pairs = async_pairs(items, REDUCE_SCATTER, at.symbol, at.inputs, at.outputs)
        if k == 0:
            return {id(wait): (id(scatter), True) for scatter, wait in pairs}
        return {id(pairs[j][1]): (id(pairs[j + k][0]), False) for j in range(len(pairs) - k)}
    position = {id(item): i for i, item in enumerate(items)}
    pairs = sorted(async_pairs(items, ALL_GATHER, at.symbol, at.inputs, at.outputs), key=lambda p: position[id(p[1])])
    if k == 0:
        return {id(gather): (id(wait), False) for gather, wait in pairs}
    return {id(pairs[j][0]): (id(pairs[j - k][1]), True) for j in range(k, len(pairs))}


def _apply(items: Sequence[Item], moves: dict[int, tuple[int, bool]]) -> list[Item]:
    """`items` with each moved one (by id) right before or after its anchor, in their own order."""
    beside: dict[tuple[int, bool], list[Item]] = {}
    for item in (i for i in items if id(i) in moves):
        beside.setdefault(moves[id(item)], []).append(item)
    ordered: list[Item] = []
    for item in (i for i in items if id(i) not in moves):
        ordered.extend(beside.get((id(item), False), ()))
        ordered.append(item)
        ordered.extend(beside.get((id(item), True), ()))
    return ordered


def _check_defined_before_use(items: Sequence[Item], at: _Accessors) -> None:
    """Raises `ValueError` naming the op that would read a tensor before the op making it."""
    made = {name for item in items for name in at.outputs(item)}
    defined: set[str] = set()
    for item in items:
        missing = [name for name in at.inputs(item) if name in made and name not in defined]
        if missing:
            raise ValueError(f"reordering FSDP collectives would run {at.symbol(item)} before {missing[0]} is made")
        defined.update(at.outputs(item))


def in_flight_order(items: Sequence[Item], in_flight: int, *, backward: bool, symbol: Callable[[Item], str],
                    inputs: Callable[[Item], Sequence[str]], outputs: Callable[[Item], Sequence[str]]) -> list[Item] | None:
    """`items` (a forward's or a backward's ops, in order) with at most `in_flight` FSDP collectives
    in flight (see the module docstring); None when nothing moves. `symbol`, `inputs` and `outputs`
    read an item's symbol name and the names of the tensors (futures included) it reads and writes."""
    at = _Accessors(symbol, inputs, outputs)
    check_in_flight(in_flight)
    first = _scatters_after_their_gradients if backward else _waits_before_first_use
    ordered = _apply(items, first(items, at))
    moves = _moves(ordered, in_flight, backward, at)
    if not moves and all(a is b for a, b in zip(ordered, items)):
        return None
    ordered = _apply(ordered, moves)
    _check_defined_before_use(ordered, at)
    return ordered


def _renumbered(op: OpNode, name: str, index: int) -> OpNode:
    members = tuple(replace(m, name=f"{name}.{i}") for i, m in enumerate(op.members))
    return replace(op, name=name, index=index, members=members)


def reorder_graph(graph: JointGraph, in_flight: int | None) -> JointGraph:
    """`graph` (traced in Thunder's order) with its ops in the order `in_flight` gives, renumbered as
    extract numbers them; `graph` itself for None or nothing to move."""
    if check_in_flight(in_flight) is None:
        return graph
    accessors = dict(symbol=lambda op: op.symbol, inputs=lambda op: op.inputs, outputs=lambda op: op.outputs)
    forward = in_flight_order(graph.forward_ops, in_flight, backward=False, **accessors)
    backward = in_flight_order(graph.backward_ops, in_flight, backward=True, **accessors)
    if forward is None and backward is None:
        return graph
    ops = [*(forward or graph.forward_ops), *(backward or graph.backward_ops)]
    counts = {False: 0, True: 0}
    renumbered = []
    for op in ops:
        index = counts[op.is_backward]
        counts[op.is_backward] += 1
        renumbered.append(_renumbered(op, f"{'bwd' if op.is_backward else 'fwd'}{index}", index))
    return replace(graph, ops=tuple(renumbered))


def gradients_awaiting_scatter_bytes(graph: JointGraph, backward_index: int) -> int:
    """Bytes of the backward's tensors alive at its op `backward_index` (made by then, read then or
    later) that a reduce-scatter reads, directly or through one op (FSDP's division by the world
    size): the unsharded gradients waiting to be scattered. In Thunder's order every reduce-scatter
    is issued after the backward's last compute, so there all of them are alive at once."""
    ops = graph.backward_ops
    readers: dict[str, list[OpNode]] = {}
    born: dict[str, int] = {}
    last_read: dict[str, int] = {}
    for j, op in enumerate(ops):
        for name in op.inputs:
            readers.setdefault(name, []).append(op)
            last_read[name] = j
        for name in op.outputs:
            born.setdefault(name, j)

    def scattered(name: str, hops: int = 2) -> bool:
        return any(op.symbol == REDUCE_SCATTER or (hops > 1 and any(scattered(o, hops - 1) for o in op.outputs))
                   for op in readers.get(name, ()))

    tensors = graph.tensors
    return sum(tensors[name].storage_bytes for name, j in born.items()
               if tensors[name].storage == name and j <= backward_index <= last_read.get(name, -1) and scattered(name))


def gathered_weights_alive_bytes(graph: JointGraph, forward_index: int) -> int:
    """Bytes of the unsharded weights (FSDP all-gathers' waited outputs) alive at the forward's op
    `forward_index`: gathered by then and read then or later (the backward's reads included). In
    Thunder's order every all-gather is issued at the forward's start, so all of them are alive."""
    ops = graph.forward_ops
    gathered = {wait.outputs[0] for _, wait in async_pairs(ops, ALL_GATHER, lambda op: op.symbol,
                                                            lambda op: op.inputs, lambda op: op.outputs)}
    born = {name: j for j, op in enumerate(ops) for name in op.outputs if name in gathered}
    last_read = {name: j for j, op in enumerate(ops) for name in op.inputs if name in gathered}
    read_later = {name for op in graph.backward_ops for name in op.inputs if name in gathered}
    tensors = graph.tensors
    return sum(tensors[name].storage_bytes for name, j in born.items()
               if j <= forward_index and (name in read_later or last_read.get(name, -1) >= forward_index))
