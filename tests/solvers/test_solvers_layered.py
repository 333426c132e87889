"""The layered solver (`solver="layered"`): per-layer menus chained by a dynamic program, checked
by simulation, with a certified gap from a CP-SAT relaxation."""

from __future__ import annotations

import itertools
import os
import random
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from remat_opt.core.errors import InfeasibleBudgetError
from remat_opt.core.layers import LayerError
from remat_opt.core.problem import RecomputeProblem
from remat_opt.planning.planner import AUTO_LAYERED_MIN_LAYERS, resolve_solver
from remat_opt.solvers import SOLVERS, ILPOptions, LayeredOptions, solve_ilp, solve_layered
from remat_opt.core.simulation import simulate_step
from remat_opt.solvers.baselines import forward_layers
from remat_opt.solvers.layered import (Decomposition, LayerClass, _chain, _menus, _regions, decomposition_of,
                                       least_peak_units)
from remat_opt.solvers._common import Budgets
from remat_opt.solvers.pareto import PEAK, sweep_budgets, sweep_points
from remat_opt.solvers.polish import polish
from remat_opt.solvers.time_bound import knapsack_time_bound
from synthetic import chain_graph, proxy_op_time_s, random_problem, stacked_blocks_graph

# Activations dominate the step (large block tensors, small gradients), as in a transformer.
ACTIVATION_HEAVY = {"inner_numels": (512, 1024, 2048), "grad_numels": (16, 64)}
OPTIONS = LayeredOptions(bound_time_limit_s=3.0, gap_tolerance=0.0)  # the polisher always runs: exact where it can be
CHAIN_ONLY = LayeredOptions(bound_time_limit_s=3.0, cp_sat_max_units=0, polish_work_events=0)


def _targets(problem, units) -> set[str]:
    return {t for u in units for t in problem.units[u].tag_targets}


def _problem(seed: int, n_blocks: int | None = None, block_ops: int | None = None) -> RecomputeProblem:
    rng = random.Random(seed)
    graph = stacked_blocks_graph(n_blocks or rng.randint(3, 6), seed=seed, block_ops=block_ops or rng.randint(8, 14),
                                 **ACTIVATION_HEAVY)
    # whole microseconds: float sums of times compare exactly with the ILP's integer times
    return RecomputeProblem.from_graph(graph, {op.name: rng.randint(1, 50) * 1e-6 for op in graph.forward_ops})


@pytest.fixture(scope="module")
def problem():
    return _problem(3, n_blocks=5, block_ops=10)


def _budgets(problem, fractions):
    low, high = SOLVERS["per_block"](problem).peak_bytes, SOLVERS["save_all"](problem).peak_bytes
    assert low < high
    return [int(low + f * (high - low)) for f in fractions]


def test_the_menus_of_several_classes_built_in_threads_are_those_built_one_by_one(problem, monkeypatch):
    (layer_class,) = decomposition_of(problem, OPTIONS).classes
    layers = layer_class.layers
    halves = [replace(layer_class, layers=layers[:2], representative=layers[0], menu=()),
              replace(layer_class, layers=layers[2:], representative=layers[3], menu=())]
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    threaded = _menus(problem, halves, OPTIONS, ())
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    one_by_one = _menus(problem, halves, OPTIONS, ())
    assert [c.menu for c in threaded] == [c.menu for c in one_by_one] and all(len(c.menu) >= 3 for c in threaded)
    assert [c.menu_time_s for c in threaded] == [c.menu_time_s for c in one_by_one]


def test_menus_span_one_layer_from_saving_all_to_per_block(problem):
    decomposition = decomposition_of(problem, OPTIONS)
    assert decomposition.n_layers == 5 and len(decomposition.classes) == 1
    (layer_class,) = decomposition.classes
    layer = layer_class.representative
    inside = layer_class.units[layer]
    assert layer_class.menu[0] == () and len(layer_class.menu) >= 3
    assert tuple(range(len(inside))) in layer_class.menu  # per-block checkpointing of the layer
    saved = decomposition.saved_bytes[layer]
    assert saved == sorted(saved, reverse=True) and saved[-1] < saved[0]
    # the times are the layer's own recompute times
    for entry, time_s in enumerate(layer_class.menu_time_s):
        assert time_s == pytest.approx(problem.extra_time_s(layer_class.units_of(layer, entry)), abs=1e-15)
    # every layer of the class, profiled on the same plan, saves the same bytes (it is the same layer)
    assert all(decomposition.saved_bytes[k] == saved for k in layer_class.layers)


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.4, 0.8])
def test_the_plan_fits_and_is_never_worse_than_the_baselines(problem, fraction):
    (budget,) = _budgets(problem, [fraction])
    plan = solve_layered(problem, peak_budget_bytes=budget, options=OPTIONS)
    assert plan.solver == "layered" and plan.peak_bytes <= budget
    for name in ("per_block", "save_all"):
        baseline = SOLVERS[name](problem)
        if baseline.peak_bytes <= budget:
            assert plan.extra_time_s <= baseline.extra_time_s
    assert plan.gap is not None and 0.0 <= plan.gap < 1.0
    assert any("certified lower bound" in note for note in plan.notes)


