"""`remat_opt.analysis.whatif` on small graphs: a tiny 3-layer Llama-2 traced on meta with fused SDPA (costed
for an H100) and synthetic stacks of identical blocks."""

import importlib
import subprocess
import sys
from dataclasses import replace

import pytest

import remat_opt
from remat_opt.costing.graph_costs import CostModel
from remat_opt.analysis import plots, thunder_1646, whatif
from remat_opt.core.layers import forward_layer_labels
from remat_opt.core.simulation import simulate_peak_bytes
from remat_opt.solvers import InfeasibleBudgetError
from remat_opt.solvers.ilp_model import ILPOptions
from remat_opt.solvers.pareto import sweep_budgets
from synthetic import chain_graph, stacked_blocks_graph

N_LAYER, N_HEAD, SEQ = 3, 4, 32  # tiny_overrides: 4 heads; 3 layers: solved exactly (no ties)


@pytest.fixture(scope="module")
def tiny():
    # Through the run's graph cache (REMAT_OPT_GRAPH_CACHE, tests/conftest.py), like every traced spec.
    from remat_opt.models.graphs import analyze_spec
    from remat_opt.models.by_name import ModelSpec

    spec = ModelSpec("Llama-2-7b-hf", n_layer=N_LAYER, seq=SEQ, dtype="float32", tiny=True, device="meta")
    return analyze_spec(spec, traced_layers=0, executors="fused-sdpa")


@pytest.fixture(scope="module")
def h100(tiny):
    return whatif.cost_graph(tiny, "H100")


@pytest.fixture(scope="module")
def sweep(h100):
    return whatif.peak_sweep(h100, 5)


@pytest.fixture(scope="module")
def stack():
    return stacked_blocks_graph(5, seed=3)


def test_whatif_imports_no_thunder():
    code = "import sys, remat_opt.analysis.whatif; print('thunder' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_cost_graph_prices_every_op(tiny, h100):
    costs = CostModel(tiny, "H100")
    assert h100.step_time_s == pytest.approx(sum(costs.op_cost(op).time_s for op in tiny.ops))
    assert set(h100.problem.op_time_s) == {op.name for op in tiny.forward_ops}
    assert whatif.cost_graph(tiny, "H200").step_time_s < h100.step_time_s  # more bandwidth, same FLOP/s


def test_graph_summary_names_the_layers(tiny):
    assert f"{N_LAYER} identical blocks of" in whatif.graph_summary(tiny)
    assert "no repeated layers" in whatif.graph_summary(chain_graph(3))


def test_sweep_runs_from_least_peak_to_save_all(tiny, sweep):
    points = sweep.points
    assert len(points) + len(sweep.unsolved) == 5 and len(points) >= 2
    assert [p.swept_budget_bytes for p in points] == sorted(p.swept_budget_bytes for p in points)
    for p in points:  # within budget by an independent simulation of the plan's tags, not its own field
        assert p.peak_bytes == simulate_peak_bytes(tiny, p.plan.recomputed_tag_targets) <= p.swept_budget_bytes
        # an optimal plan of the solver is never replaced: the curve is monotone without substitution
        assert p.plan.status == "optimal" and not p.substituted, p
    assert [p.extra_time_s for p in points] == sorted((p.extra_time_s for p in points), reverse=True)
    assert points[-1].extra_time_s == 0 and points[-1].saved_bytes == tiny.saved_activation_bytes
    assert points[0].peak_bytes < points[-1].peak_bytes and points[0].extra_time_s > 0
    assert sweep.label == "H100" and len(sweep.sdpa_recomputed) == len(points)


def test_sweep_reports_a_budget_without_plan(h100, monkeypatch):
    pareto_module = importlib.import_module("remat_opt.solvers.pareto")  # the package exports a function `pareto`

    real = pareto_module.solve_once
    budgets_bytes, _ = sweep_budgets(h100.problem, 3, "peak")

    def fail_lowest(problem, bound_bytes, *args, **kwargs):
        if bound_bytes == budgets_bytes[0]:
            raise TimeoutError("ilp: no plan within budget found")
        return real(problem, bound_bytes, *args, **kwargs)

    monkeypatch.setattr(pareto_module, "solve_once", fail_lowest)
    planner = importlib.import_module("remat_opt.planning.planner")
    monkeypatch.setattr(planner, "sweep_budgets", lambda *args: (budgets_bytes, ()))  # no known plan
    sweep = whatif.peak_sweep(h100, 3, label="x")
    assert len(sweep.points) == 2 and len(sweep.unsolved) == 1
    assert "no plan within budget" in sweep.unsolved[0]
    assert "x: no plan at" in whatif.sweep_notes([sweep])


