"""`lp_time_bound`: a lower bound on the least recompute time under a step-peak budget, from one
linear program over every event of the step (row generation), with what rerun ops read.

The knapsack bound (`solvers.time_bound`) looks at one event at a time. Here every event is a row of
one covering LP, so a storage dropped to meet one event's budget is paid for once and counts at
every event where it would have been alive. Variables, all in [0, 1]:

* ``r[o]`` per rerunnable forward op: the op reruns in the backward (cost: its time). A storage
  save-all keeps alive at an event is gone there only if the op writing its base reruns (a
  recomputed view needs its base; a recomputed copy is as large).
* ``k[i, step]`` per storage a rerun op may read, one per distinct "earliest rerun" of its readers:
  kept for a reader that cannot rerun before that event. ``k >= r[o] - r[p]`` for each such reader
  ``o`` reading tensor ``t`` of the storage, ``p`` the producer of ``t``: an input of a rerun op is
  saved unless its own producer reruns (`core.plan.derive`), and then that producer is a variable
  too, whose inputs are kept or rebuilt in turn (transitively).

Row of event ``e`` (save-all's live bytes there, exact in `solvers.peak_model`, less the budget,
must go): ``sum bytes(s) r[w(s)] - sum bytes(i) k[i, step] >= live_save_all(e) - budget``, where

* ``s`` ranges over storages save-all keeps alive at ``e`` only because they are saved, before the
  first backward op reading any output of their writer: a rerun runs right before that op
  (`core.simulation`), so from then on the storage is alive whichever is decided; a needed alias
  that no unit reruns keeps it too;
* ``k[i, step]`` counts at the events before ``step`` (and after the next lower step) where save-all
  does not keep ``i`` alive: a reader's earliest rerun is the first backward read of its outputs,
  pulled earlier by any recomputation that reads them, so a kept input is alive until then.

Every plan meets every row (its live bytes are at least the row's), so the LP optimum over any subset
of rows is a lower bound; rows are added where the LP's answer breaks the most, until none breaks.
The bound reported is the Lagrangian value of the LP's duals (weak duality), not the LP's primal
objective, so floating-point error in the LP cannot lift it above the true optimum.

**The same rows as a MILP.** Every plan is a 0/1 point of these rows (an op reruns or not, an input
is kept or not), so the least time over the 0/1 points meeting them is a lower bound too, and
HiGHS's branch and bound proves one above the LP's (its cuts and branching close part of the
integrality gap). With the time the LP leaves, the last round's rows are solved so; HiGHS's dual
bound, less a relative 1e-7 for its tolerances, is taken when larger (2026-12-08: Llama-2-70b over 8
at per-block checkpointing's peak, 839.0 ms from the LP, 918.2 ms from 3 s of MILP; 166.1 -> 173.5
ms at 211 GB; Llama-2-7b at 28.83 GB 3.178 -> 3.206 ms).
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

import numpy as np

from remat_opt.core.problem import RecomputeProblem
from remat_opt.solvers.ilp_peak import model_live_bytes
from remat_opt.solvers.peak_model import PeakModel, _merge, peak_model_of

_INF = np.iinfo(np.int64).max // 4


@dataclass(frozen=True, slots=True)
class LPBound:
    """The bound and how it was reached.

    Attributes:
        time_s: the lower bound on recompute time (None: no plan meets the budget, proven).
        rows: event rows in the last LP.
        rounds: LP solves.
        complete: every event's row holds at the LP's answer (the LP over all events was solved).
        rerun_fraction: per rerunnable op name, its value in the LP's answer.
        integral: the bound is the rows' MILP's (module docstring), above the LP's.
    """

    time_s: float | None
    rows: int = 0
    rounds: int = 0
    complete: bool = False
    rerun_fraction: dict | None = None
    integral: bool = False


@dataclass(frozen=True, slots=True)
class _Terms:
    """The LP's coefficients as event intervals (built once per problem)."""

    ops: tuple[str, ...]  # r variables
    op_time_s: np.ndarray
    # droppable pieces: storage bytes over events [start, end] on variable r[op]
    piece_op: np.ndarray
    piece_start: np.ndarray
    piece_end: np.ndarray
    piece_bytes: np.ndarray
    # kept-input pieces: bytes over events [start, end] on variable k[keep]
    keeps: tuple[str, ...]  # k variables (storages)
    keep_piece: np.ndarray
    keep_start: np.ndarray
    keep_end: np.ndarray
    keep_bytes: np.ndarray
    # k[keep] >= r[op] - r[writer] (writer -1: not rerunnable)
    link_keep: np.ndarray
    link_op: np.ndarray
    link_writer: np.ndarray


