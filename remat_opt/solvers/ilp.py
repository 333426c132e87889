"""Budgeted ILP with OR-Tools CP-SAT: least recompute time under a saved-bytes or a peak budget.

Symbols (CP-SAT variable names in brackets), all 0/1:

* ``r[u]`` (``recompute_{unit}``): unit (tag target) u is tagged ``RECOMPUTE_IN_BACKWARD``.
* ``T[o]``: op o is tagged: ``r`` of its unit, or ``t[o]`` (``tagged_{op}``) when several
  (nested) units re-run it, with ``t[o] >= r[u]`` and ``t[o] <= sum r[u]`` over them.
* ``d[o]`` (``rerun_{op}``): forward op o runs again in the backward.
* ``s[t]`` (``save_{tensor}``): tensor t is saved for backward.
* ``k[s]`` (``keep_{storage}``): storage s stays alive from the forward into the backward.

With N0 the tensors the backward reads and o(t) the op writing t:

* needed by the backward: ``s[t] + T[o(t)] >= 1`` and ``d[o(t)] >= T[o(t)]`` for t in N0;
* a rerun op is tagged: ``d[o] <= T[o]``;
* inputs of a rerun op: ``s[x] + T[o(x)] >= d[o]`` and ``d[o(x)] >= d[o] + T[o(x)] - 1``;
* a saved tensor keeps its storage: ``k[storage(t)] >= s[t]`` (input storages are free);
* only demanded ops rerun (untied models, so that each plan has one assignment and a no-good cut
  removes exactly one plan): ``d[o] <= sum d[readers of o's outputs]`` unless the backward reads
  an output of o, and ``r[u] <= sum d[o in u]``;
* saved budget: ``sum bytes[s] k[s] <= budget_bytes``;
* peak budget: ``const[e] + sum bytes[s] y[e, s] <= peak_budget_bytes`` for events e of
  `PeakModel` (a lower bound on the simulated peak), where ``y[e, s] >= s[a]`` for each alias a
  of storage s whose saving keeps s alive at e (``any_saved_...``), added lazily: after each
  solve the plan is simulated; a violated event adds its row; where the simulation exceeds the
  budget at a backward op the saved-only row misses, a schedule-aware row (`schedule_rows`) is
  added there; a plan that still passes every row (a recompute-event transient) is cut off by a
  no-good cut on ``d``. Tied (large) models instead lower the model's peak budget by the
  simulated overshoot and bisect it, reporting the gap to the first relaxation's bound.
* objective: ``min sum time[o] d[o]`` (time in integer `time_quantum_s` units).

Units not allowed (random ops, pinned, non-taggable, forward outputs) have no ``r``/``d``
variables. With repeated blocks, tied names share one variable (see `solvers.blocks`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
from ortools.sat.python import cp_model

from remat_opt.plan import RematPlan, simulate_peak_bytes, simulate_step
from remat_opt.problem import RecomputeProblem
from remat_opt.solvers._common import Budgets, InfeasibleBudgetError, checked
from remat_opt.solvers.blocks import Ties, choose_ties
from remat_opt.solvers.mincut import mincut_sweep
from remat_opt.solvers.schedule_rows import add_schedule_row

Key = tuple[str, str]  # (kind, name): kind is a key of _VAR_PREFIX
_TIE_KIND = {"r": "unit", "d": "op", "t": "op", "s": "tensor", "k": "storage"}
_VAR_PREFIX = {
    "r": "recompute",
    "t": "tagged",
    "d": "rerun",
    "s": "save",
    "k": "keep",
    "y": "any_saved",
    "q": "ran",
    "p": "pending",
    "a": "alive",
    "z": "any_alive",
}


@dataclass(frozen=True, slots=True)
class ILPOptions:
    """Options of `solve_ilp`.

    Attributes:
        time_limit_s: wall-clock limit for everything (all refinement rounds).
        num_workers: CP-SAT search workers; None: 1 for small models, 8 otherwise (CP-SAT's
            portfolio of 8 subsolvers proves optimality far faster than 2, even on 2 cores).
        time_quantum_s: resolution of op times in the objective.
        tie_blocks: tie repeated blocks: True, False, or None (when at least `min_tied_blocks`).
        min_tied_blocks: fewest repetitions for automatic tying.
        max_refinements: most lazy peak rows and no-good cuts added.
        exact_peak: refine against the simulated peak exactly (schedule rows, no-good cuts), or
            (False) lower the model's peak budget by the simulated overshoot; None: exact when
            blocks are not tied.
        max_shrinks: most model-budget trials when not exact.
        peak_tolerance: stop that search once the bracket is this fraction of the budget.
        tiebreak_saved_bytes: among plans of least time, take one with least saved bytes (a second
            solve, given at most a fifth of the time limit).
        random_seed: CP-SAT seed.
    """

    time_limit_s: float = 10.0
    num_workers: int | None = None
    time_quantum_s: float = 1e-8
    tie_blocks: bool | None = None
    min_tied_blocks: int = 4
    max_refinements: int = 200
    exact_peak: bool | None = None
    max_shrinks: int = 8
    peak_tolerance: float = 2e-3
    tiebreak_saved_bytes: bool = True
    random_seed: int = 0


# --------------------------------------------------------------------------------------------
# Constraint families (untied names)
# --------------------------------------------------------------------------------------------


def _tagged_key(problem: RecomputeProblem, op: str) -> Key | None:
    """The variable 'op is tagged': its unit's ``r``, ``t[op]`` when several units re-run it."""
    units = problem.units_of_op.get(op, ())
    if not units:
        return None
    return ("r", units[0]) if len(units) == 1 else ("t", op)


