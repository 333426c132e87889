"""Offline per-rank graphs of Thunder's FSDP and DDP (`remat_opt.data_parallel`): one process, a
fake process group of any size, on meta."""

from __future__ import annotations

import pytest

from remat_opt.data_parallel import DataParallel


def test_fsdp_graph_of_4_ranks_on_meta_shards_every_weight_4_ways():
    from costmodels.formulas import WORLD_SIZE_ATTR
    from remat_opt.model_graphs import analyze_spec
    from remat_opt.models import ModelSpec, build_model
    from remat_opt.problem import is_regather_unit

    spec = ModelSpec("Llama-2-7b-hf", n_layer=1, device="meta", tiny=True)
    graph = analyze_spec(spec, traced_layers=0, parallel=DataParallel("fsdp", 4))
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


@pytest.mark.parametrize(("strategy", "world_size", "message"), [
    ("zero3", 2, "unknown data-parallel strategy 'zero3'; use one of: fsdp, ddp"),
    ("fsdp", 0, "world size must be a positive integer, got 0"),
])
def test_bad_data_parallel_is_one_line(strategy, world_size, message):
    with pytest.raises(ValueError, match=message):
        DataParallel(strategy, world_size)
