"""The peak-memory simulation of one training step under a plan (`simulate_step`).

The step simulated: the forward ops in order (outputs allocated, then tensors freed after their
last forward use unless saved; forward outputs live to the end of the forward and are released
with the loss), then the backward with cotangents allocated at its start and the recomputed ops
inserted right before the first backward op that needs them (for an FSDP re-gather, where
`remat_opt.distributed.regather_order` puts it). A storage is freed when the last tensor aliasing it
dies; an async all-gather's or reduce-scatter's future also holds its input's storage until it dies
at its wait, and the backend's staging buffer (gloo's) is the collective's workspace. Backward
outputs that nothing reads (the gradients) live to the end. Inputs and parameters are the constant
baseline. What is recomputed and saved comes from `remat_opt.core.plan.derive`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from remat_opt.core.graph import JointGraph, OpNode
from remat_opt.core.plan import Derivation, derive, RematPlan


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

    def __init__(self, baseline_bytes: int, granularity_bytes: int = 1, by_kind: bool = True):
        self.granularity_bytes, self.by_kind_on = granularity_bytes, by_kind
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
        refs = self.refs.get(key, 0)
        if refs == 0:
            if self.granularity_bytes != 1:
                nbytes = round_up_bytes(nbytes, self.granularity_bytes)
            self.total += nbytes
            self.bytes_of[key] = nbytes
            self.kind_of[key] = kind
            self.by_kind[kind] += nbytes
        self.refs[key] = refs + 1

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
        if self.held:
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
        """``(label, live bytes, live bytes by kind)`` now, with an op's workspace (no kinds when
        `by_kind` is off)."""
        if not self.by_kind_on:
            return label, self.total + workspace_bytes, ()
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
    demanded = set(demanded)
    rec_producer = {}
    for op in graph.forward_ops:
        if op.name in demanded:
            rec_producer.update(dict.fromkeys(op.outputs, op))
    done: set[str] = set()
    schedule: list[tuple[OpNode, bool]] = []
    if not rec_producer:
        return [(op, False) for op in graph.backward_ops]
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
                  allocation_granularity_bytes: int = 1, by_kind: bool = True) -> PeakTimeline:
    """Simulates the live memory of one training step under a plan (see the module docstring).

    Args:
        graph: the joint graph.
        plan_or_tag_targets: a `RematPlan`, or the tag targets to recompute (empty: save all).
        allocation_granularity_bytes: every storage counts as its bytes rounded up to a multiple of
            this (CUDA's caching allocator: 512; 1: exact bytes).
        by_kind: split each event's live bytes by `MEMORY_KINDS` (`PeakTimeline.kind_bytes`; off:
            empty, and faster).

    Returns:
        The `PeakTimeline`.
    """
    derivation = derive(graph, _tag_targets_of(plan_or_tag_targets))
    if derivation.unavailable:
        raise ValueError(f"needed tensors are neither saved, recomputed nor inputs: {derivation.unavailable}")
    granularity = allocation_granularity_bytes
    baseline = sum(round_up_bytes(t.storage_bytes, granularity) for t in graph.tensors.values()
                   if t.kind == "input" and t.storage == t.name)
    live, events = _Live(baseline, granularity, by_kind), []
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
        kind_bytes=tuple(kinds for _, _, kinds in events) if by_kind else (),
    )


def simulate_peak_bytes(graph: JointGraph, plan_or_tag_targets: RematPlan | Iterable[str] = ()) -> int:
    """Predicted peak bytes of one step under a plan or a set of recomputed tag targets."""
    return simulate_step(graph, plan_or_tag_targets).peak_bytes
