"""Solving the CP-SAT model under a peak budget: lazy rows against the simulated peak, or a search
over the model's peak budget.

The model's peak rows (`solvers.peak_model`) are a lower bound on the simulated peak
(`remat_opt.core.simulation.simulate_step`). `refine` solves, simulates the plan, and adds the violated row
(or a schedule-aware row, `solvers.schedule_rows`, or a no-good cut) until the plan fits.
`solve_model` does that for untied models and, for tied (large) models, lowers the model's peak
budget by the simulated overshoot and bisects it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field, replace

import numpy as np

from remat_opt.core.simulation import simulate_step
from remat_opt.core.problem import RecomputeProblem
from remat_opt.solvers._clock import Clock
from remat_opt.solvers._common import Budgets
from remat_opt.solvers.blocks import Ties
from remat_opt.solvers.ilp_model import ILPModel, ILPOptions
from remat_opt.solvers.peak_model import peak_model_of
from remat_opt.solvers.schedule_rows import add_schedule_row


@dataclass(frozen=True, slots=True)
class Outcome:
    units: tuple[str, ...] | None  # None: no plan found that meets the budgets
    status: str  # "optimal", "feasible", "infeasible", "overshoot", "timeout"
    objective: float = 0.0
    bound: float = 0.0
    notes: tuple[str, ...] = ()
    overshoot_bytes: int = 0


def model_live_bytes(problem: RecomputeProblem, units) -> np.ndarray:
    _, saved, _ = problem.demand(units)
    return peak_model_of(problem).live_bytes(saved)


def _model_violation(problem: RecomputeProblem, units, peak_budget_bytes: int) -> int | None:
    """An event whose saved-only row the plan violates, or None."""
    live = model_live_bytes(problem, units)
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


@dataclass
class LearnedRows:
    """Rows `refine` found binding on one problem, at any budget: the events of peak rows and the
    backward ops of schedule rows. Both are valid at every budget (the row's bytes do not depend on
    it), so a later solve of the same problem starts with them instead of finding them again, one
    CP-SAT solve per row (a step-peak search solves one problem at many budgets)."""

    events: set[int] = field(default_factory=set)
    schedule_ops: set[int] = field(default_factory=set)


_LEARNED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # problem -> LearnedRows


def learned_rows(problem: RecomputeProblem) -> LearnedRows:
    return _LEARNED.setdefault(problem, LearnedRows())


def initial_rows(problem: RecomputeProblem) -> set[int]:
    """Events that bind most often: the peaks of save-all and of keeping nothing, the backward start."""
    save_all = model_live_bytes(problem, ())
    keep_none = peak_model_of(problem).const
    return {int(np.argmax(save_all)), int(np.argmax(keep_none)), len(problem.graph.forward_ops)}


def build_model(problem, ties: Ties, options: ILPOptions, activation_budget_bytes, model_peak_bytes,
                exact: bool = False) -> ILPModel:
    """The CP-SAT model with the saved-bytes budget, the initial peak rows and the rows earlier solves
    of `problem` found binding (`LearnedRows`; schedule rows only when `exact`, as `refine` adds them)."""
    form = ILPModel(problem, ties, options)
    if activation_budget_bytes is not None:
        form.add_saved_budget(activation_budget_bytes)
    if model_peak_bytes is not None:
        learned = learned_rows(problem)
        for event in sorted(initial_rows(problem) | learned.events):
            form.add_peak_row(event, model_peak_bytes)
        for j in sorted(learned.schedule_ops) if exact else ():
            form.schedule_rows.add(j)
            add_schedule_row(form, j, model_peak_bytes)
    form.cp.minimize(form.time_expr())
    return form


def refine(form: ILPModel, peak_budget_bytes, model_peak_bytes, clock: Clock, exact: bool) -> Outcome:
    """Solves, adding violated peak rows until the simulated plan fits `peak_budget_bytes`.

    Rows use `model_peak_bytes`. A plan meeting every saved-only row but not the simulation gets,
    when `exact`, a schedule row (then a no-good cut); otherwise it is reported as an overshoot.
    """
    problem, hint, notes = form.problem, None, []
    for _ in range(form.options.max_refinements + 1):
        if clock.expired():
            return Outcome(None, "timeout", notes=tuple(notes))
        solution = form.solve(clock, hint)
        if solution.status == "INFEASIBLE":
            return Outcome(None, "infeasible", notes=tuple(notes))
        if solution.status not in ("OPTIMAL", "FEASIBLE"):
            return Outcome(None, "timeout", notes=tuple(notes))
        hint = solution
        if peak_budget_bytes is not None:
            event = _model_violation(problem, solution.units, model_peak_bytes)
            if event is not None:
                form.add_peak_row(event, model_peak_bytes)
                learned_rows(problem).events.add(event)
                continue
            fits, over, peak = _simulated_violation(problem, solution.units, peak_budget_bytes)
            if not fits and not exact:
                over = peak - peak_budget_bytes
                return Outcome(None, "overshoot", solution.objective, solution.bound, tuple(notes), over)
            new_rows = [j for j in over if j not in form.schedule_rows]
            if new_rows:
                form.schedule_rows.add(new_rows[0])
                add_schedule_row(form, new_rows[0], model_peak_bytes)
                learned_rows(problem).schedule_ops.add(new_rows[0])
                continue
            if not fits:
                notes.append("no-good cut: a recompute transient exceeded every peak row")
                form.add_no_good(solution)
                hint = None
                continue
        status = "optimal" if solution.status == "OPTIMAL" else "feasible"
        return Outcome(solution.units, status, solution.objective, solution.bound, tuple(notes))
    return Outcome(None, "timeout", notes=(*notes, "refinement limit reached"))


def solve_model(problem, ties: Ties, options: ILPOptions, budgets: Budgets, clock: Clock):
    """``(outcome, formulation)``: exact lazy refinement (small models), or a search over the
    model's peak budget: lowered by the simulated overshoot until a plan fits, then bisected
    between the best fitting and the last overshooting value (`max_shrinks` solves in all); the
    gap is measured against the first relaxation's bound."""
    exact = options.exact_peak if options.exact_peak is not None else not ties.tied
    form = build_model(problem, ties, options, budgets.activation_bytes, budgets.peak_bytes, exact)
    first = refine(form, budgets.peak_bytes, budgets.peak_bytes, clock, exact)
    if first.status != "overshoot":
        return first, form
    high, low, floor, best = budgets.peak_bytes, None, None, None
    step = first.overshoot_bytes
    model_peak = high - step
    for _ in range(options.max_shrinks):
        trial = build_model(problem, ties, options, budgets.activation_bytes, model_peak)
        outcome = refine(trial, budgets.peak_bytes, model_peak, clock, exact=False)
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
        return Outcome(None, "timeout", notes=(note,)), form
    outcome, form = best
    note = f"model peak budget lowered to {low} so that the simulated peak fits"
    return replace(outcome, status="feasible", bound=first.bound, notes=(note,)), form
