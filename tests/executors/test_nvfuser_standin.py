"""The nvFuser stand-in executor: nvFuser's op list, nvFuser's fusion pass, runnable on CPU."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

from remat_opt import _compat  # noqa: F401
import thunder  # noqa: E402

from remat_opt import CostRemat, analyze, explain, sdpa_cpu_ex  # noqa: E402
from remat_opt.models.examples import block  # noqa: E402
from remat_opt.executors import executors_for  # noqa: E402
from remat_opt.executors.nvfuser_standin import (  # noqa: E402
    claimed_ids,
    nvfuser_passes,
    nvfuser_registrations,
    nvfuser_standin_ex,
)
from costmodels.table import CostTable, op_key  # noqa: E402
from costmodels.timing import ProfileOptions  # noqa: E402
from remat_opt.costing.cost_cache import ENV_VAR as COST_CACHE_ENV_VAR, auto_cost_table  # noqa: E402
from remat_opt.costing.graph_costs import CostModel, op_args  # noqa: E402
from remat_opt.tracing.regions import region_calls  # noqa: E402
from remat_opt.validation.measure import measure_saved_bytes  # noqa: E402
from remat_opt.costing.profiling import REGION_NOTE, replay  # noqa: E402
from remat_opt.models.by_name import ModelSpec, build_model  # noqa: E402
from remat_opt.transform.explain import last_planned_step  # noqa: E402

pytestmark = pytest.mark.slow  # Thunder compilations: minutes in all (the fast subset is -m "not slow")

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


@pytest.mark.extended  # two more traces of the stand-in (README: the extended tier)
def test_saved_sets_match_by_producer_and_shape_across_devices(llama):
    """What `benchmarks/gpu_check.py` compares on a GPU (the stand-in's meta prediction against a real
    run), here between the stand-in on meta and on CPU: the same saved set per layer; one tensor
    fewer is reported, so the comparison is not vacuous."""
    from remat_opt.validation.graph_diff import saved_set_differences, saved_signatures

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
    graph = analyze(model, *inputs, executors=executors_for("nvfuser-standin"))
    return model, inputs, grads, graph


def test_regions_are_timed_whole(block_run):
    """The profiler runs the stand-in's regions through the callables Thunder built (as nvFuser's
    fusion definitions on a GPU), keyed by their members, not their number."""
    graph = block_run[3]
    regions = [op for op in graph.ops if op.symbol.startswith("nvFusion")]
    assert regions and set(region_calls(graph)) == {op.name for op in regions}
    keys = {op_key(op_args(graph, op)) for op in regions}
    result = replay(graph, "cpu", options=ProfileOptions(warmup=1, repeats=2, min_time_s=0.0), time_keys=keys)
    assert result.problems == [] and not result.skipped and set(result.times) == keys
    assert all(key.startswith("nvFusion[") and result.times[key].note == REGION_NOTE for key in keys)
    table = CostTable(device="cpu: test", device_kind="cpu", torch_version="x", thunder_version="y",
                      entries=result.times)
    assert {CostModel(graph, "cpu", table).op_cost(op).source for op in regions} == {"measured region"}


def test_auto_costs_time_regions_of_a_graph_with_callables(block_run, tmp_path, monkeypatch):
    """A graph without Thunder's callables (cached, deepened) leaves its regions to formulas, and
    the disk cache does not record them as untimeable: the next graph with callables times them."""
    monkeypatch.setenv(COST_CACHE_ENV_VAR, str(tmp_path))
    graph = block_run[3]
    regions = {op_key(op_args(graph, op)) for op in graph.forward_ops if op.symbol.startswith("nvFusion")}
    without = auto_cost_table(replace(graph))
    assert (without.measured_regions, without.untimed_regions) == (0, len(regions)) and regions
    assert not regions & {key for key, _ in without.table.skipped}
    with_callables = auto_cost_table(graph)
    assert (with_callables.measured_regions, with_callables.untimed_regions) == (len(regions), 0)
    assert with_callables.timed_ops == len(regions)  # the other forward ops came from the cache


@pytest.mark.parametrize("fraction, cost_table", [(0.5, None), (0.0, "auto")], ids=["50%", "minimum-auto-costs"])
def test_plans_survive_thunders_fusion_pass(block_run, fraction, cost_table, tmp_path, monkeypatch):
    """Thunder's fusion pass and rematerialization run after our tags; the plan is made through them
    (`remat_opt.planning.fusion_search`), so the budget holds and the prediction is what Thunder saves. With
    ``cost_table="auto"`` the regions are timed whole and price the unfused ops the solver recomputes."""
    model, inputs, eager_grads, graph = block_run
    save_all = graph.saved_activation_bytes
    budget = int(save_all * fraction)
    executors = executors_for("nvfuser-standin")
    monkeypatch.setenv(COST_CACHE_ENV_VAR, str(tmp_path))
    transform = CostRemat(activation_budget_gb=budget / 1e9, device_spec="cpu", cost_table=cost_table)
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
    assert step.request.activation_budget_bytes == step.plan.activation_budget_bytes == budget
    # solved deterministic (one CP-SAT worker, deterministic limits: `tests/solvers/test_clock.py`),
    # so each compilation's search makes the same rounds (with 8 workers, plans of equal time came
    # back in turn: 5, 7 and 7 dry runs for one budget of a 7B layer)
    assert step.request.deterministic
    # a dry run with the plan's tags checked it: the bytes reported are Thunder's, not a model's
    assert any(f"Thunder saves {step.plan.saved_bytes:,} B" in r for r in step.fusion.rounds)
    if cost_table == "auto":
        explanation = explain(jitted)
        sources = {r.cost_source for r in explanation.rows if r.action == "recompute"}
        assert "region share" in sources and any(n.startswith("'region share'") for n in explanation.notes)
        note = next(n for n in explanation.notes if n.startswith("cost_table='auto'"))
        assert re.search(r"fusion regions: [1-9]\d* timed whole", note), note
    assert step.fusion.save_all.saved_bytes == save_all
    assert f"it saves {step.plan.saved_bytes:,} B" in str(explain(jitted))
