"""Recompute units, demand-driven saved sets and the linear peak model, on synthetic graphs."""

import random

import numpy as np
import pytest

from remat_opt.graph import JointGraph, OpNode, TensorNode, TensorOrigin
from remat_opt.plan import derive, simulate_step, storage_bytes_of
from remat_opt.problem import RecomputeProblem
from remat_opt.solvers.peak_model import peak_model_of
from synthetic import proxy_op_time_s
from synthetic import chain_graph, diamond_graph, random_joint_graph


def _problem(seed: int) -> RecomputeProblem:
    graph = random_joint_graph(seed)
    rng = random.Random(seed)
    return RecomputeProblem.from_graph(graph, {op.name: rng.randint(1, 50) * 1e-6 for op in graph.forward_ops})


def _random_units(problem: RecomputeProblem, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [u for u in problem.allowed_units if rng.random() < 0.5]


def _nested_graph() -> JointGraph:
    """x -> a -> b -> m, where m = mean-like op decomposed into a, b, m (tag target "m" re-runs all
    three, "a" and "b" only their own op); the backward reads a, b and m."""
    tensors = {n: TensorNode(n, (64,), "float32", "cpu", 256, n, 256, "forward") for n in ("a", "b", "m", "out")}
    tensors["x"] = TensorNode("x", (64,), "float32", "cpu", 256, "x", 256, "input")
    tensors["g"] = TensorNode("g", (64,), "float32", "cpu", 256, "g", 256, "cotangent")
    tensors["g1"] = TensorNode("g1", (64,), "float32", "cpu", 256, "g1", 256, "backward")
    ops = (
        OpNode("fwd0", "mul", False, 0, ("x",), ("a",), tag_units=("m", "a")),
        OpNode("fwd1", "sum", False, 1, ("a",), ("b",), tag_units=("m", "b")),
        OpNode("fwd2", "div", False, 2, ("b",), ("m",), tag_units=("m",)),
        OpNode("fwd3", "mul", False, 3, ("m",), ("out",), tag_units=("o",)),
        OpNode("bwd0", "mul", True, 0, ("g", "a", "b", "m"), ("g1",)),
    )
    origins = {n: TensorOrigin(n, n, "mul", True, "activation") for n in ("a", "b", "m")}
    origins["out"] = TensorOrigin("out", "o", "mul", False, "forward output: alive anyway")
    return JointGraph(ops, tensors, tuple(origins[n] for n in "abm"), ("x",), ("out",), origins)


def test_nested_units_overlap():
    problem = RecomputeProblem.from_graph(_nested_graph(), {f"fwd{i}": 1e-6 for i in range(4)})
    assert problem.units["m"].ops == ("fwd0", "fwd1", "fwd2") and problem.units["a"].ops == ("fwd0",)
    assert problem.units_of_op["fwd0"] == ("a", "m")  # smallest first
    assert not problem.units["o"].allowed


@pytest.mark.parametrize(
    "targets, saved, rerun",
    [((), ["a", "b", "m"], []), (("b",), ["a", "m"], ["fwd1"]), (("m",), [], ["fwd0", "fwd1", "fwd2"])],
    ids=["none", "child", "parent"],
)
def test_tagging_a_parent_reruns_its_whole_decomposition(targets, saved, rerun):
    graph = _nested_graph()
    problem = RecomputeProblem.from_graph(graph, {f"fwd{i}": 1e-6 for i in range(4)})
    _, got_saved, got_rerun = problem.demand(targets)
    assert (got_saved, got_rerun) == (saved, rerun)
    derivation = derive(graph, targets)
    assert (list(derivation.saved), list(derivation.demanded_ops)) == (saved, rerun)


def test_redundant_nested_tags_are_dropped():
    problem = RecomputeProblem.from_graph(_nested_graph(), {f"fwd{i}": 1e-6 for i in range(4)})
    assert problem.effective_units(["a", "b", "m"]) == ("m",)
    plan = problem.plan_for(["a", "m"], solver="test", status="heuristic", solve_time_s=0.0)
    assert plan.recomputed_tag_targets == ("m",) and plan.saved_bytes == 0


def test_ops_with_several_tag_targets_belong_to_each_unit():
    problem = _problem(0)  # seed 0: a split writing outputs of two tag targets, in a decomposition
    assert problem.units_of_op["fwd0"] == ("p0", "p0b", "d0")
    assert problem.units["d0"].ops == ("fwd0", "fwd1")


def test_disallowed_units_name_their_reason():
    reasons = {u.reason.split(":")[0] for seed in range(30) for u in _problem(seed).units.values() if not u.allowed}
    assert {"random op", "op marked dont_recompute", "writes a forward output"} <= {r.split(":")[0] for r in reasons}


def test_pinned_tag_targets_are_not_allowed():
    graph = chain_graph(4)
    problem = RecomputeProblem.from_graph(graph, proxy_op_time_s(graph), pinned=["p_t1"])
    assert problem.units["p_t1"].reason == "pinned by the user: p_t1"
    assert "p_t1" not in problem.allowed_units


def test_missing_op_time_is_an_error():
    graph = chain_graph(3)
    with pytest.raises(KeyError, match="no time for ops"):
        RecomputeProblem.from_graph(graph, {})


@pytest.mark.parametrize("seed", range(40))
def test_demand_agrees_with_the_independent_derivation(seed):
    problem = _problem(seed)
    units = _random_units(problem, seed)
    targets = {t for u in units for t in problem.units[u].tag_targets}
    derivation = derive(problem.graph, targets)
    needed, saved, rerun = problem.demand(units)
    assert (list(derivation.saved), list(derivation.demanded_ops)) == (saved, rerun)
    assert problem.saved_bytes(units) == storage_bytes_of(problem.graph, derivation.saved)


@pytest.mark.parametrize("seed", range(40))
def test_peak_model_is_exact_for_save_all(seed):
    problem = _problem(seed)
    _, saved, _ = problem.demand(())
    timeline = simulate_step(problem.graph)
    assert peak_model_of(problem).live_bytes(saved).tolist() == list(timeline.live_bytes)


@pytest.mark.parametrize("seed", range(40))
def test_peak_model_is_a_lower_bound(seed):
    problem = _problem(seed)
    units = _random_units(problem, seed + 1000)
    _, saved, _ = problem.demand(units)
    timeline = simulate_step(problem.graph, {t for u in units for t in problem.units[u].tag_targets})
    at_ops = [v for label, v in zip(timeline.labels, timeline.live_bytes) if not label.startswith("recompute:")]
    assert (peak_model_of(problem).live_bytes(saved) <= np.array(at_ops)).all()


def test_save_all_matches_the_graphs_saved_bytes():
    graph = diamond_graph()
    problem = RecomputeProblem.from_graph(graph, proxy_op_time_s(graph))
    assert problem.saved_bytes(()) == graph.saved_activation_bytes == 4 * 1024
    assert problem.saved_bytes(problem.allowed_units) == 0


def test_proxy_op_time_charges_views_only_the_overhead():
    graph = random_joint_graph(3)
    times = proxy_op_time_s(graph, bytes_per_s=1e9, overhead_s=1e-6)
    for op in graph.forward_ops:
        fresh = sum(graph.tensors[o].nbytes for o in op.outputs if graph.tensors[o].storage == o)
        assert times[op.name] == pytest.approx(fresh / 1e9 + 1e-6)
