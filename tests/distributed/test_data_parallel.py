"""Offline per-rank graphs of Thunder's FSDP and DDP (`remat_opt.distributed.data_parallel`): one process, a
fake process group of any size, on meta."""

from __future__ import annotations

import pytest

from remat_opt.distributed.data_parallel import DataParallel

pytestmark = pytest.mark.slow  # Thunder compilations: minutes in all (the fast subset is -m "not slow")


SPEC_ARGS = dict(name="Llama-2-7b-hf", n_layer=1, device="meta", tiny=True)


def _fsdp_graph(world_size: int, in_flight: int | None = None):
    from remat_opt.models.graphs import analyze_spec
    from remat_opt.models.by_name import ModelSpec

    return analyze_spec(ModelSpec(**SPEC_ARGS), traced_layers=0, parallel=DataParallel("fsdp", world_size, in_flight))


@pytest.fixture(scope="module")
def fsdp_4_ranks():
    return _fsdp_graph(4)


def test_fsdp_graph_of_4_ranks_on_meta_shards_every_weight_4_ways(fsdp_4_ranks):
    from costmodels.formulas import WORLD_SIZE_ATTR
    from remat_opt.models.by_name import ModelSpec, build_model
    from remat_opt.core.problem import is_regather_unit

    spec = ModelSpec(**SPEC_ARGS)
    graph = fsdp_4_ranks
    gathers = [op for op in graph.forward_ops if op.symbol == "torch_all_gather_prim_impl"]
    model, _ = build_model(spec)
    assert len(gathers) == len(list(model.parameters()))
    for op in gathers:
        shard, full = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
        assert dict(op.attrs)[WORLD_SIZE_ATTR] == 4 and full.shape[0] == 4 * shard.shape[0]
    # parameters are graph inputs: each rank holds a quarter of them
    inputs = sum(graph.tensors[n].nbytes for n in graph.input_names if n in {op.inputs[0] for op in gathers})
    assert 4 * inputs == sum(p.numel() * p.element_size() for p in model.parameters())
    assert all(is_regather_unit([op]) for op in gathers)  # each weight's all-gather may be re-gathered


def _most_in_flight(ops, collective: str) -> tuple[int, int]:
    """(how many `collective` ops there are, the most whose futures are not yet waited for at once)."""
    pending, most, count = set(), 0, 0
    for op in ops:
        if op.symbol == collective:
            pending.add(op.outputs[0])
            count, most = count + 1, max(most, len(pending))
        elif op.symbol == "torch_wait_prim_impl":
            pending.discard(op.inputs[0])
    return count, most


def test_collectives_in_flight_bounds_fsdp_all_gathers_and_reduce_scatters(fsdp_4_ranks):
    # Thunder's order: every all-gather issued at the forward's start, every reduce-scatter waited
    # for at the backward's end
    gathers, gathers_in_flight = _most_in_flight(fsdp_4_ranks.forward_ops, "torch_all_gather_prim_impl")
    scatters, scatters_in_flight = _most_in_flight(fsdp_4_ranks.backward_ops, "torch_reduce_scatter_prim_impl")
    assert gathers > 2 and gathers_in_flight == gathers
    assert scatters > 2 and scatters_in_flight == scatters
    limited = _fsdp_graph(4, in_flight=1)  # the graph of Thunder's order, reordered (collective_order)
    assert _most_in_flight(limited.forward_ops, "torch_all_gather_prim_impl") == (gathers, 1)
    assert _most_in_flight(limited.backward_ops, "torch_reduce_scatter_prim_impl") == (scatters, 1)
    # the same ops, in another order
    assert sorted(op.symbol for op in limited.ops) == sorted(op.symbol for op in fsdp_4_ranks.ops)


@pytest.mark.parametrize("in_flight", [0, 1])
def test_reordering_the_graph_equals_tracing_with_the_pass(fsdp_4_ranks, in_flight):
    """The graph of Thunder's order reordered (`collective_order.reorder_graph`, what extended
    graphs get) is the graph of the trace pass CostRemat runs (`regather_order`, in its dry runs)."""
    from remat_opt.distributed.collective_order import reorder_graph
    from remat_opt.distributed.data_parallel import fake_process_group, parallel_transform
    from remat_opt.executors import default_executors, executors_for
    from remat_opt.tracing.capture import analyze
    from remat_opt.validation.graph_diff import structural_differences
    from remat_opt.models.by_name import ModelSpec, build_model
    from remat_opt.core.simulation import simulate_peak_bytes

    model, inputs = build_model(ModelSpec(**SPEC_ARGS))
    with fake_process_group(4):
        traced = analyze(model, *inputs, executors=executors_for(default_executors("meta")),
                         transforms=[parallel_transform("fsdp", model.lm_head.weight.device)],
                         collectives_in_flight=in_flight)
    reordered = reorder_graph(fsdp_4_ranks, in_flight)
    assert [op.symbol for op in reordered.ops] == [op.symbol for op in traced.ops]
    assert [op.symbol for op in reordered.ops] != [op.symbol for op in fsdp_4_ranks.ops]
    assert structural_differences(reordered, traced) == []
    assert simulate_peak_bytes(reordered) == simulate_peak_bytes(traced)


@pytest.mark.parametrize(("strategy", "world_size", "in_flight", "message"), [
    ("zero3", 2, None, "unknown data-parallel strategy 'zero3'; use one of: fsdp, ddp"),
    ("fsdp", 0, None, "world size must be a positive integer, got 0"),
    ("fsdp", 2, -1, "collectives_in_flight must be None .* or an integer >= 0 .*, got -1"),
    ("ddp", 2, 1, "collectives_in_flight applies to FSDP's all-gathers and reduce-scatters; DDP has neither"),
])
def test_bad_data_parallel_is_one_line(strategy, world_size, in_flight, message):
    with pytest.raises(ValueError, match=message):
        DataParallel(strategy, world_size, in_flight)


