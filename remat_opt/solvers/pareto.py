"""Pareto front of (peak bytes, saved bytes, extra recompute time) over a range of budgets."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from remat_opt.core.graph import JointGraph
from remat_opt.core.plan import RematPlan
from remat_opt.core.problem import RecomputeProblem
from remat_opt.solvers._common import InfeasibleBudgetError, checked
from remat_opt.solvers.baselines import solve_save_all
from remat_opt.solvers.ilp_bounds import minimum_peak, minimum_saved_bytes
from remat_opt.solvers.ilp_model import ILPOptions
from remat_opt.solvers.layered import LayeredOptions, least_peak_units


ACTIVATION, PEAK = "activation", "peak"
BUDGET_KINDS = (ACTIVATION, PEAK)
# The solver keyword of each kind of budget.
_SOLVER_KEYWORD = {ACTIVATION: "activation_budget_bytes", PEAK: "peak_budget_bytes"}


def check_budget_kind(budget_kind: str) -> str:
    if budget_kind not in BUDGET_KINDS:
        raise ValueError(f"budget_kind must be one of {', '.join(map(repr, BUDGET_KINDS))}, got {budget_kind!r}")
    return budget_kind


@dataclass(frozen=True, slots=True)
class ParetoPoint:
    """One plan of the front.

    Attributes:
        budget_kind: which budget the sweep bounds: ``"activation"`` (bytes saved for backward) or
            ``"peak"`` (the simulated step peak).
        swept_budget_bytes: the value of that budget this point was solved for.
        peak_bytes: its simulated peak.
        saved_bytes: its saved bytes.
        extra_time_s: its recompute time.
        plan: the plan.
        substituted: True when `plan` is not the solver's own plan at this budget but a faster one
            that fits, found at a smaller budget or while bounding the sweep (see `sweep_points`).
    """

    budget_kind: str
    swept_budget_bytes: int
    peak_bytes: int
    saved_bytes: int
    extra_time_s: float
    plan: RematPlan
    substituted: bool = False


def _budget_range(problem: RecomputeProblem, budget_kind: str, options) -> tuple[int, int, tuple[RematPlan, ...]]:
    """(least budget, save-all's budget, plans at the least budget already known)."""
    ilp_options = options if isinstance(options, ILPOptions) else ILPOptions()
    save_all = solve_save_all(problem)
    if budget_kind == ACTIVATION:
        return minimum_saved_bytes(problem, ilp_options), save_all.saved_bytes, ()
    start_s = time.perf_counter()
    note = "the least-peak plan found while bounding the sweep"
    if isinstance(options, LayeredOptions):  # the chain's least-peak plan, checked by simulation
        units, solver = least_peak_units(problem, options), "layered"
    else:
        units, solver = minimum_peak(problem, ilp_options).units, "ilp"
    plan = problem.plan_for(units, solver=solver, status="fallback", solve_time_s=0.0, notes=(note,))
    # building the plan included in its time
    plan = replace(plan, peak_budget_bytes=plan.peak_bytes, solve_time_s=time.perf_counter() - start_s)
    return plan.peak_bytes, save_all.peak_bytes, (checked(problem, plan),)


def sweep_budgets(problem: RecomputeProblem, n_points: int, budget_kind: str = ACTIVATION, options=None):
    """``(budgets_bytes, known)``: `n_points` budgets evenly spaced from the least feasible to
    save-all's, and the plans already known at the least one (for peak sweeps: what bounding the
    range found)."""
    low, high, known = _budget_range(problem, check_budget_kind(budget_kind), options)
    n_points = max(2, n_points)
    return sorted({low + (high - low) * i // (n_points - 1) for i in range(n_points)}), known


def solve_once(problem: RecomputeProblem, bound_bytes: int, budget_kind: str = ACTIVATION, solver: str = "ilp",
               options=None) -> RematPlan:
    """The solver's plan under one budget of `budget_kind`, `bound_bytes`."""
    from remat_opt.solvers import SOLVERS

    extra = {} if options is None else {"options": options}
    return SOLVERS[solver](problem, **{_SOLVER_KEYWORD[check_budget_kind(budget_kind)]: bound_bytes}, **extra)


def _fits(plan: RematPlan, budget_kind: str, bound_bytes: int) -> bool:
    return (plan.peak_bytes if budget_kind == PEAK else plan.saved_bytes) <= bound_bytes


def sweep_points(problem: RecomputeProblem, budgets_bytes: Iterable[int], *, budget_kind: str = ACTIVATION,
                 solver: str = "ilp", options=None, known: Iterable[RematPlan] = (),
                 errors: list | None = None) -> list[ParetoPoint]:
    """Plans at ascending `budgets_bytes` of `budget_kind`; a fitting plan found earlier (or in
    `known`) that is faster replaces the solver's, so the curve never gets slower as the budget grows
    (the solver can stop at a time limit or a non-optimal peak search). Each point records whether it
    was substituted.

    Args:
        errors: collects ``(bound_bytes, exception)`` for budgets left without a plan; None: raise.
    """
    check_budget_kind(budget_kind)
    found, points = list(known), []
    for bound_bytes in sorted(budgets_bytes):
        plan, error = None, None
        try:
            plan = solve_once(problem, bound_bytes, budget_kind, solver, options)
        except (TimeoutError, InfeasibleBudgetError) as e:
            error = e
        candidates = [p for p in (plan, *found) if p is not None and _fits(p, budget_kind, bound_bytes)]
        if not candidates:
            if errors is None:
                raise error
            errors.append((bound_bytes, error))
            continue
        best = min(candidates, key=lambda p: p.extra_time_s)  # the solver's own plan on ties
        found.append(best)
        points.append(ParetoPoint(budget_kind=budget_kind, swept_budget_bytes=bound_bytes, peak_bytes=best.peak_bytes,
                                  saved_bytes=best.saved_bytes, extra_time_s=best.extra_time_s, plan=best,
                                  substituted=best is not plan))
    return points


def pareto_front(
    graph_or_problem: JointGraph | RecomputeProblem,
    op_time_s: Mapping[str, float] | None = None,
    n_points: int = 8,
    *,
    budget_kind: str = ACTIVATION,
    solver: str = "ilp",
    pinned: Iterable[str] = (),
    options=None,
) -> list[ParetoPoint]:
    """Plans at `n_points` budgets evenly spaced from the minimum feasible budget to save-all's.

    Args:
        graph_or_problem: a `JointGraph` (then `op_time_s` is required) or a `RecomputeProblem`.
        op_time_s: op name -> seconds, for a graph.
        n_points: number of budgets (at least 2: the minimum and save-all).
        budget_kind: ``"activation"`` (bound saved bytes) or ``"peak"`` (bound the simulated peak).
        solver: a key of `SOLVERS`.
        pinned: tag targets never recomputed (for a graph).
        options: the solver's options.

    Returns:
        One `ParetoPoint` per budget, from the smallest budget up.
    """
    if isinstance(graph_or_problem, RecomputeProblem):
        problem = graph_or_problem
    else:
        if op_time_s is None:
            raise ValueError("pareto_front(graph, ...) needs op_time_s")
        problem = RecomputeProblem.from_graph(graph_or_problem, op_time_s, pinned)
    budgets_bytes, known = sweep_budgets(problem, n_points, budget_kind, options)
    return sweep_points(problem, budgets_bytes, budget_kind=budget_kind, solver=solver, options=options, known=known)