def test_decomposition_matches_the_exact_ilp_and_its_bound_contains_the_true_gap():
    """On random layered graphs, at budgets from per-block checkpointing's peak up: the plan is
    never faster than the ILP's proven optimum (both are checked plans), its certified lower bound
    never exceeds that optimum, a zero gap means the optimum, and the plan is the optimum in nearly
    every case (measured 2026-12-06: 46 of 46 over 16 seeds and 3 budgets; the chain alone, without
    CP-SAT's polish, 8 of 47 with these per-op random times and 28 of 48 with op times equal across
    layers). The local search (`solvers.polish`) from the chain alone's plan keeps it fitting, never
    slows it and reaches the optimum in most cases (measured 2026-12-08: 10 of these 16, where the
    chain alone reaches 3)."""
    equal, searched_equal, cases = 0, 0, 0
    for seed in range(1, 9):  # seed 0's 30% budget outlasts the ILP's limit (no-good cuts)
        problem = _problem(seed)
        for budget in _budgets(problem, [0.05, 0.3]):
            try:
                exact = solve_ilp(problem, peak_budget_bytes=budget, options=ILPOptions(tie_blocks=False, time_limit_s=10))
            except TimeoutError:  # no-good cuts on recompute transients can outlast the limit
                continue
            if exact.status != "optimal":
                continue
            plan = solve_layered(problem, peak_budget_bytes=budget, options=OPTIONS)
            bound_s = plan.extra_time_s * (1 - plan.gap)
            assert knapsack_time_bound(problem, Budgets(None, budget)) <= exact.extra_time_s + 1e-12
            assert plan.extra_time_s >= exact.extra_time_s - 1e-12, (seed, budget)
            assert bound_s <= exact.extra_time_s + 1e-12, (seed, budget, bound_s, exact.extra_time_s)
            if plan.gap == 0.0:
                assert plan.extra_time_s == pytest.approx(exact.extra_time_s, abs=1e-12)
            cases += 1
            equal += plan.extra_time_s == pytest.approx(exact.extra_time_s, abs=1e-12)
            chain = solve_layered(problem, peak_budget_bytes=budget, options=CHAIN_ONLY)
            searched = polish(problem, problem.effective_units(chain.recomputed_tag_targets), Budgets(None, budget))
            searched_peak = simulate_step(problem.graph, _targets(problem, searched.units)).peak_bytes
            assert searched_peak == searched.peak_bytes <= budget
            assert exact.extra_time_s - 1e-12 <= searched.extra_time_s <= chain.extra_time_s
            searched_equal += searched.extra_time_s == pytest.approx(exact.extra_time_s, abs=1e-12)
    assert cases >= 12 and equal >= 0.75 * cases, (equal, cases)
    assert searched_equal >= 0.5 * cases, (searched_equal, cases)


