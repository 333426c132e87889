"""Peak-budget properties over seeded random joint graphs, against brute force by simulation.

Brute force enumerates every set of allowed units and simulates it with `remat_opt.core.plan` alone.
"""

import functools

import pytest

from remat_opt.core.plan import derive

from remat_opt.core.simulation import simulate_peak_bytes, simulate_step

from remat_opt.core.checker import check_plan
from remat_opt.solvers import InfeasibleBudgetError, pareto_front, solve_ilp, solve_mincut
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


def _fastest_within(seed: int, budget: int) -> float:
    """The least extra time of any set of units whose simulated peak fits `budget` (brute force)."""
    return min(t for p, t in _brute_force(seed) if p <= budget)


@pytest.mark.parametrize("level", ["min", "mid"])
@pytest.mark.parametrize("seed", SEEDS)
def test_ilp_equals_brute_force_under_a_peak_budget(seed, level):
    budget = _level(seed, level)
    plan = solve_ilp(_problem(seed), peak_budget_bytes=budget)
    assert plan.peak_bytes <= budget and plan.status == "optimal"
    assert plan.extra_time_s == pytest.approx(_fastest_within(seed, budget), abs=1e-12)
    assert check_plan(_problem(seed).graph, plan, peak_budget_bytes=budget) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_mincut_meets_a_peak_budget_its_baselines_reach(seed):
    """Min-cut's candidates include save-all and recompute-all (mask 0 and the all-units mask of
    the enumeration): at the lesser of their simulated peaks it must return a plan within it."""
    problem = _problem(seed)
    brute = _brute_force(seed)
    budget = min(brute[0][0], brute[-1][0])
    plan = solve_mincut(problem, peak_budget_bytes=budget)
    assert check_plan(problem.graph, plan, peak_budget_bytes=budget, op_time_s=problem.op_time_s) == []
    assert simulate_step(problem.graph, plan.recomputed_tag_targets).peak_bytes <= budget
    assert plan.extra_time_s >= _fastest_within(seed, budget) - 1e-12


@pytest.mark.parametrize("seed", SEEDS)
def test_mincut_below_the_least_peak_raises_naming_a_reachable_minimum(seed):
    least = _level(seed, "min")  # the least simulated peak of any plan
    with pytest.raises(InfeasibleBudgetError) as raised:
        solve_mincut(_problem(seed), peak_budget_bytes=least - 1)
    assert raised.value.kind == "peak_budget_bytes" and raised.value.budget == least - 1
    assert raised.value.minimum >= least  # no plan, min-cut's included, goes below the true minimum
    assert raised.value.minimum in {p for p, _ in _brute_force(seed)}  # the peak of a real plan


@pytest.mark.parametrize("seed", SEEDS[::2])
def test_infeasible_peak_budget_names_the_minimum(seed):
    minimum = _level(seed, "min")
    with pytest.raises(InfeasibleBudgetError, match=f"peak_budget_bytes={minimum - 1} < minimum feasible {minimum}$"):
        solve_ilp(_problem(seed), peak_budget_bytes=minimum - 1)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_peak_budget_at_the_minimum_an_error_names_is_met(seed):
    """Whatever the solver's handicap (here no model-budget trials at all), the least peak an
    infeasible budget's error names is a budget the solver then meets (its fallback includes the
    plan that reached it; seed 16 needs it)."""
    from remat_opt.solvers.ilp_model import ILPOptions

    options = ILPOptions(exact_peak=False, max_shrinks=0)
    with pytest.raises(InfeasibleBudgetError) as raised:
        solve_ilp(_problem(seed), peak_budget_bytes=1, options=options)
    minimum = raised.value.minimum
    plan = solve_ilp(_problem(seed), peak_budget_bytes=minimum, options=options)
    assert simulate_peak_bytes(_problem(seed).graph, plan.recomputed_tag_targets) <= minimum


@pytest.mark.parametrize("seed", SEEDS[:10])
def test_peak_pareto_points_are_the_ilps_own_optima_within_budget(seed):
    problem, graph = _problem(seed), _problem(seed).graph
    points = pareto_front(problem, n_points=5, budget_kind="peak")
    assert (points[0].swept_budget_bytes, points[-1].swept_budget_bytes) == (_level(seed, "min"), _brute_force(seed)[0][0])
    for p in points:
        # The solver's plan was optimal, so nothing replaced it: its own time is the brute-force optimum
        # at that budget (the curve is monotone by itself, not because `sweep_points` patched it).
        assert p.plan.status == "optimal" and not p.substituted, p
        assert p.extra_time_s == pytest.approx(_fastest_within(seed, p.swept_budget_bytes), abs=1e-12)
        assert check_plan(graph, p.plan, peak_budget_bytes=p.swept_budget_bytes, op_time_s=problem.op_time_s) == []
        assert p.peak_bytes == simulate_peak_bytes(graph, p.plan.recomputed_tag_targets) <= p.swept_budget_bytes
    times = [p.extra_time_s for p in points]
    assert times == sorted(times, reverse=True)


@pytest.mark.parametrize("seed", range(0, 40, 4))
def test_rows_found_at_one_budget_serve_the_next_with_the_same_optima(seed, monkeypatch):
    """`ilp_peak.LearnedRows`: the peak and schedule rows a solve found binding start every later
    solve of the same problem. The optima are those of solving each budget from scratch, in either
    order of budgets, never with more CP-SAT solves in all; seed 0's graph needs rows beyond the
    initial ones (21 solves from scratch, 15 with the rows kept)."""
    from remat_opt.solvers.ilp_model import ILPModel, ILPOptions
    from remat_opt.solvers.ilp_peak import _LEARNED

    problem = random_problem(seed)  # not the cached one: other tests' solves would have taught it rows
    options = ILPOptions(time_limit_s=30.0)
    low, high = simulate_peak_bytes(problem.graph, problem.allowed_units), simulate_peak_bytes(problem.graph, ())
    budgets = [low + (high - low) * k // 8 for k in range(1, 8)]
    solves = []
    monkeypatch.setattr(ILPModel, "solve", lambda form, clock, hint=None, _solve=ILPModel.solve:
                        solves.append(1) or _solve(form, clock, hint))

    def sweep(order, fresh: bool):
        solves.clear()
        _LEARNED.pop(problem, None)
        found = {}
        for budget in order:
            if fresh:
                _LEARNED.pop(problem, None)
            try:
                plan = solve_ilp(problem, peak_budget_bytes=budget, options=options)
            except InfeasibleBudgetError as error:
                found[budget] = ("infeasible", error.minimum)
                continue
            assert plan.status == "optimal" and plan.peak_bytes <= budget
            found[budget] = round(plan.extra_time_s, 12)
        return found, len(solves)

    alone, alone_solves = sweep(budgets, fresh=True)
    for order in (budgets, budgets[::-1]):
        learned, learned_solves = sweep(order, fresh=False)
        assert learned == alone
        assert learned_solves <= alone_solves
        assert seed != 0 or learned_solves < alone_solves
