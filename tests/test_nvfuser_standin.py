"""The nvFuser stand-in executor: nvFuser's op list, nvFuser's fusion pass, runnable on CPU."""

from __future__ import annotations

import pytest
import torch

from remat_opt import _compat  # noqa: F401
import thunder  # noqa: E402

from remat_opt import CostRemat, analyze, explain, sdpa_cpu_ex  # noqa: E402
from remat_opt.examples import block  # noqa: E402
from remat_opt.executors import executors_for  # noqa: E402
from remat_opt.executors.nvfuser_standin import (  # noqa: E402
    claimed_ids,
    nvfuser_passes,
    nvfuser_registrations,
    nvfuser_standin_ex,
)
from remat_opt.measure import measure_saved_bytes  # noqa: E402
from remat_opt.models import ModelSpec, build_model  # noqa: E402
from remat_opt.transform import last_planned_step  # noqa: E402

# What Thunder 0.2.6's nvfuserex_impl.py registers and nvFuser fuses by default. A Thunder upgrade that
# changes its registrations changes `claimed_ids()` and fails `test_claimed_ops_are_nvfusers_defaults`:
# review the new list, then update this one.
NVFUSER_DEFAULT_OPS = frozenset(
    "ABS ACOS ACOSH ADD AMAX AMIN ASIN ASINH ATAN ATAN2 ATANH BITWISE_AND BITWISE_LEFT_SHIFT BITWISE_NOT "
    "BITWISE_OR BITWISE_RIGHT_SHIFT BITWISE_XOR BROADCAST_IN_DIM CAT CEIL CLONE CONVERT_ELEMENT_TYPE COPY_ COS "
    "COSH DIV EQ ERF ERFC ERFCINV ERFINV EXP EXP2 EXPM1 FLOOR FMOD FULL GE GT IMAG IOTA ISFINITE LE LERP LGAMMA "
    "LOG LOG10 LOG1P LOG2 LT MAXIMUM MINIMUM MUL NE NEG NEXTAFTER PAD POW PROD REAL RECIPROCAL REMAINDER RESHAPE "
    "ROUND RSQRT SHALLOW_COPY SHAPE SIGN SIGNBIT SIN SINH SLICE SQRT SQUEEZE STRIDE_ORDER SUB SUM TAKE "
    "TAKE_ALONG_AXIS TAN TANH TOPK TRANSPOSE TRUNC UNIFORM UNIFORM_PHILOX VAR VAR_MEAN WHERE _GROUPED_MM "
    "torch.argsort torch.cumsum".split()
)


def test_claimed_ops_are_nvfusers_defaults():
    assert {str(getattr(i, "name", i)) for i in claimed_ids()} == NVFUSER_DEFAULT_OPS


def test_ops_nvfuser_leaves_off_by_default_are_not_claimed():
    options = {target: opts for target, _, opts in nvfuser_registrations()}
    assert options["PrimIDs.LINEAR"] == {"nv_enable_linear"} and options["PrimIDs.MATMUL"] == {"nv_enable_matmul"}
    assert options["ltorch.scaled_dot_product_attention (execution transform)"] == {"nv_enable_sdpa"}
    assert not {"LINEAR", "MATMUL", "EMBEDDING", "SCATTER", "INDEX_PUT"} & NVFUSER_DEFAULT_OPS


def test_nvfusers_own_passes_compile_from_thunders_source():
    passes = nvfuser_passes()
    assert set(passes) == {"remove_redundant_casts", "cse"} and all(callable(p) for p in passes.values())


@pytest.fixture(scope="module")
def llama():
    model, inputs = build_model(ModelSpec("Llama-2-7b-hf", n_layer=1, device="cpu", tiny=True))
    model(*inputs).float().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return model, inputs, grads


def test_standin_regions_run_on_cpu_and_saved_bytes_are_predicted_to_the_byte(llama):
    model, inputs, eager_grads = llama
    executors = executors_for("nvfuser-standin")
    assert executors[:2] == [nvfuser_standin_ex, sdpa_cpu_ex]
    measured = measure_saved_bytes(thunder.jit(model, executors=executors), *inputs)
    measured.output.float().sum().backward()
    for got, expected in zip((p.grad for p in model.parameters()), eager_grads):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    model.zero_grad(set_to_none=True)
    graph = analyze(model, *inputs, executors=executors)
    assert sum(op.symbol.startswith("nvFusion") for op in graph.ops) >= 5
    assert measured.activation_bytes == graph.saved_activation_bytes


def test_saved_sets_match_by_producer_and_shape_across_devices(llama):
    """What `benchmarks/gpu_check.py` compares on a GPU (the stand-in's meta prediction against a real
    run), here between the stand-in on meta and on CPU: the same saved set per layer; one tensor
    fewer is reported, so the comparison is not vacuous."""
    from remat_opt.graph_diff import saved_set_differences, saved_signatures

    model, inputs, _ = llama
    executors = executors_for("nvfuser-standin")
    on_cpu = saved_signatures(analyze(model, *inputs, executors=executors))
    with torch.device("meta"):
        meta_model = type(model)(model.config)
    on_meta = saved_signatures(analyze(meta_model, *(torch.zeros_like(i, device="meta") for i in inputs),
                                       executors=executors))
    assert sum(sum(c.values()) for c in on_cpu.values()) >= 10
    assert saved_set_differences(on_meta, on_cpu) == []
    layer, counts = next(iter(on_cpu.items()))
    key = next(iter(counts))
    fewer = {**on_cpu, layer: {**counts, key: counts[key] - 1}}
    (line,) = saved_set_differences(on_meta, fewer)
    assert line.startswith(f"{layer}: ") and f"{list(key[1])} {key[2]}: " in line
    assert line.endswith(f"predicted {counts[key]}, measured {counts[key] - 1}")


@pytest.fixture(scope="module")
def block_run():
    model, inputs = block(batch=2, seq=32)
    model(*inputs).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    save_all = analyze(model, *inputs, executors=executors_for("nvfuser-standin")).saved_activation_bytes
    return model, inputs, grads, save_all


@pytest.mark.parametrize("fraction", [0.5, 0.0], ids=["50%", "minimum"])
def test_plans_survive_thunders_fusion_pass(block_run, fraction):
    """Thunder's fusion pass and rematerialization run after our tags; the plan is made through them
    (`remat_opt.fusion_search`), so the budget holds and the prediction is what Thunder saves."""
    model, inputs, eager_grads, save_all = block_run
    budget = int(save_all * fraction)
    executors = executors_for("nvfuser-standin")
    transform = CostRemat(activation_budget_gb=budget / 1e9, device_spec="cpu")
    jitted = thunder.jit(model, transforms=[transform], executors=executors)
    measured = measure_saved_bytes(jitted, *inputs)
    measured.output.sum().backward()
    for got, expected in zip((p.grad for p in model.parameters()), eager_grads):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    model.zero_grad(set_to_none=True)
    step = last_planned_step(jitted)
    assert measured.activation_bytes == step.plan.saved_bytes <= budget
    assert step.plan.recomputed_tag_targets and step.fusion is not None
    # the user's budget, not the one the solver got in the winning round
    assert step.request.activation_budget_bytes == step.plan.budget_bytes == budget
    # the solver's unfused model alone would have been wrong: the loop is what makes it exact
    assert step.fusion.solver_saved_bytes != step.plan.saved_bytes or fraction == 0.0
    assert step.fusion.save_all.saved_bytes == save_all
    assert f"it saves {step.plan.saved_bytes:,} B" in str(explain(jitted))

