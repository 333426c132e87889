"""Cost models on GPU symbols that cannot run here: a `JointGraph` hand-built from a real GPU trace.

The fixture is the backward trace in ``tests/data/thunder_1646_llama2_7b_backward_trace.txt`` (Thunder
issue #1646: 1-layer Llama-2-7b, seq 4096, bf16, on an H100): its 45 ops in order, with the shapes
from the trace's comments, ``nvFusionN`` regions, the recomputed ``cudnn_sdpa_fwd`` before
``cudnn_sdpa_bwd``, ``TorchCompile0`` (RoPE backward) and the embedding backward. Fusion outputs
carry no shape comment in the trace; their shapes follow from the ops that consume them. Fusion
members are not printed in the trace either: the members below are a plausible RMSNorm/SwiGLU/RoPE
backward, enough to test that regions cost their members' FLOPs and their boundary bytes.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from remat_opt.core.graph import JointGraph, OpNode, TensorNode

from remat_opt.costing.graph_costs import CostModel, coverage_report, op_args
from costmodels.devices import get_device_spec
from costmodels.formulas import ITEMSIZE, formula_cost
from costmodels.runners import skip_reason

B, T, H, D, E, F, V = 1, 4096, 32, 128, 4096, 11008, 32000
SCALE = 0.08838834764831843
BF16, F32 = "bfloat16", "float32"

# name -> (shape, dtype, kind); weights and saved activations as in the seed trace (names shortened).
TENSORS = {
    "t177": ((B, T, V), BF16, "cotangent"), "w_lm_head": ((V, E), BF16, "input"), "x_7": ((B, T, E), BF16, "forward"),
    "w_ln_f": ((E,), BF16, "input"), "x_2": ((B, T, E), BF16, "forward"), "t309": ((B, T, E), BF16, "forward"),
    "rsqrt_2": ((B, T, 1), F32, "forward"), "w_mlp_proj": ((E, F), BF16, "input"), "x_4": ((B, T, F), BF16, "forward"),
    "t307": ((B, T, F), BF16, "forward"), "t308": ((B, T, F), BF16, "forward"), "w_fc_2": ((F, E), BF16, "input"),
    "to_3": ((B, T, E), BF16, "forward"), "w_fc_1": ((F, E), BF16, "input"), "w_norm_2": ((E,), BF16, "input"),
    "t304": ((B, T, E), BF16, "forward"), "t306": ((B, T, E), BF16, "forward"), "rsqrt_1": ((B, T, 1), F32, "forward"),
    "w_attn_proj": ((E, E), BF16, "input"), "t312": ((B, T, E), BF16, "forward"), "q_2": ((B, H, T, D), BF16, "forward"),
    "k_2": ((B, H, T, D), BF16, "forward"), "v_1": ((B, H, T, D), BF16, "forward"), "y": ((B, H, T, D), BF16, "forward"),
    "sin": ((T, D), BF16, "input"), "cos": ((T, D), BF16, "input"), "w_attn": ((3 * E, E), BF16, "input"),
    "x_normed_1": ((B, T, E), BF16, "forward"), "w_norm_1": ((E,), BF16, "input"), "rsqrt": ((B, T, 1), F32, "forward"),
    "idx": ((B, T), "int64", "input"),
}  # fmt: skip


def _op(symbol, inputs, outputs, attrs=(), members=()):
    """(symbol, inputs, outputs as (name, shape, dtype, view_of), attrs, members) of one fixture op."""
    return symbol, inputs, outputs, tuple(attrs), tuple(members)


def _out(name, shape, dtype=BF16, view_of=None):
    return name, shape, dtype, view_of


def _rmsnorm_backward(tag, grad, x, rsqrt, weight, residual, outs):
    """Members of an RMSNorm-backward fusion: ~12 prims over [B, T, E] in float32."""
    n = lambda s: f"{tag}_{s}"  # noqa: E731
    full, row = (B, T, E), (B, T, 1)
    return [
        _op("convert_element_type", [grad], [_out(n("g"), full, F32)]),
        _op("convert_element_type", [x], [_out(n("x"), full, F32)]),
        _op("broadcast_in_dim", [rsqrt], [_out(n("r"), full, F32)]),
        _op("mul", [n("x"), n("r")], [_out(n("xn"), full, F32)]),
        _op("mul", [n("g"), n("xn")], [_out(n("gxn"), full, F32)]),
        _op("sum", [n("gxn")], [_out(n("dw"), (E,), F32)], [("arg1", (0, 1))]),
        _op("convert_element_type", [n("dw")], [outs[0]]),
        _op("broadcast_in_dim", [weight], [_out(n("w"), full, F32)]),
        _op("mul", [n("g"), n("w")], [_out(n("gw"), full, F32)]),
        _op("mul", [n("gw"), n("xn")], [_out(n("t"), full, F32)]),
        _op("sum", [n("t")], [_out(n("s"), row, F32)], [("arg1", (2,))]),
        _op("mul", [n("xn"), n("s")], [_out(n("u"), full, F32)]),
        _op("sub", [n("gw"), n("u")], [_out(n("v"), full, F32)]),
        _op("mul", [n("v"), n("r")], [_out(n("dx"), full, F32)]),
        _op("add", [n("dx"), residual], [_out(n("sum"), full, F32)]),
        _op("convert_element_type", [n("sum")], [outs[1]]),
    ]


def _swiglu_backward():
    full = (B, T, F)
    return [
        _op("convert_element_type", ["t307"], [_out("nv1_a", full, F32)]),
        _op("neg", ["nv1_a"], [_out("nv1_n", full, F32)]),
        _op("exp", ["nv1_n"], [_out("nv1_e", full, F32)]),
        _op("add", ["nv1_e"], [_out("nv1_d", full, F32)], [("arg1", 1.0)]),
        _op("reciprocal", ["nv1_d"], [_out("nv1_s", full, F32)]),
        _op("mul", ["nv1_a", "nv1_s"], [_out("nv1_silu", full, F32)]),
        _op("convert_element_type", ["bw_t777"], [_out("nv1_g", full, F32)]),
        _op("mul", ["nv1_g", "nv1_silu"], [_out("nv1_dup", full, F32)]),
        _op("convert_element_type", ["nv1_dup"], [_out("bw_t512", full)]),
        _op("convert_element_type", ["t308"], [_out("nv1_b", full, F32)]),
        _op("mul", ["nv1_g", "nv1_b"], [_out("nv1_dsilu", full, F32)]),
        _op("mul", ["nv1_dsilu", "nv1_s"], [_out("nv1_t", full, F32)]),
        _op("convert_element_type", ["nv1_t"], [_out("bw_t529", full)]),
        _op("reshape", ["bw_t529"], [_out("bw_t530", (T, F))], [("arg1", (T, F))]),
    ]


def _rope_backward():
    half, head = (B, H, T, D // 2), (B, H, T, D)
    return [
        _op("slice_prim", ["bw_t595"], [_out("tc_lo", half)]),
        _op("slice_prim", ["bw_t595"], [_out("tc_hi", half)]),
        _op("neg", ["tc_lo"], [_out("tc_nlo", half)]),
        _op("cat", ["tc_hi", "tc_nlo"], [_out("tc_rot", head)], [("arg1", -1)]),
        _op("mul", ["tc_rot", "sin"], [_out("tc_ds", head)]),
        _op("mul", ["bw_t595", "cos"], [_out("tc_dc", head)]),
        _op("add", ["tc_ds", "tc_dc"], [_out("tc_dq", head)]),
        _op("cat", ["tc_dq", "bw_t594", "bw_t596"], [_out("tc_qkv", (B, 3 * H, T, D))], [("arg1", 1)]),
        _op("permute", ["tc_qkv"], [_out("tc_p", (B, T, 3 * H, D))], [("arg1", (0, 2, 1, 3))]),
        _op("reshape", ["tc_p"], [_out("bw_t722", (B, T, 3 * E))], [("arg1", (B, T, 3 * E))]),
        _op("reshape", ["bw_t722"], [_out("bw_t723", (T, 3 * E))], [("arg1", (T, 3 * E))]),
    ]


def _view(symbol, src, name, shape, attr):
    return _op(symbol, [src], [_out(name, shape, view_of=src)], [("arg1", attr)])


TRACE = Path(__file__).resolve().parents[1] / "data" / "thunder_1646_llama2_7b_backward_trace.txt"


def _trace_calls(text: str) -> list[str]:
    """The callees of the trace's top-level statements, in order (``torch.matmul`` -> ``matmul``)."""
    calls = [m.group(1) for m in re.finditer(r"^  (?![ #])[^=\n]*?= ([\w.]+)\(", text, re.M)]
    return [c.removeprefix("torch.") for c in calls]  # Thunder prints torch.torch.ops.aten.x for aten ops


