"""`remat-opt inspect`: output, JSON, and one-line errors for bad input."""

import argparse
import json

import pytest

from remat_opt.cli.main import main

TINY = ["Llama-2-7b-hf", "--tiny", "--n-layer", "1", "--device", "meta"]


def test_inspect_json_totals_are_consistent(capsys):
    assert main(["inspect", *TINY, "--json", "--top", "5"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"]["name"] == "Llama-2-7b-hf" and report["model"]["seq"] == 32
    assert sum(g["bytes"] for g in report["groups"]) == report["saved_activation_bytes"] > 0
    assert report["saved_bytes"] == report["saved_activation_bytes"] + report["saved_input_bytes"]
    assert len(report["top"]) == 5
    assert [t["bytes"] for t in report["top"]] == sorted((t["bytes"] for t in report["top"]), reverse=True)
    assert "remat_sdpa_cpu_fwd" in {g["op"] for g in report["groups"]}


def test_inspect_text_output(capsys):
    assert main(["inspect", "remat_opt.models.examples:block", "--executors", "default"]) == 0
    out = capsys.readouterr().out
    assert "saved for backward:" in out and "by producing op:" in out and "largest saved storages" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["inspect", "Llama-2-7b"], "unknown litgpt config name 'Llama-2-7b'; did you mean Llama-2-7b-hf"),
        (["inspect", "factories:broken"], "tracing _Broken failed"),
        (["inspect", "factories:mixed_devices"], "several devices (cpu, meta)"),
        (["inspect", "factories:not_a_pair"], "must return (model, example_inputs_tuple)"),
        (["inspect", "factories:missing"], "cannot load factory"),
        (["inspect", "Llama-2-7b-hf", "--seq", "0"], "argument --seq: must be at least 1, got 0"),
        (["inspect", *TINY, "--traced-layers", "2"], "traced_layers must be 0 (all) or at least 3, got 2"),
        (["inspect", "factories:broken", "--traced-layers", "4"], "--traced-layers needs a litgpt config name"),
        (["plan", *TINY, "--device-spec", "h100", "--world-size", "3", "--strategy", "fsdp"],
         "world size 3 does not divide what FSDP shards: lm_head.weight has 256 rows"),
        (["plan", *TINY, "--device-spec", "h100", "--world-size", "2", "--strategy", "zero3"],
         "unknown strategy 'zero3'; use one of: fsdp, ddp"),
        (["pareto", *TINY, "--device-spec", "h100", "--world-size", "2"], "--world-size and --strategy go together"),
        (["plan", *TINY, "--device-spec", "h100", "--world-size", "2", "--strategy", "ddp", "--collectives-in-flight",
          "1"], "--collectives-in-flight goes with --strategy fsdp"),
        # the model is the first thing checked: a wrong name before a missing --device-spec
        (["plan", "NoSuchModel-7b", "--tiny"], "unknown litgpt config name 'NoSuchModel-7b'"),
        (["pareto", "NoSuchModel-7b", "--tiny"], "unknown litgpt config name 'NoSuchModel-7b'"),
        (["plan", *TINY, "--device-spec", "bogus"], "unknown device spec 'bogus'; use one of h100, h200, a100, l40s, cpu"),
        (["plan", *TINY, "--bogus"], "unrecognized arguments: --bogus"),
    ],
    ids=[
        "unknown-config", "failing-forward", "mixed-devices", "bad-factory", "missing-factory", "bad-seq",
        "traced-layers-too-few", "traced-layers-of-a-factory", "world-size-not-dividing", "unknown-strategy",
        "world-size-alone", "in-flight-without-fsdp", "unknown-model-first-plan",
        "unknown-model-first-pareto", "unknown-device-spec", "unknown-flag",
    ],
)
def test_bad_input_gets_one_line_error(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("remat-opt: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_an_error_names_the_program_once(capsys):
    assert main(["plan", *TINY, "--bogus"]) == 2
    assert capsys.readouterr().err.count("remat-opt") == 1


def test_the_h100_sxm5_alias_the_api_takes_is_a_device_spec_here():
    from remat_opt.cli.main import resolve_device_spec

    assert resolve_device_spec("h100-sxm5") == "H100-SXM"


@pytest.mark.parametrize("command", ["inspect", "profile", "pareto", "plan"])
def test_every_option_has_help_and_shows_its_default(command, capsys):
    from remat_opt.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    for action in sub._actions:
        assert action.help, f"{command} {action.option_strings or action.dest} has no help"
    assert main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for action in sub._actions:
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            assert f"(default: {action.default})" in text, (command, action.option_strings)


@pytest.mark.extended  # the traces of test_deepen's extended case (shared through the graph cache)
def test_deep_configs_on_meta_are_traced_shallow_and_extended(capsys):
    # the config of test_deepen's Llama-2 case (the nvFuser stand-in, the default on meta, from 4 traced
    # layers): within one run, its traced graphs are cached and shared
    argv = ["inspect", "Llama-2-7b-hf", "--tiny", "--n-layer", "5", "--dtype", "float32", "--json"]
    assert main([*argv, "--traced-layers", "4"]) == 0
    extended = json.loads(capsys.readouterr().out)
    assert "Llama-2-7b-hf: traced 4 of 5 layers" in " ".join(extended["notes"])
    assert main([*argv, "--traced-layers", "0"]) == 0
    direct = json.loads(capsys.readouterr().out)
    assert not any("traced" in note for note in direct["notes"])
    for key in ("saved_bytes", "saved_activation_bytes", "saved_input_bytes", "groups"):
        assert extended[key] == direct[key]


def test_graph_cache_serves_the_same_graph_and_retraces_a_broken_entry(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("REMAT_OPT_GRAPH_CACHE", str(tmp_path))
    argv = ["inspect", *TINY, "--json"]
    assert main(argv) == 0
    traced = json.loads(capsys.readouterr().out)
    (entry,) = tmp_path.glob("*.pkl")  # one graph stored
    stamp = entry.stat().st_mtime_ns
    assert main(argv) == 0
    cached = json.loads(capsys.readouterr().out)
    assert entry.stat().st_mtime_ns == stamp  # read, not rewritten
    for key in ("saved_bytes", "saved_activation_bytes", "groups", "top", "model"):
        assert cached[key] == traced[key], key
    entry.write_bytes(b"not a pickle")
    with pytest.warns(UserWarning, match="ignoring unreadable"):
        assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["saved_bytes"] == traced["saved_bytes"]
    assert entry.stat().st_mtime_ns != stamp  # traced again and rewritten
    other = ["inspect", "Llama-2-7b-hf", "--tiny", "--n-layer", "1", "--seq", "16", "--device", "meta", "--json"]
    assert main(other) == 0
    assert len(list(tmp_path.glob("*.pkl"))) == 2  # another spec, another entry


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["inspect", *TINY[:-2], "--device", "nonsense"], "argument --device: unknown device 'nonsense'"),
        (["inspect", *TINY, "--top", "-1"], "argument --top: must be at least 0, got -1"),
        (["inspect", *TINY, "--n-layer", "two"], "argument --n-layer: 'two' is not an integer"),
        (["profile", "factories:sized", "--threads", "0"], "argument --threads: must be at least 1, got 0"),
        (["profile", "factories:sized", "--repeats", "0"], "argument --repeats: must be at least 1, got 0"),
        (["plan", *TINY, "--device-spec", "h100", "--budget-gb", "nan"], "--budget-gb: must be finite"),
        (["plan", *TINY, "--device-spec", "h100", "--budget-gb", "inf"], "--budget-gb: must be finite"),
        (["plan", *TINY, "--device-spec", "h100", "--time-limit-s", "0"], "--time-limit-s: must be finite and positive"),
        (["plan", *TINY, "--device-spec", "h100", "--budget-gb", "1e12"], "budget_gb"),
        (["inspect", "factories:raising"], "factory 'factories:raising' raised RuntimeError: weights not found"),
        (["inspect", "factories:needs_width"], "factory 'factories:needs_width' needs width"),
        (["inspect", "factories:sized", "--n-layer", "7"],
         "factory 'factories:sized' takes no --n-layer (of n_layer, seq, batch, dtype, device it takes batch, seq, device)"),
        (["inspect", "factories:sized", "--tiny"], "takes no --tiny"),
        (["pareto", *TINY, "--device-spec", "h100", "--out", "/proc/remat-opt-out"], "--out '/proc/remat-opt-out' is not writable"),
        (["profile", "factories:sized", "-o", "/proc/table.json"], "--output '/proc/table.json' is not writable"),
    ],
    ids=["device", "top", "n-layer-word", "threads", "repeats", "nan-budget", "inf-budget", "time-limit",
         "huge-budget", "factory-raises", "factory-needs-argument", "factory-option-ignored", "factory-tiny",
         "unwritable-out", "unwritable-output"],
)
def test_every_bad_option_is_one_line_with_status_2(argv, message, capsys):
    from factories import CALLS

    CALLS.clear()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("remat-opt: error: ") and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "sized" not in CALLS  # refused before any model was built


