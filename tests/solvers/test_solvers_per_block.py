"""Per-block activation checkpointing as a named plan (`solver="per_block"`): each repeated layer
keeps what it hands on and recomputes the rest in the backward."""

from __future__ import annotations

import pytest

from remat_opt.core.layers import LayerError
from remat_opt.core.problem import RecomputeProblem
from remat_opt.solvers import SOLVERS, InfeasibleBudgetError
from remat_opt.solvers.baselines import per_block_units
from synthetic import chain_graph, stacked_blocks_graph

N_BLOCKS, BLOCK_OPS = 5, 10


@pytest.fixture(scope="module")
def problem():
    graph = stacked_blocks_graph(N_BLOCKS, seed=3, block_ops=BLOCK_OPS)
    return RecomputeProblem.from_graph(graph, {op.name: 1e-3 for op in graph.forward_ops})


def test_each_block_keeps_only_what_it_hands_on(problem):
    plan = SOLVERS["per_block"](problem)
    # stacked_blocks_graph's block k ends in l{k}_{BLOCK_OPS - 1}: the residual stream the next block
    # (or the head) reads; everything else a block computes is recomputed
    assert sorted(plan.saved_names) == sorted(f"l{k}_{BLOCK_OPS - 1}" for k in range(N_BLOCKS))
    assert plan.solver == "per_block" and plan.recomputed_tag_targets


def test_it_lies_between_save_all_and_recompute_all(problem):
    save_all, per_block, recompute_all = (SOLVERS[name](problem) for name in ("save_all", "per_block", "recompute_all"))
    assert recompute_all.saved_bytes <= per_block.saved_bytes < save_all.saved_bytes
    assert per_block.peak_bytes < save_all.peak_bytes
    assert 0 < per_block.extra_time_s <= recompute_all.extra_time_s
    assert set(per_block_units(problem)) <= set(problem.allowed_units)


def test_a_budget_it_does_not_meet_is_refused_with_its_figure(problem):
    per_block = SOLVERS["per_block"](problem)
    assert SOLVERS["per_block"](problem, peak_budget_bytes=per_block.peak_bytes).peak_bytes == per_block.peak_bytes
    with pytest.raises(InfeasibleBudgetError):
        SOLVERS["per_block"](problem, peak_budget_bytes=per_block.peak_bytes - 1)


def test_a_graph_without_repeated_layers_is_a_clear_error():
    graph = chain_graph(6)
    problem = RecomputeProblem.from_graph(graph, {op.name: 1e-3 for op in graph.forward_ops})
    with pytest.raises(LayerError, match="per-block checkpointing needs the graph's repeated layers"):
        SOLVERS["per_block"](problem)