def test_the_fixture_is_the_recorded_trace_op_by_op():
    assert [op[0] for op in backward_ops()] == _trace_calls(TRACE.read_text())


def backward_ops():
    """The 45 ops of the seed's backward trace, in order."""
    return [
        _view("reshape", "t177", "bw_t773", (T, V), (-1, V)),
        _op("matmul", ["bw_t773", "w_lm_head"], [_out("bw_t760", (T, E))]),
        _view("reshape", "bw_t760", "bw_t774", (B, T, E), (B, T, E)),
        _view("permute", "bw_t773", "bw_t775", (V, T), (1, 0)),
        _view("reshape", "x_7", "bw_t776", (T, E), (-1, E)),
        _op("matmul", ["bw_t775", "bw_t776"], [_out("bw_t761", (V, E))]),
        _op("nvFusion0", ["w_ln_f", "bw_t774", "x_2", "t309", "rsqrt_2"],
            [_out("bw_t498", (B, T, E)), _out("bw_t502", (T, E)), _out("bw_t478", (E,))],
            members=_rmsnorm_backward("nv0", "bw_t774", "x_2", "rsqrt_2", "w_ln_f", "t309",
                                      [_out("bw_t478", (E,)), _out("bw_t498", (B, T, E))])
            + [_op("reshape", ["bw_t498"], [_out("bw_t502", (T, E))], [("arg1", (T, E))])]),
        _op("matmul", ["bw_t502", "w_mlp_proj"], [_out("bw_t762", (T, F))]),
        _view("reshape", "bw_t762", "bw_t777", (B, T, F), (B, T, F)),
        _view("reshape", "bw_t498", "bw_t778", (T, E), (-1, E)),
        _view("permute", "bw_t778", "bw_t779", (E, T), (1, 0)),
        _view("reshape", "x_4", "bw_t780", (T, F), (-1, F)),
        _op("matmul", ["bw_t779", "bw_t780"], [_out("bw_t763", (E, F))]),
        _op("nvFusion1", ["t307", "bw_t777", "t308"],
            [_out("bw_t512", (B, T, F)), _out("bw_t529", (B, T, F)), _out("bw_t530", (T, F))],
            members=_swiglu_backward()),
        _op("matmul", ["bw_t530", "w_fc_2"], [_out("bw_t764", (T, E))]),
        _view("reshape", "bw_t764", "bw_t781", (B, T, E), (B, T, E)),
        _view("reshape", "bw_t512", "bw_t782", (T, F), (-1, F)),
        _view("permute", "bw_t782", "bw_t783", (F, T), (1, 0)),
        _view("reshape", "to_3", "bw_t784", (T, E), (-1, E)),
        _op("matmul", ["bw_t783", "bw_t784"], [_out("bw_t765", (F, E))]),
        _view("reshape", "bw_t529", "bw_t785", (T, F), (-1, F)),
        _op("matmul", ["bw_t785", "w_fc_1"], [_out("bw_t766", (T, E))]),
        _view("reshape", "bw_t766", "bw_t786", (B, T, E), (B, T, E)),
        _view("permute", "bw_t785", "bw_t787", (F, T), (1, 0)),
        _op("matmul", ["bw_t787", "bw_t784"], [_out("bw_t767", (F, E))]),
        _op("nvFusion2", ["bw_t786", "bw_t781", "w_norm_2", "t304", "t306", "rsqrt_1", "bw_t498"],
            [_out("bw_t576", (B, T, E)), _out("bw_t580", (T, E)), _out("bw_t552", (E,))],
            members=_rmsnorm_backward("nv2", "bw_t786", "t306", "rsqrt_1", "w_norm_2", "bw_t498",
                                      [_out("bw_t552", (E,)), _out("bw_t576", (B, T, E))])
            + [_op("reshape", ["bw_t576"], [_out("bw_t580", (T, E))], [("arg1", (T, E))])]),
        _op("matmul", ["bw_t580", "w_attn_proj"], [_out("bw_t768", (T, E))]),
        _view("reshape", "bw_t768", "bw_t788", (B, T, E), (B, T, E)),
        _view("reshape", "bw_t576", "bw_t789", (T, E), (-1, E)),
        _view("permute", "bw_t789", "bw_t790", (E, T), (1, 0)),
        _view("reshape", "t312", "bw_t791", (T, E), (-1, E)),
        _op("matmul", ["bw_t790", "bw_t791"], [_out("bw_t769", (E, E))]),
        _view("torch_prims_reshape_impl", "bw_t788", "bw_t792", (B, T, H, D), (B, T, H, D)),
        _view("permute", "bw_t792", "bw_t793", (B, H, T, D), (0, 2, 1, 3)),
        _op("cudnn_sdpa_fwd", ["q_2", "k_2", "v_1"],
            [_out("bw_t238", (B, H, T, 1), F32), _out("bw_t239", (), "int64"), _out("bw_t240", (), "int64")],
            [("arg3", None), ("arg4", 0.0), ("arg5", True), ("scale", SCALE)]),
        _op("cudnn_sdpa_bwd", ["bw_t793", "q_2", "k_2", "v_1", "y", "bw_t238", "bw_t239", "bw_t240"],
            [_out("bw_t594", (B, H, T, D)), _out("bw_t595", (B, H, T, D)), _out("bw_t596", (B, H, T, D))],
            [("arg4", None), ("arg5", 0.0), ("arg6", True), ("scale", SCALE), ("cat_grad_qkv", False)]),
        _op("TorchCompile0", ["bw_t595", "bw_t594", "sin", "cos", "bw_t596"],
            [_out("bw_t722", (B, T, 3 * E)), _out("bw_t723", (T, 3 * E))], members=_rope_backward()),
        _op("matmul", ["bw_t723", "w_attn"], [_out("bw_t770", (T, E))]),
        _view("reshape", "bw_t770", "bw_t794", (B, T, E), (B, T, E)),
        _view("reshape", "bw_t722", "bw_t795", (T, 3 * E), (-1, 3 * E)),
        _view("permute", "bw_t795", "bw_t796", (3 * E, T), (1, 0)),
        _view("reshape", "x_normed_1", "bw_t797", (T, E), (-1, E)),
        _op("matmul", ["bw_t796", "bw_t797"], [_out("bw_t771", (3 * E, E))]),
        _op("nvFusion3", ["w_norm_1", "bw_t794", "t304", "rsqrt", "bw_t576"],
            [_out("bw_t734", (E,)), _out("bw_t758", (B, T, E))],
            members=_rmsnorm_backward("nv3", "bw_t794", "t304", "rsqrt", "w_norm_1", "bw_t576",
                                      [_out("bw_t734", (E,)), _out("bw_t758", (B, T, E))])),
        _op("torch.ops.aten.embedding_backward", ["bw_t758", "idx"], [_out("bw_t798", (V, E))],
            [("arg2", V), ("arg3", -1), ("arg4", False), ("arg5", False)]),
    ]  # fmt: skip


