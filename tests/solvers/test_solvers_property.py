"""Property tests over 200 seeded random joint graphs (<= 10 allowed recompute units each).

Brute force enumerates every set of allowed units and evaluates it with `remat_opt.core.plan` alone
(the independent derivation and saved-bytes count), never with the solvers' model. Peak-budget
properties are in `test_solvers_peak.py`.
"""

import functools
import types

import pytest

from remat_opt.core.plan import derive, storage_bytes_of

from remat_opt.core.checker import check_plan
from remat_opt.core.problem import RecomputeProblem
from remat_opt.solvers import (
    SOLVERS,
    ILPOptions,
    InfeasibleBudgetError,
    pareto_front,
    solve_ilp,
    solve_mincut,
    solve_recompute_all,
    solve_save_all,
)
from remat_opt.solvers import baselines
from remat_opt.solvers.pareto import sweep_points
from synthetic import chain_graph, random_joint_graph, random_problem, stacked_blocks_graph

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


def _fastest_within(seed: int, budget: int) -> float:
    """The least extra time of any set of units whose saved bytes fit `budget` (brute force)."""
    return min(t for b, t in _brute_force(seed) if b <= budget)


def _independent_saved_bytes(graph, plan) -> int:
    """Saved bytes of `plan`'s tag targets, derived from the graph alone (not the plan's field)."""
    return storage_bytes_of(graph, derive(graph, plan.recomputed_tag_targets).saved)


@pytest.mark.parametrize("seed", SEEDS)
def test_plans_pass_the_checker_and_mincut_is_no_faster_than_brute_force(seed):
    problem, graph = _problem(seed), _problem(seed).graph
    recompute_all = solve_recompute_all(problem)
    budget = (recompute_all.saved_bytes + solve_save_all(problem).saved_bytes) // 2
    ilp, mincut = solve_ilp(problem, activation_budget_bytes=budget), solve_mincut(problem, activation_budget_bytes=budget)
    for plan in (ilp, mincut, recompute_all, solve_save_all(problem)):
        assert check_plan(graph, plan, pinned=problem.pinned, op_time_s=problem.op_time_s) == []
    for plan in (ilp, mincut):
        assert check_plan(graph, plan, activation_budget_bytes=budget, pinned=problem.pinned) == []
        assert _independent_saved_bytes(graph, plan) <= budget
    optimum = _fastest_within(seed, budget)
    assert ilp.status == "optimal" and ilp.extra_time_s == pytest.approx(optimum, abs=1e-12)
    assert optimum <= mincut.extra_time_s + 1e-12  # no plan within the budget beats the enumeration


@pytest.mark.parametrize("level", ["min", "mid", "high"])
@pytest.mark.parametrize("seed", SEEDS)
def test_ilp_equals_brute_force_under_a_saved_budget(seed, level):
    budget = _level(seed, level)
    plan = solve_ilp(_problem(seed), activation_budget_bytes=budget)
    assert plan.status == "optimal" and plan.gap == 0.0
    assert plan.extra_time_s == pytest.approx(_fastest_within(seed, budget), abs=1e-12)
    assert check_plan(_problem(seed).graph, plan, activation_budget_bytes=budget) == []


@pytest.mark.parametrize("seed", SEEDS[::2])
def test_infeasible_saved_budget_names_the_minimum(seed):
    minimum = _level(seed, "min")
    if minimum == 0:
        pytest.skip("every activation can be recomputed: no budget is infeasible")
    with pytest.raises(InfeasibleBudgetError, match=f"activation_budget_bytes={minimum - 1} < minimum feasible {minimum}$"):
        solve_ilp(_problem(seed), activation_budget_bytes=minimum - 1)


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_solvers_share_one_signature(name):
    problem = _problem(1)
    if name in ("per_block", "layered"):  # need repeated layers, which random graphs lack
        graph = stacked_blocks_graph(4, seed=1)
        problem = RecomputeProblem.from_graph(graph, {op.name: 1e-3 for op in graph.forward_ops})
    plan = SOLVERS[name](problem, activation_budget_bytes=None, peak_budget_bytes=None)
    assert plan.solver == name
    assert check_plan(problem.graph, plan, op_time_s=problem.op_time_s) == []


