"""Ops timed inside a real training step (`remat_opt.validation.step_timing`): what the clock records, that it
changes nothing the step computes, and that a graph of another compilation is refused."""

from __future__ import annotations

from remat_opt import _compat  # noqa: F401  (applies the torch compatibility step before thunder)

import pytest
import thunder
import torch

from costmodels.table import op_key
from remat_opt.costing.graph_costs import op_args
from remat_opt.tracing.capture import analyze
from remat_opt.validation.step_timing import OpClock, check_clock_matches, time_ops_in_step

WIDTH, HIDDEN, ROWS = 256, 2048, 128


def _mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, WIDTH))
    return model, torch.randn(ROWS, WIDTH, requires_grad=True)


@pytest.fixture(scope="module")
def clocked():
    """(graph, clock, jitted, model, x): an MLP analyzed, and the same MLP jitted with an OpClock."""
    model, x = _mlp()
    graph = analyze(model, x)
    clock = OpClock()
    jitted = thunder.jit(model, transforms=[clock])
    return graph, clock, jitted, model, x


def _step(jitted, x):
    return lambda: jitted(x).sum().backward()


def test_every_op_is_timed_once_per_recorded_step(clocked):
    graph, clock, jitted, _, x = clocked
    times = time_ops_in_step(_step(jitted, x), graph, clock, steps=3, warmup_steps=1)
    assert set(times) == {op_key(op_args(graph, op)) for op in graph.ops}
    assert all(len(clock.samples[(op.is_backward, op.index)]) == 3 for op in graph.ops)  # warm-up not recorded
    assert all(t > 0 for t in times.values())
    assert not clock.recording


def test_the_clock_changes_no_gradient(clocked):
    _, _, jitted, model, x = clocked
    eager_model, eager_x = _mlp()
    eager_model(eager_x).sum().backward()
    for p in model.parameters():
        p.grad = None
    x.grad = None
    jitted(x).sum().backward()
    torch.testing.assert_close(x.grad, eager_x.grad)
    for p, q in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_a_graph_of_another_compilation_is_refused(clocked):
    _, clock, _, _, _ = clocked
    other = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    other_graph = analyze(other, torch.randn(2, 8, requires_grad=True))
    with pytest.raises(ValueError, match=r"differ from the graph's .* first fwd\d+: graph .*compile the clocked step"):
        check_clock_matches(other_graph, clock)


def test_no_recorded_step_is_refused(clocked):
    graph, clock, jitted, _, x = clocked
    with pytest.raises(ValueError, match="steps=0 must be >= 1"):
        time_ops_in_step(_step(jitted, x), graph, clock, steps=0)
