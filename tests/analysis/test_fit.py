"""`remat_opt.analysis.fit` and `remat-opt fit`: the fastest configuration that fits (issue 26).

Tiny Llama-2 (1 layer, seq 32) on meta, priced as a CPU with a memory limit set so that some
configurations fit and some do not. Its graph at micro-batch 1 is the one the CLI and
data-parallel tests trace (shared through the run's graph cache)."""

from __future__ import annotations

import json

import pytest

from remat_opt.analysis.fit import (
    Configuration,
    FitError,
    FitRow,
    _kinds,
    configurations,
    fit,
    parse_gpus,
    rank_rows,
)
from remat_opt.distributed.data_parallel import DataParallel

TINY = dict(n_layer=1, tiny=True)


# ---- request parsing (pure) ----------------------------------------------------------------


@pytest.mark.parametrize("text, count, spec", [("8xH100", 8, "H100-SXM"), ("h100", 1, "H100-SXM"),
                                               ("64 x a100", 64, "A100-80GB"), ("2*H200", 2, "H200")])
def test_gpus_parse_count_and_kind_with_nvml_memory(text, count, spec):
    gpus = parse_gpus(text)
    assert (gpus.count, gpus.device_spec) == (count, spec)
    assert gpus.memory_bytes == {"H100-SXM": 81_559, "A100-80GB": 81_920, "H200": 143_771}[spec] * 2**20


def test_rerun_kinds_group_fusion_regions_and_name_attention_sdpa_whatever_runs_it():
    # on meta the stand-in's graphs run attention through remat_opt's CPU executor; a GPU table says sdpa
    counts = {"nvFusion3": 4, "TorchCompile0": 1, "linear": 3, "remat_sdpa_cpu_fwd": 2, "cudnn_sdpa_fwd": 1,
              "mul": 1, "torch_all_gather_prim_impl": 9}
    assert _kinds(counts) == "12 ops: fusion regions (5), linear (3), sdpa (3), 1 more kinds"


