"""Collective costs: ring all-gather, reduce-scatter and all-reduce over each spec's interconnect."""

import pytest

from costmodels.devices import NOMINAL_CPU, get_device_spec, roofline_time_s, with_interconnect
from costmodels.formulas import WORLD_SIZE_ATTR, OpArgs, TensorMeta, formula_cost
from costmodels.interconnect import GLOO_LOOPBACK, INFINIBAND_NDR, NVLINK4, ring_bytes_per_rank


def _all_gather(shard_shape, world_size):
    return OpArgs("torch_all_gather_prim_impl", inputs=(TensorMeta.of(shard_shape, "bfloat16"),),
                  attrs=((WORLD_SIZE_ATTR, world_size),))


def test_all_gather_of_a_full_weight_moves_its_bytes_times_w_minus_1_over_w():
    cost = formula_cost(_all_gather((1024, 8192), world_size=8))  # a 128 MiB bf16 weight, 8 shards
    full_bytes = 8 * 1024 * 8192 * 2
    assert cost.network_bytes == full_bytes * 7 // 8 and cost.collective_calls == 1
    h100 = get_device_spec("H100")
    assert h100.interconnect is NVLINK4
    assert roofline_time_s(cost, h100) == pytest.approx(full_bytes * 7 / 8 / 450e9 + 10e-6)
    across_nodes = with_interconnect(h100, INFINIBAND_NDR)
    assert roofline_time_s(cost, across_nodes) == pytest.approx(full_bytes * 7 / 8 / 50e9 + 20e-6)


def test_cpu_gets_the_conservative_nominal_gloo_link():
    assert NOMINAL_CPU.interconnect is GLOO_LOOPBACK
    assert roofline_time_s(formula_cost(_all_gather((64, 64), 2)), NOMINAL_CPU) == pytest.approx(
        64 * 64 * 2 / 1e9 + 100e-6)


def test_wait_is_free_and_all_reduce_moves_twice_an_all_gather():
    wait = formula_cost(OpArgs("torch_wait_prim_impl", outputs=(TensorMeta.of((8,), "float32"),)))
    assert roofline_time_s(wait, NOMINAL_CPU) == 0.0
    assert ring_bytes_per_rank("all_reduce", 800, 4) == 2 * ring_bytes_per_rank("all_gather", 800, 4) == 1200
    with pytest.raises(ValueError, match="unknown collective"):
        ring_bytes_per_rank("broadcast", 800, 4)
