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

import weakref
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

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

    def op_events(self) -> tuple[np.ndarray, np.ndarray]:
        """``(op_event, is_rerun)`` per event: the index among the step's op events (forward ops,
        ``"backward start"``, backward ops: the same in every plan) of the one it belongs to,
        itself or, for a recomputation, the backward op it runs just before (the last op event for
        reruns at the end)."""
        is_rerun = np.fromiter((label.startswith("recompute:") for label in self.labels), dtype=bool,
                               count=len(self.labels))
        op_positions = np.flatnonzero(~is_rerun)
        op_event = np.searchsorted(op_positions, np.arange(len(self.labels)))
        return np.minimum(op_event, len(op_positions) - 1), is_rerun


# What live bytes are, for timelines: parameters and inputs (alive throughout), tensors saved for
# backward, other forward tensors, tensors the backward makes (gradients included), recomputed ones,
# and op workspaces.
MEMORY_KINDS = ("parameters and inputs", "saved for backward", "forward transient", "backward", "recomputed",
                "workspace")


def round_up_bytes(n_bytes: int, granularity_bytes: int) -> int:
    """`n_bytes` rounded up to a multiple of `granularity_bytes` (an allocator's block size)."""
    return -(-n_bytes // granularity_bytes) * granularity_bytes


_SAVED, _TRANSIENT, _BACKWARD, _RECOMPUTED, _WORKSPACE = 1, 2, 3, 4, 5  # indices into MEMORY_KINDS


@dataclass(frozen=True, slots=True)
class _Op:
    """One op with tensors as integer ids (`_Index.ids`), as the simulation walks it.

    Attributes:
        label: the event's label (``"recompute:fwdN"`` for a forward op rerun in the backward).
        inputs: input ids, repeats kept.
        outputs: output ids.
        touched: inputs, then outputs, each once: what may die after the op.
        forward_outputs: ``(output, storage, storage bytes)`` of outputs not aliasing an input or
            parameter (a forward op run in the forward: its storage is the key).
        backward_outputs: ``(output, storage bytes, inputs aliasing its storage)`` likewise, for a
            run in the backward (a fresh output is its own key; a view takes its aliased input's).
        forward_dying: (forward ops) the touched tensors whose last forward use this is.
        holds_inputs: an async collective (see `OpNode.op_tags`).
        workspace_bytes: see `OpNode.workspace_bytes`.
    """

    label: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    touched: tuple[int, ...]
    forward_outputs: tuple[tuple[int, int, int], ...]
    backward_outputs: tuple[tuple[int, int, tuple[int, ...]], ...]
    forward_dying: tuple[int, ...]
    holds_inputs: bool
    workspace_bytes: int


class _Index:
    """What the simulation needs of a graph, whatever the plan, with tensors as integer ids (built
    once per graph; `_index_of`). A tensor's id is its position in `graph.tensors`; a storage's key
    is its owner's id, a storage the backward recomputes is keyed ``id + n_tensors``."""

    def __init__(self, graph: JointGraph):
        tensors = graph.tensors
        self.ids = {name: i for i, name in enumerate(tensors)}
        self.n_tensors = len(self.ids)
        ids = self.ids
        last: dict[str, int] = {}
        for i, op in enumerate(graph.forward_ops):
            for name in (*op.outputs, *op.inputs):
                last[name] = i
        self.forward = [self._op(graph, op, op.name, [ids[n] for n in dict.fromkeys((*op.inputs, *op.outputs))
                                                      if last[n] == i])
                        for i, op in enumerate(graph.forward_ops)]
        self.rerun = {op.name: replace(self.forward[i], label=f"recompute:{op.name}")
                      for i, op in enumerate(graph.forward_ops)}
        self.backward = [self._op(graph, op, op.name, []) for op in graph.backward_ops]
        self.forward_outputs = [ids[n] for n in graph.forward_output_names]
        self.cotangents = sorted({ids[n] for op in graph.backward_ops for n in op.inputs
                                  if tensors[n].kind == "cotangent"})
        self.storage = [ids[t.storage] for t in tensors.values()]
        self.storage_bytes = [tensors[t.storage].storage_bytes for t in tensors.values()]

    def _op(self, graph: JointGraph, op: OpNode, label: str, dying: list[int]) -> _Op:
        tensors, ids = graph.tensors, self.ids
        fresh = [out for out in op.outputs if tensors[tensors[out].storage].kind != "input"]
        forward_outputs = tuple((ids[out], ids[tensors[out].storage], tensors[tensors[out].storage].storage_bytes)
                                for out in fresh)
        backward_outputs = tuple(
            (ids[out], tensors[tensors[out].storage].storage_bytes,
             tuple(ids[n] for n in op.inputs if tensors[n].storage == tensors[out].storage)
             if tensors[out].storage != out else ())
            for out in fresh)
        return _Op(label, tuple(ids[n] for n in op.inputs), tuple(ids[n] for n in op.outputs),
                   tuple(ids[n] for n in dict.fromkeys((*op.inputs, *op.outputs))), forward_outputs,
                   backward_outputs, tuple(dying), "holds_inputs" in op.op_tags, op.workspace_bytes)


_INDICES: dict[int, _Index] = {}  # id(graph) -> its _Index, dropped when the graph dies


def _index_of(graph: JointGraph) -> _Index:
    index = _INDICES.get(id(graph))
    if index is None:
        index = _INDICES[id(graph)] = _Index(graph)
        weakref.finalize(graph, _INDICES.pop, id(graph), None)
    return index


class _Live:
    """Reference-counted live storages: a storage key costs its bytes while any tensor holds it,
    and the events recorded so far."""

    def __init__(self, baseline_bytes: int, granularity_bytes: int = 1, by_kind: bool = True):
        self.granularity_bytes = granularity_bytes
        self.key_of: dict[int, int] = {}  # tensor -> the storage key it holds
        self.held: dict[int, dict[int, int]] = {}  # holder tensor -> {tensor: key} it keeps alive (see `hold`)
        self.refs: dict[int, int] = {}
        self.bytes_of: dict[int, int] = {}
        self.kind_of: dict[int, int] = {}
        self.by_kind = [baseline_bytes] + [0] * (len(MEMORY_KINDS) - 1) if by_kind else None
        self.total = baseline_bytes
        self.labels: list[str] = []
        self.live_bytes: list[int] = []
        self.kind_bytes: list[tuple[int, ...]] = []

    def add(self, tensor: int, key: int, nbytes: int, kind: int) -> None:
        if tensor in self.key_of:
            self.remove(tensor)
        self.key_of[tensor] = key
        self._reference(key, nbytes, kind)

    def _reference(self, key: int, nbytes: int, kind: int) -> None:
        refs = self.refs.get(key, 0)
        if refs == 0:
            if self.granularity_bytes != 1:
                nbytes = round_up_bytes(nbytes, self.granularity_bytes)
            self.total += nbytes
            self.bytes_of[key], self.kind_of[key] = nbytes, kind
            if self.by_kind is not None:
                self.by_kind[kind] += nbytes
        self.refs[key] = refs + 1

    def _release(self, key: int) -> None:
        refs = self.refs[key] - 1
        self.refs[key] = refs
        if refs == 0:
            nbytes = self.bytes_of.pop(key)
            self.total -= nbytes
            kind = self.kind_of.pop(key)
            if self.by_kind is not None:
                self.by_kind[kind] -= nbytes

    def hold(self, holder: int, tensors: tuple[int, ...]) -> None:
        """`holder` keeps the live storages of `tensors` alive until it is removed itself (an async
        collective's future holds its inputs until the wait)."""
        held = self.held.setdefault(holder, {})
        for tensor in tensors:
            key = self.key_of.get(tensor)
            if key is not None:
                if tensor in held:
                    self._release(held[tensor])
                held[tensor] = key
                self.refs[key] += 1

    def remove(self, tensor: int) -> None:
        held = self.held.pop(tensor, None) if self.held else None
        if held:
            for key in held.values():
                self._release(key)
        key = self.key_of.pop(tensor, None)
        if key is not None:
            self._release(key)

    def event(self, label: str, workspace_bytes: int = 0) -> None:
        """Records the live bytes now, with an op's workspace."""
        self.labels.append(label)
        self.live_bytes.append(self.total + workspace_bytes)
        if self.by_kind is not None:
            kinds = self.by_kind.copy()
            kinds[_WORKSPACE] += workspace_bytes
            self.kind_bytes.append(tuple(kinds))

    def run(self, op: _Op) -> None:
        """The event of `op` after its outputs: its futures hold its inputs first."""
        if op.holds_inputs:
            for out in op.outputs:
                self.hold(out, op.inputs)
        self.event(op.label, op.workspace_bytes)


def _simulate_forward(index: _Index, saved: set[int], live: _Live) -> None:
    """Forward liveness: free after the last forward use unless saved; outputs to the end."""
    keep = saved | set(index.forward_outputs)
    saved_storages = {index.storage[t] for t in saved}
    for op in index.forward:
        for out, key, nbytes in op.forward_outputs:
            live.add(out, key, nbytes, _SAVED if key in saved_storages else _TRANSIENT)
        live.run(op)
        for tensor in op.forward_dying:
            if tensor not in keep:
                live.remove(tensor)
    for tensor in index.forward_outputs:
        if tensor not in saved:
            live.remove(tensor)


def _backward_schedule(index: _Index, graph: JointGraph, demanded: Iterable[str]) -> list[tuple[_Op, bool]]:
    """Backward ops with demanded recomputed ops inserted right before their first consumer
    (depth-first: a recomputed op's recomputed inputs run before it)."""
    demanded = set(demanded)
    rec_producer = {}
    for op in graph.forward_ops:
        if op.name in demanded:
            rerun = index.rerun[op.name]
            rec_producer.update(dict.fromkeys(rerun.outputs, rerun))
    if not rec_producer:
        return [(op, False) for op in index.backward]
    done: set[str] = set()
    schedule: list[tuple[_Op, bool]] = []
    for op in index.backward:
        for name in op.inputs:
            stack = [(rec_producer[name], False)] if name in rec_producer else []
            while stack:
                node, expanded = stack.pop()
                if expanded:
                    schedule.append((node, True))
                elif node.label not in done:
                    done.add(node.label)
                    stack.append((node, True))
                    stack.extend((rec_producer[i], False) for i in reversed(node.inputs) if i in rec_producer)
        schedule.append((op, False))
    return schedule


def _simulate_backward(index: _Index, graph: JointGraph, derivation: Derivation, live: _Live) -> None:
    schedule = _backward_schedule(index, graph, derivation.demanded_ops)
    n_tensors, storage, storage_bytes = index.n_tensors, index.storage, index.storage_bytes
    last: dict[int, int] = {}
    for k, (op, _) in enumerate(schedule):
        for tensor in op.inputs:
            last[tensor] = k
    saved = [index.ids[name] for name in derivation.saved]
    keys = {tensor: storage[tensor] for tensor in saved}
    for tensor in index.cotangents:
        keys[tensor] = storage[tensor]
        live.add(tensor, keys[tensor], storage_bytes[keys[tensor]], _BACKWARD)
    live.event("backward start")
    for tensor in saved:
        if tensor not in last:
            live.remove(tensor)
    for k, (op, recompute) in enumerate(schedule):
        for out, nbytes, aliased in op.backward_outputs:
            key = out + n_tensors if recompute else out
            for name in aliased:
                if name in keys:
                    key = keys[name]
                    break
            keys[out] = key
            live.add(out, key, nbytes, _RECOMPUTED if recompute else _BACKWARD)
        live.run(op)
        for tensor in op.touched:
            if last.get(tensor, k) == k and (recompute or tensor in last):
                live.remove(tensor)


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
    index, live = _index_of(graph), _Live(baseline, granularity, by_kind)
    _simulate_forward(index, {index.ids[name] for name in derivation.saved}, live)
    _simulate_backward(index, graph, derivation, live)
    values = live.live_bytes
    peak = max(values, default=baseline)
    return PeakTimeline(
        baseline_bytes=baseline,
        labels=tuple(live.labels),
        live_bytes=tuple(values),
        peak_bytes=peak,
        peak_index=values.index(peak) if values else 0,
        kind_bytes=tuple(live.kind_bytes),
    )


def simulate_peak_bytes(graph: JointGraph, plan_or_tag_targets: RematPlan | Iterable[str] = ()) -> int:
    """Predicted peak bytes of one step under a plan or a set of recomputed tag targets."""
    return simulate_step(graph, plan_or_tag_targets).peak_bytes
