"""`remat-opt pareto` and `remat-opt plan`: files, tables, one-line errors; `benchmarks/gpu_check.py` on CPU."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from remat_opt.cli.main import main, parse_budgets_gb, resolve_device_spec
from remat_opt.planning.explanation import ExplainRow, Explanation

TINY = ["Llama-2-7b-hf", "--tiny", "--n-layer", "1", "--device", "meta"]
ROOT = Path(__file__).resolve().parents[2]


def _rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("budget", ["activation", "peak"])
def test_pareto_writes_png_svg_csv(budget, tmp_path, capsys):
    out = tmp_path / "curve"
    # a time limit no loaded machine reaches on this model: every point's wall-clock solve finishes
    # proven (at 10 s, a loaded run once left the least point to the least-peak plan found; that
    # search is now limited in deterministic time, the same on any machine)
    argv = ["pareto", *TINY, "--device-spec", "h100", "--points", "4", "--sweep", budget, "--time-limit-s", "60",
            "--out", str(out)]
    if budget == "peak":  # with the stand-in (the default on meta), this 1-layer model's least peak is its
        argv += ["--executors", "fused-sdpa"]  # save-all peak: one point; with the fused SDPA alone, 4
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    assert "peak GB" in stdout and "extra ms" in stdout and "costed for H100-SXM" in stdout
    assert f"{budget} budget sweep" in stdout and f"{budget} budget GB" in stdout  # which budget the points are
    png, svg, table = out / "pareto.png", out / "pareto.svg", out / "pareto.csv"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in svg.read_text()
    rows = _rows(table)
    assert 2 <= len(rows) <= 4  # equal budgets collapse on a tiny model
    assert {r["budget_kind"] for r in rows} == {budget}
    budgets = [int(r["swept_budget_bytes"]) for r in rows]
    assert budgets == sorted(budgets)
    extra = [float(r["extra_time_ms"]) for r in rows]
    assert all(a >= b - 1e-9 for a, b in zip(extra, extra[1:])), extra  # more memory, no more time
    assert extra[-1] == pytest.approx(0.0, abs=1e-9)
    for r in rows:
        if budget == "activation":
            assert int(r["saved_bytes"]) <= int(r["swept_budget_bytes"])
        else:
            assert int(r["peak_bytes"]) <= int(r["swept_budget_bytes"])
    statuses = [line.split()[5] for line in stdout.splitlines() if {"optimal", "feasible"} & set(line.split())]
    assert len(statuses) == len(rows) and set(statuses) <= {"optimal", "feasible"}
    assert "gap" in stdout and "%" in stdout  # each plan's certified gap


def test_pareto_explicit_budgets(tmp_path, capsys):
    out = tmp_path / "b"
    argv = ["pareto", *TINY, "--device-spec", "cpu", "--activation-budget-gb", "0.0002,0.0001", "--out", str(out)]
    assert main(argv) == 0
    rows = _rows(out / "pareto.csv")
    assert [int(r["swept_budget_bytes"]) for r in rows] == [100_000, 200_000]
    assert all(r["budget_kind"] == "activation" and int(r["saved_bytes"]) <= int(r["swept_budget_bytes"])
               for r in rows)
    assert (out / "pareto.png").exists() and (out / "pareto.svg").exists()


def test_plan_prints_explain_table(capsys):
    assert main(["plan", *TINY, "--device-spec", "h200", "--activation-budget-gb", "0.0001"]) == 0
    out = capsys.readouterr().out
    assert "tensor" in out and "action" in out and "tag target" in out
    assert "saved for backward:" in out and "predicted step peak:" in out and "extra recompute time:" in out
    assert "recompute" in out and "H200" in out


def test_plan_summary_groups_tensors_by_producer(capsys):
    argv = ["plan", *TINY, "--device-spec", "h200", "--activation-budget-gb", "0.0001"]
    assert main([*argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert main([*argv, "--summary"]) == 0
    out = capsys.readouterr().out
    assert "producer" in out and "tensors" in out and "extra recompute time:" in out
    assert "tag target" not in out  # no per-tensor table
    assert len(out.splitlines()) < len(rows)


def _row(tensor, producer, storage, nbytes, action="save"):
    return ExplainRow(tensor=tensor, producer=producer, shape=(4,), dtype="float32", storage=storage,
                      storage_bytes=nbytes, action=action, recompute_ms=0.0, tag_target=None, reason="")


def test_summary_counts_each_storage_once():
    rows = (_row("a", "mul", "a", 64), _row("b", "expand", "a", 64), _row("c", "linear", "c", 32),
            _row("d", "mul", "d", 16, action="recompute"), _row("x", None, "x", 8, action="input"))
    explanation = Explanation(rows=rows, summary="", solver="ilp", status="optimal", gap=0.0, saved_bytes=96,
                              save_all_bytes=112, peak_bytes=0, save_all_peak_bytes=0, extra_time_s=0.0,
                              recomputed_tag_targets=("d",), cached=False)
    groups = {(g["producer"], g["action"]): (g["tensors"], g["bytes"]) for g in explanation.by_producer()}
    assert groups == {("mul", "save"): (1, 64), ("expand", "save"): (1, 0), ("linear", "save"): (1, 32),
                      ("mul", "recompute"): (1, 16)}
    assert sum(b for (_, action), (_, b) in groups.items() if action == "save") == explanation.saved_bytes


def test_plan_json(capsys):
    assert main(["plan", *TINY, "--device-spec", "a100", "--budget-gb", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["peak_bytes"] <= 10**9 and data["rows"] and data["saved_bytes"] <= data["save_all_bytes"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["pareto", *TINY, "--device-spec", "x100"], "unknown device spec 'x100'"),
        (["pareto", *TINY, "--device-spec", "h100", "--points", "1"], "--points: must be at least 2, got 1"),
        (["pareto", *TINY, "--device-spec", "h100", "--budget-gb", ""], "--budget-gb needs a comma-separated"),
        (["pareto", *TINY, "--device-spec", "h100", "--activation-budget-gb", "1,,2"], "--activation-budget-gb needs a comma-separated"),
        (["pareto", *TINY, "--device-spec", "h100", "--budget-gb", "1,-2"], "must be finite and not negative"),
        (["pareto", *TINY, "--device-spec", "h100", "--budget-gb", "1,abc"], "'abc' is not a number"),
        (["plan", *TINY, "--device-spec", "h100", "--budget-gb", "-1"], "--budget-gb: must be finite and not negative"),
        (["plan", *TINY, "--device-spec", "h100", "--activation-budget-gb", "-0.5"],
         "--activation-budget-gb: must be finite and not negative"),
        (["plan", *TINY, "--device-spec", "l40"], "unknown device spec 'l40'"),
        (["plan", *TINY], "meta graphs need --device-spec"),
        (["plan", *TINY, "--device-spec", "h100", "--budget-gb", "0.000001"],
         "--budget-gb=1e-06 is below the minimum feasible"),
        (["plan", *TINY, "--device-spec", "h100", "--world-size", "2", "--strategy", "fsdp", "--budget-gb", "0.000001"],
         "sets that floor: --collectives-in-flight 1 lowers it"),
        (["pareto", *TINY, "--device-spec", "h100", "--sweep", "peak", "--activation-budget-gb", "1"],
         "--activation-budget-gb gives activation budgets; --sweep peak contradicts it"),
    ],
    ids=["unknown-spec", "one-point", "empty-budgets", "blank-budget", "negative-budget", "nan-budget",
         "negative-budget-gb", "negative-activation", "unknown-spec-plan", "no-spec", "infeasible",
         "infeasible-fsdp-names-collectives-in-flight",
         "sweep-contradicts-budgets"],
)
def test_bad_input_gets_one_line_error(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("remat-opt: error: ") and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_helpers():
    assert resolve_device_spec("H100") == "H100-SXM" and resolve_device_spec("l40s") == "L40S"
    assert resolve_device_spec("A100-80GB") == "A100-80GB" and resolve_device_spec("cpu") == "cpu"
    assert parse_budgets_gb("60, 40,50,40") == [40.0, 50.0, 60.0]
    with pytest.raises(ValueError, match="not negative"):
        parse_budgets_gb("-1")


def test_inspect_still_works(capsys):
    assert main(["inspect", *TINY, "--top", "3"]) == 0
    assert "saved for backward:" in capsys.readouterr().out


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the CPU refusal")
def test_gpu_check_needs_cuda():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--n-layer", "2"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.startswith("needs CUDA: ")
    assert "Traceback" not in proc.stderr


def test_plan_draws_the_memory_timeline(tmp_path, capsys):
    png = tmp_path / "timeline.png"
    assert main(["plan", *TINY, "--device-spec", "h100", "--activation-budget-gb", "0.0005", "--summary",
                 "--timeline", str(png)]) == 0
    assert f"wrote {png}" in capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_an_unwritable_timeline_is_refused_before_any_work(capsys):
    assert main(["plan", "factories:raising", "--device", "cpu", "--timeline", "/proc/t.png"]) == 2
    err = capsys.readouterr().err
    assert "--timeline '/proc/t.png' is not writable" in err and err.count("\n") == 1
