"""Solvers on a real joint graph: a tiny litgpt Llama (2 layers) traced once on CPU."""

import pytest

from remat_opt.plan import check_plan
from remat_opt.problem import RecomputeProblem
from synthetic import proxy_op_time_s
from remat_opt.solvers import (
    ILPOptions,
    minimum_saved_bytes,
    pareto_front,
    solve_ilp,
    solve_mincut,
    solve_recompute_all,
    solve_save_all,
)
from remat_opt.layers import find_repeated_blocks


@pytest.fixture(scope="module")
def problem(executors) -> RecomputeProblem:
    from remat_opt.extract import analyze
    from remat_opt.models import ModelSpec, build_model

    model, inputs = build_model(ModelSpec("Llama-2-7b-hf", n_layer=2, device="cpu", tiny=True))
    graph = analyze(model, *inputs, executors=executors("fused"))
    return RecomputeProblem.from_graph(graph, proxy_op_time_s(graph))


def test_pareto_front_from_the_minimum_to_save_all(problem):
    points = pareto_front(problem, n_points=6)
    print("\nbudget_bytes saved_bytes peak_bytes extra_time_ms tags")
    for p in points:
        tags = len(p.plan.recomputed_tag_targets)
        print(p.budget_bytes, p.saved_bytes, p.peak_bytes, round(p.extra_time_s * 1e3, 4), tags)
    assert points[0].budget_bytes == minimum_saved_bytes(problem)
    assert points[-1].budget_bytes == solve_save_all(problem).saved_bytes and points[-1].extra_time_s == 0.0
    for low, high in zip(points, points[1:]):
        assert low.extra_time_s >= high.extra_time_s
    for p in points:
        assert p.saved_bytes <= p.budget_bytes
        assert check_plan(problem.graph, p.plan, pinned=problem.pinned, op_time_s=problem.op_time_s) == []


def test_peak_pareto_front_is_monotone(problem):
    points = pareto_front(problem, n_points=4, budget="peak")
    for low, high in zip(points, points[1:]):
        assert low.extra_time_s >= high.extra_time_s
    assert all(p.peak_bytes <= p.budget_bytes for p in points)


def test_ilp_then_mincut_then_recompute_all(problem):
    budget = solve_save_all(problem).saved_bytes // 2
    ilp, mincut = solve_ilp(problem, budget_bytes=budget), solve_mincut(problem, budget_bytes=budget)
    everything = solve_recompute_all(problem)
    assert ilp.status == "optimal"
    assert ilp.extra_time_s <= mincut.extra_time_s <= everything.extra_time_s


def test_no_budget_mincut_recomputes_only_what_frees_memory(problem):
    plan = solve_mincut(problem)
    assert plan.saved_bytes <= solve_save_all(problem).saved_bytes
    assert check_plan(problem.graph, plan, op_time_s=problem.op_time_s) == []


def test_tied_blocks_give_a_valid_plan_no_faster_than_the_untied_optimum(problem):
    blocks = find_repeated_blocks(problem.graph)
    assert blocks is not None and blocks.count == 2
    budget = solve_save_all(problem).saved_bytes // 2
    tied = solve_ilp(problem, budget_bytes=budget, options=ILPOptions(tie_blocks=True))
    untied = solve_ilp(problem, budget_bytes=budget, options=ILPOptions(tie_blocks=False))
    assert any("tied 2 repeated blocks" in note for note in tied.notes)
    assert tied.saved_bytes <= budget
    assert tied.extra_time_s >= untied.extra_time_s - 1e-12