def test_factory_gets_the_options_it_takes_and_the_header_says_only_those(capsys):
    assert main(["inspect", "factories:sized", "--seq", "4", "--batch", "3", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == {"name": "factories:sized", "seq": "4", "batch": "3", "device": "meta"}
    assert report["saved_input_bytes"] == (3 * 4 * 16 + 16 * 16) * 4  # x and the weight: built with them
    assert main(["inspect", "factories:sized", "--seq", "4", "--batch", "3"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "factories:sized seq=4 batch=3 on meta"


def test_plan_title_names_the_device_it_costed_for(capsys):
    assert main(["plan", "factories:sized", "--device", "cpu", "--summary"]) == 0
    title = capsys.readouterr().out.splitlines()[0]
    assert title.startswith("factories:sized on cpu, costed for cpu (nominal, uncalibrated);"), title


def test_the_readme_cost_table_workflow_works_end_to_end(tmp_path, monkeypatch, capsys):
    """`profile --threads 1` writes cost_tables/cpu.json; `plan --cost-table` reads it in a process
    with another thread count (a warning, not a refusal); another machine's table needs
    --allow-other-device, which exists."""
    import torch

    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    model = ["factories:sized", "--device", "cpu"]
    try:
        assert main(["profile", *model, "--threads", "1", "--warmup", "0", "--repeats", "1", "--no-progress"]) == 0
        assert "wrote cost_tables/cpu.json" in capsys.readouterr().out
    finally:
        torch.set_num_threads(threads)
    table = tmp_path / "cost_tables" / "cpu.json"
    plan = ["plan", *model, "--cost-table", str(table), "--summary"]
    torch.set_num_threads(2)
    try:
        with pytest.warns(UserWarning, match="measured with 1 CPU threads, this process uses 2"):
            assert main(plan) == 0
    finally:
        torch.set_num_threads(threads)
    assert "costed for cpu: " in capsys.readouterr().out

    data = json.loads(table.read_text())
    data["device"] = "cpu: another machine (64 cores visible)"
    table.write_text(json.dumps(data))
    assert main(plan) == 2
    err = capsys.readouterr().err
    assert "measured on 'cpu: another machine" in err and "--allow-other-device" in err and err.count("\n") == 1
    with pytest.warns(UserWarning, match="using it anyway"):
        assert main([*plan, "--allow-other-device"]) == 0


def test_plan_with_auto_costs_times_the_model_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("REMAT_OPT_COST_CACHE", str(tmp_path))
    argv = ["plan", "factories:sized", "--device", "cpu", "--cost-table", "auto", "--summary"]
    assert main(argv) == 0
    first = capsys.readouterr().err
    assert "cost_table='auto'" in first and " 0 timed now" not in first
    assert main(argv) == 0
    assert " 0 timed now in 0.0 s" in capsys.readouterr().err
