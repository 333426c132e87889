"""Per-op formulas, the registry, device specs, the roofline and the cost API (no compilation)."""

from __future__ import annotations

import math
from dataclasses import replace

from remat_opt import _compat  # noqa: F401  (applies the torch compatibility step before thunder)

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from remat_opt.core.graph import JointGraph, OpNode, TensorNode

from costmodels import formulas
from remat_opt.costing.graph_costs import CostModel, coverage_report
from costmodels.devices import GPU_SPECS, NOMINAL_CPU, get_device_spec, roofline_time_s, with_tf32
from costmodels.formulas import OpArgs, OpCost, TensorMeta, causal_fraction, formula_cost, register_cost
from costmodels.table import CostTable, TableEntry, op_key


def _meta(*shape, dtype=torch.float32):
    return torch.empty(shape, device="meta", dtype=dtype)


def _torch_flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def _args(symbol, inputs, outputs=(), attrs=(), dtype="float32"):
    return OpArgs(
        symbol=symbol,
        inputs=tuple(TensorMeta.of(s, dtype) for s in inputs),
        outputs=tuple(TensorMeta.of(s, dtype) for s in outputs),
        attrs=tuple(attrs),
    )


# ---------------------------------------------------------------------------------------------
# FLOPs equal torch.utils.flop_counter on the same shapes
# ---------------------------------------------------------------------------------------------

MATMUL_SHAPES = {
    "mm": ((32, 64), (64, 48)),
    "bmm_4d": ((2, 4, 32, 16), (2, 4, 16, 40)),
    "broadcast_3d_2d": ((3, 32, 64), (64, 48)),
    "broadcast_batch": ((1, 4, 32, 16), (3, 1, 16, 8)),
}


@pytest.mark.parametrize("a_shape,b_shape", MATMUL_SHAPES.values(), ids=MATMUL_SHAPES.keys())
def test_matmul_flops_equal_flop_counter(a_shape, b_shape):
    a, b = _meta(*a_shape), _meta(*b_shape)
    out = torch.matmul(a, b)
    cost = formula_cost(_args("matmul", (a_shape, b_shape), (out.shape,)))
    assert cost.flops == _torch_flops(lambda: torch.matmul(a, b))
    assert cost.matrix_flops == cost.flops and cost.vector_flops == 0


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_linear_flops_equal_flop_counter(bias):
    x, w = _meta(2, 32, 64), _meta(96, 64)
    b = _meta(96) if bias else None
    shapes = [(2, 32, 64), (96, 64)] + ([(96,)] if bias else [])
    cost = formula_cost(_args("linear", shapes, [(2, 32, 96)]))
    assert cost.flops == _torch_flops(lambda: F.linear(x, w, b)) == 2 * 64 * 64 * 96


SDPA_SHAPES = {
    "self": ((2, 4, 32, 16), (2, 4, 32, 16), (2, 4, 32, 16)),
    "cross_q_shorter": ((2, 4, 24, 16), (2, 4, 40, 16), (2, 4, 40, 8)),
}
# Fused attention symbols -> position of their is_causal argument (attrs key "argN").
FORWARD_SYMBOLS = {
    "remat_sdpa_cpu_fwd": 4,
    "cudnn_sdpa_fwd": 5,
    "sdpaex_grad_forward_scaled_dot_product_efficient_attention": 5,
    "sdpafx_grad_forward_scaled_dot_product_efficient_attention": 4,
    "scaled_dot_product_attention": 5,
}
BACKWARD_SYMBOLS = {
    "remat_sdpa_cpu_bwd": 7,
    "cudnn_sdpa_bwd": 6,
    "sdpaex_scaled_dot_product_efficient_attention_backward": 10,
    "sdpafx_scaled_dot_product_efficient_attention_backward": 11,
}


