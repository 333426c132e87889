"""Repeated blocks (transformer layers): find them and tie their decisions together.

Transformer graphs repeat one block. `find_repeated_blocks` looks for the longest periodic run of
forward-op signatures (symbol, shapes, dtypes, attributes, tags, taggability); `block_ties` maps
each unit, op, tensor and storage of block m > 0 to its counterpart in block 0. A solver that gives
tied names one variable solves a problem the size of one block and replicates the decision; tying
only adds equalities, so every tied solution is a valid plan of the whole graph (and the checker
verifies it on the whole graph).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from remat_opt.graph import JointGraph, OpNode
from remat_opt.problem import RecomputeProblem


@dataclass(frozen=True, slots=True)
class RepeatedBlocks:
    """`count` consecutive blocks of `period` forward ops starting at forward op index `start`."""

    start: int
    period: int
    count: int

    def block_of(self, index: int) -> int | None:
        offset = index - self.start
        if offset < 0 or offset >= self.period * self.count:
            return None
        return offset // self.period


@dataclass(frozen=True, slots=True)
class Ties:
    """Canonical names per kind (``"unit"``, ``"op"``, ``"tensor"``, ``"storage"``); absent: itself."""

    maps: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    blocks: RepeatedBlocks | None = None

    def of(self, kind: str, name: str) -> str:
        return self.maps.get(kind, {}).get(name, name)

    @property
    def tied(self) -> bool:
        return any(self.maps.values())


def op_kind(op: OpNode):
    """An op's symbol; for a fusion region (``TorchCompile7``, ``nvFusion3``), its members' symbols.

    Fusion regions are numbered through the trace, so equal regions in two layers differ by name.
    """
    return ("fusion", tuple(op_kind(m) for m in op.members)) if op.members else op.symbol


def _signature(graph: JointGraph, op: OpNode) -> tuple:
    def meta(names):
        return tuple((graph.tensors[n].shape, graph.tensors[n].dtype) for n in names)

    origins = tuple(
        (o.taggable, o.reason) if (o := graph.origins.get(n)) is not None else None for n in op.outputs
    )
    return (op_kind(op), meta(op.outputs), meta(op.inputs), repr(op.attrs), tuple(sorted(op.op_tags)), origins)


def op_signature_codes(graph: JointGraph, ops) -> np.ndarray:
    """One integer per op; equal codes mean equal signatures (symbol, shapes, dtypes, attributes, tags)."""
    codes: dict[tuple, int] = {}
    return np.array([codes.setdefault(_signature(graph, op), len(codes)) for op in ops], dtype=np.int64)


def find_periodic_run(codes: np.ndarray, *, min_block_ops: int = 8, min_count: int = 2) -> RepeatedBlocks | None:
    """The periodic run of `codes` covering the most entries (shortest period on ties), or None."""
    best, best_cover = None, 0
    for period in range(min_block_ops, len(codes) // min_count + 1):
        eq = np.concatenate(([False], codes[:-period] == codes[period:], [False]))
        edges = np.flatnonzero(np.diff(eq.astype(np.int8)))
        if len(edges) == 0:
            continue
        starts, ends = edges[0::2], edges[1::2]
        longest = int(np.argmax(ends - starts))
        count = (int(ends[longest] - starts[longest]) + period) // period
        if count >= min_count and (count - 1) * period > best_cover:
            best, best_cover = RepeatedBlocks(int(starts[longest]), period, count), (count - 1) * period
    return best


def find_repeated_blocks(graph: JointGraph, *, min_block_ops: int = 8, min_count: int = 2) -> RepeatedBlocks | None:
    """The periodic run of forward ops covering the most ops (shortest period on ties), or None.

    Args:
        graph: the joint graph.
        min_block_ops: shortest block considered.
        min_count: fewest repetitions considered.
    """
    codes = op_signature_codes(graph, graph.forward_ops)
    return find_periodic_run(codes, min_block_ops=min_block_ops, min_count=min_count)


def _op_ties(graph: JointGraph, blocks: RepeatedBlocks) -> dict[str, str]:
    ops = graph.forward_ops
    ties = {}
    for op in ops:
        block = blocks.block_of(op.index)
        if block:
            ties[op.name] = ops[op.index - block * blocks.period].name
    return ties


def block_ties(problem: RecomputeProblem, blocks: RepeatedBlocks) -> Ties:
    """Ties every unit, op, tensor and storage of blocks 1.. to its counterpart in block 0."""
    graph = problem.graph
    op_tie = _op_ties(graph, blocks)
    by_name = problem.ops_by_name
    tensor_tie = {}
    for name, canonical in op_tie.items():
        outs, canonical_outs = by_name[name].outputs, by_name[canonical].outputs
        tensor_tie.update(zip(outs, canonical_outs) if len(outs) == len(canonical_outs) else ())
    unit_by_ops = {unit.ops: unit for unit in problem.units.values()}
    unit_tie = {}
    for unit in problem.units.values():
        if not all(op in op_tie for op in unit.ops):
            continue
        twin = unit_by_ops.get(tuple(op_tie[o] for o in unit.ops))
        if twin is not None and twin.allowed == unit.allowed:
            unit_tie[unit.name] = twin.name
    storage_tie = {}
    for tensor, canonical in tensor_tie.items():
        node, twin = graph.tensors[tensor], graph.tensors[canonical]
        if node.storage == tensor and twin.storage == canonical and node.storage_bytes == twin.storage_bytes:
            storage_tie[tensor] = canonical
    maps = {"unit": unit_tie, "op": op_tie, "tensor": tensor_tie, "storage": storage_tie}
    return Ties(maps=maps, blocks=blocks)


def choose_ties(problem: RecomputeProblem, tie_blocks: bool | None, min_tied_blocks: int = 4) -> Ties:
    """Block ties for `problem` when asked (True) or when enough blocks repeat (None)."""
    if tie_blocks is False:
        return Ties()
    blocks = find_repeated_blocks(problem.graph)
    if blocks is None or (tie_blocks is None and blocks.count < min_tied_blocks):
        return Ties()
    return block_ties(problem, blocks)
