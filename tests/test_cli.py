"""`remat-opt inspect`: output, JSON, and one-line errors for bad input."""

import json

import pytest

from remat_opt.cli import main

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
    assert main(["inspect", "remat_opt.examples:block", "--executors", "default"]) == 0
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
        (["inspect", "Llama-2-7b-hf", "--seq", "0"], "seq must be a positive integer"),
        (["inspect", *TINY, "--traced-layers", "2"], "traced_layers must be 0 (all) or at least 3, got 2"),
        (["inspect", "factories:broken", "--traced-layers", "4"], "--traced-layers needs a litgpt config name"),
    ],
    ids=[
        "unknown-config", "failing-forward", "mixed-devices", "bad-factory", "missing-factory", "bad-seq",
        "traced-layers-too-few", "traced-layers-of-a-factory",
    ],
)
def test_bad_input_gets_one_line_error(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("remat-opt: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_deep_configs_on_meta_are_traced_shallow_and_extended(capsys):
    # the config of test_deepen's Llama-2 case: within one run, its traced graphs are cached and shared
    argv = ["inspect", "Llama-2-7b-hf", "--tiny", "--n-layer", "5", "--json"]
    assert main(argv) == 0
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
