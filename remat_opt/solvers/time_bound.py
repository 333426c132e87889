"""Proven lower bounds on the least recompute time of any plan under a budget (the certified gap).

Three relaxations of the simulated step peak, built on `solvers.peak_model` (a lower bound on the
simulated live bytes at every event, so every fitting plan meets its rows):

* `knapsack_time_bound`: one event at a time as a fractional knapsack. Save-all's live bytes there
  (exact in the peak model) beyond the budget must go; a storage save-all keeps alive there is gone
  only if the op writing it reruns (a recomputed view needs its base alive, a recomputed copy is as
  large, and what a plan adds only raises the need). Charging each op's time to the storages it
  writes, the cheapest bytes per second first, gives a bound in milliseconds of arithmetic at any
  graph size. In the backward, a storage dropped there is rebuilt later from what its writer reads:
  an input not alive there in save-all is kept (its bytes, shared among its readers) or rebuilt (its
  writer's time); a Lagrangian multiplier prices the bytes, and every multiplier gives a bound. The
  largest over a sample of events is the bound.
* `solvers.lp_bound.lp_time_bound`: every event at once, one covering LP (HiGHS) with what the rerun
  ops read kept or rebuilt, transitively, then its rows as a MILP in the time left ("the MILP
  bound"); `relaxation_bound` takes the larger of it and the knapsack.
* `lower_bound`: CP-SAT on the whole untied model (`solvers.ilp_model`) with the peak model's rows,
  schedule rows (`solvers.schedule_rows`) and no-good cuts added where its answers break the
  simulation, within a time limit; its proven objective bound. Its plans that fit are candidates
  (the polisher). It also takes `relaxation_bound`, so it never reports less.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from remat_opt.core.problem import RecomputeProblem
from remat_opt.solvers._clock import Clock
from remat_opt.solvers._common import Budgets
from remat_opt.solvers.blocks import Ties
from remat_opt.solvers.ilp_model import ILPModel, ILPOptions
from remat_opt.solvers.ilp_peak import _simulated_violation, model_live_bytes
from remat_opt.solvers.lp_bound import lp_time_bound
from remat_opt.solvers.peak_model import peak_model_of
from remat_opt.solvers.schedule_rows import add_schedule_row


@dataclass(frozen=True, slots=True)
class TimeBound:
    """A proven lower bound on the least recompute time under the budgets, and fitting plans met.

    Attributes:
        time_s: the bound (0.0 when nothing was proven); None: the budgets are proven infeasible.
        optimal: the relaxation's optimum was found and fits the simulated peak (then it is optimal).
        candidates: unit sets the relaxation returned (check them against the simulation).
        source: which relaxation gave `time_s`.
    """

    time_s: float | None
    optimal: bool = False
    candidates: tuple[tuple[str, ...], ...] = ()
    source: str = "the knapsack bound"


def lower_bound(problem: RecomputeProblem, budgets: Budgets, *, time_limit_s: float, time_quantum_s: float = 1e-8,
                num_workers: int = 8, hint_units: tuple[str, ...] | None = None, incumbent_s: float | None = None,
                gap_tolerance: float = 0.0, cp_sat: bool = True) -> TimeBound:
    """Least time of the untied CP-SAT model under the peak model's rows (a relaxation of the
    simulated peak), within `time_limit_s`: its proven bound, or `relaxation_bound` when larger, is
    a lower bound on every plan's time under `budgets` (None: the budgets are proven infeasible).
    CP-SAT is not run when `relaxation_bound` already puts `incumbent_s` (a fitting plan's time)
    within `gap_tolerance` of the optimum, nor with `cp_sat` False (the relaxations alone, which
    then get the whole limit)."""
    enough_s = None if incumbent_s is None else incumbent_s * (1 - gap_tolerance)
    relaxation_limit_s = time_limit_s / 2 if cp_sat else time_limit_s
    relaxed_s, source = relaxation_bound(problem, budgets, time_limit_s=relaxation_limit_s, enough_s=enough_s)
    if relaxed_s is None:
        return TimeBound(None)
    close = incumbent_s is not None and incumbent_s - relaxed_s <= gap_tolerance * incumbent_s
    if time_limit_s <= 0 or close or not cp_sat:
        return TimeBound(relaxed_s, source=source)
    clock = Clock(time_limit_s, deterministic=False)  # 8 workers: a wall-clock limit (`solvers._clock`)
    ilp_options = ILPOptions(time_quantum_s=time_quantum_s, num_workers=num_workers)
    form = ILPModel(problem, Ties(), ilp_options)
    if budgets.activation_bytes is not None:
        form.add_saved_budget(budgets.activation_bytes)
    rows: set[int] = set()
    if budgets.peak_bytes is not None:
        model = peak_model_of(problem)
        rows = {int(np.argmax(model_live_bytes(problem, ()))), int(np.argmax(model.const)), len(problem.graph.forward_ops)}
        if hint_units is not None:
            rows.add(int(np.argmax(model_live_bytes(problem, hint_units))))
        for event in rows:
            form.add_peak_row(event, budgets.peak_bytes)
    form.cp.minimize(form.time_expr())
    # Op times are rounded to the quantum in the model: a rounded-up time could lift the bound above
    # the true least time by at most the sum of the roundings up.
    quantum = time_quantum_s
    slack_s = sum(max(0.0, round(problem.op_time_s[o] / quantum) * quantum - problem.op_time_s[o])
                  for o in problem.rerunnable_ops)
    best_bound, candidates, hint = relaxed_s, [], None
    cp_sat = "the CP-SAT relaxation"
    while not clock.expired():
        # Half the time left per solve: a plan that breaks a row then still leaves time to add it.
        solution = form.solve(clock.child(max(0.5, clock.remaining_s() / 2)), hint)
        if solution.status == "INFEASIBLE":
            return TimeBound(None)
        if solution.status not in ("OPTIMAL", "FEASIBLE"):
            break
        if solution.bound * quantum - slack_s > best_bound:
            best_bound, source = solution.bound * quantum - slack_s, cp_sat
        candidates.append(solution.units)
        hint = solution
        if budgets.peak_bytes is None:
            return TimeBound(max(0.0, best_bound), solution.status == "OPTIMAL", tuple(candidates), source)
        live = model_live_bytes(problem, solution.units)
        event = int(np.argmax(live))
        if live[event] > budgets.peak_bytes and event not in rows:
            rows.add(event)
            form.add_peak_row(event, budgets.peak_bytes)
            continue
        fits, over, _ = _simulated_violation(problem, solution.units, budgets.peak_bytes)
        if fits:
            return TimeBound(max(0.0, best_bound), solution.status == "OPTIMAL", tuple(candidates), source)
        new_rows = [j for j in over if j not in form.schedule_rows]
        if new_rows:  # the recompute schedule's liveness at that backward op: still a lower bound
            form.schedule_rows.add(new_rows[0])
            add_schedule_row(form, new_rows[0], budgets.peak_bytes)
        else:  # this plan does not fit: cutting it off keeps every fitting plan
            form.add_no_good(solution)
            hint = None
    return TimeBound(max(0.0, best_bound), False, tuple(candidates), source)


def relaxation_bound(problem: RecomputeProblem, budgets: Budgets, *, time_limit_s: float,
                     enough_s: float | None = None) -> tuple[float | None, str]:
    """``(seconds, source)``: the larger of the knapsack bound and, under a peak budget, the LP bound
    (`solvers.lp_bound`, within `time_limit_s`, raised by its rows' MILP unless it already reaches
    `enough_s`; left out without scipy); None: proven infeasible."""
    knapsack_s = knapsack_time_bound(problem, budgets)
    if knapsack_s is None or budgets.peak_bytes is None or time_limit_s <= 0:
        return knapsack_s, "the knapsack bound"
    try:
        found = lp_time_bound(problem, budgets.peak_bytes, time_limit_s=time_limit_s, enough_s=enough_s)
    except ImportError:  # scipy (HiGHS) is not installed: the knapsack bound alone
        return knapsack_s, "the knapsack bound"
    if found.time_s is None:
        return None, "the LP bound"
    source = "the MILP bound" if found.integral else "the LP bound"
    return (found.time_s, source) if found.time_s > knapsack_s else (knapsack_s, "the knapsack bound")


def _storage_costs_s(problem: RecomputeProblem) -> dict[str, float]:
    """Per forward storage, a share of the time of the op writing it (its base): that op reruns
    whenever the storage is needed and not kept; an op's shares sum to its time. Storages written
    by ops no allowed unit reruns cost infinity (they cannot be dropped)."""
    graph, costs = problem.graph, {}
    for op in graph.forward_ops:
        own = [o for o in op.outputs if graph.tensors[o].storage == o and graph.tensors[o].kind != "input"]
        share = float(problem.op_time_s.get(op.name, math.inf)) / len(own) if own else 0.0
        rerunnable = op.name in problem.units_of_op
        costs.update(dict.fromkeys(own, share if rerunnable else math.inf))
    return costs


def _fractional_knapsack_s(costs_s: np.ndarray, nbytes: np.ndarray, need_bytes: int) -> float | None:
    """Least time dropping at least `need_bytes` (fractions allowed), cheapest per byte first; None
    when even dropping every droppable storage does not free that much."""
    if need_bytes <= 0:
        return 0.0
    finite = np.isfinite(costs_s)
    costs_s, nbytes = costs_s[finite], nbytes[finite]
    if nbytes.sum() < need_bytes:
        return None
    order = np.argsort(costs_s / np.maximum(nbytes, 1), kind="stable")
    freed = np.cumsum(nbytes[order])
    last = int(np.searchsorted(freed, need_bytes))  # the first storage that frees enough
    before = freed[last - 1] if last else 0
    partial = (need_bytes - before) / nbytes[order][last]
    return float(costs_s[order][:last].sum() + partial * costs_s[order][last])


def knapsack_time_bound(problem: RecomputeProblem, budgets: Budgets, max_rows: int = 40) -> float | None:
    """A lower bound on the recompute time of every plan meeting `budgets` (None: none can).

    Saved bytes: every needed storage of save-all beyond the budget must be dropped. Peak: at an
    event of the peak model, what save-all keeps alive beyond the budget must be dropped; the rows
    are the `max_rows` events where save-all's live bytes are highest, spread over the step.
    """
    costs = _storage_costs_s(problem)
    bound = 0.0
    if budgets.activation_bytes is not None:
        storages = sorted({problem.storage_of(t) for t in problem.needed_by_backward} - {None})
        nbytes = np.array([problem.storage_bytes(s) for s in storages], dtype=np.int64)
        found = _fractional_knapsack_s(np.array([costs.get(s, math.inf) for s in storages]), nbytes,
                                       int(nbytes.sum()) - budgets.activation_bytes)
        if found is None:
            return None
        bound = found
    if budgets.peak_bytes is None:
        return bound
    model = peak_model_of(problem)
    live = model_live_bytes(problem, ())
    needed = set(problem.needed_by_backward)
    for event in knapsack_rows(live, budgets.peak_bytes, max_rows):
        _, row = model.row(event)
        # what save-all keeps alive here (a needed alias keeps it): to drop one, the op writing it
        # reruns (a recomputed view needs its base alive; a recomputed copy is as large)
        storages = [s for s, (_, aliases) in row.items() if needed.intersection(aliases)]
        nbytes = np.array([row[s][0] for s in storages], dtype=np.int64)
        costs_s = np.array([costs.get(s, math.inf) for s in storages])
        need_bytes = int(live[event]) - budgets.peak_bytes
        found = _fractional_knapsack_s(costs_s, nbytes, need_bytes)
        if found is None:
            return None
        if event > len(problem.graph.forward_ops):  # in the backward: what the reruns read stays alive or reruns
            penalties = _input_penalties(problem, model, event, storages, costs)
            found = max(found, _lagrangian_bound_s(costs_s, nbytes, need_bytes, penalties))
        bound = max(bound, found)
    return bound


def _input_penalties(problem: RecomputeProblem, model, event: int, storages: list[str], costs: dict[str, float]):
    """``(item, bytes, seconds)`` arrays: for each droppable storage (item), each storage its writer
    reads that is not alive at `event` in save-all (neither droppable there nor read across it): a
    plan dropping the item keeps that input alive at `event` (its bytes) or reruns its writer (its
    time), each shared equally among the items whose writers read it."""
    graph, producers = problem.graph, problem.graph.producers
    index = {s: i for i, s in enumerate(storages)}
    reads: dict[str, list[int]] = {}
    for i, storage in enumerate(storages):
        producer = producers.get(storage)
        for name in dict.fromkeys(producer.inputs if producer is not None else ()):
            source = problem.storage_of(name)
            if source is None or source == storage or source in index:
                continue
            if any(first <= event <= last for first, last in model.covered.get(source, ())):
                continue  # alive here whatever is decided
            reads.setdefault(source, []).append(i)
    items, nbytes, seconds = [], [], []
    for source, readers in reads.items():
        share = 1.0 / len(readers)
        items.extend(readers)
        nbytes.extend([graph.tensors[source].storage_bytes * share] * len(readers))
        seconds.extend([costs.get(source, math.inf) * share] * len(readers))
    return np.array(items, dtype=np.int64), np.array(nbytes, dtype=float), np.array(seconds, dtype=float)


def _lagrangian_bound_s(costs_s: np.ndarray, nbytes: np.ndarray, need_bytes: int, penalties, n_grid: int = 200) -> float:
    """max over multipliers (seconds per byte) of ``need * m + sum_i min(0, cost_i(m) - m * bytes_i)``,
    where ``cost_i(m)`` adds, per input of item i, the cheaper of keeping it (``m`` x its bytes) or
    rerunning its writer (its time): a lower bound for every multiplier (weak duality)."""
    items, input_bytes, input_s = penalties
    finite = np.isfinite(costs_s) & (nbytes > 0)
    ratios = costs_s[finite] / nbytes[finite]
    if not len(ratios) or need_bytes <= 0:
        return 0.0
    grid = np.unique(np.quantile(ratios, np.linspace(0.0, 1.0, n_grid)))
    best = 0.0
    for m in grid:
        penalty = np.bincount(items, weights=np.minimum(m * input_bytes, input_s), minlength=len(costs_s))
        terms = np.minimum(0.0, costs_s + penalty - m * nbytes)
        best = max(best, float(need_bytes * m + terms[np.isfinite(terms)].sum()))
    return best


def knapsack_rows(live: np.ndarray, peak_budget_bytes: int, max_rows: int = 40) -> list[int]:
    """Up to `max_rows` events where save-all's live bytes (`live`, per peak-model event) exceed the
    budget, highest first, at least a quarter-row's share of the step apart."""
    spacing = max(1, len(live) // (4 * max_rows))
    rows: list[int] = []
    for event in np.argsort(-live, kind="stable"):
        if live[event] <= peak_budget_bytes or len(rows) == max_rows:
            break
        if all(abs(int(event) - r) >= spacing for r in rows):
            rows.append(int(event))
    return rows