def test_time_out_returns_a_checked_plan():
    graph = random_joint_graph(7, n_ops=(400, 400))
    times = {op.name: (i % 7 + 1) * 1e-6 for i, op in enumerate(graph.forward_ops)}
    problem = RecomputeProblem.from_graph(graph, times)
    budget = solve_save_all(problem).saved_bytes // 3
    options = ILPOptions(time_limit_s=0.05, num_workers=1, tiebreak_saved_bytes=False)
    plan = solve_ilp(problem, activation_budget_bytes=budget, options=options)
    assert plan.status in ("optimal", "feasible", "fallback")
    assert plan.status != "feasible" or plan.gap >= 0.0
    assert check_plan(problem.graph, plan, activation_budget_bytes=budget, op_time_s=problem.op_time_s) == []
    assert _independent_saved_bytes(problem.graph, plan) <= budget


@pytest.mark.parametrize("seed", range(10))
def test_saved_pareto_points_are_the_ilps_own_optima_within_budget(seed):
    problem, graph = _problem(seed), _problem(seed).graph
    points = pareto_front(problem, n_points=5, budget_kind="activation")
    save_all_bytes = _brute_force(seed)[0][0]  # mask 0: no unit tagged
    assert (points[0].swept_budget_bytes, points[-1].swept_budget_bytes) == (_level(seed, "min"), save_all_bytes)
    for p in points:
        # The solver's plan was optimal, so nothing replaced it: its own time is the brute-force optimum
        # at that budget (the curve is monotone by itself, not because `sweep_points` patched it).
        assert p.plan.status == "optimal" and not p.substituted, p
        assert p.extra_time_s == pytest.approx(_fastest_within(seed, p.swept_budget_bytes), abs=1e-12)
        assert check_plan(graph, p.plan, activation_budget_bytes=p.swept_budget_bytes, op_time_s=problem.op_time_s) == []
        assert p.saved_bytes == _independent_saved_bytes(graph, p.plan) <= p.swept_budget_bytes
    times = [p.extra_time_s for p in points]
    assert times == sorted(times, reverse=True)


def _chain_problem() -> RecomputeProblem:
    graph = chain_graph(4)  # x -> t0 -> t1 -> t2 -> t3 (output); t0..t2 saved, 1024 bytes each
    return RecomputeProblem.from_graph(graph, {op.name: 1e-6 for op in graph.forward_ops})


def test_sweep_records_a_faster_known_plan_it_substitutes():
    problem = _chain_problem()
    save_all = solve_save_all(problem)
    assert save_all.saved_bytes == 3 * 1024 and save_all.extra_time_s == 0.0
    # recompute-all's own plan at any budget reruns t0..t2 (3 us, 0 bytes); save-all fits from 3072 bytes
    low, high = sweep_points(problem, [3 * 1024 - 1, 3 * 1024], solver="recompute_all", known=(save_all,))
    assert not low.substituted and low.plan.solver == "recompute_all"
    assert (low.saved_bytes, low.extra_time_s) == (0, pytest.approx(3e-6))
    assert high.substituted and high.plan is save_all
    assert (high.saved_bytes, high.extra_time_s) == (3 * 1024, 0.0)


def test_sweep_substitutes_a_known_plan_where_the_solver_has_none():
    problem = _chain_problem()
    recompute_all = solve_recompute_all(problem)  # 0 saved bytes: save-all's solver cannot meet 1024
    (point,) = sweep_points(problem, [1024], solver="save_all", known=(recompute_all,))
    assert point.substituted and point.plan is recompute_all
    with pytest.raises(InfeasibleBudgetError):
        sweep_points(problem, [1024], solver="save_all")


def test_baseline_solve_time_covers_building_the_plan(monkeypatch):
    """A baseline's solve time is the time to build its plan (it used to be measured before)."""
    clock = [100.0]
    monkeypatch.setattr(baselines, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    real_plan_for = RecomputeProblem.plan_for

    def slow_plan_for(self, *args, **kwargs):
        plan = real_plan_for(self, *args, **kwargs)
        clock[0] += 2.5  # building the plan takes 2.5 s on the fake clock
        return plan

    monkeypatch.setattr(RecomputeProblem, "plan_for", slow_plan_for)
    for solve in (solve_save_all, solve_recompute_all):
        assert solve(_chain_problem()).solve_time_s == 2.5