def _node(name, shape, dtype, kind, storage_of=None, nodes=None):
    nbytes = math.prod(shape) * ITEMSIZE[dtype]
    if storage_of is not None:
        storage, storage_bytes = nodes[storage_of].storage, nodes[storage_of].storage_bytes
    else:
        storage, storage_bytes = name, 0 if kind == "internal" else nbytes
    return TensorNode(name=name, shape=tuple(shape), dtype=dtype, device="cuda:0", nbytes=nbytes, storage=storage,
                      storage_bytes=storage_bytes, kind=kind)  # fmt: skip


def build_gpu_graph() -> JointGraph:
    """The seed's backward trace as a `JointGraph` (no forward ops: it was not printed)."""
    nodes = {name: _node(name, shape, dtype, kind) for name, (shape, dtype, kind) in TENSORS.items()}
    ops = []
    for index, (symbol, inputs, outputs, attrs, members) in enumerate(backward_ops()):
        name = f"bwd{index}"
        member_nodes = []
        for j, (m_symbol, m_inputs, m_outputs, m_attrs, _) in enumerate(members):
            for out, shape, dtype, _ in m_outputs:
                nodes.setdefault(out, _node(out, shape, dtype, "internal"))
            m_outs = tuple(o[0] for o in m_outputs)
            member_nodes.append(
                OpNode(name=f"{name}.{j}", symbol=m_symbol, is_backward=True, index=j, inputs=tuple(m_inputs),
                       outputs=m_outs, attrs=m_attrs)  # fmt: skip
            )
        for out, shape, dtype, view_of in outputs:
            nodes[out] = _node(out, shape, dtype, "backward", view_of, nodes)
        ops.append(
            OpNode(name=name, symbol=symbol, is_backward=True, index=index, inputs=tuple(inputs),
                   outputs=tuple(o[0] for o in outputs), attrs=attrs, members=tuple(member_nodes),
                   op_tags=frozenset({"fusion"}) if members else frozenset())  # fmt: skip
        )
    return JointGraph(ops=tuple(ops), tensors=nodes, saved=(), input_names=(), forward_output_names=())


