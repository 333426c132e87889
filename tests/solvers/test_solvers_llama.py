"""Solvers on a real joint graph: a tiny litgpt Llama (2 layers) traced once on CPU."""

import pytest

from remat_opt.core.plan import derive, storage_bytes_of

from remat_opt.core.simulation import simulate_peak_bytes

from remat_opt.core.checker import check_plan
from remat_opt.core.problem import RecomputeProblem
from synthetic import proxy_op_time_s
from remat_opt.solvers import (
    ILPOptions,
    InfeasibleBudgetError,
    pareto_front,
    solve_ilp,
    solve_mincut,
    solve_save_all,
)
from remat_opt.core.layers import find_repeated_blocks


@pytest.fixture(scope="module")
def problem(executors) -> RecomputeProblem:
    from remat_opt.tracing.capture import analyze
    from remat_opt.models.by_name import ModelSpec, build_model

    model, inputs = build_model(ModelSpec("Llama-2-7b-hf", n_layer=2, device="cpu", tiny=True))
    graph = analyze(model, *inputs, executors=executors("fused"))
    return RecomputeProblem.from_graph(graph, proxy_op_time_s(graph))


def _assert_own_optima(points) -> None:
    """The ILP's plan at each budget was optimal, so `sweep_points` kept it: the curve never gets
    slower as the budget grows by itself, not because an earlier plan was substituted."""
    for p in points:
        assert p.plan.status == "optimal" and not p.substituted, p
    for low, high in zip(points, points[1:]):
        assert low.extra_time_s >= high.extra_time_s


def test_pareto_front_from_the_minimum_to_save_all(problem):
    graph = problem.graph
    points = pareto_front(problem, n_points=6)
    print("\nbudget_bytes saved_bytes peak_bytes extra_time_ms tags")
    for p in points:
        tags = len(p.plan.recomputed_tag_targets)
        print(p.swept_budget_bytes, p.saved_bytes, p.peak_bytes, round(p.extra_time_s * 1e3, 4), tags)
    # The first budget is the least any plan meets: the model has no plan one byte below it.
    with pytest.raises(InfeasibleBudgetError):
        solve_ilp(problem, activation_budget_bytes=points[0].swept_budget_bytes - 1)
    # The last is what Thunder saves by default (from the graph), where nothing needs recomputing.
    assert points[-1].swept_budget_bytes == graph.saved_activation_bytes and points[-1].extra_time_s == 0.0
    _assert_own_optima(points)
    for p in points:
        assert check_plan(graph, p.plan, activation_budget_bytes=p.swept_budget_bytes, pinned=problem.pinned,
                          op_time_s=problem.op_time_s) == []
        derived = derive(graph, p.plan.recomputed_tag_targets).saved
        assert p.saved_bytes == storage_bytes_of(graph, derived) <= p.swept_budget_bytes


def test_peak_pareto_front_is_monotone(problem):
    points = pareto_front(problem, n_points=4, budget_kind="peak")
    _assert_own_optima(points)
    for p in points:
        assert p.peak_bytes == simulate_peak_bytes(problem.graph, p.plan.recomputed_tag_targets) <= p.swept_budget_bytes


def test_ilp_optimum_is_no_slower_than_mincut(problem):
    budget = solve_save_all(problem).saved_bytes // 2
    ilp, mincut = solve_ilp(problem, activation_budget_bytes=budget), solve_mincut(problem, activation_budget_bytes=budget)
    for plan in (ilp, mincut):
        assert check_plan(problem.graph, plan, activation_budget_bytes=budget, op_time_s=problem.op_time_s) == []
    assert ilp.status == "optimal"
    assert ilp.extra_time_s <= mincut.extra_time_s + 1e-12


def test_no_budget_mincut_recomputes_only_what_frees_memory(problem):
    plan = solve_mincut(problem)
    assert plan.saved_bytes <= solve_save_all(problem).saved_bytes
    assert check_plan(problem.graph, plan, op_time_s=problem.op_time_s) == []


def test_tied_blocks_give_a_valid_plan_no_faster_than_the_untied_optimum(problem):
    blocks = find_repeated_blocks(problem.graph)
    assert blocks is not None and blocks.count == 2
    budget = solve_save_all(problem).saved_bytes // 2
    tied = solve_ilp(problem, activation_budget_bytes=budget, options=ILPOptions(tie_blocks=True))
    untied = solve_ilp(problem, activation_budget_bytes=budget, options=ILPOptions(tie_blocks=False))
    assert any("tied 2 repeated blocks" in note for note in tied.notes)
    assert check_plan(problem.graph, tied, activation_budget_bytes=budget, op_time_s=problem.op_time_s) == []
    assert untied.status == "optimal"  # so no plan within the budget, tied or not, is faster
    assert tied.extra_time_s >= untied.extra_time_s - 1e-12


def test_no_budget_recomputes_only_views_and_says_so(problem):
    # with neither budget, the plan is the least memory among plans adding no recompute time
    from remat_opt.planning.explanation import explain_step
    from remat_opt.planning.planner import PlanRequest, plan_step

    step = plan_step(problem.graph, PlanRequest.create(device_spec="cpu"))
    recomputed = [row for row in explain_step(step).rows if row.action == "recompute"]
    assert step.plan.extra_time_s == 0
    assert recomputed, "this graph has views worth re-deriving"
    assert all("no cost" in row.reason and "budget" not in row.reason for row in recomputed), recomputed
