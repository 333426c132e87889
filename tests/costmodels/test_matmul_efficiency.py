"""Shape-aware matmul throughput on GPU specs: the large-GEMM (MAMF) fraction, wave and tile
quantization, GEMM shapes carried by formulas and fusion regions, CPUs unchanged (no compilation)."""

from __future__ import annotations

import pytest

from costmodels.devices import (
    GEMM_TILE,
    GPU_SPECS,
    NOMINAL_CPU,
    SM_COUNT,
    CpuCalibration,
    cpu_device_spec,
    gemm_efficiency,
    matrix_fraction,
    matrix_time_s,
    roofline_time_s,
)
from costmodels.formulas import OpArgs, TensorMeta, formula_cost, gemm_flops

H100 = GPU_SPECS["H100-SXM"]
# The MAMF table's bf16 rows (stas00/ml-engineering, compute/accelerator/README.md): MAMF / theory.
MAMF_BF16 = {"H100-SXM": 794.5 / 989, "H200": 794.5 / 989, "A100-80GB": 271.2 / 312, "L40S": 794.5 / 989}


def _linear(rows: int, n_out: int, n_in: int, dtype: str = "bfloat16"):
    """``linear`` of a ``[rows, n_in]`` input and a ``[n_out, n_in]`` weight: one (1, rows, n_out, n_in) GEMM."""
    return formula_cost(OpArgs(
        symbol="linear",
        inputs=(TensorMeta.of((rows, n_in), dtype), TensorMeta.of((n_out, n_in), dtype)),
        outputs=(TensorMeta.of((rows, n_out), dtype),),
    ))


def _gemm_s(shape, spec=H100, dtype="bfloat16") -> float:
    """Time of the matrix FLOPs of one ``(batch, M, N, K)`` GEMM, through the bmm formula."""
    batch, m, n, k = shape
    cost = formula_cost(OpArgs(
        symbol="bmm",
        inputs=(TensorMeta.of((batch, m, k), dtype), TensorMeta.of((batch, k, n), dtype)),
        outputs=(TensorMeta.of((batch, m, n), dtype),),
    ))
    return matrix_time_s(cost, spec)


# ---------------------------------------------------------------------------------------------
# Formulas carry their GEMM shapes
# ---------------------------------------------------------------------------------------------


def test_linear_matmul_and_linear_backward_carry_gemm_shapes_that_add_up_to_their_flops():
    linear = _linear(4096, 11008, 4096)
    assert linear.gemm_shapes == ((1, 4096, 11008, 4096),)
    bmm = formula_cost(OpArgs(symbol="matmul", inputs=(TensorMeta.of((2, 32, 64, 128), "bfloat16"),
                                                       TensorMeta.of((128, 96), "bfloat16"))))
    assert bmm.gemm_shapes == ((64, 64, 96, 128),)
    grad, x, w = (TensorMeta.of(s, "bfloat16") for s in ((8, 512, 1024), (8, 512, 256), (1024, 256)))
    backward = formula_cost(OpArgs(symbol="te_functional_linear_bwd", inputs=(grad, x, w)))
    # input gradient [4096, 1024] @ [1024, 256]; weight gradient [1024, 4096] @ [4096, 256]
    assert backward.gemm_shapes == ((1, 4096, 256, 1024), (1, 1024, 256, 4096))
    for cost in (linear, bmm, backward):
        assert sum(map(gemm_flops, cost.gemm_shapes)) == cost.matrix_flops == cost.flops


def test_a_fusion_region_is_timed_by_its_members_gemm_shapes():
    # 19 x 7 = 133 tiles of 128x256 on 132 SMs: two waves, the second with one tile
    member = OpArgs(symbol="linear", inputs=(TensorMeta.of((2432, 4096), "bfloat16"), TensorMeta.of((1792, 4096), "bfloat16")),
                    outputs=(TensorMeta.of((2432, 1792), "bfloat16"),))
    add = OpArgs(symbol="add", inputs=member.outputs * 2, outputs=member.outputs)
    region = formula_cost(OpArgs(symbol="TorchCompile0", inputs=member.inputs, outputs=member.outputs,
                                 members=(member, add)))
    alone = formula_cost(member)
    assert region.gemm_shapes == alone.gemm_shapes == ((1, 2432, 1792, 4096),)
    assert matrix_time_s(region, H100) == pytest.approx(matrix_time_s(alone, H100), rel=1e-12)
    # the shape matters: two waves of 132 tiles for 2432 x 1792 useful outputs
    at_fraction_s = region.matrix_flops / (H100.matrix_peak("bfloat16") * matrix_fraction(H100, "bfloat16"))
    assert matrix_time_s(region, H100) == pytest.approx(at_fraction_s * 2 * 132 * 128 * 256 / (2432 * 1792), rel=1e-12)


def test_attention_has_no_gemm_shape_and_runs_at_the_large_gemm_fraction():
    q = TensorMeta.of((1, 32, 4096, 128), "bfloat16")
    cost = formula_cost(OpArgs(symbol="cudnn_sdpa_fwd", inputs=(q, q, q), attrs=(("is_causal", True),)))
    assert cost.gemm_shapes == ()
    expected_s = cost.matrix_flops / (989.4e12 * MAMF_BF16["H100-SXM"])
    assert matrix_time_s(cost, H100) == pytest.approx(expected_s, rel=1e-9)


