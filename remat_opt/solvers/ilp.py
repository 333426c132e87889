"""`solve_ilp`: least recompute time under a saved-bytes and/or a simulated-peak budget (CP-SAT).

The model is `solvers.ilp_model` (its docstring maps every variable and constraint family to
English), the peak refinement `solvers.ilp_peak`, the minimum budgets `solvers.ilp_bounds`. This
module chains them: solve (tied blocks first, untied when no block-uniform plan fits), explain an
infeasible budget, fall back to the baselines and min-cut plans on a time-out, and among the
fastest plans prefer the one saving least.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace

from remat_opt.core.plan import RematPlan

from remat_opt.core.simulation import simulate_peak_bytes
from remat_opt.core.problem import RecomputeProblem
from remat_opt.solvers._clock import Clock
from remat_opt.solvers._common import Budgets, checked
from remat_opt.solvers.blocks import Ties, choose_ties
from remat_opt.solvers.ilp_bounds import infeasible_error, minimum_peak, tag_targets
from remat_opt.solvers.ilp_model import ILPModel, ILPOptions
from remat_opt.solvers.ilp_peak import Outcome, solve_model
from remat_opt.solvers.mincut import mincut_sweep


def _fitting(problem: RecomputeProblem, budgets: Budgets, candidates) -> list[tuple[float, tuple[str, ...]]]:
    """``(extra time, units)`` of each candidate that meets `budgets`."""
    fits = []
    for units in candidates:
        units = problem.effective_units(units)
        if budgets.admits(problem.saved_bytes(units), simulate_peak_bytes(problem.graph, tag_targets(problem, units))):
            fits.append((problem.extra_time_s(units), units))
    return fits


def _fallback(problem: RecomputeProblem, budgets: Budgets, outcome: Outcome, options: ILPOptions, ties: Ties) -> Outcome:
    """When the solver found no plan in time: the fastest of the baselines and a min-cut sweep that
    fits; failing those, under a peak budget, the plan of the least peak (`minimum_peak`, the one an
    infeasible budget's error names), so that a budget at that minimum is met."""
    fits = _fitting(problem, budgets, [(), problem.allowed_units, *(units for _, units in mincut_sweep(problem, 8, ties))])
    note = "the solver found no plan in time: fastest fitting baseline or min-cut plan"
    if not fits and budgets.peak_bytes is not None:
        fits = _fitting(problem, budgets, [minimum_peak(problem, options).units])
        note = "the solver found no plan in time: the plan of the least step peak found"
    if not fits:
        counts = Counter(outcome.notes)
        why = "; ".join(f"{n} ({counts[n]} times)" if counts[n] > 1 else n for n in counts) \
            or f"time_limit_s={options.time_limit_s} passed"
        raise TimeoutError(f"ilp: no plan within budget found ({why}), nor among the baselines, min-cut plans "
                           "and the least-peak plan")
    return Outcome(min(fits)[1], "fallback", notes=(*outcome.notes, note))


def _tiebreak(form: ILPModel, outcome: Outcome, budgets: Budgets, clock: Clock) -> tuple[str, ...]:
    """Among plans with the optimal time, one with least saved bytes (kept only if it still fits)."""
    best_time = int(round(outcome.objective))
    form.cp.add(form.time_expr() <= best_time)
    form.cp.minimize(form.saved_bytes_expr(form.byte_gcd))
    solution = form.solve(clock.child(form.options.time_limit_s / 5))
    if solution.status not in ("OPTIMAL", "FEASIBLE") or solution.units == outcome.units:
        return outcome.units
    problem = form.problem
    saved = problem.saved_bytes(solution.units)
    peak = simulate_peak_bytes(problem.graph, tag_targets(problem, solution.units))
    slower = problem.extra_time_s(solution.units) > problem.extra_time_s(outcome.units)
    if not budgets.admits(saved, peak) or slower or saved >= problem.saved_bytes(outcome.units):
        return outcome.units
    return solution.units


def solve_ilp(
    problem: RecomputeProblem,
    *,
    activation_budget_bytes: int | None = None,
    peak_budget_bytes: int | None = None,
    options: ILPOptions = ILPOptions(),
) -> RematPlan:
    """Least recompute time subject to a saved-bytes and/or a simulated-peak budget.

    Args:
        problem: the recompute problem.
        activation_budget_bytes: bound on saved bytes (distinct storages, inputs excluded).
        peak_budget_bytes: bound on the simulated peak of one step.
        options: `ILPOptions`.

    Returns:
        A checked `RematPlan`; on a time-out the best plan found, with its gap.

    Raises:
        InfeasibleBudgetError: no plan meets the budgets; the message names the minimum.
        TimeoutError: the time limit passed before any plan within budget was found.
    """
    start = time.perf_counter()
    clock = options.clock()
    budgets = Budgets(activation_budget_bytes, peak_budget_bytes)
    ties = choose_ties(problem, options.tie_blocks, options.min_tied_blocks)
    outcome, form = solve_model(problem, ties, options, budgets, clock)
    if outcome.units is None and outcome.status != "infeasible" and ties.tied and not clock.expired():
        # No block-uniform plan fit the simulated peak: search the whole graph exactly in the time left.
        untied, untied_form = solve_model(problem, Ties(), options, budgets, clock)
        if untied.units is not None or untied.status == "infeasible":
            note = "no block-uniform plan fits the simulated peak: solved without tying blocks"
            outcome, form, ties = replace(untied, notes=(*outcome.notes, note)), untied_form, Ties()
    if outcome.status == "infeasible":
        raise infeasible_error(problem, budgets, options)
    if outcome.units is None:
        outcome = _fallback(problem, budgets, outcome, options, ties)
    units = outcome.units
    if options.tiebreak_saved_bytes and outcome.status == "optimal":
        units = _tiebreak(form, outcome, budgets, clock)
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
        solve_time_s=0.0,
        gap=gap,
        activation_budget_bytes=activation_budget_bytes,
        peak_budget_bytes=peak_budget_bytes,
        notes=notes,
    )
    plan = replace(plan, solve_time_s=time.perf_counter() - start)  # building the plan included
    return checked(problem, plan)