def _families(problem: RecomputeProblem, exact_demand: bool) -> Iterator[tuple[list[tuple[Key, int]], int]]:
    """Yields ``(terms, lower)`` meaning ``sum(coef * var) >= lower``, family by family."""
    producers, inputs = problem.graph.producers, set(problem.graph.input_names)
    saved_vars: dict[str, None] = {}
    # An op re-run by several units is tagged iff one of them is.
    for o in problem.rerunnable_ops:
        units = problem.units_of_op[o]
        if len(units) > 1:
            yield from (([(("t", o), 1), (("r", u), -1)], 0) for u in units)
            yield [*((("r", u), 1) for u in units), (("t", o), -1)], 0
    # Needed by the backward: saved, or recomputed by rerunning its (tagged) op.
    for t in problem.needed_by_backward:
        o, tagged = producers[t].name, _tagged_key(problem, producers[t].name)
        saved_vars[t] = None
        if tagged is not None:
            yield [(("s", t), 1), (tagged, 1)], 1
            yield [(("d", o), 1), (tagged, -1)], 0
        else:
            yield [(("s", t), 1)], 1
    readers: dict[str, list[str]] = {}
    for o in problem.rerunnable_ops:
        # A rerun op is tagged.
        yield [(_tagged_key(problem, o), 1), (("d", o), -1)], 0
        for x in dict.fromkeys(problem.ops_by_name[o].inputs):
            if x in inputs:
                continue
            ox = producers[x].name
            tagged, saved_vars[x] = _tagged_key(problem, ox), None
            readers.setdefault(ox, []).append(o)
            # Inputs of a rerun op: saved, or rebuilt by rerunning their own (tagged) op.
            if tagged is not None:
                yield [(("s", x), 1), (tagged, 1), (("d", o), -1)], 0
                yield [(("d", ox), 1), (("d", o), -1), (tagged, -1)], -1
            else:
                yield [(("s", x), 1), (("d", o), -1)], 0
    # A saved tensor keeps its storage alive (storages of inputs and parameters are free).
    for t in saved_vars:
        storage = problem.storage_of(t)
        if storage is not None:
            yield [(("k", storage), 1), (("s", t), -1)], 0
    if exact_demand:
        yield from _demand_upper_bounds(problem, set(problem.needed_by_backward), readers)


def _demand_upper_bounds(problem: RecomputeProblem, needed: set[str], readers: dict[str, list[str]]):
    """Only demanded ops rerun, only units that rerun an op are tagged: one ``d`` per plan."""
    for name in problem.allowed_units:
        # A tagged unit reruns at least one of its ops.
        yield [*((("d", o), 1) for o in problem.units[name].ops), (("r", name), -1)], 0
    for o in problem.rerunnable_ops:
        if not any(t in needed for t in problem.ops_by_name[o].outputs):
            # An op reruns only if a rerun op reads its output.
            yield [*((("d", c), 1) for c in dict.fromkeys(readers.get(o, ()))), (("d", o), -1)], 0