@pytest.fixture(scope="module")
def gpu_graph() -> JointGraph:
    return build_gpu_graph()


def _by_symbol(graph: JointGraph, symbol: str) -> OpNode:
    return next(op for op in graph.ops if op.symbol == symbol)


def test_fixture_is_the_seed_trace(gpu_graph):
    symbols = [op.symbol for op in gpu_graph.ops]
    assert len(symbols) == 45
    assert symbols.count("matmul") == 12
    assert symbols.index("cudnn_sdpa_fwd") + 1 == symbols.index("cudnn_sdpa_bwd")
    assert {s for s in symbols if s.startswith(("nvFusion", "TorchCompile"))} == {
        "nvFusion0", "nvFusion1", "nvFusion2", "nvFusion3", "TorchCompile0"
    }  # fmt: skip


def test_every_gpu_symbol_has_a_formula(gpu_graph):
    report = coverage_report(gpu_graph)
    assert report.ok, report.format()
    assert report.by_formula["fusion"] == 5
    assert report.by_formula["sdpa"] == 1 and report.by_formula["sdpa_backward"] == 1


# A causal T x T score matrix keeps the diagonal and below: T (T + 1) / 2 scores per head.
CAUSAL_SCORES = B * H * T * (T + 1) // 2


def test_cudnn_sdpa_counts_full_matrix_flops_and_causal_effective_flops(gpu_graph):
    fwd = formula_cost(op_args(gpu_graph, _by_symbol(gpu_graph, "cudnn_sdpa_fwd")))
    bwd = formula_cost(op_args(gpu_graph, _by_symbol(gpu_graph, "cudnn_sdpa_bwd")))
    # Full matrix, as torch's flop counter: q @ k.T and p @ v, 2 D FLOPs per score each (forward);
    # the scores again, dO @ v.T, p.T @ dO, dS @ k and dS.T @ q (backward): 274.9 and 687.2 GFLOP.
    assert fwd.flops == 4 * B * H * T * T * D == 274_877_906_944
    assert bwd.flops == 10 * B * H * T * T * D == 687_194_767_360
    # Executed: the kept scores only, 4 D FLOPs each on tensor cores, and one exp each.
    assert fwd.matrix_flops == 4 * D * CAUSAL_SCORES == 137_472_507_904
    assert fwd.transcendentals == CAUSAL_SCORES == 268_500_992
    assert bwd.matrix_flops == 10 * D * CAUSAL_SCORES
    assert fwd.dtype == BF16