def test_a_budget_below_every_plan_names_the_least_found_and_a_proven_bound(problem):
    least = SOLVERS["save_all"](problem)
    units = least_peak_units(problem, OPTIONS)
    least_peak = problem.plan_for(units, solver="x", status="x", solve_time_s=0.0).peak_bytes
    with pytest.raises(InfeasibleBudgetError) as info:
        solve_layered(problem, peak_budget_bytes=least_peak // 2, options=OPTIONS)
    error = info.value
    assert error.minimum == least_peak and error.lower_bound <= error.minimum <= least.peak_bytes
    # the advice, followed, gives a plan
    assert solve_layered(problem, peak_budget_bytes=error.minimum, options=OPTIONS).peak_bytes <= error.minimum


def test_an_unproven_minimum_is_labelled_the_least_found():
    error = InfeasibleBudgetError("peak_budget_bytes", 24 * 10**9, 27_056_455_680, 26_989_346_816, "layered").to_gb()
    assert str(error) == ("layered: budget_gb=24 is below the least found, 27.057 GB; no plan can go below 26.990 GB "
                          "(proven): use budget_gb=27.057 or more")
    proven = InfeasibleBudgetError("peak_budget_bytes", 24 * 10**9, 27_056_455_680, solver="ilp").to_gb()
    assert "below the minimum feasible 27.057 GB: use budget_gb=27.057 or more" in str(proven)


def test_an_activation_budget_is_met(problem):
    save_all = SOLVERS["save_all"](problem)
    budget = save_all.saved_bytes // 2
    plan = solve_layered(problem, activation_budget_bytes=budget, options=OPTIONS)
    assert plan.saved_bytes <= budget and plan.extra_time_s > 0


def test_a_graph_without_repeated_layers_is_a_clear_error():
    graph = chain_graph(6)
    problem = RecomputeProblem.from_graph(graph, {op.name: 1e-3 for op in graph.forward_ops})
    with pytest.raises(LayerError, match="repeated layers"):
        solve_layered(problem, peak_budget_bytes=10**9)


def test_auto_takes_the_layered_solver_for_large_layered_graphs(problem):
    assert resolve_solver("auto", problem) == "ilp"  # small: the whole-graph ILP proves optimality
    large = _problem(1, n_blocks=AUTO_LAYERED_MIN_LAYERS, block_ops=12)
    assert resolve_solver("auto", large) == "layered"
    assert resolve_solver("mincut", large) == "mincut"


def test_a_peak_sweep_starts_at_the_least_peak_and_never_slows_down(problem):
    budgets, known = sweep_budgets(problem, 4, PEAK, OPTIONS)
    assert known[0].peak_bytes == budgets[0] == known[0].peak_budget_bytes
    points = sweep_points(problem, budgets, budget_kind=PEAK, solver="layered", options=OPTIONS, known=known)
    assert [p.swept_budget_bytes for p in points] == budgets
    for p in points:
        assert p.peak_bytes <= p.swept_budget_bytes
    for low, high in zip(points, points[1:]):
        assert low.extra_time_s >= high.extra_time_s


@pytest.mark.parametrize("seed", range(12))
def test_the_knapsack_bound_never_exceeds_the_exact_optimum(seed):
    """On random graphs (views, multi-output ops, nested units), at saved-bytes and peak budgets:
    the knapsack bound is at most the ILP's proven optimum, and says "infeasible" (None) only where
    the ILP finds no plan."""
    problem = random_problem(seed)
    save_all = SOLVERS["save_all"](problem)
    recompute_all = SOLVERS["recompute_all"](problem)
    for budgets in (Budgets(save_all.saved_bytes // 2, None), Budgets(recompute_all.saved_bytes, None),
                    Budgets(None, (save_all.peak_bytes + recompute_all.peak_bytes) // 2)):
        bound_s = knapsack_time_bound(problem, budgets)
        try:
            exact = solve_ilp(problem, activation_budget_bytes=budgets.activation_bytes,
                              peak_budget_bytes=budgets.peak_bytes, options=ILPOptions(tie_blocks=False))
        except InfeasibleBudgetError:
            continue
        assert bound_s is not None, (seed, budgets)
        if exact.status == "optimal":
            assert bound_s <= exact.extra_time_s + 1e-12, (seed, budgets, bound_s, exact.extra_time_s)


def _synthetic_decomposition(rng: random.Random, n_layers: int, n_entries: int) -> Decomposition:
    """A decomposition of one class with random (saved, excess, time) menu entries."""
    entries = [(rng.randint(50, 200), rng.randint(300, 2000), rng.randint(1, 40) * 1e-6) for _ in range(n_entries)]
    layer_class = LayerClass(layers=tuple(range(n_layers)), representative=0, units={k: () for k in range(n_layers)},
                             menu=tuple(() for _ in entries))
    return Decomposition(
        n_layers, [layer_class], {k: 0 for k in range(n_layers)},
        saved_bytes={k: [s for s, _, _ in entries] for k in range(n_layers)},
        layer_time_s={k: [t for _, _, t in entries] for k in range(n_layers)},
        excess_bytes={k: [e for _, e, _ in entries] for k in range(n_layers)},
        head_excess_bytes=rng.randint(0, 500))


def _estimated_peak(d: Decomposition, choice: list[int]) -> int:
    prefix, peak = 0, 0
    for k, entry in enumerate(choice):
        peak = max(peak, prefix + d.excess_bytes[k][entry])
        prefix += d.saved_bytes[k][entry]
    return max(peak, prefix + d.head_excess_bytes)


@pytest.mark.parametrize("seed", range(20))
def test_the_chain_is_exact_at_byte_resolution_and_never_over_budget_when_coarse(seed):
    """Against every choice of 3 entries for 4 layers: with one bucket per byte the chain's plan is
    the fastest within the budget; with 8 buckets its plan's estimated peak still fits (each
    bucket keeps a path with its exact bytes; rounding up per layer used to rule plans out)."""
    rng = random.Random(seed)
    d = _synthetic_decomposition(rng, 4, 3)
    peaks = sorted({_estimated_peak(d, list(c)) for c in itertools.product(range(3), repeat=4)})
    budget = peaks[rng.randrange(len(peaks))]
    fitting = [c for c in itertools.product(range(3), repeat=4) if _estimated_peak(d, list(c)) <= budget]
    best_s = min(sum(d.time_s(k, e) for k, e in enumerate(c)) for c in fitting)
    regions = np.full(d.n_layers + 1, budget, dtype=np.int64)
    exact = _chain(d, regions, None, buckets=budget + 1)
    assert _estimated_peak(d, exact) <= budget
    assert sum(d.time_s(k, e) for k, e in enumerate(exact)) == pytest.approx(best_s, abs=1e-15)
    coarse = _chain(d, regions, None, buckets=8)
    assert coarse is None or _estimated_peak(d, coarse) <= budget


def test_the_chain_reaches_a_budget_that_rounding_up_per_layer_missed():
    # 80 layers saving 101 B each at 8,879 B (79 x 101 + 900): with steps of 89 B, rounding up
    # counted 178 B per layer and found nothing under the budget
    layer_class = LayerClass(layers=tuple(range(80)), representative=0, units={k: () for k in range(80)}, menu=((), ()))
    d = Decomposition(80, [layer_class], {k: 0 for k in range(80)},
                      saved_bytes={k: [1000, 101] for k in range(80)}, layer_time_s={k: [0.0, 1e-6] for k in range(80)},
                      excess_bytes={k: [900, 900] for k in range(80)})
    budget = 79 * 101 + 900
    choice = _chain(d, np.full(81, budget, dtype=np.int64), None, buckets=100)
    assert choice == [1] * 80 and _estimated_peak(d, choice) == budget


def test_hoisted_all_gathers_do_not_move_the_forward_into_the_last_layers_region():
    """FSDP's all-gathers run at the forward's start (Thunder's order); they serve one layer each
    (satellites) and must not put every later forward op in the last layer's region (which made
    the chain's estimates of that region wrong by whole layers on 70B graphs)."""
    graph = stacked_blocks_graph(5, seed=2, block_ops=12, gathered_weights=True, **ACTIVATION_HEAVY)
    problem = RecomputeProblem.from_graph(graph, proxy_op_time_s(graph))
    layer_of = forward_layers(graph)
    assert {layer_of[op.name] for op in graph.forward_ops[:5]} == set(range(5))  # the gathers come first
    decomposition = decomposition_of(problem, OPTIONS)
    timeline = simulate_step(graph, by_kind=False)
    regions = _regions(timeline, decomposition.keys, decomposition.n_layers)
    for op, region in zip(graph.forward_ops[5:], regions[5:]):
        if op.name in layer_of:
            assert region == layer_of[op.name], (op.name, region)
    budget = (SOLVERS["per_block"](problem).peak_bytes + SOLVERS["save_all"](problem).peak_bytes) // 2
    assert solve_layered(problem, peak_budget_bytes=budget, options=OPTIONS).peak_bytes <= budget


def test_only_an_overshooting_regions_budget_is_lowered_then_raised_back_while_plans_fit(monkeypatch):
    """`_chain_plans` against a scripted simulation: region 1 overshoots a 120 B budget by 30 B, so
    the next chain gets 90 B there and 120 B elsewhere; once a plan fits, region 1's budget is
    raised halfway back towards where it overshot (105 B), and so on while plans fit."""
    import remat_opt.solvers.layered as layered

    d = _synthetic_decomposition(random.Random(0), 3, 2)
    budgets_seen = []

    def chain(decomposition, region_peak_bytes, activation_budget_bytes, buckets, minimise_peak=False):
        budgets_seen.append(region_peak_bytes.tolist())
        return [0, 0, 0]

    lives = [[100, 150, 90, 80]] + [[100, 95, 90, 80]] * 10  # live bytes per region (3 layers, the head)

    def profile(problem, n_layers, keys, units):  # nothing saved: each region's live bytes are its excess
        return np.zeros(n_layers, dtype=np.int64), np.array(lives[len(budgets_seen) - 1]), 0

    monkeypatch.setattr(layered, "_chain", chain)
    monkeypatch.setattr(layered, "_profile", profile)
    problem = SimpleNamespace(assess=lambda units: (tuple(units), 0, 0.0))
    plans = layered._chain_plans(problem, d, Budgets(None, 120), LayeredOptions(max_rounds=4))
    assert budgets_seen == [[120, 120, 120, 120], [120, 90, 120, 120], [120, 105, 120, 120], [120, 112, 120, 120]]
    assert [p.peak_bytes for p in plans] == [150, 100, 100, 100]
