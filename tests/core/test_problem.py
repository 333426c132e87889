"""Recompute units, demand-driven saved sets and the linear peak model, on synthetic graphs."""

import random

import numpy as np
import pytest

from remat_opt.core.graph import (
    REASON_AUXILIARY,
    REASON_FORWARD_OUTPUT,
    REASON_INPUT,
    REASON_NO_ORIGIN,
    REASON_RANDOM,
    JointGraph,
    OpNode,
    TensorNode,
    TensorOrigin,
)
from remat_opt.core.plan import derive, storage_bytes_of
from remat_opt.core.simulation import simulate_step
from remat_opt.core.problem import RecomputeProblem
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


def _tensor(name: str, nbytes: int, kind: str = "forward", view_of: tuple[str, int] | None = None) -> TensorNode:
    """A 1-d float32 tensor owning its memory, or a view of `view_of` = (base, base's storage bytes)."""
    storage, storage_bytes = view_of or (name, nbytes)
    return TensorNode(name, (nbytes // 4,), "float32", "cpu", nbytes, storage, storage_bytes, kind)


def _origin(name: str, target: str | None = None, taggable: bool = True, reason: str = "activation"):
    return TensorOrigin(name, target or f"p_{name}", "mul", taggable, reason)


def _split_graph() -> JointGraph:
    """x -> h -> split -> (s0, s1); v = s0[:64] (a view into s0's storage); out = v * s1.

    Bytes: x 256 (input), h 1024, s0 512, s1 128, v 256 of s0's 512, out 256 (forward output).
    The split has one tag target per output (p_s0, p_s1) and, with the op writing h, forms a
    decomposition tagged d. The backward reads v, s0, s1, h and x.
    """
    tensors = {t.name: t for t in (
        _tensor("x", 256, "input"), _tensor("h", 1024), _tensor("s0", 512), _tensor("s1", 128),
        _tensor("v", 256, view_of=("s0", 512)), _tensor("out", 256), _tensor("g", 256, "cotangent"), _tensor("g1", 256, "backward"),
    )}
    ops = (
        OpNode("fwd0", "mul", False, 0, ("x",), ("h",), tag_units=("d", "p_h")),
        OpNode("fwd1", "split", False, 1, ("h",), ("s0", "s1"), tag_units=("d", "p_s0", "p_s1")),
        OpNode("fwd2", "slice", False, 2, ("s0",), ("v",), tag_units=("p_v",)),
        OpNode("fwd3", "mul", False, 3, ("v", "s1"), ("out",), tag_units=("p_out",)),
        OpNode("bwd0", "mul", True, 0, ("g", "v", "s0", "s1", "h", "x"), ("g1",)),
    )
    origins = {n: _origin(n) for n in ("h", "s0", "s1", "v")}
    origins["out"] = _origin("out", taggable=False, reason=REASON_FORWARD_OUTPUT)
    saved = (*(origins[n] for n in ("v", "s0", "s1", "h")), TensorOrigin("x", None, None, False, REASON_INPUT))
    return JointGraph(ops, tensors, saved, ("x",), ("out",), origins)


_SPLIT_TIMES = {"fwd0": 1e-6, "fwd1": 2e-6, "fwd2": 4e-6, "fwd3": 8e-6}


def test_ops_with_several_tag_targets_belong_to_each_unit():
    problem = RecomputeProblem.from_graph(_split_graph(), _SPLIT_TIMES)
    assert list(problem.units) == ["d", "p_h", "p_s0", "p_s1", "p_v", "p_out"]
    expected = {  # (ops, outputs, inputs other than graph inputs, time)
        "d": (("fwd0", "fwd1"), ("h", "s0", "s1"), (), 3e-6),
        "p_h": (("fwd0",), ("h",), (), 1e-6),
        "p_s0": (("fwd1",), ("s0", "s1"), ("h",), 2e-6),
        "p_s1": (("fwd1",), ("s0", "s1"), ("h",), 2e-6),
        "p_v": (("fwd2",), ("v",), ("s0",), 4e-6),
        "p_out": (("fwd3",), ("out",), ("v", "s1"), 8e-6),
    }
    for name, (ops, outputs, inputs, time_s) in expected.items():
        unit = problem.units[name]
        assert (unit.ops, unit.outputs, unit.inputs, unit.tag_targets) == (ops, outputs, inputs, (name,))
        assert unit.time_s == pytest.approx(time_s)
    assert problem.allowed_units == ("d", "p_h", "p_s0", "p_s1", "p_v")
    assert problem.units["p_out"].reason == "writes a forward output: out"
    assert problem.units_of_op == {"fwd0": ("p_h", "d"), "fwd1": ("p_s0", "p_s1", "d"), "fwd2": ("p_v",)}
    assert problem.effective_units(["p_s0", "p_s1", "d", "p_v"]) == ("d", "p_v")  # d already reruns fwd1


@pytest.mark.parametrize(
    "units, saved, rerun, saved_bytes, extra_s",
    [
        ((), ["v", "s0", "s1", "h"], [], 512 + 128 + 1024, 0.0),  # v and s0: one storage, counted once
        (("p_v",), ["s0", "s1", "h"], ["fwd2"], 512 + 128 + 1024, 4e-6),  # the view's base stays saved
        (("p_s1",), ["v", "h"], ["fwd1"], 512 + 1024, 2e-6),  # the split reruns from h; v still holds s0
        (("p_v", "p_s0"), ["h"], ["fwd1", "fwd2"], 1024, 6e-6),
        (("d",), ["v"], ["fwd0", "fwd1"], 512, 3e-6),  # the 256-byte view keeps all 512 bytes alive
        (("d", "p_v"), [], ["fwd0", "fwd1", "fwd2"], 0, 7e-6),
    ],
    ids=["none", "view", "split", "view-and-split", "decomposition", "everything"],
)
def test_saved_bytes_count_storages_worked_by_hand(units, saved, rerun, saved_bytes, extra_s):
    graph = _split_graph()
    problem = RecomputeProblem.from_graph(graph, _SPLIT_TIMES)
    _, got_saved, got_rerun = problem.demand(units)
    assert (got_saved, got_rerun) == (saved, rerun)
    assert problem.saved_bytes(units) == saved_bytes
    assert problem.extra_time_s(units) == pytest.approx(extra_s)
    derivation = derive(graph, {t for u in units for t in problem.units[u].tag_targets})
    assert (list(derivation.saved), list(derivation.demanded_ops)) == (saved, rerun)
    assert storage_bytes_of(graph, derivation.saved) == saved_bytes


def _reasons_graph() -> JointGraph:
    """x -> a; r = uniform(a) (random); q = pinned_op(a) (dont_recompute); (o, lse) = sdpa(q), lse
    an auxiliary output under o's tag target; out = o * r (forward output); n = exp(a), whose op
    has a tag unit but n no origin. The backward reads a, r, q, o, lse and n."""
    names = ("a", "r", "q", "o", "lse", "n", "out")
    tensors = {n: _tensor(n, 256) for n in names}
    tensors.update(x=_tensor("x", 256, "input"), g=_tensor("g", 256, "cotangent"), g1=_tensor("g1", 256, "backward"))
    ops = (
        OpNode("fwd0", "mul", False, 0, ("x",), ("a",)),
        OpNode("fwd1", "uniform", False, 1, ("a",), ("r",), op_tags=frozenset({"random"})),
        OpNode("fwd2", "pinned_op", False, 2, ("a",), ("q",), op_tags=frozenset({"dont_recompute"})),
        OpNode("fwd3", "sdpa", False, 3, ("q",), ("o", "lse")),
        OpNode("fwd4", "mul", False, 4, ("o", "r"), ("out",)),
        OpNode("fwd5", "exp", False, 5, ("a",), ("n",), tag_units=("p_n",)),
        OpNode("bwd0", "mul", True, 0, ("g", "a", "r", "q", "o", "lse", "n"), ("g1",)),
    )
    origins = {
        "a": _origin("a"),
        "r": _origin("r", taggable=False, reason=REASON_RANDOM),
        "q": _origin("q"),
        "o": _origin("o"),
        "lse": _origin("lse", target="p_o", taggable=False, reason=REASON_AUXILIARY),
        "out": _origin("out", taggable=False, reason=REASON_FORWARD_OUTPUT),
    }
    saved = tuple(origins.get(n, TensorOrigin(n, None, None, False, REASON_NO_ORIGIN)) for n in ("a", "r", "q", "o", "lse", "n"))
    return JointGraph(ops, tensors, saved, ("x",), ("out",), origins)


def test_disallowed_units_name_their_reason():
    problem = RecomputeProblem.from_graph(_reasons_graph(), {f"fwd{i}": 1e-6 for i in range(6)})
    assert {name: unit.reason for name, unit in problem.units.items()} == {
        "p_a": "",
        "p_r": "random op: recomputing would draw new numbers: fwd1",  # before its untaggable output
        "p_q": "op marked dont_recompute: fwd2",
        "p_o": "an output is not taggable: lse (auxiliary output of a grad rule: only recomputable with its whole op)",
        "p_out": "writes a forward output: out",  # before its untaggable origin
        "p_n": "an output is not taggable: n (no origin)",
    }
    assert problem.allowed_units == ("p_a",)
    pinned = RecomputeProblem.from_graph(_reasons_graph(), {f"fwd{i}": 1e-6 for i in range(6)}, pinned=["p_a", "p_r"])
    assert pinned.units["p_a"].reason == "pinned by the user: p_a"
    assert pinned.units["p_r"].reason == "pinned by the user: p_r"  # pinning is named first
    assert pinned.allowed_units == ()


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


def _async_collectives_graph():
    """A forward all-gather of an activation and a backward reduce-scatter of a gradient, each an
    async collective whose input stays alive until its wait, with ops in between."""
    from synthetic import _Builder

    b = _Builder()
    b.input("x", 64)
    b.forward("mul", ["x"], [b.tensor("t0", 256, "forward")])
    b.forward("all_gather", ["t0"], [b.tensor("fut", 1024, "forward")], tags={"collective", "holds_inputs"})
    b.forward("exp", ["x"], [b.tensor("t1", 512, "forward")])
    b.forward("wait", ["fut"], [b.tensor("gathered", 1024, "forward", base="fut")])
    b.forward("mul", ["t1", "gathered"], [b.tensor("out", 256, "forward")])
    b.tensor("g_out", 256, "cotangent")
    b.backward("mul", ["g_out", "t1"], [b.tensor("g1", 2048, "backward")])
    b.backward("reduce_scatter", ["g1"], [b.tensor("g1_fut", 512, "backward")], tags={"collective", "holds_inputs"})
    b.backward("mul", ["g_out", "gathered"], [b.tensor("g2", 128, "backward")])
    b.backward("wait", ["g1_fut"], [b.tensor("grad_x", 512, "backward", base="g1_fut")])
    return b.graph(["t1", "gathered"], ["out"])


def test_peak_model_keeps_an_async_collectives_input_until_its_wait():
    # Before: the model freed the input at the collective (2,048 x 4 B of the gradient short at the
    # backward op in between; the same on a 70B FSDP graph at 15,392 events, up to 0.52 GB).
    graph = _async_collectives_graph()
    problem = RecomputeProblem.from_graph(graph, proxy_op_time_s(graph))
    _, saved, _ = problem.demand(())
    timeline = simulate_step(graph)
    assert peak_model_of(problem).live_bytes(saved).tolist() == list(timeline.live_bytes)
    between = timeline.labels.index("bwd2")
    assert timeline.live_bytes[between] >= 2048 * 4 + 512 * 4  # the gradient and its future


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
    times = proxy_op_time_s(_split_graph(), bytes_per_s=1e9, overhead_s=1e-6)
    # h: 1024 bytes; split: s0 + s1 = 640 bytes; the view v writes nothing new; out: 256 bytes
    assert times == pytest.approx({"fwd0": 2.024e-6, "fwd1": 1.64e-6, "fwd2": 1e-6, "fwd3": 1.256e-6})
