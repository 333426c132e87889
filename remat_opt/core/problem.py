"""The recompute decision problem over a `JointGraph`, as the solvers see it (no Thunder imports).

The unit of decision is a **tag target** X and its **recompute unit**: the final forward ops that a
``RECOMPUTE_IN_BACKWARD`` tag on X re-runs, i.e. every forward op with X in its
`OpNode.tag_units` (graphs without `tag_units` fall back to the tag targets of the op's outputs).
Units may nest: tagging the output of a decomposed op (``norm_x = mean(x * x)``) re-runs its whole
decomposition, tagging one intermediate of it re-runs only that op. A unit is *allowed* when no op
is random or marked ``dont_recompute``, every output is taggable and none is a forward output, and
X is not pinned. An op is *tagged* when one of its units is.

Tagging a set R of units has Thunder's demand-driven effect: starting from the tensors the backward
reads (`graph.saved`), a needed tensor written by a tagged op makes that op run in the backward
(*rerun*) and its inputs needed; any other needed forward tensor is saved; inputs and parameters
are always alive. Saved bytes count distinct storages (views keep their base alive).

"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

from remat_opt.core.graph import JointGraph, OpNode
from remat_opt.core.plan import INPUT, RECOMPUTE, RematPlan, SAVE, TensorDecision
from remat_opt.core.simulation import simulate_step

REASON_NOT_TAGGABLE = "an output is not taggable"
REASON_RANDOM_OP = "random op: recomputing would draw new numbers"
REASON_DONT_RECOMPUTE = "op marked dont_recompute"
REASON_FORWARD_OUTPUT = "writes a forward output"
REASON_PINNED = "pinned by the user"
REASON_COLLECTIVE = "collective: never recomputed, except an FSDP weight's all-gather as a planned re-gather"


@dataclass(frozen=True, slots=True)
class RecomputeUnit:
    """The ops one tag re-runs.

    Attributes:
        name: the tag target.
        tag_targets: ``(name,)``, what the transform tags for this unit.
        ops: its final forward ops, in forward order.
        outputs: tensors its ops write.
        inputs: forward tensors its ops read that they do not write (graph inputs excluded).
        time_s: time of running all its ops once.
        allowed: whether it may be recomputed.
        reason: why not (empty when allowed).
    """

    name: str
    tag_targets: tuple[str, ...]
    ops: tuple[str, ...]
    outputs: tuple[str, ...]
    inputs: tuple[str, ...]
    time_s: float
    allowed: bool
    reason: str = ""


def op_tag_units(graph: JointGraph, op: OpNode) -> tuple[str, ...]:
    """Tag targets whose tag re-runs `op`: `OpNode.tag_units`, else its outputs' tag targets."""
    if op.tag_units:
        return op.tag_units
    origins = (graph.origins.get(o) for o in op.outputs)
    return tuple(dict.fromkeys(o.tag_target for o in origins if o is not None and o.tag_target))


def _ops_by_target(graph: JointGraph) -> dict[str, list[OpNode]]:
    by_target: dict[str, list[OpNode]] = {}
    for op in graph.forward_ops:
        for target in op_tag_units(graph, op):
            by_target.setdefault(target, []).append(op)
    return by_target


def _disallow_reason(graph: JointGraph, target: str, ops: list[OpNode], pinned: frozenset[str]) -> str:
    if target in pinned:
        return f"{REASON_PINNED}: {target}"
    outputs = set(graph.forward_output_names)
    for op in ops:
        if "random" in op.op_tags:
            return f"{REASON_RANDOM_OP}: {op.name}"
        if "dont_recompute" in op.op_tags:
            return f"{REASON_DONT_RECOMPUTE}: {op.name}"
        if "collective" in op.op_tags and not is_regather_unit(ops):
            return f"{REASON_COLLECTIVE}: {op.name} ({op.symbol})"
        for out in op.outputs:
            origin = graph.origins.get(out)
            if out in outputs:
                return f"{REASON_FORWARD_OUTPUT}: {out}"
            if origin is None or not origin.taggable:
                return f"{REASON_NOT_TAGGABLE}: {out} ({origin.reason if origin else 'no origin'})"
    return ""