def test_sweep_tables(sweep):
    rows = whatif.sweep_rows(sweep)
    assert len(rows) == len(sweep.points) and rows[-1]["extra ms"] == "0.00"
    (row,) = whatif.endpoint_rows([whatif.relabel(sweep, "tiny")])
    assert row["curve"] == "tiny" and float(row["save-all peak GB"]) >= float(row["least peak GB"])
    assert float(row["predicted step ms"]) == pytest.approx(sweep.step_time_s * 1e3, abs=0.1)
    assert whatif.sweep_notes([]) == "Every budget of every sweep has a plan."


def test_sdpa_units_are_the_attention_kernels(tiny, h100):
    sdpa_ops = whatif.sdpa_forward_ops(tiny)
    assert len(sdpa_ops) == N_LAYER and {op.symbol for op in sdpa_ops} <= whatif.SDPA_FORWARD_SYMBOLS
    units = thunder_1646.sdpa_units(h100.problem)
    assert len(units) == N_LAYER
    symbols = {h100.problem.ops_by_name[op].symbol for u in units for op in h100.problem.units[u].ops}
    assert symbols <= whatif.SDPA_FORWARD_SYMBOLS


def test_sdpa_case_against_save_all(tiny, h100):
    problem, case = h100.problem, thunder_1646.sdpa_case(h100)
    assert case.n_sdpa_ops == N_LAYER
    assert case.saved_freed_bytes == problem.saved_bytes(()) - problem.saved_bytes(case.units) > 0
    assert case.extra_time_s == pytest.approx(sum(problem.op_time_s[op.name] for op in whatif.sdpa_forward_ops(tiny)))
    assert case.auxiliary_bytes == N_LAYER * N_HEAD * SEQ * 4  # one float32 logsumexp [1, H, T] per layer
    assert case.saved_freed_bytes > case.auxiliary_bytes
    rows = thunder_1646.sdpa_case_rows(case)
    assert rows[0]["% of measured step"] == "2.45"  # (350.15 - 341.78) / 341.78, measured
    assert rows[2]["what"].startswith(f"tag the {N_LAYER} SDPA units")


def test_sdpa_recomputed_counts_and_verdict(tiny, h100, sweep):
    units = thunder_1646.sdpa_units(h100.problem)
    plan = h100.problem.plan_for(units, solver="t", status="t", solve_time_s=0.0)
    assert whatif.count_sdpa_recomputed(tiny, plan) == N_LAYER
    n_points = len(sweep.points)
    none = replace(sweep, sdpa_recomputed=(0,) * n_points)
    expected = f"The solver reruns no SDPA forward in any of the {n_points} plans of the sweeps."
    assert thunder_1646.sdpa_verdict([none]) == expected
    picked = replace(sweep, sdpa_recomputed=(0,) * (n_points - 1) + (2,))
    assert thunder_1646.sdpa_verdict([picked]).startswith(f"The solver reruns SDPA in 1 of {n_points} plans: H100 at")
    assert "(2 SDPA ops)" in thunder_1646.sdpa_verdict([picked])


def test_layers_of_a_stack(stack):
    layers = forward_layer_labels(stack)
    assert sorted(set(layers.values())) == ["after", *(f"layer {i}" for i in range(5))]
    assert set(forward_layer_labels(chain_graph(3)).values()) == {"before"}


def test_saved_bytes_by_layer_and_kind_sum_to_saved(stack):
    by_layer = whatif.saved_bytes_by_layer(stack)
    assert list(by_layer)[:2] == ["layer 0", "layer 1"] and list(by_layer)[-1] == "after"
    assert sum(by_layer.values()) == stack.saved_activation_bytes
    assert len({by_layer[f"layer {i}"] for i in range(1, 5)}) == 1  # identical blocks save alike
    by_kind = whatif.saved_bytes_by_kind(stack)
    assert sum(by_kind.values()) == stack.saved_activation_bytes
    assert list(by_kind.values()) == sorted(by_kind.values(), reverse=True)


