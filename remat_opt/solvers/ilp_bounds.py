"""The least memory any plan needs, found with the CP-SAT model: least saved bytes, least simulated
peak with a proven lower bound, and the `InfeasibleBudgetError` that names them."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace

import numpy as np

from remat_opt.core.simulation import simulate_peak_bytes
from remat_opt.core.problem import RecomputeProblem
from remat_opt.solvers._clock import Clock
from remat_opt.solvers._common import Budgets, InfeasibleBudgetError
from remat_opt.solvers.blocks import choose_ties
from remat_opt.solvers.ilp_model import ILPModel, ILPOptions
from remat_opt.solvers.ilp_peak import initial_rows, model_live_bytes, solve_model
from remat_opt.solvers.mincut import mincut_sweep


def minimum_saved_bytes(problem: RecomputeProblem, options: ILPOptions = ILPOptions()) -> int:
    """The least saved bytes of any plan (under the ties `options` implies).

    Returns:
        The model's optimum; with tied blocks, bytes that the tied model can meet.
    """
    form = ILPModel(problem, choose_ties(problem, options.tie_blocks, options.min_tied_blocks), options)
    form.cp.minimize(form.saved_bytes_expr())
    solution = form.solve(options.clock())
    if solution.status not in ("OPTIMAL", "FEASIBLE"):
        return problem.saved_bytes(problem.allowed_units)
    return int(round(solution.objective))


def peak_model_minimum(problem: RecomputeProblem, form: ILPModel, clock: Clock) -> tuple[int, list]:
    """``(bound, plans)``: the least peak-model maximum (rows added lazily), a lower bound on the
    simulated peak, and the units of the plans the solver went through."""
    model = form.peak_model
    peak = form.cp.new_int_var(0, int(model.const.max() + sum(model.nbytes.values())), "peak")
    for event in initial_rows(problem):
        form.add_peak_row(event, peak)
    form.cp.minimize(peak)
    lower, candidates = 0, []
    for _ in range(form.options.max_refinements):
        solution = form.solve(clock)
        if solution.status not in ("OPTIMAL", "FEASIBLE"):
            break
        candidates.append(solution.units)
        lower = int(solution.bound)
        live = model_live_bytes(problem, solution.units)
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


_MINIMA: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # problem -> {options: PeakMinimum}


def minimum_peak(problem: RecomputeProblem, options: ILPOptions = ILPOptions()) -> PeakMinimum:
    """The least simulated peak found within the time limit (deterministic: `solvers._clock`), with a
    lower bound and its plan's units.

    A lower bound from the peak model; the best of its plan, the baselines and a min-cut sweep;
    then bisection on the peak budget with the ILP as the feasibility oracle (each probe within an
    eighth of the limit), until the two meet (within `ILPOptions.minimum_peak_tolerance`) or the
    time limit passes. Deterministic, so kept per problem and options: a search that asks several
    infeasible budgets (`planning.fusion_search`) pays for it once.
    """
    options = replace(options, deterministic=True)  # the same minimum on every rank and every rerun
    known = _MINIMA.setdefault(problem, {})
    if options not in known:
        known[options] = _minimum_peak(problem, options)
    return known[options]


def _minimum_peak(problem: RecomputeProblem, options: ILPOptions) -> PeakMinimum:
    clock = options.clock()
    ties = choose_ties(problem, options.tie_blocks, options.min_tied_blocks)
    lower, candidates = peak_model_minimum(problem, ILPModel(problem, ties, options), clock)
    candidates += [(), problem.allowed_units, *(units for _, units in mincut_sweep(problem, 8, ties))]
    best, best_units = min(
        (simulate_peak_bytes(problem.graph, tag_targets(problem, units)), tuple(units)) for units in candidates
    )
    floor = lower
    while best - floor > options.minimum_peak_tolerance * best and floor < best and not clock.expired():
        middle = (floor + best) // 2
        # each probe gets an eighth of the limit: one that neither proves the middle infeasible nor
        # finds a plan (no-good cuts on recompute transients) took all that was left, 5.9 s of 10,
        # on a 7B layer; capped, the bisection goes on above the middle
        probe = clock.child(options.time_limit_s / 8)
        outcome, _ = solve_model(problem, ties, options, Budgets(None, middle), probe)
        if outcome.units is not None:
            peak = simulate_peak_bytes(problem.graph, tag_targets(problem, outcome.units))
            best, best_units = min((best, best_units), (peak, tuple(outcome.units)))
            continue
        floor = middle + 1
        lower = floor if outcome.status == "infeasible" else lower
    return PeakMinimum(best_bytes=best, lower_bytes=min(lower, best), units=best_units)


def minimum_peak_bytes(problem: RecomputeProblem, options: ILPOptions = ILPOptions()) -> tuple[int, int]:
    """``(best, lower_bound)`` of `minimum_peak`: the least simulated peak found, and a bound on it."""
    found = minimum_peak(problem, options)
    return found.best_bytes, found.lower_bytes


def tag_targets(problem: RecomputeProblem, units) -> set[str]:
    return {t for u in units for t in problem.units[u].tag_targets}


def infeasible_error(problem: RecomputeProblem, budgets: Budgets, options: ILPOptions) -> InfeasibleBudgetError:
    if budgets.activation_bytes is not None:
        minimum = minimum_saved_bytes(problem, options)
        if budgets.activation_bytes < minimum:
            return InfeasibleBudgetError("activation_budget_bytes", budgets.activation_bytes, minimum, solver="ilp")
    best, lower = minimum_peak_bytes(problem, options)
    return InfeasibleBudgetError("peak_budget_bytes", budgets.peak_bytes, best, lower, "ilp")