def is_regather_unit(ops: list[OpNode]) -> bool:
    """Whether a unit's ops are exactly one FSDP weight's all-gather and wait: tagging it re-gathers
    the unsharded weight in the backward instead of keeping it (its cost is communication)."""
    return bool(ops) and all("regather" in op.op_tags for op in ops)


def _make_unit(graph: JointGraph, target: str, ops: list[OpNode], op_time_s, pinned) -> RecomputeUnit:
    outputs = tuple(dict.fromkeys(o for op in ops for o in op.outputs))
    written, graph_inputs = set(outputs), set(graph.input_names)
    inputs = tuple(dict.fromkeys(i for op in ops for i in op.inputs if i not in written and i not in graph_inputs))
    reason = _disallow_reason(graph, target, ops, pinned)
    return RecomputeUnit(
        name=target,
        tag_targets=(target,),
        ops=tuple(op.name for op in ops),
        outputs=outputs,
        inputs=inputs,
        time_s=sum(float(op_time_s.get(op.name, 0.0)) for op in ops),
        allowed=not reason,
        reason=reason,
    )


@dataclass(frozen=True, eq=False)
class RecomputeProblem:
    """Units, needs and costs of one joint graph; build with `RecomputeProblem.from_graph`.

    Attributes:
        graph: the joint graph.
        units: recompute units by name, in forward order.
        op_time_s: op name -> seconds (needed for every op of an allowed unit).
        pinned: tag targets that must not be recomputed.
    """

    graph: JointGraph
    units: dict[str, RecomputeUnit]
    op_time_s: Mapping[str, float]
    pinned: frozenset[str] = frozenset()

    @classmethod
    def from_graph(
        cls, graph: JointGraph, op_time_s: Mapping[str, float], pinned: Iterable[str] = ()
    ) -> RecomputeProblem:
        """Builds the units of `graph`.

        Args:
            graph: the joint graph.
            op_time_s: seconds per final forward op name (backward ops are not needed).
            pinned: tag targets the user forbids recomputing.

        Raises:
            KeyError: an op of an allowed unit has no time.
        """
        pinned = frozenset(pinned)
        units = {}
        for target, ops in _ops_by_target(graph).items():
            unit = _make_unit(graph, target, ops, op_time_s, pinned)
            missing = [o for o in unit.ops if o not in op_time_s]
            if unit.allowed and missing:
                raise KeyError(f"op_time_s has no time for ops {missing} (tag target {target})")
            units[target] = unit
        return cls(graph=graph, units=units, op_time_s=dict(op_time_s), pinned=pinned)

    # ---- derived views -------------------------------------------------------------------

    @cached_property
    def units_of_op(self) -> dict[str, tuple[str, ...]]:
        """Forward op -> the allowed units that re-run it, smallest first."""
        found: dict[str, list[str]] = {}
        for unit in self.units.values():
            for op in unit.ops if unit.allowed else ():
                found.setdefault(op, []).append(unit.name)
        return {op: tuple(sorted(names, key=lambda u: len(self.units[u].ops))) for op, names in found.items()}

    @cached_property
    def rerunnable_ops(self) -> tuple[str, ...]:
        """Forward ops some allowed unit re-runs, in forward order."""
        return tuple(op.name for op in self.graph.forward_ops if op.name in self.units_of_op)

    @cached_property
    def forward_tensors(self) -> tuple[str, ...]:
        """Tensors written by forward ops, in order."""
        return tuple(dict.fromkeys(o for op in self.graph.forward_ops for o in op.outputs))

    @cached_property
    def unit_of_op(self) -> dict[str, str]:
        """Forward op -> the smallest allowed unit re-running it, else the smallest unit (for reasons)."""
        smallest: dict[str, str] = {}
        for unit in sorted(self.units.values(), key=lambda u: (u.allowed, -len(u.ops))):
            smallest.update(dict.fromkeys(unit.ops, unit.name))
        return smallest

    @cached_property
    def unit_of_tensor(self) -> dict[str, str]:
        """Forward tensor -> `unit_of_op` of the op writing it."""
        ops = (op for op in self.graph.forward_ops if op.name in self.unit_of_op)
        return {t: self.unit_of_op[op.name] for op in ops for t in op.outputs}

    @cached_property
    def ops_by_name(self) -> dict[str, OpNode]:
        return {op.name: op for op in self.graph.forward_ops}

    @cached_property
    def needed_by_backward(self) -> tuple[str, ...]:
        """Forward tensors the backward reads (graph inputs excluded), in saved order."""
        inputs = set(self.graph.input_names)
        return tuple(dict.fromkeys(n for n in self.graph.saved_names if n not in inputs))

    @cached_property
    def allowed_units(self) -> tuple[str, ...]:
        return tuple(name for name, unit in self.units.items() if unit.allowed)

    def storage_of(self, tensor: str) -> str | None:
        """The storage a saved `tensor` keeps alive, or None when it is an input's (free)."""
        storage = self.graph.tensors[tensor].storage
        return None if self.graph.tensors[storage].kind == "input" else storage

    def storage_bytes(self, storage: str) -> int:
        return self.graph.tensors[storage].storage_bytes

    # ---- evaluating a set of recomputed units --------------------------------------------

    def demand(self, units: Iterable[str]) -> tuple[list[str], list[str], list[str]]:
        """Needed tensors, saved tensors and rerun ops when `units` are tagged (demand-driven).

        Returns:
            ``(needed, saved, rerun_ops)``: needed tensors in first-needed order, the saved ones
            among them in that order, and the ops run in the backward, in forward order.
        """
        tagged = {op for u in units for op in self.units[u].ops}
        inputs, producers = set(self.graph.input_names), self.graph.producers
        needed, seen, saved, rerun = [], set(), [], set()
        stack = list(reversed(self.graph.saved_names))
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            needed.append(name)
            if name in inputs:
                continue
            op = producers[name]
            if op.name in tagged:
                rerun.add(op.name)
                stack.extend(reversed(op.inputs))
            else:
                saved.append(name)
        order = [op.name for op in self.graph.forward_ops if op.name in rerun]
        return needed, saved, order

    def saved_bytes(self, units: Iterable[str]) -> int:
        """Distinct non-input storage bytes saved when `units` are tagged."""
        _, saved, _ = self.demand(units)
        return self._storage_bytes_of(saved)

    def extra_time_s(self, units: Iterable[str]) -> float:
        """Seconds of the ops rerun in the backward when `units` are tagged."""
        _, _, rerun = self.demand(units)
        return sum(float(self.op_time_s[op]) for op in rerun)

    def effective_units(self, units: Iterable[str]) -> tuple[str, ...]:
        """A subset of `units` with the same rerun ops (each kept unit adds one), in forward order."""
        _, _, rerun = self.demand(units)
        return self._kept_units(units, rerun)

    def assess(self, units: Iterable[str]) -> tuple[tuple[str, ...], int, float]:
        """``(effective_units, saved_bytes, extra_time_s)`` of `units`, from one demand walk."""
        units = tuple(units)
        _, saved, rerun = self.demand(units)
        time_s = sum(float(self.op_time_s[op]) for op in rerun)
        return self._kept_units(units, rerun), self._storage_bytes_of(saved), time_s

    def _storage_bytes_of(self, tensors: Iterable[str]) -> int:
        storages = {self.storage_of(t) for t in tensors} - {None}
        return sum(self.storage_bytes(s) for s in storages)

    def _kept_units(self, units: Iterable[str], rerun: list[str]) -> tuple[str, ...]:
        rerun_set, covered, kept = set(rerun), set(), set()
        # Ties broken by name: the same plan in every process (set order follows string hashes).
        for u in sorted(set(units), key=lambda u: (-len(rerun_set.intersection(self.units[u].ops)), u)):
            new = rerun_set.intersection(self.units[u].ops) - covered
            if new:
                kept.add(u)
                covered |= new
        return tuple(u for u in self.units if u in kept)

    def check_allowed(self, units: Iterable[str]) -> None:
        bad = [f"{u} ({self.units[u].reason})" for u in units if not self.units[u].allowed]
        if bad:
            raise ValueError(f"units may not be recomputed: {bad}")

    # ---- plans --------------------------------------------------------------------------

    def _first_runs(self, rerun: list[str]) -> dict[str, tuple[str, ...]]:
        """Tensor the backward reads -> rerun ops run right before its first reader, in order."""
        rerun_set, producers = set(rerun), self.graph.producers
        done: set[str] = set()
        runs: dict[str, tuple[str, ...]] = {}
        for op in self.graph.backward_ops:
            for name in op.inputs:
                producer = producers.get(name)
                if producer is None or producer.name not in rerun_set or producer.name in done:
                    continue
                emitted, stack = [], [(producer, False)]
                while stack:  # depth-first, inputs before the op, as the backward runs them
                    node, expanded = stack.pop()
                    if expanded:
                        emitted.append(node.name)
                        continue
                    if node.name in done:
                        continue
                    done.add(node.name)
                    stack.append((node, True))
                    for i in reversed(node.inputs):
                        p = producers.get(i)
                        if p is not None and p.name in rerun_set and p.name not in done:
                            stack.append((p, False))
                runs[name] = tuple(emitted)
        return runs

    def _decisions(self, needed: list[str], saved: list[str], rerun: list[str]) -> tuple[TensorDecision, ...]:
        saved_set, inputs = set(saved), set(self.graph.input_names)
        runs = self._first_runs(rerun)
        decisions = []
        for name in needed:
            tensor = self.graph.tensors[name]
            action = INPUT if name in inputs else SAVE if name in saved_set else RECOMPUTE
            origin = self.graph.origins.get(name)
            ops = runs.get(name, (self.graph.producers[name].name,)) if action == RECOMPUTE else ()
            decisions.append(
                TensorDecision(
                    name=name,
                    action=action,
                    storage=tensor.storage,
                    storage_bytes=0 if self.storage_of(name) is None else tensor.storage_bytes,
                    tag_target=origin.tag_target if origin is not None else None,
                    recompute_ops=ops,
                )
            )
        return tuple(decisions)

    def plan_for(
        self,
        units: Iterable[str],
        *,
        solver: str,
        status: str,
        solve_time_s: float,
        gap: float | None = None,
        activation_budget_bytes: int | None = None,
        peak_budget_bytes: int | None = None,
        notes: Iterable[str] = (),
    ) -> RematPlan:
        """The `RematPlan` for tagging `units` (units that rerun nothing are dropped)."""
        units = self.effective_units(units)
        self.check_allowed(units)
        needed, saved, rerun = self.demand(units)
        targets = sorted({t for u in units for t in self.units[u].tag_targets})
        return RematPlan(
            solver=solver,
            status=status,
            recomputed_tag_targets=tuple(targets),
            recompute_ops=tuple(rerun),
            decisions=self._decisions(needed, saved, rerun),
            saved_names=tuple(saved),
            saved_bytes=self.saved_bytes(units),
            peak_bytes=simulate_step(self.graph, targets).peak_bytes,
            extra_time_s=sum(float(self.op_time_s[op]) for op in rerun),
            solve_time_s=solve_time_s,
            gap=gap,
            activation_budget_bytes=activation_budget_bytes,
            peak_budget_bytes=peak_budget_bytes,
            notes=tuple(notes),
        )