def test_saved_bytes_of_a_plan(tiny, sweep):
    plan = sweep.points[0].plan
    assert sum(whatif.saved_bytes_by_layer(tiny, plan.saved_names).values()) == plan.saved_bytes
    assert sum(whatif.saved_bytes_by_kind(tiny, plan.saved_names).values()) == plan.saved_bytes
    rows = whatif.saved_gb_rows({"save-all": {"a": 2 * 10**9}, "plan": {"a": 10**9, "b": 5}})
    assert rows == [{"": "a", "save-all GB": "2.000", "plan GB": "1.000"},
                    {"": "b", "save-all GB": "0.000", "plan GB": "0.000"}]


def test_plan_at_peak_gb_is_graph_plan(tiny, h100, sweep):
    budget_gb = sweep.points[1].swept_budget_bytes / whatif.GB
    plan, reference = whatif.plan_at_peak_gb(h100, budget_gb), remat_opt.plan_graph(tiny, budget_gb=budget_gb, device_spec="H100")
    # CP-SAT may return another optimum among ties: compare the objective (op times in the solver's
    # integer time quanta, where plans a few nanoseconds apart tie) and the budget
    quantum_s = ILPOptions().time_quantum_s
    objective = [sum(round(h100.problem.op_time_s[o] / quantum_s) for o in p.recompute_ops) for p in (plan, reference)]
    assert objective[0] == objective[1]
    assert plan.extra_time_s == pytest.approx(reference.extra_time_s, abs=len(plan.recompute_ops + reference.recompute_ops) * quantum_s / 2)
    assert plan.peak_bytes <= round(budget_gb * whatif.GB) and plan.status == reference.status == "optimal"
    with pytest.raises(InfeasibleBudgetError, match=r"budget_gb=1e-06 is below the minimum feasible [0-9.]+ GB"):
        whatif.plan_at_peak_gb(h100, 1e-6)


def test_budget_table_shows_infeasible_budgets(h100, sweep):
    save_all_gb = sweep.points[-1].swept_budget_bytes / whatif.GB
    low, mid, high = whatif.plans_at_peak_budgets(h100, (1e-6, sweep.points[1].swept_budget_bytes / whatif.GB, save_all_gb))
    assert low.plan is None and low.infeasible and "budget_gb=1e-06 is below the minimum feasible" in low.message
    assert mid.plan is not None and high.plan.extra_time_s == 0
    rows = whatif.budget_rows(h100, [low, mid, high])
    assert rows[0]["feasible"] == "no" and rows[0]["recomputed"] == low.message and rows[0]["peak GB"] == "-"
    assert rows[1]["feasible"] == "yes" and rows[1]["recomputed"] == whatif.describe_recomputed(h100, mid.plan)
    assert rows[2]["recomputed"].split(";")[0] == "nothing"
    unknown = whatif.BudgetOutcome(budget_gb=1.0, plan=None, message="timed out")
    assert whatif.budget_rows(h100, [unknown])[0]["feasible"] == "no plan found"


def test_recomputed_by_kind_splits_free_views(h100, sweep):
    plan = sweep.points[0].plan
    paid, free = whatif.recomputed_by_kind(h100, plan), whatif.recomputed_by_kind(h100, plan, free=True)
    assert sum(paid.values()) + sum(free.values()) == len(plan.recompute_ops)
    assert sum(paid.values()) > 0
    assert list(paid.values()) == sorted(paid.values(), reverse=True)
    assert whatif.format_counts({"mul": 64, "to": 32}) == "mul (64), to (32)"
    assert whatif.format_counts({}) == "nothing"


def test_markdown_table():
    rows = [{"a": 1, "b": "x|y"}, {"a": 2, "b": ""}]
    assert whatif.markdown_table(rows) == "| a | b |\n| --- | --- |\n| 1 | x\\|y |\n| 2 |  |"
    assert whatif.markdown_table([]) == "(no rows)"