def test_matmul_backward_forms_from_the_trace(gpu_graph):
    # bw_t761 = matmul([32000, 4096] (a view of the transposed cotangent), [4096, 4096]): the lm_head weight grad.
    op = next(op for op in gpu_graph.ops if op.outputs == ("bw_t761",))
    cost = formula_cost(op_args(gpu_graph, op))
    assert cost.flops == 2 * V * T * E
    assert cost.bytes_written == V * E * 2
    assert cost.bytes_read == (V * T + T * E) * 2


def test_views_from_the_trace_are_free(gpu_graph):
    views = [op for op in gpu_graph.ops if op.symbol in ("reshape", "permute", "torch_prims_reshape_impl")]
    assert len(views) == 25
    for op in views:
        cost = formula_cost(op_args(gpu_graph, op))
        assert (cost.bytes_read, cost.bytes_written, cost.kernels) == (0, 0, 0), op


def test_fusion_regions_cost_member_flops_and_boundary_bytes(gpu_graph):
    op = _by_symbol(gpu_graph, "nvFusion1")
    args = op_args(gpu_graph, op)
    cost = formula_cost(args)
    members = [formula_cost(m) for m in args.members]
    # Per [1, 4096, 11008] element, the SwiGLU backward members do neg, exp, add, reciprocal (the
    # sigmoid), mul (silu), mul (d up), mul and mul (d gate): 8 FLOPs, one of them an exp; the
    # casts and the reshape count none.
    assert cost.flops == 8 * B * T * F == 360_710_144
    assert cost.vector_flops == cost.flops and cost.matrix_flops == 0
    assert cost.transcendentals == B * T * F  # one exp per element (SiLU)
    assert cost.kernels == 1  # no matrix product inside: one fused kernel
    # Boundary only: three [1, 4096, 11008] bf16 inputs, two of those outputs plus a view-free reshape output.
    assert cost.bytes_read == 3 * B * T * F * 2
    assert cost.bytes_written == 3 * B * T * F * 2
    assert cost.bytes_read < sum(m.bytes_read for m in members)