# --------------------------------------------------------------------------------------------
# The CP-SAT model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Solution:
    status: str  # "OPTIMAL", "FEASIBLE", "INFEASIBLE", "UNKNOWN", ...
    units: tuple[str, ...] = ()
    objective: float = 0.0
    bound: float = 0.0
    values: dict | None = None


class _Formulation:
    """The CP-SAT model of one problem under one set of ties (mutable while refining)."""

    def __init__(self, problem: RecomputeProblem, ties: Ties, options: ILPOptions):
        self.problem, self.ties, self.options = problem, ties, options
        self.cp = cp_model.CpModel()
        self.vars: dict[Key, cp_model.IntVar] = {}
        self.storages: set[str] = set()  # untied storages with a keep variable
        self.saved_tensors: set[str] = set()  # untied tensors with a save variable
        self.any_saved: dict[frozenset, Key] = {}
        self.schedule_rows: set[int] = set()
        self.backward_reads = None
        seen = set()
        for terms, lower in _families(problem, exact_demand=not ties.tied):
            mapped = self._map(terms)
            signature = (tuple(sorted(mapped.items())), lower)
            if signature not in seen:
                seen.add(signature)
                self.cp.add(sum(c * self.var(k) for k, c in mapped.items()) >= lower)
            self.storages.update(name for (kind, name), _ in terms if kind == "k")
            self.saved_tensors.update(name for (kind, name), _ in terms if kind == "s")
        self.byte_weights = self._weights(((s, problem.storage_bytes(s)) for s in sorted(self.storages)), "k")
        op_times = ((o, round(problem.op_time_s[o] / options.time_quantum_s)) for o in problem.rerunnable_ops)
        self.time_weights = self._weights(op_times, "d")
        self.byte_gcd = math.gcd(*self.byte_weights.values()) or 1

    def _map(self, terms) -> dict[Key, int]:
        mapped: dict[Key, int] = {}
        for (kind, name), coef in terms:
            key = (kind, self.ties.of(_TIE_KIND[kind], name))
            mapped[key] = mapped.get(key, 0) + coef
        return {k: c for k, c in mapped.items() if c}

    def _weights(self, pairs, kind: str) -> dict[Key, int]:
        weights: dict[Key, int] = {}
        for name, w in pairs:
            key = (kind, self.ties.of(_TIE_KIND[kind], name))
            weights[key] = weights.get(key, 0) + int(w)
        return weights

    def var(self, key: Key) -> cp_model.IntVar:
        if key not in self.vars:
            self.vars[key] = self.cp.new_bool_var(f"{_VAR_PREFIX[key[0]]}_{key[1]}")
        return self.vars[key]

    def saved_bytes_expr(self, divisor: int = 1):
        return sum((w // divisor) * self.var(k) for k, w in self.byte_weights.items())

    def time_expr(self):
        return sum(w * self.var(k) for k, w in self.time_weights.items())

    def add_saved_budget(self, budget_bytes: int) -> None:
        # Saved budget: the kept storages fit in budget_bytes (exact after dividing by the gcd).
        self.cp.add(self.saved_bytes_expr(self.byte_gcd) <= budget_bytes // self.byte_gcd)

    def _any_saved(self, aliases) -> Key | None:
        """The variable 'one of these aliases is saved' (a save variable itself for one alias)."""
        keys = frozenset(("s", self.ties.of("tensor", a)) for a in aliases if a in self.saved_tensors)
        if len(keys) <= 1:
            return next(iter(keys), None)
        if keys not in self.any_saved:
            key = ("y", str(len(self.any_saved)))
            for k in sorted(keys):  # sorted: the same model in every process (string hashes vary)
                self.cp.add(self.var(key) >= self.var(k))
            self.any_saved[keys] = key
        return self.any_saved[keys]

    def add_peak_row(self, event: int, peak_budget) -> None:
        # Peak budget at one event: what is alive anyway plus storages alive because saved.
        const, row = self.problem.peak_model.row(event)
        weights: dict[Key, int] = {}
        for nbytes, aliases in row.values():
            key = self._any_saved(aliases)
            if key is not None:
                weights[key] = weights.get(key, 0) + nbytes
        self.cp.add(sum(w * self.var(k) for k, w in weights.items()) + const <= peak_budget)

    def add_no_good(self, solution: _Solution) -> None:
        # No-good: the rerun set of a plan the simulation rejected may not come back.
        flips = [1 - v if solution.values[k] else v for k, v in self.vars.items() if k[0] == "d"]
        self.cp.add(sum(flips) >= 1)

    def solve(self, deadline: float, hint: _Solution | None = None) -> _Solution:
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.01, deadline - time.perf_counter())
        workers = self.options.num_workers
        solver.parameters.num_workers = workers or (1 if len(self.vars) < 200 else 8)
        solver.parameters.random_seed = self.options.random_seed
        self.cp.clear_hints()
        if hint is not None and hint.values:
            for key, var in self.vars.items():
                self.cp.add_hint(var, hint.values.get(key, 0))
        status = solver.status_name(solver.solve(self.cp))
        if status not in ("OPTIMAL", "FEASIBLE"):
            return _Solution(status)
        values = {k: solver.value(v) for k, v in self.vars.items()}
        units = tuple(
            u for u in self.problem.allowed_units if values.get(("r", self.ties.of("unit", u)), 0)
        )
        return _Solution(status, units, solver.objective_value, solver.best_objective_bound, values)


# --------------------------------------------------------------------------------------------
# Lazy refinement against the simulated peak
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Outcome:
    units: tuple[str, ...] | None  # None: no plan found that meets the budgets
    status: str  # "optimal", "feasible", "infeasible", "overshoot", "timeout"
    objective: float = 0.0
    bound: float = 0.0
    notes: tuple[str, ...] = ()
    overshoot_bytes: int = 0


def _model_live_bytes(problem: RecomputeProblem, units) -> np.ndarray:
    _, saved, _ = problem.demand(units)
    return problem.peak_model.live_bytes(saved)


def _model_violation(problem: RecomputeProblem, units, peak_budget_bytes: int) -> int | None:
    """An event whose saved-only row the plan violates, or None."""
    live = _model_live_bytes(problem, units)
    event = int(np.argmax(live))
    return event if live[event] > peak_budget_bytes else None


def _simulated_violation(problem: RecomputeProblem, units, peak_budget_bytes: int) -> tuple[bool, list[int], int]:
    """``(fits, backward_ops, peak)``: whether the simulated peak fits, the backward op indices
    (a recompute event counts as the op it precedes) where it does not, worst first, the peak."""
    targets = {t for u in units for t in problem.units[u].tag_targets}
    timeline = simulate_step(problem.graph, targets)
    if timeline.peak_bytes <= peak_budget_bytes:
        return True, [], timeline.peak_bytes
    over: dict[int, int] = {}
    pending = []
    for label, live in zip(timeline.labels, timeline.live_bytes):
        if label.startswith("recompute:"):
            pending.append(live)
        elif label.startswith("bwd"):
            worst = max([live, *pending])
            if worst > peak_budget_bytes:
                over[int(label[3:])] = worst
            pending = []
    return False, sorted(over, key=lambda j: -over[j]), timeline.peak_bytes


def _initial_rows(problem: RecomputeProblem) -> set[int]:
    """Events that bind most often: the peaks of save-all and of keeping nothing, the backward start."""
    save_all = _model_live_bytes(problem, ())
    keep_none = problem.peak_model.const
    return {int(np.argmax(save_all)), int(np.argmax(keep_none)), len(problem.graph.forward_ops)}


def _build(problem, ties: Ties, options: ILPOptions, budget_bytes, model_peak_bytes) -> _Formulation:
    form = _Formulation(problem, ties, options)
    if budget_bytes is not None:
        form.add_saved_budget(budget_bytes)
    for event in _initial_rows(problem) if model_peak_bytes is not None else ():
        form.add_peak_row(event, model_peak_bytes)
    form.cp.minimize(form.time_expr())
    return form


def _refine(form: _Formulation, peak_budget_bytes, model_peak_bytes, deadline: float, exact: bool) -> _Outcome:
    """Solves, adding violated peak rows until the simulated plan fits `peak_budget_bytes`.

    Rows use `model_peak_bytes`. A plan meeting every saved-only row but not the simulation gets,
    when `exact`, a schedule row (then a no-good cut); otherwise it is reported as an overshoot.
    """
    problem, hint, notes = form.problem, None, []
    for _ in range(form.options.max_refinements + 1):
        solution = form.solve(deadline, hint)
        if solution.status == "INFEASIBLE":
            return _Outcome(None, "infeasible", notes=tuple(notes))
        if solution.status not in ("OPTIMAL", "FEASIBLE"):
            return _Outcome(None, "timeout", notes=tuple(notes))
        hint = solution
        if peak_budget_bytes is not None:
            event = _model_violation(problem, solution.units, model_peak_bytes)
            if event is not None:
                form.add_peak_row(event, model_peak_bytes)
                continue
            fits, over, peak = _simulated_violation(problem, solution.units, peak_budget_bytes)
            if not fits and not exact:
                over = peak - peak_budget_bytes
                return _Outcome(None, "overshoot", solution.objective, solution.bound, tuple(notes), over)
            new_rows = [j for j in over if j not in form.schedule_rows]
            if new_rows:
                form.schedule_rows.add(new_rows[0])
                add_schedule_row(form, new_rows[0], model_peak_bytes)
                continue
            if not fits:
                notes.append("no-good cut: a recompute transient exceeded every peak row")
                form.add_no_good(solution)
                hint = None
                continue
        status = "optimal" if solution.status == "OPTIMAL" else "feasible"
        return _Outcome(solution.units, status, solution.objective, solution.bound, tuple(notes))
    return _Outcome(None, "timeout", notes=(*notes, "refinement limit reached"))


def _solve(problem, ties: Ties, options: ILPOptions, budgets: Budgets, deadline: float):
    """``(outcome, formulation)``: exact lazy refinement (small models), or a search over the
    model's peak budget: lowered by the simulated overshoot until a plan fits, then bisected
    between the best fitting and the last overshooting value (`max_shrinks` solves in all); the
    gap is measured against the first relaxation's bound."""
    exact = options.exact_peak if options.exact_peak is not None else not ties.tied
    form = _build(problem, ties, options, budgets.saved_bytes, budgets.peak_bytes)
    first = _refine(form, budgets.peak_bytes, budgets.peak_bytes, deadline, exact)
    if first.status != "overshoot":
        return first, form
    high, low, floor, best = budgets.peak_bytes, None, None, None
    step = first.overshoot_bytes
    model_peak = high - step
    for _ in range(options.max_shrinks):
        trial = _build(problem, ties, options, budgets.saved_bytes, model_peak)
        outcome = _refine(trial, budgets.peak_bytes, model_peak, deadline, exact=False)
        if outcome.status == "overshoot":
            # The solver fills any model budget to its edge, so equal steps can overshoot forever:
            # double the step until a plan fits (or the model turns infeasible), then bisect.
            high, step = model_peak, max(2 * step, outcome.overshoot_bytes)
        elif outcome.units is not None:
            low = model_peak
            if best is None or outcome.objective < best[0].objective:
                best = (outcome, trial)
        elif outcome.status == "infeasible":
            floor = model_peak  # too low for the model: the answer lies above
        else:
            break
        below = low if low is not None else floor
        if below is not None and high - below <= max(1, options.peak_tolerance * budgets.peak_bytes):
            break
        model_peak = model_peak - step if below is None else (below + high) // 2
    if best is None:
        note = f"no model peak budget down to {model_peak} gave a fitting plan in {options.max_shrinks} trials"
        return _Outcome(None, "timeout", notes=(note,)), form
    outcome, form = best
    note = f"model peak budget lowered to {low} so that the simulated peak fits"
    return replace(outcome, status="feasible", bound=first.bound, notes=(note,)), form


# --------------------------------------------------------------------------------------------
# Minimum budgets (for the infeasibility error)
# --------------------------------------------------------------------------------------------


def minimum_saved_bytes(problem: RecomputeProblem, options: ILPOptions = ILPOptions()) -> int:
    """The least saved bytes of any plan (under the ties `options` implies).

    Returns:
        The model's optimum; with tied blocks, bytes that the tied model can meet.
    """
    form = _Formulation(problem, choose_ties(problem, options.tie_blocks, options.min_tied_blocks), options)
    form.cp.minimize(form.saved_bytes_expr())
    solution = form.solve(time.perf_counter() + options.time_limit_s)
    if solution.status not in ("OPTIMAL", "FEASIBLE"):
        return problem.saved_bytes(problem.allowed_units)
    return int(round(solution.objective))


def _peak_model_minimum(problem: RecomputeProblem, form: _Formulation, deadline: float) -> tuple[int, list]:
    """Least peak-model maximum (rows added lazily): a lower bound on the simulated peak."""
    model = problem.peak_model
    peak = form.cp.new_int_var(0, int(model.const.max() + sum(model.nbytes.values())), "peak")
    for event in _initial_rows(problem):
        form.add_peak_row(event, peak)
    form.cp.minimize(peak)
    lower, candidates = 0, []
    for _ in range(form.options.max_refinements):
        solution = form.solve(deadline)
        if solution.status not in ("OPTIMAL", "FEASIBLE"):
            break
        candidates.append(solution.units)
        lower = int(solution.bound)
        live = _model_live_bytes(problem, solution.units)
        if live.max() <= solution.objective:
            break
        form.add_peak_row(int(np.argmax(live)), peak)
    return lower, candidates


@dataclass(frozen=True, slots=True)
class PeakMinimum:
    """The least simulated step peak found, a proven lower bound on it, and the units that reach it."""

    best_bytes: int
    lower_bytes: int
    units: tuple[str, ...]


def minimum_peak(problem: RecomputeProblem, options: ILPOptions = ILPOptions()) -> PeakMinimum:
    """The least simulated peak found within the time limit, with a lower bound and its plan's units.

    A lower bound from the peak model; the best of its plan, the baselines and a min-cut sweep;
    then bisection on the peak budget with the ILP as the feasibility oracle, until the two meet
    or the time limit passes.
    """
    deadline = time.perf_counter() + options.time_limit_s
    ties = choose_ties(problem, options.tie_blocks, options.min_tied_blocks)
    lower, candidates = _peak_model_minimum(problem, _Formulation(problem, ties, options), deadline)
    candidates += [(), problem.allowed_units, *(units for _, units in mincut_sweep(problem, 8, ties))]
    best, best_units = min(
        (simulate_peak_bytes(problem.graph, _targets(problem, units)), tuple(units)) for units in candidates
    )
    floor = lower
    while floor < best and time.perf_counter() < deadline:
        middle = (floor + best) // 2
        outcome, _ = _solve(problem, ties, options, Budgets(None, middle), deadline)
        if outcome.units is not None:
            peak = simulate_peak_bytes(problem.graph, _targets(problem, outcome.units))
            best, best_units = min((best, best_units), (peak, tuple(outcome.units)))
            continue
        floor = middle + 1
        lower = floor if outcome.status == "infeasible" else lower
    return PeakMinimum(best_bytes=best, lower_bytes=min(lower, best), units=best_units)


def minimum_peak_bytes(problem: RecomputeProblem, options: ILPOptions = ILPOptions()) -> tuple[int, int]:
    """``(best, lower_bound)`` of `minimum_peak`: the least simulated peak found, and a bound on it."""
    found = minimum_peak(problem, options)
    return found.best_bytes, found.lower_bytes


def _targets(problem: RecomputeProblem, units) -> set[str]:
    return {t for u in units for t in problem.units[u].tag_targets}


def _infeasible(problem: RecomputeProblem, budgets: Budgets, options: ILPOptions) -> InfeasibleBudgetError:
    if budgets.saved_bytes is not None:
        minimum = minimum_saved_bytes(problem, options)
        if budgets.saved_bytes < minimum:
            return InfeasibleBudgetError("budget_bytes", budgets.saved_bytes, minimum, solver="ilp")
    best, lower = minimum_peak_bytes(problem, options)
    return InfeasibleBudgetError("peak_budget_bytes", budgets.peak_bytes, best, lower, "ilp")


# --------------------------------------------------------------------------------------------
# The solver
# --------------------------------------------------------------------------------------------


def _fallback(problem: RecomputeProblem, budgets: Budgets, outcome: _Outcome, options: ILPOptions, ties: Ties) -> _Outcome:
    """When the solver found no plan in time: the fastest of the baselines and a min-cut sweep that fits."""
    fits = []
    candidates = [(), problem.allowed_units, *(units for _, units in mincut_sweep(problem, 8, ties))]
    for units in candidates:
        units = problem.effective_units(units)
        if budgets.admits(problem.saved_bytes(units), simulate_peak_bytes(problem.graph, _targets(problem, units))):
            fits.append((problem.extra_time_s(units), units))
    if not fits:
        why = "; ".join(outcome.notes) or f"time_limit_s={options.time_limit_s} passed"
        raise TimeoutError(f"ilp: no plan within budget found ({why}), nor among the baselines and min-cut plans")
    note = "the solver found no plan in time: fastest fitting baseline or min-cut plan"
    return _Outcome(min(fits)[1], "fallback", notes=(*outcome.notes, note))


def _tiebreak(form: _Formulation, outcome: _Outcome, budgets: Budgets, deadline: float) -> tuple[str, ...]:
    """Among plans with the optimal time, one with least saved bytes (kept only if it still fits)."""
    best_time = int(round(outcome.objective))
    form.cp.add(form.time_expr() <= best_time)
    form.cp.minimize(form.saved_bytes_expr(form.byte_gcd))
    solution = form.solve(min(deadline, time.perf_counter() + form.options.time_limit_s / 5))
    if solution.status not in ("OPTIMAL", "FEASIBLE") or solution.units == outcome.units:
        return outcome.units
    problem = form.problem
    saved = problem.saved_bytes(solution.units)
    peak = simulate_peak_bytes(problem.graph, _targets(problem, solution.units))
    slower = problem.extra_time_s(solution.units) > problem.extra_time_s(outcome.units)
    if not budgets.admits(saved, peak) or slower or saved >= problem.saved_bytes(outcome.units):
        return outcome.units
    return solution.units


def solve_ilp(
    problem: RecomputeProblem,
    *,
    budget_bytes: int | None = None,
    peak_budget_bytes: int | None = None,
    options: ILPOptions = ILPOptions(),
) -> RematPlan:
    """Least recompute time subject to a saved-bytes and/or a simulated-peak budget.

    Args:
        problem: the recompute problem.
        budget_bytes: bound on saved bytes (distinct storages, inputs excluded).
        peak_budget_bytes: bound on the simulated peak of one step.
        options: `ILPOptions`.

    Returns:
        A checked `RematPlan`; on a time-out the best plan found, with its gap.

    Raises:
        InfeasibleBudgetError: no plan meets the budgets; the message names the minimum.
        TimeoutError: the time limit passed before any plan within budget was found.
    """
    start = time.perf_counter()
    deadline = start + options.time_limit_s
    budgets = Budgets(budget_bytes, peak_budget_bytes)
    ties = choose_ties(problem, options.tie_blocks, options.min_tied_blocks)
    outcome, form = _solve(problem, ties, options, budgets, deadline)
    if outcome.units is None and outcome.status != "infeasible" and ties.tied and time.perf_counter() < deadline:
        # No block-uniform plan fit the simulated peak: search the whole graph exactly in the time left.
        untied, untied_form = _solve(problem, Ties(), options, budgets, deadline)
        if untied.units is not None or untied.status == "infeasible":
            note = "no block-uniform plan fits the simulated peak: solved without tying blocks"
            outcome, form, ties = replace(untied, notes=(*outcome.notes, note)), untied_form, Ties()
    if outcome.status == "infeasible":
        raise _infeasible(problem, budgets, options)
    if outcome.units is None:
        outcome = _fallback(problem, budgets, outcome, options, ties)
    units = outcome.units
    if options.tiebreak_saved_bytes and outcome.status == "optimal":
        units = _tiebreak(form, outcome, budgets, deadline)
    notes = list(outcome.notes)
    if ties.tied:
        blocks = ties.blocks
        notes.append(f"tied {blocks.count} repeated blocks of {blocks.period} ops: optimal among block-uniform plans")
    gap = {"optimal": 0.0, "fallback": None}.get(outcome.status)
    if outcome.status == "feasible":
        gap = (outcome.objective - outcome.bound) / max(outcome.objective, 1e-30)
    plan = problem.plan_for(
        units,
        solver="ilp",
        status=outcome.status,
        solve_time_s=time.perf_counter() - start,
        gap=gap,
        budget_bytes=budget_bytes,
        peak_budget_bytes=peak_budget_bytes,
        notes=notes,
    )
    return checked(problem, plan)