def test_figures(sweep, stack):
    fig = plots.plot_sweeps([sweep, whatif.relabel(sweep, "again")], "title")
    assert [len(ax.lines) for ax in fig.axes] == [2, 2]
    bars = plots.plot_saved_bytes({"save-all": whatif.saved_bytes_by_kind(stack)}, horizontal=True)
    assert len(bars.axes[0].patches) == len(whatif.saved_bytes_by_kind(stack))


def test_write_png(sweep, tmp_path):
    path = plots.write_llama2_7b_h100_png(tmp_path / "docs" / "pareto.png", sweep=sweep)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in path.parent.iterdir()] == ["pareto.png"]


@pytest.fixture(scope="module")
def standin():
    # The notebook's default graphs: the nvFuser stand-in's regions and Thunder's rematerialization.
    # The spec and executors of tests/core/test_deepen.py's 4-layer stand-in trace (one trace for both files).
    from remat_opt.models.graphs import analyze_spec
    from remat_opt.models.by_name import ModelSpec

    spec = ModelSpec("Llama-2-7b-hf", n_layer=4, seq=SEQ, dtype="float32", tiny=True, device="meta")
    return analyze_spec(spec, traced_layers=0, executors="nvfuser-standin")


def test_the_notebooks_analyses_run_on_standin_graphs(standin):
    regions = [op for op in standin.forward_ops if op.members]
    assert regions, "the stand-in forms fusion regions"
    h100 = whatif.cost_graph(standin, "H100")
    sweep = whatif.peak_sweep(h100, 3)  # one point here: recomputing lowers no peak of this tiny model
    assert not sweep.unsolved and sweep.points[-1].saved_bytes == standin.saved_activation_bytes
    half_bytes = standin.saved_activation_bytes // 2
    plan = remat_opt.plan_graph(standin, activation_budget_gb=half_bytes / 1e9, device_spec="H100")
    assert 0 < plan.saved_bytes <= half_bytes and plan.extra_time_s > 0
    case = thunder_1646.sdpa_case(h100)
    assert case.n_sdpa_ops == 4 and case.saved_freed_bytes > 0
    by_kind = whatif.saved_bytes_by_kind(standin)
    assert sum(by_kind.values()) == standin.saved_activation_bytes
    assert not any(kind.startswith("nvFusion") for kind in by_kind), by_kind  # regions show what they computed
    assert any(kind.endswith("(fused)") for kind in by_kind), by_kind
    assert sum(whatif.saved_bytes_by_layer(standin).values()) == sum(by_kind.values())


def test_model_graph_uses_the_standin_unless_told(monkeypatch):
    calls = []
    monkeypatch.setattr("remat_opt.models.graphs.analyze_model", lambda name, **kw: calls.append(kw))
    whatif.model_graph("Llama-2-7b-hf", seq=SEQ)
    whatif.model_graph("Llama-2-7b-hf", seq=SEQ, executors="fused-sdpa", traced_layers=3)
    assert [(c["executors"], c["traced_layers"]) for c in calls] == [(None, 4), ("fused-sdpa", 3)]  # None: the stand-in


def test_the_notebooks_parameters_reach_the_solver(h100, monkeypatch):
    from remat_opt import solvers

    seen = []
    solve = solvers.SOLVERS["ilp"]

    def spy(*args, options, **kwargs):
        seen.append(options.time_limit_s)
        return solve(*args, options=options, **kwargs)

    monkeypatch.setitem(solvers.SOLVERS, "ilp", spy)  # plan_at_peak_gb, and the sweep through the planner
    whatif.plan_at_peak_gb(h100, 1.0, time_limit_s=0.5)
    whatif.peak_sweep(h100, 2, time_limit_s=0.75)
    assert seen[0] == 0.5 and set(seen[1:]) == {0.75} and len(seen) > 1


def test_default_executors_are_the_standin_on_meta_only():
    from remat_opt.executors import default_executors

    assert default_executors("meta") == "nvfuser-standin"
    assert default_executors("cpu") == default_executors("cuda") == "fused-sdpa"


