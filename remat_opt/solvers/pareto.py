"""Pareto front of (peak bytes, saved bytes, extra recompute time) over a range of budgets."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from remat_opt.graph import JointGraph
from remat_opt.plan import RematPlan
from remat_opt.problem import RecomputeProblem


@dataclass(frozen=True, slots=True)
class ParetoPoint:
    """One plan of the front.

    Attributes:
        budget_bytes: the budget it was solved for (saved or peak bytes, per `pareto`'s `budget`).
        peak_bytes: its simulated peak.
        saved_bytes: its saved bytes.
        extra_time_s: its recompute time.
        plan: the plan.
    """

    budget_bytes: int
    peak_bytes: int
    saved_bytes: int
    extra_time_s: float
    plan: RematPlan


def _budget_range(problem: RecomputeProblem, budget: str, options) -> tuple[int, int]:
    from remat_opt.solvers.baselines import solve_save_all
    from remat_opt.solvers.ilp import ILPOptions, minimum_peak_bytes, minimum_saved_bytes

    ilp_options = options if isinstance(options, ILPOptions) else ILPOptions()
    save_all = solve_save_all(problem)
    if budget == "saved":
        return minimum_saved_bytes(problem, ilp_options), save_all.saved_bytes
    best, _ = minimum_peak_bytes(problem, ilp_options)
    return best, save_all.peak_bytes


def pareto(
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
    from remat_opt.solvers import SOLVERS

    if isinstance(graph_or_problem, RecomputeProblem):
        problem = graph_or_problem
    else:
        if op_time_s is None:
            raise ValueError("pareto(graph, ...) needs op_time_s")
        problem = RecomputeProblem.from_graph(graph_or_problem, op_time_s, pinned)
    if budget not in ("saved", "peak"):
        raise ValueError(f"budget must be 'saved' or 'peak', got {budget!r}")
    low, high = _budget_range(problem, budget, options)
    n_points = max(2, n_points)
    budgets = sorted({low + (high - low) * i // (n_points - 1) for i in range(n_points)})
    keyword = "budget_bytes" if budget == "saved" else "peak_budget_bytes"
    extra = {} if options is None else {"options": options}
    points = []
    for b in budgets:
        plan = SOLVERS[solver](problem, **{keyword: b}, **extra)
        points.append(
            ParetoPoint(
                budget_bytes=b,
                peak_bytes=plan.peak_bytes,
                saved_bytes=plan.saved_bytes,
                extra_time_s=plan.extra_time_s,
                plan=plan,
            )
        )
    return points