def _first_backward_events(problem: RecomputeProblem, n_forward: int) -> dict[str, int]:
    first: dict[str, int] = {}
    for j, op in enumerate(problem.graph.backward_ops):
        for name in op.inputs:
            first.setdefault(name, n_forward + 1 + j)
    return first


def _earliest_reruns(problem: RecomputeProblem, first_read: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """``(first_need, earliest)`` per rerunnable op: the event of the first backward op reading one of
    its outputs, and the earliest event before which it may rerun in any plan (a recomputation
    reading its outputs pulls it to just before that one)."""
    graph, rerunnable = problem.graph, set(problem.units_of_op)
    first_need = {op.name: min((first_read.get(o, _INF) for o in op.outputs), default=_INF)
                  for op in graph.forward_ops if op.name in rerunnable}
    earliest = dict(first_need)
    consumers = graph.consumers
    for op in reversed(graph.forward_ops):
        if op.name not in rerunnable:
            continue
        pulled = [earliest[c.name] for o in op.outputs for c in consumers.get(o, ())
                  if not c.is_backward and c.name in earliest]
        earliest[op.name] = min([earliest[op.name], *pulled])
    return first_need, earliest


def _subtract(spans: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`spans` (merged, sorted) less `holes` (merged, sorted)."""
    out = []
    for start, end in spans:
        for h_start, h_end in holes:
            if h_end < start or h_start > end:
                continue
            if h_start > start:
                out.append((start, h_start - 1))
            start = max(start, h_end + 1)
            if start > end:
                break
        if start <= end:
            out.append((start, end))
    return out


def _save_all_alive(model: PeakModel, storage: str, needed: set[str]) -> list[tuple[int, int]]:
    """Events where save-all keeps `storage` alive: its forward life, its saved span, its reads."""
    lo = model.storage_lo[storage]
    his = [model.alias_hi[a] for a in model.aliases[storage] if a in needed]
    spans = [(0, lo - 1)] if lo > 0 else []  # before lo: not yet written, or in its forward life
    if his:
        spans.append((lo, max(his)))
    spans.extend(model.covered.get(storage, ()))
    return _merge(spans)


def _terms(problem: RecomputeProblem) -> _Terms:
    graph, model = problem.graph, peak_model_of(problem)
    n_forward = len(graph.forward_ops)
    producers, needed = graph.producers, set(problem.needed_by_backward)
    first_read = _first_backward_events(problem, n_forward)
    first_need, earliest = _earliest_reruns(problem, first_read)
    op_index: dict[str, int] = {}
    pieces = []
    for storage, lo in model.storage_lo.items():
        his = {a: model.alias_hi[a] for a in model.aliases[storage] if a in needed}
        writer = producers.get(storage)
        if not his or writer is None or writer.name not in first_need:
            continue
        # a needed alias no unit reruns is saved: the storage stays until its last read
        pinned_until = max((hi for a, hi in his.items() if producers[a].name not in first_need), default=lo - 1)
        alive_until = min(max(his.values()), first_need[writer.name] - 1)
        o = op_index.setdefault(writer.name, len(op_index))
        for start, end in model._uncovered(storage, max(lo, pinned_until + 1), alive_until):
            pieces.append((o, start, end, model.nbytes[storage]))
    # Every op a plan may rerun reads its inputs then: each is kept (saved) or rebuilt by its own
    # producer, which then reads its inputs, and so on: the rerunnable producers join as variables.
    readers: dict[str, list[tuple[int, str, str]]] = {}  # storage -> (earliest rerun, reader op, tensor read)
    todo = list(op_index)
    while todo:
        name = todo.pop()
        for tensor in dict.fromkeys(problem.ops_by_name[name].inputs):
            source = problem.storage_of(tensor)
            if source is None or source not in model.storage_lo:
                continue
            readers.setdefault(source, []).append((earliest[name], name, tensor))
            producer = producers.get(tensor)
            if producer is not None and producer.name in first_need and producer.name not in op_index:
                op_index[producer.name] = len(op_index)
                todo.append(producer.name)
    # Staircase keep variables per storage: with its readers' earliest reruns E_1 > E_2 > ..., the
    # variable of step i says "kept for a reader rerunning at or after E_i", and counts on events
    # [E_(i+1), E_i - 1] where save-all does not keep the storage alive anyway.
    keeps, keep_pieces, links = [], [], []
    for source, found in readers.items():
        steps = sorted({e for e, _, _ in found}, reverse=True)
        alive = _save_all_alive(model, source, needed)
        for i, step in enumerate(steps):
            if step <= 0:
                continue
            below = steps[i + 1] if i + 1 < len(steps) else 0
            spans = _subtract([(max(below, 0), min(step, len(model.const)) - 1)], alive)
            if not spans:
                continue
            k = len(keeps)
            keeps.append(f"{source}@{step}")
            keep_pieces += [(k, a, b, model.nbytes[source]) for a, b in spans]
            for e, reader, tensor in found:
                if e >= step:
                    producer = producers.get(tensor)
                    links.append((k, op_index[reader], op_index.get(producer.name, -1) if producer is not None else -1))
    ops = tuple(op_index)
    links = sorted(set(links))

    def column(rows, i, dtype=np.int64):
        return np.array([r[i] for r in rows], dtype=dtype)

    return _Terms(
        ops=ops, op_time_s=np.array([float(problem.op_time_s[o]) for o in ops]),
        piece_op=column(pieces, 0), piece_start=column(pieces, 1), piece_end=column(pieces, 2),
        piece_bytes=column(pieces, 3, float),
        keeps=tuple(keeps), keep_piece=column(keep_pieces, 0), keep_start=column(keep_pieces, 1),
        keep_end=column(keep_pieces, 2), keep_bytes=column(keep_pieces, 3, float),
        link_keep=column(links, 0), link_op=column(links, 1), link_writer=column(links, 2),
    )


def _spread(values: np.ndarray, starts: np.ndarray, ends: np.ndarray, n_events: int) -> np.ndarray:
    diff = np.zeros(n_events + 1)
    np.add.at(diff, starts, values)
    np.add.at(diff, ends + 1, -values)
    return np.cumsum(diff)[:-1]


def _row_matrix(terms: _Terms, events: np.ndarray, n_ops: int):
    """Sparse rows (one per event) over the columns ``r (n_ops) + k``."""
    import scipy.sparse as sparse

    data, rows, cols = [], [], []
    for row, event in enumerate(events):
        on = (terms.piece_start <= event) & (terms.piece_end >= event)
        data.append(terms.piece_bytes[on])
        cols.append(terms.piece_op[on])
        keep = (terms.keep_start <= event) & (terms.keep_end >= event)
        data.append(-terms.keep_bytes[keep])
        cols.append(n_ops + terms.keep_piece[keep])
        rows.append(np.full(int(on.sum() + keep.sum()), row))
    shape = (len(events), n_ops + len(terms.keeps))
    return sparse.csr_matrix((np.concatenate(data), (np.concatenate(rows), np.concatenate(cols))), shape=shape)


def _link_matrix(terms: _Terms, n_ops: int):
    """Rows ``r[op] - r[writer] - k[keep] <= 0``."""
    import scipy.sparse as sparse

    n = len(terms.link_keep)
    has_writer = terms.link_writer >= 0
    rows = np.concatenate([np.arange(n), np.arange(n)[has_writer], np.arange(n)])
    cols = np.concatenate([terms.link_op, terms.link_writer[has_writer], n_ops + terms.link_keep])
    data = np.concatenate([np.ones(n), -np.ones(int(has_writer.sum())), -np.ones(n)])
    return sparse.csr_matrix((data, (rows, cols)), shape=(n, n_ops + len(terms.keeps)))


_TERMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def lp_time_bound(problem: RecomputeProblem, peak_budget_bytes: int, *, time_limit_s: float = 5.0,
                  rows_per_round: int = 64, integral: bool = True, enough_s: float | None = None) -> LPBound:
    """The LP bound (module docstring) on the recompute time of every plan whose simulated step peak
    is at most `peak_budget_bytes`, within `time_limit_s` (the rows added so far still bound); with
    `integral`, raised by the same rows as a MILP in the time left, unless the LP's bound already
    reaches `enough_s`.

    Raises:
        ImportError: scipy is not installed (its HiGHS solves the LP).
    """
    import scipy.sparse as sparse
    from scipy.optimize import linprog

    deadline = time.perf_counter() + time_limit_s
    model = peak_model_of(problem)
    terms = _TERMS.get(problem)
    if terms is None:
        terms = _TERMS[problem] = _terms(problem)
    n_events, n_ops = len(model.const), len(terms.ops)
    need = model_live_bytes(problem, ()).astype(float) - peak_budget_bytes
    if need.max() <= 0:
        return LPBound(0.0, complete=True)
    droppable = _spread(terms.piece_bytes, terms.piece_start, terms.piece_end, n_events)
    if np.any(droppable < need):  # even dropping everything droppable leaves an event over budget
        return LPBound(None, complete=True)
    links = _link_matrix(terms, n_ops)
    cost = np.concatenate([terms.op_time_s, np.zeros(len(terms.keeps))])
    scale_bytes = max(1.0, float(need.max()))
    scale_s = max(float(cost.max()), 1e-12)
    rows = list(_spread_rows(need, rows_per_round, set()))
    best, rounds, complete, x = 0.0, 0, False, None
    while rows and time.perf_counter() < deadline:
        events = np.array(sorted(rows))
        a_rows = _row_matrix(terms, events, n_ops)
        a_ub = sparse.vstack([-a_rows / scale_bytes, links]).tocsr()
        b_ub = np.concatenate([-need[events] / scale_bytes, np.zeros(links.shape[0])])
        result = linprog(cost / scale_s, A_ub=a_ub, b_ub=b_ub, bounds=(0.0, 1.0), method="highs",
                         options={"time_limit": max(0.1, deadline - time.perf_counter())})
        rounds += 1
        if result.status == 2:  # infeasible rows: no plan meets them
            return LPBound(None, len(rows), rounds, True)
        if result.status != 0:
            break
        x = result.x
        best = max(best, _dual_bound(cost, a_ub, b_ub, result.ineqlin.marginals, scale_s))
        r, k = x[:n_ops], x[n_ops:]
        lhs = (_spread(terms.piece_bytes * r[terms.piece_op], terms.piece_start, terms.piece_end, n_events)
               - _spread(terms.keep_bytes * k[terms.keep_piece], terms.keep_start, terms.keep_end, n_events))
        broken = need - lhs
        tolerance = max(1.0, 1e-7 * peak_budget_bytes)
        new = _spread_rows(np.where(broken > tolerance, broken, 0.0), rows_per_round, set(rows))
        if not new:
            complete = True
            break
        rows.extend(new)
    fractions = None if x is None else dict(zip(terms.ops, x[:n_ops].tolist()))
    raised = False
    if integral and x is not None and (enough_s is None or best < enough_s):
        found = _milp_bound(cost, a_ub, b_ub, scale_s, deadline)
        if found is not None and found > best:
            best, raised = found, True
    return LPBound(best, len(rows), rounds, complete, fractions, raised)


# HiGHS stops once its bound is within this of its best 0/1 point (which no plan undercuts): more
# search could raise the bound by at most that much (on Llama-2-70b over 8: 4.0 s instead of the
# whole limit at per-block checkpointing's peak, 2.4 s at 211 GB, the same bound within 0.03%).
MILP_RELATIVE_GAP = 2e-3


def _milp_bound(cost: np.ndarray, a_ub, b_ub: np.ndarray, scale_s: float, deadline: float) -> float | None:
    """HiGHS's proven lower bound on ``min cost x, A x <= b, x in {0, 1}`` (seconds) by `deadline`,
    less a relative 1e-7 for its tolerances, or None (no bound by then)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    left_s = deadline - time.perf_counter()
    if left_s < 0.1:
        return None
    result = milp(cost / scale_s, constraints=[LinearConstraint(a_ub, -np.inf, b_ub)],
                  integrality=np.ones(len(cost)), bounds=Bounds(0.0, 1.0),
                  options={"time_limit": left_s, "disp": False, "mip_rel_gap": MILP_RELATIVE_GAP})
    dual = getattr(result, "mip_dual_bound", None)
    if result.status not in (0, 1) or dual is None or not np.isfinite(dual):
        return None
    return max(0.0, float(dual) * scale_s * (1 - 1e-7))


def _spread_rows(weights: np.ndarray, count: int, taken: set[int]) -> list[int]:
    """Up to `count` events of positive weight, heaviest first, not in `taken`."""
    positive = np.flatnonzero(weights > 0)
    order = positive[np.argsort(-weights[positive], kind="stable")]
    return [int(e) for e in order if int(e) not in taken][:count]


def _dual_bound(cost: np.ndarray, a_ub, b_ub: np.ndarray, marginals: np.ndarray, scale_s: float) -> float:
    """Weak duality for ``min c x, A x <= b, 0 <= x <= 1``: for any ``y >= 0``,
    ``-y b + sum_j min(0, c_j + (A^T y)_j)`` bounds the optimum from below (seconds)."""
    y = np.maximum(0.0, -np.asarray(marginals, dtype=float))
    reduced = cost / scale_s + a_ub.T @ y
    value = -float(y @ b_ub) + float(np.minimum(0.0, reduced).sum())
    return max(0.0, value * scale_s)
