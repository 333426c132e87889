"""Ties between repeated blocks (transformer layers): one decision for every copy of a block.

Transformer graphs repeat one block (`remat_opt.core.layers.find_repeated_blocks`); `block_ties` maps
each unit, op, tensor and storage of block m > 0 to its counterpart in block 0. A solver that gives
tied names one variable solves a problem the size of one block and replicates the decision; tying
only adds equalities, so every tied solution is a valid plan of the whole graph (and the checker
verifies it on the whole graph).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from remat_opt.core.graph import JointGraph
from remat_opt.core.layers import RepeatedBlocks, find_repeated_blocks
from remat_opt.core.problem import RecomputeProblem


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
