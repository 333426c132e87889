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


@dataclass(frozen=True, slots=True)
class ParetoPoint:
    """One plan of the front.

    Attributes:
        budget_bytes: the budget it was solved for (saved or peak bytes, per `pareto`'s `budget`).
        peak_bytes: its simulated peak.
        saved_bytes: its saved bytes.
        extra_time_s: its recompute time.
        plan: the plan.
        substituted: True when `plan` is not the solver's own plan at this budget but a faster one
            that fits, found at a smaller budget or while bounding the sweep (see `sweep_points`).
    """

    budget_bytes: int
    peak_bytes: int
    saved_bytes: int
    extra_time_s: float
    plan: RematPlan
    substituted: bool = False


def _budget_range(problem: RecomputeProblem, budget: str, options) -> tuple[int, int, tuple[RematPlan, ...]]:
    """(least budget, save-all's budget, plans at the least budget already known)."""
    ilp_options = options if isinstance(options, ILPOptions) else ILPOptions()
    save_all = solve_save_all(problem)
    if budget == "saved":
        return minimum_saved_bytes(problem, ilp_options), save_all.saved_bytes, ()
    start_s = time.perf_counter()
    found = minimum_peak(problem, ilp_options)
    note = "the least-peak plan found while bounding the sweep"
    plan = problem.plan_for(found.units, solver="ilp", status="fallback", peak_budget_bytes=found.best_bytes,
                            solve_time_s=0.0, notes=(note,))
    plan = replace(plan, solve_time_s=time.perf_counter() - start_s)  # building the plan included
    return found.best_bytes, save_all.peak_bytes, (checked(problem, plan),)


def sweep_budgets(problem: RecomputeProblem, n_points: int, budget: str = "saved", options=None):
    """``(budgets, known)``: `n_points` budgets evenly spaced from the least feasible to save-all's,
    and the plans already known at the least one (for peak sweeps: what bounding the range found)."""
    if budget not in ("saved", "peak"):
        raise ValueError(f"budget must be 'saved' or 'peak', got {budget!r}")
    low, high, known = _budget_range(problem, budget, options)
    n_points = max(2, n_points)
    return sorted({low + (high - low) * i // (n_points - 1) for i in range(n_points)}), known


def solve_once(problem: RecomputeProblem, budget_bytes: int, budget: str = "saved", solver: str = "ilp",
               options=None) -> RematPlan:
    """The solver's plan at one budget (``"saved"`` or ``"peak"`` bytes)."""
    from remat_opt.solvers import SOLVERS

    keyword = "budget_bytes" if budget == "saved" else "peak_budget_bytes"
    extra = {} if options is None else {"options": options}
    return SOLVERS[solver](problem, **{keyword: budget_bytes}, **extra)


def _fits(plan: RematPlan, budget: str, budget_bytes: int) -> bool:
    return (plan.peak_bytes if budget == "peak" else plan.saved_bytes) <= budget_bytes


def sweep_points(problem: RecomputeProblem, budgets: Iterable[int], *, budget: str = "saved", solver: str = "ilp",
                 options=None, known: Iterable[RematPlan] = (), errors: list | None = None) -> list[ParetoPoint]:
    """Plans at ascending `budgets`; a fitting plan found earlier (or in `known`) that is faster
    replaces the solver's, so the curve never gets slower as the budget grows (the solver can stop
    at a time limit or a non-optimal peak search). Each point records whether it was substituted.

    Args:
        errors: collects ``(budget_bytes, exception)`` for budgets left without a plan; None: raise.
    """
    found, points = list(known), []
    for budget_bytes in sorted(budgets):
        plan, error = None, None
        try:
            plan = solve_once(problem, budget_bytes, budget, solver, options)
        except (TimeoutError, InfeasibleBudgetError) as e:
            error = e
        candidates = [p for p in (plan, *found) if p is not None and _fits(p, budget, budget_bytes)]
        if not candidates:
            if errors is None:
                raise error
            errors.append((budget_bytes, error))
            continue
        best = min(candidates, key=lambda p: p.extra_time_s)  # the solver's own plan on ties
        found.append(best)
        points.append(ParetoPoint(budget_bytes=budget_bytes, peak_bytes=best.peak_bytes, saved_bytes=best.saved_bytes,
                                  extra_time_s=best.extra_time_s, plan=best, substituted=best is not plan))
    return points


def pareto_front(
    graph_or_problem: JointGraph | RecomputeProblem,
    op_time_s: Mapping[str, float] | None = None,
    n_points: int = 8,
    *,
    budget: str = "saved",
    solver: str = "ilp",
    pinned: Iterable[str] = (),
    options=None,
) -> list[ParetoPoint]:
    """Plans at `n_points` budgets evenly spaced from the minimum feasible budget to save-all's.

    Args:
        graph_or_problem: a `JointGraph` (then `op_time_s` is required) or a `RecomputeProblem`.
        op_time_s: op name -> seconds, for a graph.
        n_points: number of budgets (at least 2: the minimum and save-all).
        budget: ``"saved"`` (bound saved bytes) or ``"peak"`` (bound the simulated peak).
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
    budgets, known = sweep_budgets(problem, n_points, budget, options)
    return sweep_points(problem, budgets, budget=budget, solver=solver, options=options, known=known)
