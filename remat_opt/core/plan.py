"""Remat plans and what a plan means on a joint graph.

A `RematPlan` says, for every forward tensor the backward needs, whether it is saved or recomputed
(and which forward ops recompute it, in order), and which pre-autodiff proxies (`tag targets`) the
transform must tag with ``RECOMPUTE_IN_BACKWARD``. Solvers produce plans; nothing here imports
them. `derive` re-derives what a plan recomputes and saves from the `JointGraph` and its tag
targets alone, with Thunder's semantics (used by the independent checker, `remat_opt.core.checker`,
and the step simulation, `remat_opt.core.simulation`):

* Tagging a tag target X makes every final forward op with X in its `OpNode.tag_units` (for
  graphs without them: with an output whose tag target is X) recomputable; such an op recomputes
  all its outputs.
* Recompute is demand-driven, as Thunder's backward clones only the tagged producers of tensors
  it reads: a needed tensor whose producer is recomputed makes that op's inputs needed in turn;
  any other needed forward tensor is saved. Inputs and parameters are always alive.
* Memory is counted by storage (`TensorNode.storage`): a saved view keeps its base alive.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from remat_opt.core.graph import JointGraph, OpNode

SAVE = "save"
RECOMPUTE = "recompute"
INPUT = "input"


@dataclass(frozen=True, slots=True)
class TensorDecision:
    """What happens to one forward tensor that the backward (or a recomputation) needs.

    Attributes:
        name: tensor name.
        action: ``"save"``, ``"recompute"`` or ``"input"`` (input or parameter: always alive).
        storage: the tensor owning its memory.
        storage_bytes: bytes of that storage (0 for input storage).
        tag_target: pre-autodiff proxy a tag would go on (None for inputs).
        recompute_ops: for ``"recompute"``: if the backward reads it, the ops the backward runs
            right before its first reader, in order (ops rerun earlier for another tensor are not
            repeated); if only a recomputation reads it, its own op.
    """

    name: str
    action: str
    storage: str
    storage_bytes: int
    tag_target: str | None
    recompute_ops: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RematPlan:
    """A save/recompute decision for one joint graph, with its predicted costs.

    Attributes:
        solver: name of the solver that made it.
        status: ``"optimal"``, ``"feasible"`` (stopped early, see `gap`), ``"heuristic"``.
        recomputed_tag_targets: the tag targets to tag, sorted (what the transform applies).
        recompute_ops: every final forward op recomputed in the backward, in forward order.
        decisions: one per needed forward tensor, in the order they are first needed.
        saved_names: tensors saved for backward (inputs and parameters excluded), in order.
        saved_bytes: distinct storage bytes of `saved_names` (views of inputs cost nothing).
        peak_bytes: simulated peak of one step (`simulate_step`), parameters included.
        extra_time_s: summed time of `recompute_ops`.
        solve_time_s: wall time of the solver.
        gap: relative optimality gap of `extra_time_s` (0.0 proven optimal, None unknown).
        activation_budget_bytes: the saved-bytes budget it was solved for, if any.
        peak_budget_bytes: the peak budget it was solved for, if any.
        notes: solver remarks (ties across repeated blocks, fallbacks, ...).
    """

    solver: str
    status: str
    recomputed_tag_targets: tuple[str, ...]
    recompute_ops: tuple[str, ...]
    decisions: tuple[TensorDecision, ...]
    saved_names: tuple[str, ...]
    saved_bytes: int
    peak_bytes: int
    extra_time_s: float
    solve_time_s: float
    gap: float | None = None
    activation_budget_bytes: int | None = None
    peak_budget_bytes: int | None = None
    notes: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line: solver, status, saved and peak bytes, extra time."""
        gap = "" if self.gap is None else f", gap {self.gap:.2%}"
        return (
            f"{self.solver} ({self.status}{gap}): saved {self.saved_bytes / 2**20:.2f} MiB, "
            f"peak {self.peak_bytes / 2**20:.2f} MiB, +{self.extra_time_s * 1e3:.3f} ms recompute, "
            f"{len(self.recomputed_tag_targets)} tag targets, solved in {self.solve_time_s:.3f} s"
        )


# --------------------------------------------------------------------------------------------
# Derivation from the graph (independent of the solvers)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Derivation:
    """What a set of tag targets implies, derived from the graph alone.

    Attributes:
        tag_targets: the tag targets.
        recomputed_ops: names of every forward op the tags recompute (demanded or not).
        demanded_ops: the recomputed ops the backward actually runs, in forward order.
        needed: needed forward tensors, in the order first needed.
        saved: needed tensors that are saved (not inputs, not recomputed), in that order.
        unavailable: needed tensors that are neither saved, recomputed nor inputs (a bug).
    """

    tag_targets: frozenset[str]
    recomputed_ops: frozenset[str]
    demanded_ops: tuple[str, ...]
    needed: tuple[str, ...]
    saved: tuple[str, ...]
    unavailable: tuple[str, ...] = field(default=())


def tag_target_ops(graph: JointGraph) -> dict[str, tuple[OpNode, ...]]:
    """Tag target -> the forward ops its tag re-runs (computed once per graph; read-only)."""
    return graph.ops_by_tag_target


def recomputed_ops(graph: JointGraph, tag_targets: Iterable[str]) -> frozenset[str]:
    """Names of the forward ops that tagging `tag_targets` makes Thunder recompute (when needed)."""
    by_target = tag_target_ops(graph)
    return frozenset(op.name for target in tag_targets for op in by_target.get(target, ()))


def derive(graph: JointGraph, tag_targets: Iterable[str]) -> Derivation:
    """Walks the backward's demand from `graph.saved` through the recomputed ops."""
    targets = frozenset(tag_targets)
    recomputed = recomputed_ops(graph, targets)
    producers, inputs = graph.producers, set(graph.input_names)
    needed, seen, demanded, saved, unavailable = [], set(), set(), [], []
    todo = list(reversed(graph.saved_names))
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        needed.append(name)
        op = producers.get(name)
        if name in inputs:
            continue
        if op is None or op.is_backward:
            unavailable.append(name)
        elif op.name in recomputed:
            demanded.add(op.name)
            todo.extend(reversed(op.inputs))
        else:
            saved.append(name)
    order = [op.name for op in graph.forward_ops if op.name in demanded]
    return Derivation(targets, recomputed, tuple(order), tuple(needed), tuple(saved), tuple(unavailable))


def storage_bytes_of(graph: JointGraph, names: Iterable[str]) -> int:
    """Distinct storage bytes of `names`, storages of inputs and parameters excluded."""
    storages = {graph.tensors[n].storage for n in names}
    return sum(graph.tensors[s].storage_bytes for s in storages if graph.tensors[s].kind != "input")
