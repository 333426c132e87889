"""Repeated-block detection and tied solving on synthetic stacks of identical blocks."""

import pytest

from remat_opt.core.checker import check_plan
from remat_opt.core.problem import RecomputeProblem
from synthetic import proxy_op_time_s
from remat_opt.solvers import ILPOptions, MinCutOptions, solve_ilp, solve_mincut, solve_save_all
from remat_opt.core.layers import find_repeated_blocks
from remat_opt.solvers.blocks import block_ties
from synthetic import random_joint_graph, stacked_blocks_graph


@pytest.fixture(scope="module")
def stack() -> RecomputeProblem:
    graph = stacked_blocks_graph(6, seed=3)
    return RecomputeProblem.from_graph(graph, proxy_op_time_s(graph))


def test_detects_every_block(stack):
    blocks = find_repeated_blocks(stack.graph)
    assert (blocks.start, blocks.period, blocks.count) == (0, 10, 6)
    ties = block_ties(stack, blocks)
    assert len(ties.maps["unit"]) == 5 * 10  # every unit of blocks 1..5
    assert ties.of("unit", "p_l5_3") == "p_l0_3"


@pytest.mark.parametrize("seed", range(20))
def test_random_graphs_have_no_blocks_to_tie(seed):
    assert find_repeated_blocks(random_joint_graph(seed)) is None


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.75])
def test_tied_solvers_return_checked_plans(stack, fraction):
    budget = int(solve_save_all(stack).saved_bytes * fraction)
    tied = solve_ilp(stack, activation_budget_bytes=budget, options=ILPOptions(tie_blocks=True))
    untied = solve_ilp(stack, activation_budget_bytes=budget, options=ILPOptions(tie_blocks=False))
    cut = solve_mincut(stack, activation_budget_bytes=budget, options=MinCutOptions(tie_blocks=True))
    for plan in (tied, untied, cut):
        assert plan.saved_bytes <= budget
        assert check_plan(stack.graph, plan, op_time_s=stack.op_time_s) == []
    assert untied.extra_time_s <= tied.extra_time_s + 1e-12
    assert tied.extra_time_s <= cut.extra_time_s + 1e-12


def test_tied_peak_budget_plan_fits(stack):
    save_all = solve_save_all(stack)
    budget = int(save_all.peak_bytes * 0.9)
    plan = solve_ilp(stack, peak_budget_bytes=budget, options=ILPOptions(tie_blocks=True))
    assert plan.peak_bytes <= budget
    assert plan.status in ("optimal", "feasible") and plan.gap >= 0.0