@pytest.mark.parametrize("text, memory_gb, message", [
    ("8xB300", None, "unknown GPU kind 'B300'; use one of h100, h200, a100, l40s, cpu"),
    ("8 GPUs", None, "is not COUNTxKIND"),
    ("0xH100", None, "the GPU count must be at least 1"),
    ("2xcpu", None, "the memory of a cpu device is not known; give it with --memory-gb"),
    ("2xcpu", -1.0, "--memory-gb must be positive"),
])
def test_bad_gpus_are_one_line_errors(text, memory_gb, message):
    with pytest.raises(FitError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        parse_gpus(text, memory_gb)
    assert "\n" not in str(error.value)


def test_configurations_cover_fsdp_variants_and_ddp_by_micro_batch():
    configs = configurations(parse_gpus("8xH100"), global_batch=64)
    # 8 sequences per rank: micro-batches 1, 2, 4, 8 with 8, 4, 2, 1 accumulation steps
    assert {(c.micro_batch, c.accumulation) for c in configs} == {(1, 8), (2, 4), (4, 2), (8, 1)}
    assert all(c.global_batch == 64 for c in configs)
    assert {(c.parallel.strategy, c.parallel.collectives_in_flight, c.torch_fsdp) for c in configs} == {
        ("fsdp", 1, None), ("fsdp", 2, None), ("fsdp", None, None), ("ddp", None, None),
        ("fsdp", None, "checkpoint"), ("fsdp", None, "costremat")}
    assert len(configs) == 6 * 4
    described = {c.describe() for c in configs if c.micro_batch == 1}
    assert "torch FSDP1 x8 (ThunderFX), per-block checkpointing, micro-batch 1 x 8 steps" in described
    assert "FSDP x8, Thunder's order, micro-batch 1 x 8 steps" in described
    single = configurations(parse_gpus("h100"), micro_batches=[1, 2])  # no data parallelism on one GPU
    assert [(c.micro_batch, c.accumulation, c.parallel, c.torch_fsdp) for c in single] == [
        (1, 1, None, None), (2, 1, None, None)]
    only = configurations(parse_gpus("2xH100"), micro_batches=[1], strategies=["fsdp1"])
    assert [c.torch_fsdp for c in only] == ["checkpoint", "costremat"]


def test_gpus_across_nodes_collect_over_infiniband():
    from costmodels.interconnect import INFINIBAND_NDR, NVLINK4

    assert parse_gpus("8xH100").spec.interconnect == NVLINK4
    assert parse_gpus("64xH100").spec.interconnect == INFINIBAND_NDR
    assert parse_gpus("2xcpu", 1.0).spec == "cpu"


@pytest.mark.parametrize("kwargs, message", [
    (dict(global_batch=60), "--global-batch 60 does not split over 8 GPUs; use a multiple of 8 (56, 64)"),
    (dict(global_batch=64, micro_batches=[3]), "micro-batch 3 cannot make up --global-batch 64 on 8 GPUs"),
    (dict(strategies=["zero3"]), "unknown strategy 'zero3'; use any of fsdp, ddp, fsdp1"),
])
def test_requests_that_cannot_be_searched_say_why(kwargs, message):
    with pytest.raises(FitError, match=message.replace("(", r"\(").replace(")", r"\)")):
        configurations(parse_gpus("8xH100"), **kwargs)


def test_rows_rank_fastest_fitting_first_then_least_over():
    def row(m, fits, tokens=None, over=0):
        return FitRow(Configuration(m, 1, None), fits, 1, 0, over_bytes=over, tokens_per_s_per_gpu=tokens)

    ranked = rank_rows([row(1, True, 10.0), row(8, False, over=5), row(2, True, 30.0), row(4, False, over=2)])
    assert [r.config.micro_batch for r in ranked] == [2, 1, 4, 8]


def test_the_plan_file_goes_to_the_fastest_thunder_jit_configuration():
    from remat_opt.analysis.fit import FitResult

    fsdp1 = FitRow(Configuration(1, 1, DataParallel("fsdp", 8), "checkpoint"), True, 1, 0, tokens_per_s_per_gpu=30.0)
    jit = FitRow(Configuration(1, 1, DataParallel("fsdp", 8, 1)), True, 1, 0, tokens_per_s_per_gpu=20.0)
    result = FitResult("m", 8, parse_gpus("8xH100"), 1, 0.05, rank_rows([jit, fsdp1]), (), 0.0)
    assert result.best is fsdp1 and result.best_thunder_jit is jit
    assert result.best_thunder_jit.config.describe() == "FSDP x8, 1 in flight, micro-batch 1"


# ---- overlap of collectives (a traced FSDP graph) --------------------------------------------


@pytest.mark.slow
def test_collectives_overlap_compute_only_as_far_as_the_waits_allow():
    from remat_opt.analysis.training_step import overlapped_step
    from remat_opt.costing.graph_costs import CostModel
    from remat_opt.models.by_name import ModelSpec
    from remat_opt.models.graphs import analyze_spec

    spec = ModelSpec("Llama-2-7b-hf", device="meta", **TINY)
    steps = {}
    for in_flight in (0, 1, None):
        graph = analyze_spec(spec, traced_layers=0, parallel=DataParallel("fsdp", 4, in_flight))
        steps[in_flight] = overlapped_step(graph, CostModel(graph, "H100-SXM"))
    serial = steps[0]
    assert serial.communication_s > 0
    # no collective in flight: compute waits for every one of them in full
    assert serial.time_s == pytest.approx(serial.compute_s + serial.communication_s, rel=1e-12)
    for step in (steps[1], steps[None]):
        assert (step.compute_s, step.communication_s) == pytest.approx((serial.compute_s, serial.communication_s))
        assert max(step.compute_s, step.communication_s) <= step.time_s < serial.time_s


# ---- the search, end to end on meta ----------------------------------------------------------


@pytest.fixture(scope="module")
def roomy():
    """Every configuration of one "GPU" with ample memory: all save everything."""
    return fit("Llama-2-7b-hf", gpus="1xcpu", memory_gb=1.0, seq=32, micro_batches=[1, 2, 4], **TINY)


@pytest.mark.slow
@pytest.mark.extended  # a direct trace at micro-batch 4 (~20 s): out of the README's test command
def test_graphs_above_micro_batch_3_are_sized_from_2_and_3_exactly():
    from remat_opt.analysis.fit import ModelRequest, _graph
    from remat_opt.models.graphs import analyze_spec

    request = ModelRequest("Llama-2-7b-hf", 32, **TINY)
    made = _graph(request, Configuration(4, 1, None))
    traced = analyze_spec(request.spec(4), traced_layers=4)
    assert "linear in the batch from the graphs traced at 2 and 3" in made.notes[-1]
    assert made.ops == traced.ops and made.tensors == traced.tensors and made.saved == traced.saved


@pytest.mark.slow
def test_a_limit_between_micro_batches_fits_the_small_ones_and_plans_the_next(roomy):
    from remat_opt.analysis.fit import ModelRequest, _graph, _parameters
    from remat_opt.analysis.training_step import predict_training_step
    from remat_opt.costing.graph_costs import CostModel

    assert all(r.fits and r.plan is None for r in roomy.rows)
    peak = {r.config.micro_batch: r.peak_bytes for r in roomy.rows}
    assert peak[1] < peak[2] < peak[4]
    # a limit below micro-batch 4's save-all peak, above micro-batch 2's
    limit = (peak[2] + peak[4]) // 2
    result = fit("Llama-2-7b-hf", gpus="1xcpu", memory_gb=limit / 1e9, memory_margin=0.0, seq=32,
                 micro_batches=[1, 2, 4, 8], **TINY)
    rows = {r.config.micro_batch: r for r in result.rows}
    assert result.limit_bytes == round(limit) and rows[1].fits and rows[2].fits and not rows[8].fits
    request = ModelRequest("Llama-2-7b-hf", 32, **TINY)
    for row in result.rows:
        if row.fits:  # the reported peak is the iteration's, under the plan, as training_step predicts it
            graph = _graph(request, row.config)
            tags = row.plan.recomputed_tag_targets if row.plan else ()
            again = predict_training_step(graph, CostModel(graph, "cpu"), _parameters(request, row.config), tags,
                                          cuda_arch=None)
            assert row.peak_bytes == again.peak_bytes <= result.limit_bytes
        else:
            assert row.over_bytes > 0 and (row.peak_bytes is None or row.peak_bytes > result.limit_bytes)
    # micro-batch 4 fits only by recomputing: slower than saving everything
    slower = next(r for r in roomy.rows if r.config.micro_batch == 4)
    assert rows[4].fits and rows[4].plan is not None and rows[4].recompute_s > 0
    assert rows[4].step_time_s > slower.step_time_s
    fitting = [r.tokens_per_s_per_gpu for r in result.rows if r.fits]
    assert fitting == sorted(fitting, reverse=True) and result.best is result.rows[0]


# ---- the command -----------------------------------------------------------------------------


CLI_TINY = ["Llama-2-7b-hf", "--tiny", "--n-layer", "1", "--seq", "32"]


@pytest.mark.parametrize("args, message", [
    (["--gpus", "8xB300"], "unknown GPU kind 'B300'"),
    (["--gpus", "8xH100", "--global-batch", "12"], "--global-batch 12 does not split over 8 GPUs"),
    (["--gpus", "2xH100", "--global-batch", "8", "--micro-batches", "3"], "micro-batch 3 cannot make up"),
    (["--gpus", "2xcpu"], "the memory of a cpu device is not known; give it with --memory-gb"),
    (["--gpus", "2xH100", "--collectives-in-flight", "one"], "'one' is neither a count of collectives nor"),
    (["--gpus", "2xH100", "--memory-margin", "1.5"], "--memory-margin must be in [0, 1)"),
    (["--gpus", "2xH100", "--strategy", "fsdp,zero3"], "unknown strategy 'zero3'; use any of: fsdp, ddp, fsdp1"),
])
def test_cli_bad_input_is_one_line(capsys, args, message):
    from remat_opt.cli.main import main

    assert main(["fit", *CLI_TINY, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("remat-opt: error: ") and message in err and "\n" not in err


@pytest.mark.slow
def test_cli_json_ranks_writes_the_plan_and_names_the_line_to_run(capsys, roomy, tmp_path):
    from remat_opt.cli.main import main
    from remat_opt.planning.plan_file import PlanFile

    out = tmp_path / "fit.json"
    assert main(["fit", *CLI_TINY, "--gpus", "1xcpu", "--memory-gb", "1", "--micro-batches", "1,2,4", "--json",
                 "--no-progress", "--out", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["config"]["micro_batch"] for r in data["rows"]] == [r.config.micro_batch for r in roomy.rows]
    assert [r["peak_bytes"] for r in data["rows"]] == [r.peak_bytes for r in roomy.rows]
    assert data["apply"][0] == f"jitted = thunder.jit(model, transforms=[CostRemat(plan={str(out)!r}, device_spec='cpu')])"
    assert data["apply"][1].startswith("python train.py   # micro-batch 4")
    plan = PlanFile.load(out)
    assert plan.description["micro_batch"] == 4 and plan.tag_targets == {} and plan.world_size == 1


# ---- torch's FSDP1 under ThunderFX (one block traced through ThunderFX) -----------------------


@pytest.mark.slow
@pytest.mark.extended
def test_torch_fsdp1_rows_checkpointing_and_costremats_block_plan():
    """Two ranks' FSDP1 iteration (`analysis.torch_fsdp`, exact on 2 gloo ranks in
    tests/distributed/test_torch_fsdp.py): with room, CostRemat's block plan saves everything and
    is faster than per-block checkpointing; at checkpointing's own peak as the limit, CostRemat's
    row is the least-recompute block plan (Thunder tags, not torch's checkpoint_wrapper) that fits."""
    from remat_opt.analysis.fit import ModelRequest, _block_menu, _torch_fsdp_case, plan_file_of
    from remat_opt.analysis.thunder_1370 import CHECKPOINT_WRAPPER

    # one block is traced whatever the depth: 8 blocks make the activations matter
    kwargs = dict(gpus="2xcpu", seq=128, micro_batches=[1], strategies=["fsdp1"], memory_margin=0.0, n_layer=8,
                  tiny=True)
    roomy_result = fit("Llama-2-7b-hf", memory_gb=1.0, **kwargs)
    roomy = {r.config.torch_fsdp: r for r in roomy_result.rows}
    assert roomy["checkpoint"].fits and roomy["costremat"].fits
    assert roomy["costremat"].recompute_s == 0 < roomy["checkpoint"].recompute_s
    assert roomy["costremat"].step_time_s < roomy["checkpoint"].step_time_s
    assert roomy["checkpoint"].block_tag_targets == CHECKPOINT_WRAPPER
    limit = roomy["checkpoint"].peak_bytes
    assert roomy["costremat"].peak_bytes > limit  # saving everything needs more than checkpointing
    tight = fit("Llama-2-7b-hf", memory_gb=limit / 1e9, **kwargs)
    rows = {r.config.torch_fsdp: r for r in tight.rows}
    assert rows["checkpoint"].fits and rows["checkpoint"].peak_bytes == limit
    key = (ModelRequest("Llama-2-7b-hf", 128, n_layer=8, tiny=True), 2, 1, tight.gpus)
    case = _torch_fsdp_case(*key)
    fitting = [p for p in _block_menu(*key, 10.0)
               if p.tag_targets != CHECKPOINT_WRAPPER and case.predict(p).peak_bytes <= limit]
    assert fitting and rows["costremat"].fits and rows["costremat"].peak_bytes <= limit
    n_blocks = case.units.n_blocks
    assert rows["costremat"].recompute_s == pytest.approx(n_blocks * min(p.recompute_time_s for p in fitting))
    assert rows["costremat"].block_tag_targets != CHECKPOINT_WRAPPER
    below = {r.config.torch_fsdp: r for r in fit("Llama-2-7b-hf", memory_gb=(limit - 1) / 1e9, **kwargs).rows}
    assert not below["checkpoint"].fits and below["checkpoint"].over_bytes == 1
    with pytest.raises(FitError, match="plan files do not cover yet"):
        plan_file_of(tight, rows["checkpoint"])