@pytest.mark.parametrize("symbol", FORWARD_SYMBOLS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shapes", SDPA_SHAPES.values(), ids=SDPA_SHAPES.keys())
def test_sdpa_forward_flops_equal_flop_counter(symbol, causal, shapes):
    q, k, v = (_meta(*s, dtype=torch.float16) for s in shapes)
    efficient_attention = torch.ops.aten._scaled_dot_product_efficient_attention
    counted = _torch_flops(lambda: efficient_attention(q, k, v, None, True, 0.0, causal))
    out_shape = shapes[0][:3] + (shapes[2][3],)
    args = _args(symbol, shapes, [out_shape], [(f"arg{FORWARD_SYMBOLS[symbol]}", causal)], "float16")
    cost = formula_cost(args)
    # torch counts the full score matrix also for causal attention; so does `flops`.
    assert cost.flops == counted
    # What the kernel executes: 2 FLOPs per (kept score, head dim) for q @ k.T and for p @ v, over
    # the scores a top-left causal mask keeps (counted on a real mask, not with `causal_fraction`).
    (batch, heads, q_len, d_qk), (_, _, kv_len, d_v) = shapes[0], shapes[2]
    kept_scores = int(torch.ones(q_len, kv_len).tril().sum()) if causal else q_len * kv_len
    assert cost.matrix_flops == 2 * batch * heads * kept_scores * (d_qk + d_v)
    assert cost.transcendentals == batch * heads * kept_scores  # one exp per kept score
    assert formulas.sdpa_is_causal(args) is causal


@pytest.mark.parametrize("symbol", BACKWARD_SYMBOLS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpa_backward_flops_equal_flop_counter(symbol, causal):
    shape = (2, 4, 32, 16)
    q, k, v, out, grad = (_meta(*shape, dtype=torch.float16) for _ in range(5))
    lse = _meta(2, 4, 32)
    seed = torch.empty((), dtype=torch.int64, device="meta")
    counted = _torch_flops(
        lambda: torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            grad, q, k, v, None, out, lse, seed, seed, 0.0, [True, True, True, False], causal
        )
    )
    args = _args(symbol, [shape] * 4, [shape] * 3, [(f"arg{BACKWARD_SYMBOLS[symbol]}", causal)], "float16")
    assert formula_cost(args).flops == counted == 5 * 2 * 2 * 4 * 32 * 32 * 16


def test_sdpa_grouped_query_attention_counts_query_heads():
    q, kv = (1, 8, 32, 16), (1, 2, 32, 16)
    tq, tkv = _meta(*q), _meta(*kv)
    counted = _torch_flops(lambda: F.scaled_dot_product_attention(tq, tkv, tkv, enable_gqa=True))
    assert formula_cost(_args("remat_sdpa_cpu_fwd", [q, kv, kv], [q])).flops == counted


def test_flash_attention_3_layout_is_batch_seq_heads():
    bshd = (2, 32, 4, 16)  # batch 2, seq 32, 4 heads, head dim 16
    bhsd = (2, 4, 32, 16)
    fa3 = formula_cost(_args("fa3_fwd", [bshd] * 3, [bshd], [("arg3", True)]))
    cpu = formula_cost(_args("remat_sdpa_cpu_fwd", [bhsd] * 3, [bhsd], [("arg4", True)]))
    # By hand: 2 * 4 = 8 score matrices of 32 x 32; q @ k.T and p @ v cost 2 * 16 FLOPs per score
    # each: 8 * 1024 * 64 = 524288. Causal keeps 32 * 33 / 2 = 528 of the 1024 scores: 8 * 528 * 64.
    assert (fa3.flops, fa3.matrix_flops) == (524288, 270336) == (cpu.flops, cpu.matrix_flops)


@pytest.mark.parametrize(
    "q_len,kv_len,expected",
    [(1, 1, 1.0), (4, 4, 10 / 16), (2, 4, 3 / 8), (4, 2, 7 / 8), (4096, 4096, 4097 / 8192)],
)
def test_causal_fraction_counts_top_left_mask(q_len, kv_len, expected):
    mask = torch.ones(q_len, kv_len).tril()
    assert causal_fraction(q_len, kv_len) == pytest.approx(expected) == pytest.approx(mask.mean().item())


# ---------------------------------------------------------------------------------------------
# Registry, families, fallback
# ---------------------------------------------------------------------------------------------


def test_registering_a_symbol_twice_raises():
    with pytest.raises(ValueError, match="'matmul' already registered"):
        register_cost("matmul")(lambda args: OpCost(flops=0, bytes_read=0, bytes_written=0))


def test_fusion_regions_are_recognised_by_name():
    assert formulas.is_fusion_symbol("nvFusion12") and formulas.is_fusion_symbol("TorchCompile0")
    assert not formulas.is_fusion_symbol("nvFusion") and not formulas.is_fusion_symbol("TorchCompile_xentropy")
    assert formulas.has_formula("nvFusion3")


def test_unknown_symbol_gets_an_explicit_fallback():
    args = _args("my_custom_op", [(4, 8)], [(4, 8)])
    cost = formula_cost(args)
    assert cost.formula == "fallback"
    assert cost.flops == 32 and cost.bytes_read == cost.bytes_written == 128
    assert formulas.missing_formulas(args) == ["my_custom_op"]


def test_elementwise_counts_broadcast_output_and_reads_inputs_once():
    x = TensorMeta.of((8, 16), "bfloat16", name="x")
    out = TensorMeta.of((8, 16), "bfloat16", name="y")
    cost = formula_cost(OpArgs(symbol="mul", inputs=(x, x), outputs=(out,)))
    assert (cost.flops, cost.bytes_read, cost.bytes_written) == (128, 256, 256)


def test_expand_view_is_read_at_its_base_size():
    base = TensorMeta(shape=(1, 16), dtype="float32", nbytes=64, storage_bytes=64)
    expanded = TensorMeta(shape=(8, 16), dtype="float32", nbytes=512, storage_bytes=64, name="e")
    out = TensorMeta.of((8, 16), "float32")
    cost = formula_cost(OpArgs(symbol="add", inputs=(expanded, TensorMeta.of((8, 16), "float32")), outputs=(out,)))
    assert cost.bytes_read == 64 + 512
    assert base.read_bytes == 64


def test_view_is_free_and_a_copying_reshape_is_not():
    src = TensorMeta.of((4, 8), "float32")
    aliased, fresh = TensorMeta.of((32,), "float32", is_view=True), TensorMeta.of((32,), "float32")
    view = formula_cost(OpArgs(symbol="reshape", inputs=(src,), outputs=(aliased,)))
    copy = formula_cost(OpArgs(symbol="reshape", inputs=(src,), outputs=(fresh,)))
    assert (view.bytes_read, view.bytes_written, view.kernels) == (0, 0, 0)
    assert (copy.bytes_read, copy.bytes_written, copy.kernels) == (128, 128, 1)
    # split into three views: three views' dispatcher overhead (measured in a step: ~3x a reshape)
    thirds = tuple(TensorMeta.of((4, 8), "float32", is_view=True) for _ in range(3))
    split = formula_cost(OpArgs(symbol="split", inputs=(TensorMeta.of((4, 24), "float32"),), outputs=thirds))
    assert (split.kernels, split.views, view.views) == (0, 3, 1)


def test_transcendentals_and_activations():
    exp = formula_cost(_args("exp", [(10,)], [(10,)]))
    silu = formula_cost(_args("silu", [(10,)], [(10,)]))
    softmax = formula_cost(_args("softmax", [(4, 10)], [(4, 10)]))
    assert (exp.flops, exp.transcendentals) == (10, 10)
    assert (silu.flops, silu.transcendentals) == (40, 10)
    assert (softmax.flops, softmax.transcendentals) == (200, 40)


def test_embedding_reads_gathered_rows_not_the_table():
    args = OpArgs(
        symbol="embedding",
        inputs=(TensorMeta.of((1, 32), "int64"), TensorMeta.of((32000, 64), "bfloat16")),
        outputs=(TensorMeta.of((1, 32, 64), "bfloat16"),),
    )
    cost = formula_cost(args)
    assert cost.flops == 0
    assert cost.bytes_read == 32 * 8 + 32 * 64 * 2


def test_embedding_backward_adds_every_gradient_element():
    args = OpArgs(
        symbol="torch.ops.aten.embedding_backward",
        inputs=(TensorMeta.of((1, 32, 64), "float32"), TensorMeta.of((1, 32), "int64")),
        outputs=(TensorMeta.of((256, 64), "float32"),),
        attrs=(("arg2", 256),),
    )
    cost = formula_cost(args)
    assert cost.flops == 32 * 64
    assert cost.bytes_written == 256 * 64 * 4 + 32 * 64 * 4


def test_cross_entropy_forward_and_backward():
    logits, target = (16, 32000), (16,)
    inputs = (TensorMeta.of(logits, "float32"), TensorMeta.of(target, "int64"))
    fwd = formula_cost(OpArgs(symbol="cross_entropy", inputs=inputs, outputs=(TensorMeta.of((), "float32"),)))
    bwd = formula_cost(_args("apex_cross_entropy_backward", [(), logits], [logits]))
    assert (fwd.flops, fwd.transcendentals) == (5 * 16 * 32000, 16 * 32000)
    assert bwd.flops == 4 * 16 * 32000


def test_fusion_cost_sums_member_flops_and_counts_boundary_bytes():
    x = TensorMeta.of((64,), "float32", name="x")
    mid = TensorMeta(shape=(64,), dtype="float32", nbytes=256, storage_bytes=0, name="mid")  # internal
    out = TensorMeta.of((64,), "float32", name="out")
    members = (
        OpArgs(symbol="exp", inputs=(x,), outputs=(mid,)),
        OpArgs(symbol="mul", inputs=(mid, x), outputs=(out,)),
    )
    region = formula_cost(OpArgs(symbol="nvFusion0", inputs=(x,), outputs=(out,), members=members))
    assert (region.flops, region.transcendentals) == (128, 64)
    assert (region.bytes_read, region.bytes_written, region.kernels, region.formula) == (256, 256, 1, "fusion")


# ---------------------------------------------------------------------------------------------
# Devices and the roofline
# ---------------------------------------------------------------------------------------------


def test_device_specs_are_dense_vendor_figures():
    h100, a100 = get_device_spec("H100"), get_device_spec("a100")
    assert h100.matrix_peak("bfloat16") == pytest.approx(989.4e12)
    assert h100.memory_bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert get_device_spec("H200").memory_bandwidth_bytes_per_s == pytest.approx(4.8e12)
    assert a100.matrix_peak("bfloat16") == pytest.approx(312e12)
    assert a100.matrix_peak("float32") == pytest.approx(19.5e12)
    assert get_device_spec("NVIDIA L40S").matrix_peak("float16") == pytest.approx(362.05e12)
    assert get_device_spec("NVIDIA H100 80GB HBM3").name == "H100-SXM"
    assert with_tf32(a100).matrix_peak("float32") == pytest.approx(156e12)
    assert set(GPU_SPECS) == {"H100-SXM", "H200", "A100-80GB", "L40S"}


def test_unknown_device_names_the_known_ones():
    with pytest.raises(ValueError, match="known: H100-SXM, H200, A100-80GB, L40S"):
        get_device_spec("TPUv5")


# Figures the roofline tests use, written out: the H100 SXM sheet (dense bf16 tensor cores 989.4
# TFLOP/s, FP32 67 TFLOP/s, HBM3 3.35 TB/s, 4 us per kernel launch) and NOMINAL_CPU (50 GFLOP/s
# matmul, 5 GFLOP/s vector, 1e9 exp/s, 10 GB/s DRAM, 50 GB/s within 1 MiB of cache, 3 us per kernel,
# 1 us per view).
H100_LAUNCH_S, CPU_LAUNCH_S, CPU_VIEW_S = 4e-6, 3e-6, 1e-6


def test_roofline_picks_the_binding_resource():
    h100 = get_device_spec("H100")
    # 1 TFLOP on bf16 tensor cores, no GEMM shape: at the large-GEMM fraction 794.5 / 989 of 989.4
    # TFLOP/s, 1e12 / 794.82e12 = 1.2581 ms; its 1 MB of reads take 0.3 us.
    compute = OpCost(flops=10**12, bytes_read=10**6, bytes_written=0, matrix_flops=10**12, dtype="bfloat16")
    assert roofline_time_s(compute, h100) == pytest.approx(1.258144e-3 + H100_LAUNCH_S, rel=1e-6)
    # 10 GB read: 1e10 / 3.35e12 = 2.9851 ms; its 1 MFLOP takes 15 ps.
    memory = OpCost(flops=10**6, bytes_read=10**10, bytes_written=0, vector_flops=10**6, dtype="bfloat16")
    assert roofline_time_s(memory, h100) == pytest.approx(2.985075e-3 + H100_LAUNCH_S, rel=1e-6)
    # Both at once: compute (1.2581 ms) and memory (2.9851 ms) overlap; the longer one is paid.
    both = OpCost(flops=10**12, bytes_read=10**10, bytes_written=0, matrix_flops=10**12, dtype="bfloat16")
    assert roofline_time_s(both, h100) == pytest.approx(2.985075e-3 + H100_LAUNCH_S, rel=1e-6)
    view = OpCost(flops=0, bytes_read=0, bytes_written=0, kernels=0, formula="view")
    free = OpCost(flops=0, bytes_read=0, bytes_written=0, kernels=0, formula="free")
    assert roofline_time_s(view, NOMINAL_CPU) == CPU_VIEW_S
    split_in_three = OpCost(flops=0, bytes_read=0, bytes_written=0, kernels=0, formula="view", views=3)
    assert roofline_time_s(split_in_three, NOMINAL_CPU) == pytest.approx(3 * CPU_VIEW_S)
    assert roofline_time_s(free, NOMINAL_CPU) == 0.0


def test_roofline_uses_cache_bandwidth_for_small_working_sets():
    small = OpCost(flops=0, bytes_read=1000, bytes_written=0)  # fits in the 1 MiB cache: 1000 B / 50 GB/s
    large = OpCost(flops=0, bytes_read=10 << 20, bytes_written=0)  # 10 MiB from DRAM: 10485760 B / 10 GB/s
    assert roofline_time_s(small, NOMINAL_CPU) == pytest.approx(2e-8 + CPU_LAUNCH_S, rel=1e-9)
    assert roofline_time_s(large, NOMINAL_CPU) == pytest.approx(1.048576e-3 + CPU_LAUNCH_S, rel=1e-9)


# ---------------------------------------------------------------------------------------------
# The cost API on a hand-built graph
# ---------------------------------------------------------------------------------------------


def _tensor(name, shape, kind="forward"):
    nbytes = 4 * math.prod(shape)
    return TensorNode(name=name, shape=shape, dtype="float32", device="cpu", nbytes=nbytes, storage=name,
                      storage_bytes=nbytes, kind=kind)  # fmt: skip


@pytest.fixture
def tiny_graph() -> JointGraph:
    """x -> linear(w) -> h -> exp -> e; backward: the weight gradient gT @ x (gT: the cotangent, transposed)."""
    tensors = {
        "x": _tensor("x", (8, 16), "input"),
        "w": _tensor("w", (32, 16), "input"),
        "h": _tensor("h", (8, 32)),
        "e": _tensor("e", (8, 32)),
        "gT": _tensor("gT", (32, 8), "cotangent"),
        "gw": _tensor("gw", (32, 16), "backward"),
    }
    ops = (
        OpNode(name="fwd0", symbol="linear", is_backward=False, index=0, inputs=("x", "w"), outputs=("h",),
               attrs=(("arg2", None),)),
        OpNode(name="fwd1", symbol="exp", is_backward=False, index=1, inputs=("h",), outputs=("e",)),
        OpNode(name="bwd0", symbol="matmul", is_backward=True, index=0, inputs=("gT", "x"), outputs=("gw",)),
    )  # fmt: skip
    return JointGraph(ops=ops, tensors=tensors, saved=(), input_names=("x", "w"), forward_output_names=("e",))


# Roofline times of `tiny_graph`'s ops on NOMINAL_CPU, by hand (every op's bytes fit in the 1 MiB cache):
# linear [8,16] x [32,16]^T: 2*8*16*32 = 8192 FLOPs / 50 GFLOP/s = 163.84 ns; (512 + 2048 + 1024) B /
#   50 GB/s = 71.68 ns; compute-bound: 163.84 ns + 3 us.
LINEAR_S = 163.84e-9 + CPU_LAUNCH_S
# exp of 256 floats: 256 exp / 1e9/s = 256 ns; (1024 + 1024) B / 50 GB/s = 40.96 ns: 256 ns + 3 us.
EXP_S = 256e-9 + CPU_LAUNCH_S
# matmul [32,8] @ [8,16]: 2*32*16*8 = 8192 FLOPs = 163.84 ns; (1024 + 512 + 2048) B = 71.68 ns.
WEIGHT_GRAD_S = 163.84e-9 + CPU_LAUNCH_S


def test_cost_model_uses_formulas_without_a_table(tiny_graph):
    costs = CostModel(tiny_graph, "cpu")
    linear = costs.op_cost("fwd0")
    assert linear.source == "formula" and linear.flops == 2 * 8 * 16 * 32
    assert (linear.bytes_read, linear.bytes_written) == ((8 * 16 + 32 * 16) * 4, 8 * 32 * 4)
    assert linear.time_s == pytest.approx(LINEAR_S, rel=1e-9)
    assert costs.op_cost("fwd1").time_s == pytest.approx(EXP_S, rel=1e-9)
    assert costs.chain_time_s(["fwd0", "fwd1"]) == pytest.approx(LINEAR_S + EXP_S, rel=1e-9)
    assert costs.total_time_s(backward=False) == pytest.approx(LINEAR_S + EXP_S, rel=1e-9)
    assert costs.producer_cost("e").time_s == pytest.approx(EXP_S, rel=1e-9)
    assert costs.op_cost("bwd0").flops == 2 * 32 * 16 * 8
    assert costs.total_time_s(backward=True) == pytest.approx(WEIGHT_GRAD_S, rel=1e-9)
    assert costs.total_time_s() == pytest.approx(LINEAR_S + EXP_S + WEIGHT_GRAD_S, rel=1e-9)
    assert coverage_report(tiny_graph).ok


def test_cost_model_prefers_measured_entries(tiny_graph):
    from remat_opt.costing.graph_costs import op_args

    key = op_key(op_args(tiny_graph, tiny_graph.ops[0]))
    table = CostTable(
        device="cpu: test", device_kind="cpu", torch_version="x", thunder_version="y",
        entries={key: TableEntry(key=key, symbol="linear", time_s=1.5e-3, repeats=10)},
    )  # fmt: skip
    costs = CostModel(tiny_graph, "cpu", table)
    assert costs.op_cost("fwd0").source == "measured" and costs.op_cost("fwd0").time_s == 1.5e-3
    assert costs.op_cost("fwd1").source == "formula"
    chain = costs.chain_cost(["fwd0", "fwd1"])
    assert chain.source == "formula" and chain.time_s == pytest.approx(1.5e-3 + EXP_S, rel=1e-9)
    assert (chain.flops, chain.kernels) == (8192 + 256, 2)
    assert costs.chain_cost(["fwd0"]).source == "measured"
    assert costs.measured_share() == pytest.approx(1 / 3)


def _fused_twin(tiny_graph: JointGraph) -> tuple[JointGraph, JointGraph]:
    """`tiny_graph` with tag units (linear: "h", exp: "e"), and its fused twin: one region running both."""
    unfused = replace(tiny_graph, ops=(replace(tiny_graph.ops[0], tag_units=("h",)),
                                       replace(tiny_graph.ops[1], tag_units=("e",)), tiny_graph.ops[2]))
    members = tuple(replace(op, name=f"fwd0.{i}") for i, op in enumerate(unfused.ops[:2]))
    region = OpNode(name="fwd0", symbol="TorchCompile0", is_backward=False, index=0, inputs=("x", "w"),
                    outputs=("e",), members=members, op_tags=frozenset({"fusion"}))
    return unfused, replace(tiny_graph, ops=(region, tiny_graph.ops[2]))


def _times_table(graph: JointGraph, times_s: dict[str, float]) -> CostTable:
    from remat_opt.costing.graph_costs import op_args

    keys = {name: op_key(op_args(graph, op)) for op in graph.ops if (name := op.name) in times_s}
    return CostTable(device="cpu: test", device_kind="cpu", torch_version="x", thunder_version="y",
                     entries={k: TableEntry(key=k, symbol=n, time_s=times_s[n], repeats=1) for n, k in keys.items()})


def test_unfused_ops_take_their_share_of_a_region_timed_whole(tiny_graph):
    unfused, fused = _fused_twin(tiny_graph)
    own = _times_table(unfused, {"fwd0": 3e-6, "fwd1": 1e-6})
    region = _times_table(fused, {"fwd0": 2e-6})
    table = replace(own, entries={**own.entries, **region.entries})
    assert CostModel(fused, "cpu", table).op_cost("fwd0").source == "measured region"
    costs = CostModel(unfused, "cpu", table, region_graph=fused)
    linear, exp = costs.op_cost("fwd0"), costs.op_cost("fwd1")
    # own times 3 us + 1 us, the region they run in 2 us: each op costs half its own time
    assert (linear.source, exp.source) == ("region share", "region share")
    assert linear.time_s == pytest.approx(1.5e-6, rel=1e-12) and exp.time_s == pytest.approx(0.5e-6, rel=1e-12)
    assert costs.op_cost("bwd0").source == "formula"  # backward ops keep their own cost
    assert costs.chain_cost(["fwd0", "fwd1"]).source == "measured"
    # a region without a whole-region time leaves the ops their own times
    unpriced = CostModel(unfused, "cpu", own, region_graph=fused)
    assert unpriced.op_cost("fwd0").source == "measured" and unpriced.op_cost("fwd0").time_s == 3e-6


def test_regions_that_share_a_pre_autodiff_op_are_priced_together(tiny_graph):
    from remat_opt.costing.graph_costs import region_groups

    unfused, fused = _fused_twin(tiny_graph)
    region = fused.ops[0]
    # the region split in two, both running part of the exp's pre-autodiff op "e"
    first = replace(region, name="fwd0", members=(region.members[0], replace(region.members[1], name="fwd0.1")))
    second = replace(region, name="fwd1", index=1, members=(replace(region.members[1], name="fwd1.0"),))
    split = replace(fused, ops=(first, second, fused.ops[1]))
    [(regions, ops)] = region_groups(unfused, split)
    assert [r.name for r in regions] == ["fwd0", "fwd1"] and [op.name for op in ops] == ["fwd0", "fwd1"]
    apart = replace(fused, ops=(replace(first, members=first.members[:1]), second, fused.ops[1]))
    assert [([r.name for r in rs], [op.name for op in ops]) for rs, ops in region_groups(unfused, apart)] == [
        (["fwd0"], ["fwd0"]), (["fwd1"], ["fwd1"])]  # no op in common: priced apart
    assert region_groups(unfused, replace(fused, ops=(fused.ops[1],))) == []  # no regions: no shares


def test_producer_of_an_input_is_an_error(tiny_graph):
    with pytest.raises(KeyError, match="'x' has no producing op"):
        CostModel(tiny_graph, "cpu").producer_cost("x")


def test_a_cpu_table_cannot_price_a_gpu(tiny_graph):
    table = CostTable(device="cpu: test", device_kind="cpu", torch_version="x", thunder_version="y")
    with pytest.raises(ValueError, match="measured on 'cpu: test' cannot price ops on 'H100'"):
        CostModel(tiny_graph, "H100", table)


def test_rank_agreement_compares_only_the_keys_both_maps_have():
    from remat_opt.validation.cost_report import rank_agreement

    table_s = {"a": 1.0, "b": 2.0, "c": 3.0, "only-table": 0.0}
    in_step_s = {"a": 10.0, "b": 30.0, "c": 20.0, "only-step": 99.0}
    # Over a, b, c: ranks (1, 2, 3) against (1, 3, 2): 1 - 6 * 2 / 24.
    assert rank_agreement(table_s, in_step_s) == pytest.approx(0.5)
    assert rank_agreement(table_s, in_step_s, keys={"a", "b"}) == pytest.approx(1.0)
    assert math.isnan(rank_agreement(table_s, in_step_s, keys={"a"}))


def test_spearman_ranks_with_ties():
    from remat_opt.validation.cost_report import spearman

    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # Ranks, not values: a monotone but non-linear relation is a perfect rank correlation.
    assert spearman([1e-6, 1e-3, 1.0, 1e3], [1, 2, 3, 4]) == pytest.approx(1.0)
    # No ties: 1 - 6 * sum(d^2) / (n (n^2 - 1)); rank differences (-1, 1, -1, 1, 0): 1 - 6 * 4 / 120.
    assert spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)
    # Ties share their average rank: ranks (1.5, 1.5, 3) against (1, 2, 3):
    # deviations (-0.5, -0.5, 1) and (-1, 0, 1): 1.5 / sqrt(1.5 * 2) = sqrt(3) / 2.
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.8660254)
    # Ties in both lists: ranks (3, 1.5, 4, 1.5, 5) and (2.5, 4, 1, 5, 2.5), both of mean 3;
    # deviations (0, -1.5, 1, -1.5, 2) and (-0.5, 1, -2, 2, -0.5): covariance -7.5, variances 9.5 each.
    assert spearman([3, 1, 4, 1, 5], [2, 7, 1, 8, 2]) == pytest.approx(-7.5 / 9.5)
    assert math.isnan(spearman([2, 2, 2], [1, 2, 3]))  # a constant list has no ranking
    with pytest.raises(ValueError, match="equal length >= 2"):
        spearman([1], [1])


@pytest.mark.parametrize(
    "symbol,attrs",
    [
        ("sdpaex_grad_forward_scaled_dot_product_efficient_attention", [("arg3", None), ("arg4", 0.0), ("arg5", True)]),
        ("sdpafx_grad_forward_scaled_dot_product_efficient_attention", [("arg3", 0.0), ("arg4", True)]),
    ],
    ids=["efficient", "flash"],
)
def test_gpu_sdpa_runners_match_aten_signatures_on_meta(symbol, attrs):
    from costmodels.runners import make_call

    shape = (1, 2, 64, 16)
    q = _meta(*shape, dtype=torch.float16)
    out = make_call(_args(symbol, [shape] * 3, [shape], attrs, "float16"), [q, q, q], "meta")()
    assert tuple(out[0].shape) == shape