def test_cost_remat_refuses_a_negative_collectives_in_flight():
    from remat_opt import CostRemat

    with pytest.raises(ValueError, match="collectives_in_flight must be None"):
        CostRemat(collectives_in_flight=-2)


# The CLI names the same lowering in every suite (tests/cli/test_cli_pareto.py); this compile-time
# path runs in the extended tier (README).
@pytest.mark.extended
def test_an_infeasible_fsdp_peak_budget_points_to_collectives_in_flight():
    import thunder

    from remat_opt import CostRemat, InfeasibleBudgetError
    from remat_opt.distributed.data_parallel import fake_process_group, parallel_transform
    from remat_opt.executors import executors_for
    from remat_opt.models.by_name import ModelSpec, build_model

    model, inputs = build_model(ModelSpec(**SPEC_ARGS))
    with fake_process_group(2):
        transforms = [parallel_transform("fsdp", model.lm_head.weight.device), CostRemat(budget_gb=1e-9, device_spec="H100")]
        jitted = thunder.jit(model, transforms=transforms, executors=executors_for("fused-sdpa"))
        with pytest.raises(InfeasibleBudgetError) as raised:
            jitted(*inputs)  # planned at compile time, on meta: nothing runs
    assert any("CostRemat(collectives_in_flight=1) lowers it" in note for note in raised.value.__notes__)


def test_in_thunders_order_every_unsharded_gradient_awaits_its_reduce_scatter_at_once(fsdp_4_ranks):
    from remat_opt.distributed.collective_order import REDUCE_SCATTER, gradients_awaiting_scatter_bytes
    from remat_opt.models.by_name import ModelSpec, build_model

    backward = fsdp_4_ranks.backward_ops
    first_scatter = next(j for j, op in enumerate(backward) if op.symbol == REDUCE_SCATTER)
    model, _ = build_model(ModelSpec(**SPEC_ARGS))
    unsharded = sum(p.numel() * p.element_size() for p in model.parameters())
    # Thunder issues the reduce-scatters after the backward's last compute: all gradients wait there
    assert gradients_awaiting_scatter_bytes(fsdp_4_ranks, first_scatter) == unsharded
    assert gradients_awaiting_scatter_bytes(fsdp_4_ranks, 0) < unsharded / 4
    assert gradients_awaiting_scatter_bytes(fsdp_4_ranks, len(backward) - 1) == 0


@pytest.mark.parametrize("in_flight", [0, 1])
def test_with_collectives_in_flight_each_reduce_scatter_follows_its_gradient(fsdp_4_ranks, in_flight):
    from remat_opt.distributed.collective_order import (REDUCE_SCATTER, WAIT, gradients_awaiting_scatter_bytes,
                                                        reorder_graph)

    limited = reorder_graph(fsdp_4_ranks, in_flight)
    backward = limited.backward_ops
    made_at = {name: j for j, op in enumerate(backward) for name in op.outputs}
    scatters = [j for j, op in enumerate(backward) if op.symbol == REDUCE_SCATTER]
    assert len(scatters) == sum(op.symbol == REDUCE_SCATTER for op in fsdp_4_ranks.backward_ops) > 2
    divisions = {made_at[backward[j].inputs[0]] for j in scatters}  # FSDP's division by the world size
    for j in scatters:
        division = made_at[backward[j].inputs[0]]
        gradient_made = max(made_at[name] for name in backward[division].inputs if name in made_at)
        # nothing but divisions, scatters and waits between a gradient and its scatter
        between = range(gradient_made + 1, j)
        assert all(i in divisions or backward[i].symbol in (REDUCE_SCATTER, WAIT) for i in between), \
            [backward[i].symbol for i in between]
    # so the unsharded gradients no longer all wait at once, as in Thunder's order
    thunders = max(gradients_awaiting_scatter_bytes(fsdp_4_ranks, j) for j in range(len(fsdp_4_ranks.backward_ops)))
    most = max(gradients_awaiting_scatter_bytes(limited, j) for j in range(len(backward)))
    assert most < thunders / 2, (most, thunders)


def test_in_thunders_order_every_unsharded_weight_is_alive_from_the_forwards_start(fsdp_4_ranks):
    from remat_opt.distributed.collective_order import ALL_GATHER, WAIT, gathered_weights_alive_bytes
    from remat_opt.models.by_name import ModelSpec, build_model

    forward = fsdp_4_ranks.forward_ops
    last_wait = max(j for j, op in enumerate(forward) if op.symbol == WAIT)
    model, _ = build_model(ModelSpec(**SPEC_ARGS))
    unsharded = sum(p.numel() * p.element_size() for p in model.parameters())
    matrices = sum(p.numel() * p.element_size() for p in model.parameters() if p.dim() > 1)
    # at the last wait every weight matrix is alive; a norm's weight may be used up by then
    assert matrices <= gathered_weights_alive_bytes(fsdp_4_ranks, last_wait) <= unsharded
    first_gather = next(j for j, op in enumerate(forward) if op.symbol == ALL_GATHER)
    assert gathered_weights_alive_bytes(fsdp_4_ranks, first_gather) == 0
    limited = _fsdp_graph(4, in_flight=0)  # each weight gathered just before its use
    most = max(gathered_weights_alive_bytes(limited, j) for j in range(len(limited.forward_ops)))
    assert most < matrices
