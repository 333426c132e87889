"""Reference plans every solver is compared with (Checkmate's checkpoint-all and recompute-all)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from remat_opt.core.plan import RematPlan
from remat_opt.core.problem import RecomputeProblem
from remat_opt.solvers._common import Budgets, checked, raise_if_over


@dataclass(frozen=True, slots=True)
class BaselineOptions:
    """Baselines take no options; the dataclass keeps the solver signature uniform."""


def _fixed_plan(problem, units, name, activation_budget_bytes, peak_budget_bytes) -> RematPlan:
    start = time.perf_counter()
    plan = problem.plan_for(
        units,
        solver=name,
        status="heuristic",
        solve_time_s=0.0,
        activation_budget_bytes=activation_budget_bytes,
        peak_budget_bytes=peak_budget_bytes,
    )
    # Building the plan (demand walk, peak simulation) is the whole solve: time it, not the call's arguments.
    plan = replace(plan, solve_time_s=time.perf_counter() - start)
    budgets = Budgets(activation_budget_bytes, peak_budget_bytes)
    raise_if_over(plan, budgets, minimum_saved=plan.saved_bytes, minimum_peak=plan.peak_bytes)
    return checked(problem, plan)


def solve_save_all(
    problem: RecomputeProblem,
    *,
    activation_budget_bytes: int | None = None,
    peak_budget_bytes: int | None = None,
    options: BaselineOptions = BaselineOptions(),
) -> RematPlan:
    """Saves every tensor the backward reads (Thunder's default); raises if over a budget."""
    return _fixed_plan(problem, (), "save_all", activation_budget_bytes, peak_budget_bytes)


def solve_recompute_all(
    problem: RecomputeProblem,
    *,
    activation_budget_bytes: int | None = None,
    peak_budget_bytes: int | None = None,
    options: BaselineOptions = BaselineOptions(),
) -> RematPlan:
    """Tags every allowed unit: everything recomputable is recomputed; raises if over a budget."""
    return _fixed_plan(problem, problem.allowed_units, "recompute_all", activation_budget_bytes, peak_budget_bytes)