# ---------------------------------------------------------------------------------------------
# The large-GEMM fraction, wave and tile quantization
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec_name", list(GPU_SPECS))
def test_a_large_square_bf16_gemm_runs_at_the_mamf_fraction(spec_name):
    spec = GPU_SPECS[spec_name]
    side = GEMM_TILE[1] * SM_COUNT[spec_name]  # a whole number of full waves of 128x256 tiles
    assert gemm_efficiency(spec, "bfloat16", (1, side, side, 8192)) == pytest.approx(MAMF_BF16[spec_name], rel=1e-12)


def test_a_large_unaligned_square_gemm_comes_close_to_the_mamf_fraction_from_below():
    # 16384^2: 128 x 64 = 8192 tiles in 63 waves of 132 (62.06 full): 98.5% of the slots are useful
    efficiency = gemm_efficiency(H100, "bfloat16", (1, 16384, 16384, 16384))
    assert efficiency == pytest.approx(MAMF_BF16["H100-SXM"] * 8192 / (63 * 132), rel=1e-12)
    assert efficiency < MAMF_BF16["H100-SXM"]


def test_one_tile_more_than_the_sms_costs_a_whole_second_wave():
    sms = SM_COUNT["H100-SXM"]
    one_wave_s = _gemm_s((1, 128 * sms, 256, 8192))  # 132 tiles
    one_over_s = _gemm_s((1, 128 * (sms + 1), 256, 8192))  # 133 tiles: 2 waves
    two_waves_s = _gemm_s((1, 128 * 2 * sms, 256, 8192))  # 264 tiles: 2 full waves
    assert one_over_s == pytest.approx(two_waves_s, rel=1e-12)
    assert two_waves_s == pytest.approx(2 * one_wave_s, rel=1e-12)


def test_m_and_n_are_padded_up_to_tile_multiples():
    # one wave either way: 129 rows take two 128-row tiles, as 256 rows do
    assert _gemm_s((1, 129, 256, 4096)) == pytest.approx(_gemm_s((1, 256, 256, 4096)), rel=1e-12)
    ratio = gemm_efficiency(H100, "bfloat16", (1, 129, 256, 4096)) / gemm_efficiency(H100, "bfloat16", (1, 256, 256, 4096))
    assert ratio == pytest.approx(129 / 256, rel=1e-12)


def test_the_batch_of_a_bmm_spreads_over_the_sms_with_its_tiles():
    # 133 matrices of one tile each: two waves, as 264 would be
    assert _gemm_s((133, 128, 256, 4096)) == pytest.approx(_gemm_s((264, 128, 256, 4096)), rel=1e-12)


@pytest.mark.parametrize("dim", ["batch", "M", "N", "K"])
@pytest.mark.parametrize("spec_name", ["H100-SXM", "A100-80GB"])
def test_more_flops_are_never_faster(spec_name, dim):
    index = ("batch", "M", "N", "K").index(dim)
    base = (1, 1000, 1000, 1000)
    sizes = range(1, 1200, 7)
    times = [_gemm_s(base[:index] + (size,) + base[index + 1:], GPU_SPECS[spec_name]) for size in sizes]
    assert all(a <= b for a, b in zip(times, times[1:]))


def test_more_flops_are_never_faster_through_the_roofline():
    times = [roofline_time_s(_linear(rows, 4096, 4096), H100) for rows in range(128, 40_000, 331)]
    assert all(a <= b for a, b in zip(times, times[1:]))


def test_fp8_takes_its_own_mamf_row_and_float32_the_bf16_one():
    side = 256 * 132
    assert gemm_efficiency(H100, "float8_e4m3fn", (1, side, side, 8192)) == pytest.approx(1402.6 / 1979, rel=1e-12)
    assert gemm_efficiency(GPU_SPECS["H200"], "float8_e4m3fn", (1, side, side, 8192)) == pytest.approx(1453.4 / 1979)
    assert gemm_efficiency(H100, "float32", (1, side, side, 8192)) == pytest.approx(MAMF_BF16["H100-SXM"], rel=1e-12)


# ---------------------------------------------------------------------------------------------
# CPUs are unchanged
# ---------------------------------------------------------------------------------------------


def _calibrated_cpu():
    return cpu_device_spec(CpuCalibration(
        matmul_flops_per_s=(("float32", 2e11), ("bfloat16", 1e11)), vector_flops_per_s=1e10,
        transcendentals_per_s=2e9, memory_bandwidth_bytes_per_s=2e10, cache_bandwidth_bytes_per_s=1e11,
        cache_bytes=1 << 20, launch_overhead_s=5e-6, view_overhead_s=1e-6, threads=2,
    ), name="cpu (test)")


@pytest.mark.parametrize("spec", [NOMINAL_CPU, _calibrated_cpu()], ids=["nominal", "calibrated"])
def test_a_cpu_times_matmuls_at_its_matmul_rate_whatever_the_shape(spec):
    cost = _linear(129, 257, 1000, dtype="float32")  # neither tile- nor wave-friendly on a GPU
    assert gemm_efficiency(spec, "float32", cost.gemm_shapes[0]) == 1.0
    compute_s = cost.matrix_flops / spec.matrix_peak("float32")
    memory_s = cost.bytes_total / spec.memory_bandwidth_bytes_per_s
    assert roofline_time_s(cost, spec) == max(compute_s, memory_s) + spec.launch_overhead_s
