"""Remat plans, the independent plan checker and the peak-memory simulation of one training step.

A `RematPlan` says, for every forward tensor the backward needs, whether it is saved or recomputed
(and which forward ops recompute it, in order), and which pre-autodiff proxies (`tag targets`) the
transform must tag with ``RECOMPUTE_IN_BACKWARD``. Solvers produce plans; nothing here imports
them. `check_plan` and `simulate_step` re-derive everything from the `JointGraph` and the plan's
tag targets alone, with Thunder's semantics:

* Tagging a tag target X makes every final forward op with X in its `OpNode.tag_units` (for
  graphs without them: with an output whose tag target is X) recomputable; such an op recomputes
  all its outputs.
* Recompute is demand-driven, as Thunder's backward clones only the tagged producers of tensors
  it reads: a needed tensor whose producer is recomputed makes that op's inputs needed in turn;
  any other needed forward tensor is saved. Inputs and parameters are always alive.
* Memory is counted by storage (`TensorNode.storage`): a saved view keeps its base alive.

The step simulated by `simulate_step`: the forward ops in order (outputs allocated, then tensors
freed after their last forward use unless saved; forward outputs live to the end of the forward
and are released with the loss), then the backward with cotangents allocated at its start and the
recomputed ops inserted right before the first backward op that needs them (for an FSDP re-gather,
where `remat_opt.distributed.regather_order` puts it). A storage is freed when the last tensor aliasing it dies;
an async all-gather's or reduce-scatter's future also holds its input's storage until it dies at its
wait, and the backend's staging buffer (gloo's) is the collective's workspace. Backward outputs that
nothing reads (the gradients) live to the end. Inputs and parameters are the constant baseline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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


def _tag_target_ops(graph: JointGraph) -> dict[str, list[OpNode]]:
    """Tag target -> the forward ops its tag re-runs."""
    by_target: dict[str, list[OpNode]] = {}
    for op in graph.forward_ops:
        targets = op.tag_units or tuple(
            dict.fromkeys(o.tag_target for o in map(graph.origins.get, op.outputs) if o and o.tag_target)
        )
        for target in targets:
            by_target.setdefault(target, []).append(op)
    return by_target


def recomputed_ops(graph: JointGraph, tag_targets: Iterable[str]) -> frozenset[str]:
    """Names of the forward ops that tagging `tag_targets` makes Thunder recompute (when needed)."""
    by_target = _tag_target_ops(graph)
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


# --------------------------------------------------------------------------------------------
# Peak simulation
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeakTimeline:
    """Live bytes of one step after each op's outputs are allocated (its workspace included).

    Attributes:
        baseline_bytes: inputs and parameters (always alive).
        labels: per event, the op name (recomputed ops as ``"recompute:fwdN"``) or
            ``"backward start"`` (saved tensors and cotangents only).
        live_bytes: per event, total live bytes (baseline included).
        peak_bytes: the maximum of `live_bytes` (the baseline when there are no events).
        peak_index: index of the first event reaching it.
        kind_bytes: per event, `live_bytes` split by `MEMORY_KINDS` (same order; sums to it).
    """

    baseline_bytes: int
    labels: tuple[str, ...]
    live_bytes: tuple[int, ...]
    peak_bytes: int
    peak_index: int
    kind_bytes: tuple[tuple[int, ...], ...] = ()

    @property
    def peak_label(self) -> str:
        return self.labels[self.peak_index] if self.labels else ""


# What live bytes are, for timelines: parameters and inputs (alive throughout), tensors saved for
# backward, other forward tensors, tensors the backward makes (gradients included), recomputed ones,
# and op workspaces.
MEMORY_KINDS = ("parameters and inputs", "saved for backward", "forward transient", "backward", "recomputed",
                "workspace")


def round_up_bytes(n_bytes: int, granularity_bytes: int) -> int:
    """`n_bytes` rounded up to a multiple of `granularity_bytes` (an allocator's block size)."""
    return -(-n_bytes // granularity_bytes) * granularity_bytes


class _Live:
    """Reference-counted live storages: a storage key costs its bytes while any tensor holds it."""

    def __init__(self, baseline_bytes: int, granularity_bytes: int = 1):
        self.granularity_bytes = granularity_bytes
        self.held: dict[str, list[str]] = {}  # holder tensor -> the references it holds (see `hold`)
        self.key_of: dict[str, str] = {}
        self.refs: dict[str, int] = {}
        self.bytes_of: dict[str, int] = {}
        self.kind_of: dict[str, str] = {}
        self.by_kind = dict.fromkeys(MEMORY_KINDS, 0)
        self.by_kind[MEMORY_KINDS[0]] = baseline_bytes
        self.total = baseline_bytes

    def add(self, tensor: str, key: str, nbytes: int, kind: str) -> None:
        if tensor in self.key_of:
            self.remove(tensor)
        self.key_of[tensor] = key
        nbytes = round_up_bytes(nbytes, self.granularity_bytes)
        if self.refs.get(key, 0) == 0:
            self.total += nbytes
            self.bytes_of[key] = nbytes
            self.kind_of[key] = kind
            self.by_kind[kind] += nbytes
        self.refs[key] = self.refs.get(key, 0) + 1

    def hold(self, holder: str, tensors) -> None:
        """`holder` keeps the live storages of `tensors` alive until it is removed itself (an async
        collective's future holds its inputs until the wait)."""
        for tensor in tensors:
            key = self.key_of.get(tensor)
            if key is not None:
                reference = f"{holder}^{tensor}"
                self.add(reference, key, self.bytes_of[key], self.kind_of[key])
                self.held.setdefault(holder, []).append(reference)

    def remove(self, tensor: str) -> None:
        for reference in self.held.pop(tensor, ()):
            self.remove(reference)
        key = self.key_of.pop(tensor, None)
        if key is None:
            return
        self.refs[key] -= 1
        if self.refs[key] == 0:
            nbytes = self.bytes_of.pop(key)
            self.total -= nbytes
            self.by_kind[self.kind_of.pop(key)] -= nbytes

    def event(self, label: str, workspace_bytes: int = 0) -> tuple[str, int, tuple[int, ...]]:
        """``(label, live bytes, live bytes by kind)`` now, with an op's workspace."""
        kinds = tuple(self.by_kind[k] + (workspace_bytes if k == "workspace" else 0) for k in MEMORY_KINDS)
        return label, self.total + workspace_bytes, kinds


def _hold_inputs(op: OpNode, live: _Live) -> None:
    """An async collective's outputs (futures) keep its inputs alive until the wait."""
    if "holds_inputs" in op.op_tags:
        for out in op.outputs:
            live.hold(out, op.inputs)


def _forward_last_use(graph: JointGraph) -> dict[str, int]:
    last: dict[str, int] = {}
    for i, op in enumerate(graph.forward_ops):
        for name in (*op.outputs, *op.inputs):
            last[name] = i
    return last


def _simulate_forward(graph: JointGraph, saved: set[str], live: _Live, events: list) -> None:
    """Forward liveness: free after the last forward use unless saved; outputs to the end."""
    tensors, keep = graph.tensors, saved | set(graph.forward_output_names)
    saved_storages = {tensors[name].storage for name in saved}
    last = _forward_last_use(graph)
    for i, op in enumerate(graph.forward_ops):
        for out in op.outputs:
            storage = tensors[out].storage
            if tensors[storage].kind != "input":
                kind = "saved for backward" if storage in saved_storages else "forward transient"
                live.add(out, storage, tensors[storage].storage_bytes, kind)
        _hold_inputs(op, live)
        events.append(live.event(op.name, op.workspace_bytes))
        for name in dict.fromkeys((*op.inputs, *op.outputs)):
            if last[name] == i and name not in keep:
                live.remove(name)
    for name in graph.forward_output_names:
        if name not in saved:
            live.remove(name)


def _backward_schedule(graph: JointGraph, demanded: Iterable[str]) -> list[tuple[OpNode, bool]]:
    """Backward ops with demanded recomputed ops inserted right before their first consumer
    (depth-first: a recomputed op's recomputed inputs run before it)."""
    by_name = {op.name: op for op in graph.forward_ops}
    rec_producer = {out: by_name[n] for n in demanded for out in by_name[n].outputs}
    done: set[str] = set()
    schedule: list[tuple[OpNode, bool]] = []
    for op in graph.backward_ops:
        for name in op.inputs:
            stack = [(rec_producer[name], False)] if name in rec_producer else []
            while stack:
                node, expanded = stack.pop()
                if expanded:
                    schedule.append((node, True))
                elif node.name not in done:
                    done.add(node.name)
                    stack.append((node, True))
                    stack.extend((rec_producer[i], False) for i in reversed(node.inputs) if i in rec_producer)
        schedule.append((op, False))
    return schedule


def _backward_key(graph: JointGraph, tensor: str, op: OpNode, recompute: bool, keys: dict[str, str]) -> str:
    """Storage key of a tensor written in the backward: fresh, or its aliased input's key."""
    storage = graph.tensors[tensor].storage
    if storage != tensor:
        for name in op.inputs:
            if graph.tensors[name].storage == storage and name in keys:
                return keys[name]
    return f"{tensor}@recompute" if recompute else tensor


def _simulate_backward(graph: JointGraph, derivation: Derivation, live: _Live, events: list) -> None:
    tensors = graph.tensors
    schedule = _backward_schedule(graph, derivation.demanded_ops)
    last: dict[str, int] = {}
    for k, (op, _) in enumerate(schedule):
        for name in op.inputs:
            last[name] = k
    keys = {name: tensors[name].storage for name in derivation.saved}
    for name in {n for op in graph.backward_ops for n in op.inputs if tensors[n].kind == "cotangent"}:
        keys[name] = tensors[name].storage
        live.add(name, keys[name], tensors[keys[name]].storage_bytes, "backward")
    events.append(live.event("backward start"))
    for name in derivation.saved:
        if name not in last:
            live.remove(name)
    for k, (op, recompute) in enumerate(schedule):
        for out in op.outputs:
            if tensors[tensors[out].storage].kind == "input":
                continue
            keys[out] = _backward_key(graph, out, op, recompute, keys)
            live.add(out, keys[out], tensors[tensors[out].storage].storage_bytes, "recomputed" if recompute else "backward")
        _hold_inputs(op, live)
        events.append(live.event(f"recompute:{op.name}" if recompute else op.name, op.workspace_bytes))
        for name in dict.fromkeys((*op.inputs, *op.outputs)):
            if last.get(name, k) == k and (name in last or recompute):
                live.remove(name)


def _tag_targets_of(plan_or_tag_targets: RematPlan | Iterable[str]) -> tuple[str, ...]:
    if isinstance(plan_or_tag_targets, RematPlan):
        return plan_or_tag_targets.recomputed_tag_targets
    return tuple(plan_or_tag_targets)


def simulate_step(graph: JointGraph, plan_or_tag_targets: RematPlan | Iterable[str] = (), *,
                  allocation_granularity_bytes: int = 1) -> PeakTimeline:
    """Simulates the live memory of one training step under a plan (see the module docstring).

    Args:
        graph: the joint graph.
        plan_or_tag_targets: a `RematPlan`, or the tag targets to recompute (empty: save all).
        allocation_granularity_bytes: every storage counts as its bytes rounded up to a multiple of
            this (CUDA's caching allocator: 512; 1: exact bytes).

    Returns:
        The `PeakTimeline`.
    """
    derivation = derive(graph, _tag_targets_of(plan_or_tag_targets))
    if derivation.unavailable:
        raise ValueError(f"needed tensors are neither saved, recomputed nor inputs: {derivation.unavailable}")
    granularity = allocation_granularity_bytes
    baseline = sum(round_up_bytes(t.storage_bytes, granularity) for t in graph.tensors.values()
                   if t.kind == "input" and t.storage == t.name)
    live, events = _Live(baseline, granularity), []
    _simulate_forward(graph, set(derivation.saved), live, events)
    _simulate_backward(graph, derivation, live, events)
    values = [v for _, v, _ in events]
    peak = max(values, default=baseline)
    return PeakTimeline(
        baseline_bytes=baseline,
        labels=tuple(label for label, _, _ in events),
        live_bytes=tuple(values),
        peak_bytes=peak,
        peak_index=values.index(peak) if values else 0,
        kind_bytes=tuple(kinds for _, _, kinds in events),
    )


def simulate_peak_bytes(graph: JointGraph, plan_or_tag_targets: RematPlan | Iterable[str] = ()) -> int:
    """Predicted peak bytes of one step under a plan or a set of recomputed tag targets."""
    return simulate_step(graph, plan_or_tag_targets).peak_bytes


# --------------------------------------------------------------------------------------------
# Checker
# --------------------------------------------------------------------------------------------


def _check_allowed(graph: JointGraph, op_names: Iterable[str], pinned, targets) -> list[str]:
    """No random, pinned, non-taggable or forward-output-writing op may be recomputed."""
    errors = [f"pinned tag target {t} is tagged" for t in sorted(set(targets) & pinned)]
    by_name = {op.name: op for op in graph.forward_ops}
    outputs = set(graph.forward_output_names)
    for name in sorted(op_names, key=lambda n: by_name[n].index):
        op = by_name[name]
        if op.op_tags & {"random", "dont_recompute"}:
            errors.append(f"op {name} ({op.symbol}) is {sorted(op.op_tags & {'random', 'dont_recompute'})}")
        if "collective" in op.op_tags and "regather" not in op.op_tags:
            errors.append(f"op {name} ({op.symbol}) is a collective other than an FSDP weight's all-gather")
        for out in op.outputs:
            origin = graph.origins.get(out)
            if out in outputs:
                errors.append(f"op {name} writes forward output {out}: it cannot be recomputed")
            elif origin is None or not origin.taggable:
                errors.append(f"op {name} output {out} is not taggable ({origin.reason if origin else 'no origin'})")
    return errors


def _check_recompute_order(graph: JointGraph, plan: RematPlan, saved: set[str]) -> list[str]:
    """Each recomputed op's inputs are saved, inputs, or recomputed earlier in `recompute_ops`."""
    by_name = {op.name: op for op in graph.forward_ops}
    available = set(graph.input_names) | saved
    errors = []
    for name in plan.recompute_ops:
        op = by_name.get(name)
        if op is None:
            errors.append(f"recompute op {name} is not a forward op")
            continue
        missing = [i for i in op.inputs if i not in available]
        if missing:
            errors.append(f"recompute op {name} reads {missing}: neither saved nor recomputed before it")
        available.update(op.outputs)
    return errors


def _check_decisions(graph: JointGraph, plan: RematPlan, derivation: Derivation) -> list[str]:
    errors = []
    by_name = {d.name: d for d in plan.decisions}
    saved, inputs = set(derivation.saved), set(graph.input_names)
    for name in derivation.needed:
        want = INPUT if name in inputs else SAVE if name in saved else RECOMPUTE
        got = by_name.get(name)
        if got is None:
            errors.append(f"needed tensor {name} has no decision (expected {want})")
        elif got.action != want:
            errors.append(f"tensor {name}: plan says {got.action}, the graph implies {want}")
    extra = set(by_name) - set(derivation.needed)
    if extra:
        errors.append(f"decisions for tensors nothing needs: {sorted(extra)[:10]}")
    return errors


def _check_totals(graph, plan, derivation, op_time_s) -> list[str]:
    errors = []
    if set(plan.saved_names) != set(derivation.saved):
        diff = set(plan.saved_names) ^ set(derivation.saved)
        errors.append(f"saved_names differ from the graph's implied saved set on {sorted(diff)[:10]}")
    saved_bytes = storage_bytes_of(graph, derivation.saved)
    if plan.saved_bytes != saved_bytes:
        errors.append(f"saved_bytes={plan.saved_bytes} but the saved storages hold {saved_bytes} bytes")
    if tuple(plan.recompute_ops) != derivation.demanded_ops:
        errors.append(f"recompute_ops {plan.recompute_ops[:8]}... differ from {derivation.demanded_ops[:8]}...")
    if op_time_s is not None:
        extra = sum(op_time_s[n] for n in derivation.demanded_ops)
        if abs(extra - plan.extra_time_s) > 1e-9 * max(1.0, extra) + 1e-12:
            errors.append(f"extra_time_s={plan.extra_time_s} but the recomputed ops take {extra}")
    return errors


def check_plan(
    graph: JointGraph,
    plan: RematPlan,
    *,
    activation_budget_bytes: int | None = None,
    peak_budget_bytes: int | None = None,
    pinned: Iterable[str] = (),
    op_time_s: Mapping[str, float] | None = None,
) -> list[str]:
    """Checks a plan against the graph alone; an empty list means feasible and consistent.

    Args:
        graph: the joint graph the plan is for.
        plan: the plan.
        activation_budget_bytes: bound on saved bytes (default: the plan's `activation_budget_bytes`).
        peak_budget_bytes: bound on the simulated peak (default: the plan's `peak_budget_bytes`).
        pinned: tag targets the user forbids recomputing.
        op_time_s: op times; when given, `extra_time_s` is checked too.

    Returns:
        One message per violation.
    """
    activation_budget_bytes = plan.activation_budget_bytes if activation_budget_bytes is None else activation_budget_bytes
    peak_budget_bytes = plan.peak_budget_bytes if peak_budget_bytes is None else peak_budget_bytes
    known = set(_tag_target_ops(graph))
    errors = [f"tag target {t} names no forward op's output" for t in plan.recomputed_tag_targets if t not in known]
    derivation = derive(graph, plan.recomputed_tag_targets)
    errors += [f"needed tensor {n} is neither saved, recomputed nor an input" for n in derivation.unavailable]
    errors += _check_allowed(graph, derivation.recomputed_ops, frozenset(pinned), plan.recomputed_tag_targets)
    errors += _check_recompute_order(graph, plan, set(plan.saved_names))
    errors += _check_decisions(graph, plan, derivation)
    errors += _check_totals(graph, plan, derivation, op_time_s)
    if activation_budget_bytes is not None and plan.saved_bytes > activation_budget_bytes:
        errors.append(f"saved_bytes={plan.saved_bytes} > activation_budget_bytes={activation_budget_bytes}")
    if not derivation.unavailable:
        peak = simulate_peak_bytes(graph, plan.recomputed_tag_targets)
        if peak != plan.peak_bytes:
            errors.append(f"peak_bytes={plan.peak_bytes} but the simulated peak is {peak}")
        if peak_budget_bytes is not None and peak > peak_budget_bytes:
            errors.append(f"simulated peak {peak} > peak_budget_bytes={peak_budget_bytes}")
    return errors