def test_training_step_adds_the_benchmarks_loss_optimizer_and_allocator(standin):
    from costmodels.formulas import formula_cost
    from remat_opt.core.simulation import simulate_step
    from remat_opt.analysis.training_step import CUBLAS_WORKSPACE_BYTES, Parameters, adamw_op_args, predict_training_step

    parameters = thunder_1646.benchmark_parameters("Llama-2-7b-hf", n_layer=4, seq=SEQ, dtype="float32", tiny=True)
    assert parameters.dtype == "float32"
    assert len(parameters.numels) == 2 + 4 * 7 + 1  # wte, lm_head; 2 norms, qkv, proj, 3 MLP per layer; ln_f
    costs = CostModel(standin, "H100")
    step = predict_training_step(standin, costs, parameters)
    assert sum(step.memory_terms.values()) == step.peak_bytes == max(step.phase_peaks.values())
    moments = 2 * sum(-(-n * 4 // 512) * 512 for n in parameters.numels)
    assert step.memory_terms["AdamW moments"] == moments and step.memory_terms["cuBLAS workspace"] == 32 << 20
    exact, rounded = simulate_step(standin), simulate_step(standin, allocation_granularity_bytes=512)
    assert rounded.peak_bytes > exact.peak_bytes and all(b % 512 == 0 for b in rounded.live_bytes)
    resident = moments + CUBLAS_WORKSPACE_BYTES["sm90"]
    assert step.phase_peaks["optimizer step"] == rounded.live_bytes[-1] + resident
    assert step.phase_peaks["backward"] == max(rounded.live_bytes[len(standin.forward_ops):]) + resident
    # bf16 moments of fp32 parameters take half; the optimizer's time is its formula's on the H100 sheet
    half = predict_training_step(standin, costs, parameters, optimizer_state_dtype="bfloat16")
    assert half.memory_terms["AdamW moments"] < moments
    adamw = formula_cost(adamw_op_args(parameters, "float32"))
    assert adamw.bytes_read == 4 * parameters.bytes and adamw.bytes_written == 3 * parameters.bytes
    big = formula_cost(adamw_op_args(Parameters((65_536 * 400,) * 100, "bfloat16"), "bfloat16"))
    assert big.kernels == 125  # 40,000 chunks of 65,536 elements, 320 per launch
    recomputing = predict_training_step(standin, costs, parameters, thunder_1646.sdpa_units(whatif.cost_graph(standin, "H100").problem))
    assert recomputing.time_terms["recomputed in the backward"] > 0 == step.time_terms["recomputed in the backward"]


def test_seed_rows_compare_with_1646s_measurements(standin):
    seed = thunder_1646.seed_prediction(whatif.cost_graph(standin, "H100"),
                                  thunder_1646.benchmark_parameters("Llama-2-7b-hf", n_layer=4, seq=SEQ, dtype="float32", tiny=True))
    rows = thunder_1646.seed_rows(seed)
    assert [r["run"].split(" (")[0] for r in rows] == ["SDPA kept", "SDPA rerun for its logsumexp, output kept"]
    assert rows[0]["peak GB predicted / measured"].endswith("/ 64.18") and rows[1]["ms predicted / measured"].endswith("/ 350.15")
    assert seed.rerun_time_s > seed.kept.time_s and seed.rerun_peak_bytes <= seed.kept.peak_bytes
    assert any(r["term"].startswith("time: optimizer step") for r in thunder_1646.seed_breakdown_rows(seed))


def test_one_ranks_optimizer_keeps_states_for_its_shard_under_fsdp_and_for_everything_under_ddp():
    from remat_opt.distributed.data_parallel import DataParallel

    whole = thunder_1646.benchmark_parameters("Llama-2-7b-hf", n_layer=1, tiny=True)
    fsdp = thunder_1646.benchmark_parameters("Llama-2-7b-hf", DataParallel("fsdp", 4), n_layer=1, tiny=True)
    assert fsdp.numels == tuple(n // 4 for n in whole.numels) and 4 * fsdp.bytes == whole.bytes
    assert whole.per_rank(DataParallel("ddp", 4)) == whole
    with pytest.raises(ValueError, match="FSDP over 3 ranks: a parameter of .* elements does not split evenly"):
        whole.per_rank(DataParallel("fsdp", 3))


def test_no_budget_adds_no_recompute_time_on_standin_graphs(standin):
    # a fusion region's tag targets are its members': the zero-time plan must pin them too
    plan = remat_opt.plan_graph(standin, device_spec="H100")
    assert plan.extra_time_s == 0 and plan.recomputed_tag_targets == (), plan.recomputed_tag_targets
