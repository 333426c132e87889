"""`PeakModel`: a linear lower bound on the simulated step peak, used by the ILP's peak rows.

It gives the live bytes at every step event as a function of which tensors are saved
(`remat_opt.core.simulation.simulate_step` is the exact simulation); it is exact for the forward and for
save-all, and omits only liveness changes that recompute chains cause in the backward.
`peak_model_of(problem)` builds it once per problem.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from remat_opt.core.graph import JointGraph
from remat_opt.core.problem import RecomputeProblem

_MODELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def peak_model_of(problem: RecomputeProblem) -> PeakModel:
    """The `PeakModel` of `problem`'s graph, built on first use and kept while the problem lives."""
    model = _MODELS.get(problem)
    if model is None:
        model = _MODELS[problem] = PeakModel.from_graph(problem.graph)
    return model



@dataclass(frozen=True)
class PeakModel:
    """Live bytes at each step event, as a function of which tensors are saved.

    Events e: forward op i is ``i``, the backward start is ``F``, backward op j is ``F + 1 + j``.
    ``live(e) = const[e] + sum over storages s of bytes[s] * [some saved alias a of s has
    lo[s] <= e <= hi[a]] * [e not in covered[s]]``: a saved alias keeps its storage alive from the
    end of its forward life (`lo`) to its last backward read (`hi`); `covered` are the backward
    events where some alias is alive whatever is decided (it is read then), already in `const`,
    with transients, the backward's own tensors, cotangents and parameters. Exact for save-all
    and for the forward; a lower bound otherwise (it omits recompute-chain transients).

    Attributes:
        const: bytes alive at each event whatever is saved.
        labels: event names (op names, ``"backward start"``).
        storage_lo: per non-input forward storage, the first event it is alive only if saved.
        alias_hi: per forward tensor with such a storage, the last event its saving keeps it alive.
        covered: per storage, merged ``(first, last)`` backward event spans counted in `const`.
        aliases: per storage, its forward tensors.
        nbytes: per storage, its bytes.
    """

    const: np.ndarray
    labels: tuple[str, ...]
    storage_lo: dict[str, int]
    alias_hi: dict[str, int]
    covered: dict[str, list[tuple[int, int]]]
    aliases: dict[str, list[str]]
    nbytes: dict[str, int]

    @classmethod
    def from_graph(cls, graph: JointGraph) -> PeakModel:
        """Builds the intervals by a liveness pass over the forward and the save-all backward."""
        tensors, n_fwd = graph.tensors, len(graph.forward_ops)
        n_events = n_fwd + 1 + len(graph.backward_ops)
        first, last_fwd = _forward_storage_spans(graph)
        reads, covered, const_spans = _backward_spans(graph, n_fwd)
        diff = np.zeros(n_events + 1, dtype=np.int64)
        for storage in first:
            _add_span(diff, first[storage], last_fwd[storage], tensors[storage].storage_bytes)
            for start, end in covered.get(storage, ()):
                _add_span(diff, start, end, tensors[storage].storage_bytes)
        for start, end, nbytes in const_spans:
            _add_span(diff, start, end, nbytes)
        for event, op in enumerate((*graph.forward_ops, None, *graph.backward_ops)):
            if op is not None and op.workspace_bytes:
                _add_span(diff, event, event, op.workspace_bytes)
        baseline = sum(t.storage_bytes for t in tensors.values() if t.kind == "input" and t.storage == t.name)
        aliases: dict[str, list[str]] = {}
        for op in graph.forward_ops:
            for out in op.outputs:
                if tensors[out].storage in first:
                    aliases.setdefault(tensors[out].storage, []).append(out)
        return cls(
            const=np.cumsum(diff)[:-1] + baseline,
            labels=(*(op.name for op in graph.forward_ops), "backward start", *(op.name for op in graph.backward_ops)),
            storage_lo={s: last_fwd[s] + 1 for s in first},
            alias_hi={a: n_fwd + 1 + reads[a] if a in reads else n_fwd for s in aliases for a in aliases[s]},
            covered=covered,
            aliases=aliases,
            nbytes={s: tensors[s].storage_bytes for s in first},
        )

    def _uncovered(self, storage: str, lo: int, hi: int) -> list[tuple[int, int]]:
        pieces, start = [], lo
        for first, last in self.covered.get(storage, ()):
            if last < start or first > hi:
                continue
            if first > start:
                pieces.append((start, first - 1))
            start = max(start, last + 1)
        if start <= hi:
            pieces.append((start, hi))
        return pieces

    def live_bytes(self, saved: Iterable[str]) -> np.ndarray:
        """Lower bound on live bytes at every event when the tensors `saved` are saved."""
        hi: dict[str, int] = {}
        for a in saved:
            storage = self._storage_of_alias.get(a)
            if storage is not None:
                hi[storage] = max(hi.get(storage, -1), self.alias_hi[a])
        diff = np.zeros(len(self.const) + 1, dtype=np.int64)
        for storage, last in hi.items():
            for start, end in self._uncovered(storage, self.storage_lo[storage], last):
                _add_span(diff, start, end, self.nbytes[storage])
        return self.const + np.cumsum(diff)[:-1]

    def row(self, event: int) -> tuple[int, dict[str, tuple[int, tuple[str, ...]]]]:
        """``(const, {storage: (bytes, aliases)})`` at one event: the storage is alive then iff one
        of `aliases` is saved."""
        row = {}
        names, lo, hi = self._row_candidates
        for i in np.flatnonzero((lo <= event) & (hi >= event)):  # the storages a saved alias can keep alive then
            storage = names[i]
            if any(first <= event <= last for first, last in self.covered.get(storage, ())):
                continue
            keeping = tuple(a for a in self.aliases[storage] if self.alias_hi[a] >= event)
            if keeping:
                row[storage] = (self.nbytes[storage], keeping)
        return int(self.const[event]), row

    @cached_property
    def _row_candidates(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """The storages (in `storage_lo`'s order), their `storage_lo` and the last event an alias keeps each."""
        names = list(self.storage_lo)
        lo = np.array([self.storage_lo[s] for s in names], dtype=np.int64)
        hi = np.array([max(self.alias_hi[a] for a in self.aliases[s]) for s in names], dtype=np.int64)
        return names, lo, hi

    @cached_property
    def _storage_of_alias(self) -> dict[str, str]:
        return {a: s for s, names in self.aliases.items() for a in names}


def _add_span(diff: np.ndarray, start: int, end: int, nbytes: int) -> None:
    if end >= start:
        diff[start] += nbytes
        diff[end + 1] -= nbytes


def _forward_storage_spans(graph: JointGraph) -> tuple[dict[str, int], dict[str, int]]:
    """Per non-input forward storage: first forward event alive, last forward event alive unsaved."""
    tensors, n_fwd = graph.tensors, len(graph.forward_ops)
    outputs = set(graph.forward_output_names)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, op in enumerate(graph.forward_ops):
        for name in op.inputs:
            storage = tensors[name].storage
            if storage in first:
                last[storage] = max(last[storage], i)
        for name in op.outputs:
            storage = tensors[name].storage
            if tensors[storage].kind == "input":
                continue
            first.setdefault(storage, i)
            last[storage] = max(last.get(storage, i), n_fwd - 1 if name in outputs else i)
    # An async collective's inputs live until its outputs (futures) are last used: the wait.
    used: dict[str, int] = {}
    for i, op in enumerate(graph.forward_ops):
        for name in (*op.inputs, *op.outputs):
            used[name] = n_fwd - 1 if name in outputs else i
    extend_held_reads(graph.forward_ops, used)
    for op in graph.forward_ops:
        if "holds_inputs" in op.op_tags:
            for name in op.inputs:
                if tensors[name].storage in first:
                    last[tensors[name].storage] = max(last[tensors[name].storage], used[name])
    return first, last


def extend_held_reads(ops, last_read: dict[str, int]) -> None:
    """Extends `last_read` (tensor -> index of its last read among `ops`) of each input of an async
    collective (``"holds_inputs"``) to its outputs' last read: the backend reads the input until
    the future's wait (`core.simulation` holds it as long). In reverse order, so that a chain of
    holds extends to its last wait."""
    for op in reversed(ops):
        if "holds_inputs" in op.op_tags:
            until = max((last_read[o] for o in op.outputs if o in last_read), default=-1)
            for name in op.inputs:
                if name in last_read:
                    last_read[name] = max(last_read[name], until)


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _backward_spans(graph: JointGraph, n_fwd: int):
    """Backward liveness that holds whatever is decided.

    Returns:
        ``(last_read, covered, const_spans)``: last backward op reading each forward tensor;
        per forward storage, merged event spans where one of its tensors is alive because it is
        read (a forward tensor from first to last read; a backward view of it from its birth to
        its last read, or to the end if unread); and ``(start, end, bytes)`` spans of cotangents
        and of storages the backward allocates.
    """
    tensors, end = graph.tensors, len(graph.backward_ops) - 1
    forward_storage = {tensors[o].storage for op in graph.forward_ops for o in op.outputs}
    forward_storage -= {s for s in forward_storage if tensors[s].kind == "input"}
    first_read: dict[str, int] = {}
    last_read: dict[str, int] = {}
    born: dict[str, int] = {}
    for j, op in enumerate(graph.backward_ops):
        for name in op.inputs:
            first_read.setdefault(name, j)
            last_read[name] = j
        for name in op.outputs:
            born.setdefault(name, j)
    for name in born:  # unread backward tensors (gradients) live to the end
        last_read.setdefault(name, end)
    extend_held_reads(graph.backward_ops, last_read)
    spans: dict[str, list[tuple[int, int]]] = {}
    for name, last in last_read.items():
        storage = tensors[name].storage
        start = born.get(name, first_read.get(name, last))
        if tensors[storage].kind == "cotangent":  # cotangents arrive at the backward start
            start = -1
        spans.setdefault(storage, []).append((n_fwd + 1 + start, n_fwd + 1 + last))
    covered = {s: _merge(v) for s, v in spans.items() if s in forward_storage}
    const_spans = [
        (start, stop, tensors[s].storage_bytes)
        for s, v in spans.items()
        if s not in forward_storage and tensors[s].kind != "input"
        for start, stop in _merge(v)
    ]
    forward_reads = {n: j for n, j in last_read.items() if n not in born and tensors[n].kind != "cotangent"}
    return forward_reads, covered, const_spans
