"""Extending a traced graph with more layers gives the graph a direct trace of that depth gives."""

import dataclasses

import pytest

import remat_opt
from remat_opt.core.deepen import DeepenError, extend_layers
from remat_opt.validation.graph_diff import structural_differences
from remat_opt.core.layers import find_layers
from remat_opt.models.graphs import analyze_model
from remat_opt.core.simulation import simulate_peak_bytes
from remat_opt.solvers import ILPOptions
from synthetic import chain_graph, stacked_blocks_graph

pytestmark = pytest.mark.slow  # Thunder compilations: minutes in all (the fast subset is -m "not slow")

# id: (config, executors, traced layers). 3 is the fewest layers `extend_layers` accepts: the
# cheapest traces that still copy a layer. The nvFuser stand-in (the default on meta) needs 4: its
# fusion regions span layer boundaries, so the first and last layers' blocks differ from the rest.
CASES = {
    "llama2-nvfuser-standin": ("Llama-2-7b-hf", "nvfuser-standin", 4),
}
# Pythia (parallel residual, fused SDPA) and Llama-3 (GQA, decomposed SDPA) from 3 traced layers to 4
# also extend exactly; they left the suite to keep it under 8 minutes: `benchmarks/deepen_check.py
# --model pythia-14m --executors fused-sdpa --traced-layers 3 --layers 4 --seq 32` (and Llama-3-8B
# with --executors default) checks them at full width.


# Its two traces (4 and 5 layers, ~85 s on 2 cores) run in the extended tier (README), beside
# `benchmarks/deepen_check.py`'s 8- and 32-layer checks; the error cases below run in every suite.
@pytest.fixture(scope="module", params=[pytest.param(k, marks=pytest.mark.extended) for k in sorted(CASES)])
def extended_and_direct(request):
    name, executors, traced = CASES[request.param]
    kwargs = dict(seq=32, dtype="float32", n_layer=traced + 1, tiny=True, executors=executors)
    extended = analyze_model(name, traced_layers=traced, **kwargs)
    return extended, analyze_model(name, traced_layers=traced + 1, **kwargs), (traced, executors)


def test_extended_graph_is_the_direct_trace_up_to_names(extended_and_direct):
    extended, direct, (traced, _) = extended_and_direct
    assert any(f"extended from {traced} traced layers to {traced + 1} " in note for note in extended.notes)
    assert structural_differences(extended, direct) == []


def test_extended_graph_predicts_the_direct_traces_memory(extended_and_direct):
    extended, direct, _ = extended_and_direct
    assert extended.saved_activation_bytes == direct.saved_activation_bytes
    assert simulate_peak_bytes(extended) == simulate_peak_bytes(direct)


def test_extended_graph_plans_like_the_direct_trace(extended_and_direct):
    extended, direct, _ = extended_and_direct
    points = [remat_opt.pareto_curve(graph, 4, device_spec="H100") for graph in (extended, direct)]
    # The ILP prices ops in quanta of time_quantum_s: equally optimal plans may differ by that per op.
    resolution_s = ILPOptions().time_quantum_s * len(direct.forward_ops)
    for a, b in zip(*points):
        assert (a.saved_bytes, a.peak_bytes) == (b.saved_bytes, b.peak_bytes)
        assert a.extra_time_s == pytest.approx(b.extra_time_s, rel=0, abs=resolution_s)


def test_extending_twice_matches_one_direct_trace_deeper(extended_and_direct):
    extended, direct, _ = extended_and_direct
    twice = extend_layers(extended, 1)
    assert len(twice.forward_ops) > len(direct.forward_ops)
    assert structural_differences(twice, direct) == [f"forward_ops: {len(twice.forward_ops)} vs {len(direct.forward_ops)}"]
    assert structural_differences(twice, extend_layers(direct, 1)) == []


def test_structural_differences_sees_a_changed_tensor(extended_and_direct):
    extended, direct, _ = extended_and_direct
    name = direct.saved_names[-1]
    changed = dataclasses.replace(direct.tensors[name], dtype="float64")
    mutated = dataclasses.replace(direct, tensors={**direct.tensors, name: changed})
    assert any(name in diff for diff in structural_differences(extended, mutated))


def test_layers_are_found_forward_and_backward(extended_and_direct):
    _, direct, (traced, executors) = extended_and_direct
    layers = find_layers(direct)
    depth = traced + 1
    assert layers.forward.count == depth
    if executors == "nvfuser-standin":  # the loss's region takes in the last layer's backward start, the
        # embedding's its end: the repeated backward blocks are the other layers', in reverse
        assert layers.backward_layer_of_block == tuple(range(depth - 1, 0, -1))
    else:
        assert layers.backward_layer_of_block == tuple(range(depth - 1, -1, -1))


def test_no_repeated_layers_is_a_clear_error():
    with pytest.raises(DeepenError, match="no block of the .* forward ops repeats 3 or more times"):
        extend_layers(chain_graph(6), 2)


def test_random_backward_is_a_clear_error():
    with pytest.raises(DeepenError, match="backward ops repeats"):
        extend_layers(stacked_blocks_graph(4), 2)


def test_extra_layers_must_not_be_negative():
    with pytest.raises(ValueError, match="extra_layers must not be negative"):
        extend_layers(chain_graph(6), -1)


def test_no_extra_layers_returns_the_graph():
    graph = chain_graph(6)
    assert extend_layers(graph, 0) is graph


def test_peak_sweep_over_tied_layers_plans_every_budget(extended_and_direct):
    points = remat_opt.pareto_curve(extended_and_direct[0], 6, device_spec="H100", budget_kind="peak")
    assert [p.peak_bytes <= p.swept_budget_bytes for p in points] == [True] * len(points)
    assert all(p.plan.status in ("optimal", "feasible") for p in points[1:]), [p.plan.status for p in points]
    assert [p.extra_time_s for p in points] == sorted((p.extra_time_s for p in points), reverse=True)
