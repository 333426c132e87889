"""Coverage of the formulas and runners on the traces of every model family, planned on meta.

One Thunder analysis per (family, executors), shared by the tests through a module-scoped cache
(~6 s each). The full matrix (every family, both executor lists, cpu and meta) is printed by
``benchmarks/cost_coverage.py``; CPU and decomposed-SDPA traces are covered in
``test_costmodels_profile.py``.
"""

from __future__ import annotations

import remat_opt
from remat_opt import _compat  # noqa: F401  (applies the torch compatibility step before thunder)

import math

import pytest
import thunder

from remat_opt.models.examples import block
from remat_opt.tracing.capture import analyze
from remat_opt.models.by_name import ModelSpec, build_model

from remat_opt.costing.graph_costs import CostModel, coverage_report
from remat_opt.costing.profiling import replay

pytestmark = pytest.mark.slow  # Thunder compilations: minutes in all (the fast subset is -m "not slow")

LITGPT_FAMILIES = ("Llama-2-7b-hf", "Llama-3-8B", "gemma-2b", "phi-2", "pythia-14m", "Mistral-7B-v0.1")
FAMILIES = (*LITGPT_FAMILIES, "block")
# The other families (one meta trace each) run in the extended tier (README).
EVERY_SUITE = ("Llama-2-7b-hf", "block")
FAMILY_PARAMS = [pytest.param(f, marks=() if f in EVERY_SUITE else pytest.mark.extended) for f in FAMILIES]


def build_graph(family: str, executors: str, device: str):
    """Joint graph of a tiny one-layer model of `family` (``"block"``: the hand-written block)."""
    if family == "block":
        model, inputs = block(device=device)
    else:
        model, inputs = build_model(ModelSpec(family, n_layer=1, device=device, tiny=True))
    executor_list = None if executors == "default" else [remat_opt.sdpa_cpu_ex, *thunder.get_default_executors()]
    return analyze(model, *inputs, executors=executor_list)


@pytest.fixture(scope="module")
def meta_graph():
    cache = {}

    def get(family: str, executors: str = "fused"):
        if (family, executors) not in cache:
            cache[family, executors] = build_graph(family, executors, "meta")
        return cache[family, executors]

    return get


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_no_op_falls_back_with_fused_sdpa_on_meta(meta_graph, family):
    report = coverage_report(meta_graph(family))
    assert report.ok, report.format()


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_runners_reproduce_every_op_on_meta(meta_graph, family):
    result = replay(meta_graph(family), "meta", time_ops=False)
    assert result.problems == []
    assert result.skipped == {}


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_every_op_gets_a_positive_h100_time(meta_graph, family):
    costs = CostModel(meta_graph(family), "H100")
    times = [costs.op_cost(op).time_s for op in meta_graph(family).ops]
    assert all(math.isfinite(t) and t >= 0 for t in times)
    assert costs.total_time_s() > 0


def test_fused_sdpa_is_in_the_traces_that_allow_it(meta_graph):
    symbols = {op.symbol for op in meta_graph("Llama-3-8B").ops}
    assert {"remat_sdpa_cpu_fwd", "remat_sdpa_cpu_bwd"} <= symbols
    # Mistral's sliding-window mask makes the executor decline: SDPA stays decomposed.
    assert "remat_sdpa_cpu_fwd" not in {op.symbol for op in meta_graph("Mistral-7B-v0.1").ops}