def test_gpu_only_ops_are_not_executed_here():
    assert "fusion region" in skip_reason("nvFusion0")
    assert "no torch runner" in skip_reason("cudnn_sdpa_fwd")


def test_h100_roofline_of_the_recomputed_sdpa(gpu_graph):
    # Issue #1646 measured 350.15 - 341.78 ms over 32 layers for recomputing cuDNN SDPA: 0.26 ms per
    # layer. The roofline (tensor cores for the causal half, special-function units for the exps)
    # must land in the same range; a factor of 2 either way would mislead the planner.
    h100 = get_device_spec("H100")
    costs = CostModel(gpu_graph, h100)
    recompute = costs.op_cost(_by_symbol(gpu_graph, "cudnn_sdpa_fwd"))
    assert recompute.source == "formula"
    # By hand, with the H100 SXM sheet: 137.47 GFLOP on bf16 tensor cores at the large-GEMM fraction
    # of 989.4 TFLOP/s (MAMF 794.5 of 989: 794.8 TFLOP/s, 173.0 us), the other 4 softmax FLOPs per
    # kept score at 67 TFLOP/s (16.0 us) and one exp per kept score on the special-function units at
    # 4.18e12/s (64.2 us); reading q, k, v (3 x 32 MiB bf16) and writing the float32 logsumexp
    # (0.5 MiB) and two int64 seeds take 30.2 us at 3.35 TB/s, so compute binds; plus one 4 us
    # launch: 257.2 us.
    compute_s = 4 * D * CAUSAL_SCORES / (989.4e12 * 794.5 / 989) + 4 * CAUSAL_SCORES / 67e12 + CAUSAL_SCORES / 4.18e12
    memory_s = (3 * B * H * T * D * 2 + B * H * T * 4 + 2 * 8) / 3.35e12
    assert memory_s < compute_s
    assert recompute.time_s == pytest.approx(compute_s + 4e-6, rel=1e-9)
    assert recompute.time_s == pytest.approx(257.2e-6, abs=0.1e-6)
    assert 0.13e-3 < recompute.time_s < 0.52e-3
    backward_s = costs.total_time_s(backward=True)
    assert costs.op_cost(_by_symbol(gpu_graph, "cudnn_sdpa_bwd")).time_s < backward_s
    assert costs.chain_time_s(gpu_graph.ops) == pytest.approx(backward_s)


def test_gpu_graph_needs_a_named_device(gpu_graph, monkeypatch):
    # Planned on a machine without the GPU it was traced on (inference by GPU name: test_costing.py).
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="pass device_spec= one of H100-SXM"):
        CostModel(gpu_graph)
