"""The plan checker and the peak simulation on hand-built graphs with hand-computed numbers."""

import dataclasses

import pytest

from remat_opt.core.graph import REASON_FORWARD_OUTPUT, REASON_INPUT, JointGraph, OpNode, TensorNode, TensorOrigin
from remat_opt.core.plan import derive
from remat_opt.core.simulation import MEMORY_KINDS, simulate_peak_bytes, simulate_step
from remat_opt.core.checker import check_plan
from remat_opt.core.problem import RecomputeProblem


def _tensor(name, nbytes, kind, storage=None, storage_bytes=None):
    return TensorNode(name, (nbytes // 4,), "float32", "cpu", nbytes, storage or name, storage_bytes or nbytes, kind)


def _origin(name, target, taggable=True, reason="activation"):
    return TensorOrigin(name, target, "mul", taggable, reason)


@pytest.fixture
def view_graph() -> JointGraph:
    """x -> a (1024 B) -> b = view(a) -> c (512 B, output); the backward reads b; grad of x."""
    tensors = {
        "x": _tensor("x", 256, "input"),
        "a": _tensor("a", 1024, "forward"),
        "b": _tensor("b", 1024, "forward", storage="a", storage_bytes=1024),
        "c": _tensor("c", 512, "forward"),
        "g_out": _tensor("g_out", 512, "cotangent"),
        "g1": _tensor("g1", 512, "backward"),
        "grad_x": _tensor("grad_x", 256, "backward"),
    }
    ops = (
        OpNode("fwd0", "mul", False, 0, ("x",), ("a",)),
        OpNode("fwd1", "reshape", False, 1, ("a",), ("b",)),
        OpNode("fwd2", "mul", False, 2, ("b",), ("c",)),
        OpNode("bwd0", "mul", True, 0, ("g_out", "b"), ("g1",)),
        OpNode("bwd1", "sum", True, 1, ("g1",), ("grad_x",)),
    )
    origins = {"a": _origin("a", "A"), "b": _origin("b", "B"), "c": _origin("c", "C", False, REASON_FORWARD_OUTPUT)}
    return JointGraph(ops, tensors, (origins["b"],), ("x",), ("c",), origins)


@pytest.fixture
def problem(view_graph):
    return RecomputeProblem.from_graph(view_graph, {"fwd0": 2e-6, "fwd1": 1e-6, "fwd2": 3e-6})


def test_save_all_timeline_by_hand(view_graph):
    timeline = simulate_step(view_graph)
    # baseline x=256; a lives on through its saved view b; c is released with the loss
    assert timeline.labels == ("fwd0", "fwd1", "fwd2", "backward start", "bwd0", "bwd1")
    assert timeline.live_bytes == (1280, 1280, 1792, 1792, 2304, 1024)
    assert (timeline.peak_bytes, timeline.peak_label) == (2304, "bwd0")


def test_recompute_all_timeline_by_hand(view_graph):
    timeline = simulate_step(view_graph, ["A", "B"])
    # a is freed after its last forward use (fwd2 reads b), then rebuilt right before bwd0
    assert timeline.labels == (
        *("fwd0", "fwd1", "fwd2", "backward start"),
        *("recompute:fwd0", "recompute:fwd1", "bwd0", "bwd1"),
    )
    assert timeline.live_bytes == (1280, 1280, 1792, 768, 1792, 1792, 2304, 1024)


def test_timeline_kinds_by_hand_and_they_sum_to_the_live_bytes(view_graph):
    save_all, recompute_all = simulate_step(view_graph), simulate_step(view_graph, ["A", "B"])
    kinds = dict(zip(MEMORY_KINDS, zip(*save_all.kind_bytes)))
    assert kinds["parameters and inputs"] == (256,) * 6  # x
    assert kinds["saved for backward"][:4] == (1024, 1024, 1024, 1024)  # a, whose view b is saved
    assert kinds["forward transient"][2] == 512  # c, the loss
    assert kinds["recomputed"] == (0,) * 6
    assert max(dict(zip(MEMORY_KINDS, zip(*recompute_all.kind_bytes)))["recomputed"]) == 1024  # a, rebuilt
    for timeline in (save_all, recompute_all):
        assert tuple(map(sum, timeline.kind_bytes)) == timeline.live_bytes


def test_recomputing_a_view_of_a_saved_base_saves_nothing(view_graph, problem):
    plan = problem.plan_for(["B"], solver="test", status="heuristic", solve_time_s=0.0)
    assert plan.saved_names == ("a",)
    assert plan.saved_bytes == 1024 == problem.saved_bytes(())
    assert plan.recompute_ops == ("fwd1",)
    assert check_plan(view_graph, plan, op_time_s=problem.op_time_s) == []


def test_plan_decisions_and_recompute_chain(view_graph, problem):
    plan = problem.plan_for(["A", "B"], solver="test", status="heuristic", solve_time_s=0.0)
    decisions = {d.name: d for d in plan.decisions}
    assert decisions["b"].action == "recompute" and decisions["b"].recompute_ops == ("fwd0", "fwd1")
    assert decisions["a"].action == "recompute" and decisions["a"].recompute_ops == ("fwd0",)  # its own op
    assert decisions["x"].action == "input"
    assert plan.saved_bytes == 0 and plan.extra_time_s == pytest.approx(3e-6)
    assert plan.recomputed_tag_targets == ("A", "B")
    assert check_plan(view_graph, plan, op_time_s=problem.op_time_s) == []


def test_derive_matches_demand(view_graph, problem):
    for targets in ([], ["A"], ["B"], ["A", "B"]):
        derivation = derive(view_graph, targets)
        needed, saved, rerun = problem.demand(targets)
        got = (list(derivation.needed), list(derivation.saved), list(derivation.demanded_ops))
        assert got == (needed, saved, rerun)


@pytest.mark.parametrize(
    "mutation, message",
    [
        (dict(saved_bytes=1), "saved_bytes=1 but the saved storages hold"),
        (dict(peak_bytes=7), "peak_bytes=7 but the simulated peak is 2304"),
        (dict(saved_names=()), "saved_names differ"),
        (dict(recompute_ops=()), "recompute_ops"),
        (dict(extra_time_s=1.0), "extra_time_s=1.0 but the recomputed ops take"),
        (dict(decisions=()), "has no decision"),
        (dict(recomputed_tag_targets=("B", "nope")), "tag target nope names no forward op"),
        (dict(activation_budget_bytes=100), "saved_bytes=1024 > activation_budget_bytes=100"),
        (dict(peak_budget_bytes=2000), "simulated peak 2304 > peak_budget_bytes=2000"),
    ],
    ids=["bytes", "peak", "saved", "ops", "time", "decisions", "unknown-target", "budget", "peak-budget"],
)
def test_checker_rejects_inconsistent_plans(view_graph, problem, mutation, message):
    plan = dataclasses.replace(problem.plan_for(["B"], solver="test", status="heuristic", solve_time_s=0.0), **mutation)
    errors = check_plan(view_graph, plan, op_time_s=problem.op_time_s)
    assert any(message in e for e in errors), errors


def test_checker_rejects_pinned_and_forward_outputs(view_graph, problem):
    plan = problem.plan_for(["B"], solver="test", status="heuristic", solve_time_s=0.0)
    assert any("pinned tag target B" in e for e in check_plan(view_graph, plan, pinned=["B"]))
    forged = dataclasses.replace(plan, recomputed_tag_targets=("B", "C"))
    assert any("writes forward output c" in e for e in check_plan(view_graph, forged))


@pytest.fixture
def random_op_graph() -> JointGraph:
    """x -> m = dropout-mask (random) ; y = m * x; the backward reads m and y."""
    tensors = {
        "x": _tensor("x", 256, "input"),
        "m": _tensor("m", 256, "forward"),
        "y": _tensor("y", 256, "forward"),
        "z": _tensor("z", 256, "forward"),
        "g_out": _tensor("g_out", 256, "cotangent"),
        "g1": _tensor("g1", 256, "backward"),
    }
    ops = (
        OpNode("fwd0", "uniform", False, 0, ("x",), ("m",), op_tags=frozenset({"random"})),
        OpNode("fwd1", "mul", False, 1, ("m", "x"), ("y",)),
        OpNode("fwd2", "mul", False, 2, ("y",), ("z",)),
        OpNode("bwd0", "mul", True, 0, ("g_out", "y", "m", "x"), ("g1",)),
    )
    origins = {
        "m": TensorOrigin("m", "M", "uniform", False, "random op"),
        "y": _origin("y", "Y"),
        "z": _origin("z", "Z", False, REASON_FORWARD_OUTPUT),
    }
    saved = (origins["y"], origins["m"], TensorOrigin("x", None, None, False, REASON_INPUT))
    return JointGraph(ops, tensors, saved, ("x",), ("z",), origins)


def test_checker_rejects_random_ops(random_op_graph):
    problem = RecomputeProblem.from_graph(random_op_graph, {"fwd0": 1e-6, "fwd1": 1e-6, "fwd2": 1e-6})
    assert not problem.units["M"].allowed and problem.units["Y"].allowed
    plan = problem.plan_for(["Y"], solver="test", status="heuristic", solve_time_s=0.0)
    assert check_plan(random_op_graph, plan) == []
    assert plan.saved_names == ("m",)  # recomputing y needs the mask saved, never redrawn
    forged = dataclasses.replace(plan, recomputed_tag_targets=("M", "Y"))
    assert any("['random']" in e for e in check_plan(random_op_graph, forged))


def test_simulate_peak_bytes_accepts_a_plan(view_graph, problem):
    plan = problem.plan_for(["A", "B"], solver="test", status="heuristic", solve_time_s=0.0)
    assert simulate_peak_bytes(view_graph, plan) == simulate_peak_bytes(view_graph, ["A", "B"]) == plan.peak_bytes


@pytest.mark.parametrize("seed", range(20))
def test_timeline_kinds_sum_to_the_live_bytes_on_random_graphs(seed):
    from synthetic import random_joint_graph

    graph = random_joint_graph(seed)
    targets = sorted({o.tag_target for o in graph.saved if o.taggable})
    for timeline in (simulate_step(graph), simulate_step(graph, targets[: len(targets) // 2])):
        assert tuple(map(sum, timeline.kind_bytes)) == timeline.live_bytes
        assert all(min(kinds) >= 0 for kinds in timeline.kind_bytes)
