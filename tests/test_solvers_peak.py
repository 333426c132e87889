"""Peak-budget properties over seeded random joint graphs, against brute force by simulation.

Brute force enumerates every set of allowed units and simulates it with `remat_opt.plan` alone.
"""

import functools

import pytest

from remat_opt.plan import check_plan, derive, simulate_step
from remat_opt.solvers import InfeasibleBudgetError, solve_ilp, solve_mincut
from synthetic import random_problem

SEEDS = range(0, 200, 4)


_problem = functools.cache(random_problem)


@functools.cache
def _brute_force(seed: int) -> tuple[tuple[int, float], ...]:
    """(simulated peak, extra time) of every set of allowed units."""
    problem = _problem(seed)
    units = problem.allowed_units
    results = []
    for mask in range(1 << len(units)):
        targets = {t for i, u in enumerate(units) if mask >> i & 1 for t in problem.units[u].tag_targets}
        extra = sum(problem.op_time_s[o] for o in derive(problem.graph, targets).demanded_ops)
        results.append((simulate_step(problem.graph, targets).peak_bytes, extra))
    return tuple(results)


def _level(seed: int, level: str) -> int:
    values = sorted({r[0] for r in _brute_force(seed)})
    return {"min": values[0], "mid": values[len(values) // 2]}[level]


@pytest.mark.parametrize("level", ["min", "mid"])
@pytest.mark.parametrize("seed", SEEDS)
def test_ilp_equals_brute_force_under_a_peak_budget(seed, level):
    budget = _level(seed, level)
    plan = solve_ilp(_problem(seed), peak_budget_bytes=budget)
    assert plan.peak_bytes <= budget and plan.status == "optimal"
    assert plan.extra_time_s == pytest.approx(min(t for p, t in _brute_force(seed) if p <= budget), abs=1e-12)
    assert check_plan(_problem(seed).graph, plan, peak_budget_bytes=budget) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_mincut_meets_a_peak_budget_or_says_why(seed):
    budget = _level(seed, "mid")
    try:
        plan = solve_mincut(_problem(seed), peak_budget_bytes=budget)
    except InfeasibleBudgetError as e:
        assert e.minimum > budget
        return
    assert plan.peak_bytes <= budget
    assert plan.extra_time_s >= solve_ilp(_problem(seed), peak_budget_bytes=budget).extra_time_s - 1e-12


@pytest.mark.parametrize("seed", SEEDS[::2])
def test_infeasible_peak_budget_names_the_minimum(seed):
    minimum = _level(seed, "min")
    with pytest.raises(InfeasibleBudgetError, match=f"peak_budget_bytes={minimum - 1} < minimum feasible {minimum}$"):
        solve_ilp(_problem(seed), peak_budget_bytes=minimum - 1)
