"""cost_table="auto": profiled at the first compilation, cached on disk, rebuilt when it cannot be trusted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from remat_opt import _compat  # noqa: F401
import thunder  # noqa: E402

from remat_opt import CostRemat, explain  # noqa: E402
from remat_opt.costing.cost_cache import ENV_VAR, auto_cost_table, table_path  # noqa: E402
from remat_opt.models.examples import block  # noqa: E402
from remat_opt.tracing.capture import analyze  # noqa: E402

pytestmark = pytest.mark.slow  # Thunder compilations: minutes in all (the fast subset is -m "not slow")

BUDGET_GB = 50e3 / 1e9  # forces recomputation in the block (save-all: 434 kB)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    return tmp_path


def _compile_and_explain(model, x):
    jitted = thunder.jit(model, transforms=[CostRemat(activation_budget_gb=BUDGET_GB, cost_table="auto")])
    jitted(x).sum().backward()
    return explain(jitted)


def _note(explanation) -> str:
    return next(n for n in explanation.notes if n.startswith("cost_table='auto'"))


def test_first_compile_profiles_then_the_cache_serves_this_and_another_process(cache):
    model, (x,) = block(batch=2, seq=16)
    explanation = _compile_and_explain(model, x)
    first = _note(explanation)
    assert " 0 forward ops from the cache" in first and " 0 timed now" not in first
    recomputed = [r for r in explanation.rows if r.action == "recompute"]
    assert recomputed and all("measured" in r.cost_source for r in recomputed)  # explain says where costs came from
    assert "(measured" in str(explanation)
    assert table_path("cpu").exists() and table_path("cpu").parent == cache
    second = _note(_compile_and_explain(model, x))
    assert " 0 timed now in 0.0 s" in second and " 0 forward ops from the cache" not in second
    script = (
        "from remat_opt import CostRemat, explain; import thunder; from remat_opt.models.examples import block;"
        "m, (x,) = block(batch=2, seq=16); j = thunder.jit(m, transforms=[CostRemat(activation_budget_gb="
        f"{BUDGET_GB}, cost_table='auto')]); j(x).sum().backward();"
        "print([n for n in explain(j).notes if n.startswith(\"cost_table='auto'\")][0])"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, ENV_VAR: str(cache)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert " 0 timed now in 0.0 s" in out.stdout


@pytest.mark.extended  # a profiling compile of its own (README: the extended tier)
def test_a_corrupt_or_foreign_cache_file_is_rebuilt_with_a_warning(cache):
    model, (x,) = block(batch=2, seq=16)
    graph = analyze(model, x)
    auto_cost_table(graph)
    path = table_path("cpu")
    data = json.loads(path.read_text())
    path.write_text(path.read_text()[:100])  # truncated
    with pytest.warns(UserWarning, match="rebuilding it"):
        assert auto_cost_table(graph).timed_ops > 0
    path.write_text(json.dumps({**data, "device": "cpu: another machine (64 cores visible)"}))
    with pytest.warns(UserWarning, match="measured on 'cpu: another machine.*rebuilding it"):
        rebuilt = auto_cost_table(graph)
    assert rebuilt.timed_ops > 0 and rebuilt.table.device != data["device"] + "x"
    assert json.loads(path.read_text())["device"] == data["device"]


def test_meta_graphs_keep_formula_costs(cache):
    with torch.device("meta"):
        model, (x,) = block(batch=2, seq=16, device="meta")
    costs = auto_cost_table(analyze(model, x))
    assert costs.table is None and "formulas" in costs.note() and not list(cache.iterdir())


def test_the_cache_file_names_the_timing_method(cache):
    # tables timed alone in a loop (the earlier default) measured other times: never mixed in
    assert table_path("cpu").parent == cache and "in-order" in table_path("cpu").name
