"""Property tests over 200 seeded random joint graphs (<= 10 allowed recompute units each).

Brute force enumerates every set of allowed units and evaluates it with `remat_opt.plan` alone
(the independent derivation and saved-bytes count), never with the solvers' model. Peak-budget
properties are in `test_solvers_peak.py`.
"""

import functools

import pytest

from remat_opt.plan import check_plan, derive, storage_bytes_of
from remat_opt.problem import RecomputeProblem
from remat_opt.solvers import (
    SOLVERS,
    ILPOptions,
    InfeasibleBudgetError,
    solve_ilp,
    solve_mincut,
    solve_recompute_all,
    solve_save_all,
)
from synthetic import random_joint_graph, random_problem

SEEDS = range(200)


_problem = functools.cache(random_problem)


@functools.cache
def _brute_force(seed: int) -> tuple[tuple[int, float], ...]:
    """(saved bytes, extra time) of every set of allowed units."""
    problem = _problem(seed)
    units = problem.allowed_units
    assert len(units) <= 16
    results = []
    for mask in range(1 << len(units)):
        targets = {t for i, u in enumerate(units) if mask >> i & 1 for t in problem.units[u].tag_targets}
        derivation = derive(problem.graph, targets)
        extra = sum(problem.op_time_s[o] for o in derivation.demanded_ops)
        results.append((storage_bytes_of(problem.graph, derivation.saved), extra))
    return tuple(results)


def _level(seed: int, level: str) -> int:
    values = sorted({r[0] for r in _brute_force(seed)})
    return {"min": values[0], "mid": values[len(values) // 2], "high": values[-1]}[level]


@pytest.mark.parametrize("seed", SEEDS)
def test_plans_pass_the_checker_and_ilp_le_mincut_le_recompute_all(seed):
    problem = _problem(seed)
    recompute_all = solve_recompute_all(problem)
    budget = (recompute_all.saved_bytes + solve_save_all(problem).saved_bytes) // 2
    ilp, mincut = solve_ilp(problem, budget_bytes=budget), solve_mincut(problem, budget_bytes=budget)
    for plan in (ilp, mincut, recompute_all, solve_save_all(problem)):
        assert check_plan(problem.graph, plan, pinned=problem.pinned, op_time_s=problem.op_time_s) == []
    assert max(ilp.saved_bytes, mincut.saved_bytes) <= budget
    assert ilp.extra_time_s <= mincut.extra_time_s + 1e-12
    assert mincut.extra_time_s <= recompute_all.extra_time_s + 1e-12


@pytest.mark.parametrize("level", ["min", "mid", "high"])
@pytest.mark.parametrize("seed", SEEDS)
def test_ilp_equals_brute_force_under_a_saved_budget(seed, level):
    budget = _level(seed, level)
    plan = solve_ilp(_problem(seed), budget_bytes=budget)
    assert plan.status == "optimal" and plan.gap == 0.0
    assert plan.extra_time_s == pytest.approx(min(t for b, t in _brute_force(seed) if b <= budget), abs=1e-12)
    assert check_plan(_problem(seed).graph, plan, budget_bytes=budget) == []


@pytest.mark.parametrize("seed", SEEDS[::2])
def test_infeasible_saved_budget_names_the_minimum(seed):
    minimum = _level(seed, "min")
    if minimum == 0:
        pytest.skip("every activation can be recomputed: no budget is infeasible")
    with pytest.raises(InfeasibleBudgetError, match=f"budget_bytes={minimum - 1} < minimum feasible {minimum}$"):
        solve_ilp(_problem(seed), budget_bytes=minimum - 1)


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_solvers_share_one_signature(name):
    problem = _problem(1)
    plan = SOLVERS[name](problem, budget_bytes=None, peak_budget_bytes=None)
    assert plan.solver == name
    assert check_plan(problem.graph, plan, op_time_s=problem.op_time_s) == []


def test_time_out_returns_a_checked_plan():
    graph = random_joint_graph(7, n_ops=(400, 400))
    times = {op.name: (i % 7 + 1) * 1e-6 for i, op in enumerate(graph.forward_ops)}
    problem = RecomputeProblem.from_graph(graph, times)
    budget = solve_save_all(problem).saved_bytes // 3
    options = ILPOptions(time_limit_s=0.05, num_workers=1, tiebreak_saved_bytes=False)
    plan = solve_ilp(problem, budget_bytes=budget, options=options)
    assert plan.status in ("optimal", "feasible", "fallback")
    assert plan.status != "feasible" or plan.gap >= 0.0
    assert plan.saved_bytes <= budget
    assert check_plan(problem.graph, plan, op_time_s=problem.op_time_s) == []


@pytest.mark.parametrize("seed", range(10))
def test_pareto_never_slower_at_a_larger_budget(seed):
    from remat_opt.solvers import pareto_front

    problem = random_problem(seed)
    for budget in ("saved", "peak"):
        points = pareto_front(problem, n_points=5, budget=budget)
        times = [p.extra_time_s for p in points]
        assert times == sorted(times, reverse=True), (budget, times)
        assert all((p.peak_bytes if budget == "peak" else p.saved_bytes) <= p.budget_bytes for p in points)
