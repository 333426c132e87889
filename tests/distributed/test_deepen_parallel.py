"""Extending one rank's graph under Thunder's FSDP or DDP (`remat_opt.core.deepen`) gives the graph a
direct trace of that depth gives: a layer's all-gathers, reductions and waits, which Thunder places
outside the repeated blocks, are copied with it."""

from __future__ import annotations

from collections import Counter

import pytest

import remat_opt
from remat_opt.distributed.data_parallel import DataParallel
from remat_opt.validation.graph_diff import structural_differences
from remat_opt.models.graphs import analyze_spec
from remat_opt.models.by_name import ModelSpec
from remat_opt.core.simulation import simulate_peak_bytes
from remat_opt.solvers import ILPOptions

pytestmark = [pytest.mark.slow,  # Thunder compilations: minutes in all (the fast subset is -m "not slow")
              pytest.mark.extended]  # two minutes of FSDP/DDP traces: out of the README's test command

# id: (strategy, executors, traced layers, depth). The nvFuser stand-in (the default on meta) needs 4
# traced layers: its regions span layer boundaries, and a layer's first norm weight is gathered with
# the layer before it; two extra layers check that the copies hand those on. Thunder's executors
# (fused SDPA) need 3. FSDP with them (3 -> 4, 4 -> 6, the 70B what-if's executors) matched too; left
# out to keep the suite's time: these traces are its longest. DDP with the stand-in in float32 cannot
# be extended (the stand-in fuses DDP's forward copies of every weight into one region; in bfloat16 it
# extends): `benchmarks/deepen_check.py --tiny --seq 32 --layers 5 --strategy ddp --dtype float32
# --no-write` prints the CLI's one-line error (a 4-layer trace: 30 s, out of the suite's time).
# The FSDP case runs in bfloat16, what a GPU trains in: there the stand-in broadcasts each norm weight
# right after its all-gather, and the backward's blocks start mid-layer, so a weight's gather feeds
# the forward block of its layer and the backward block labelled one layer lower (lag -1; float32
# extended before that was handled, bfloat16 did not, at 8 ranks as at 70B width).
CASES = {
    "fsdp-nvfuser-standin-4to6": ("fsdp", "nvfuser-standin", 4, 6, "bfloat16"),
    "ddp-fused-sdpa-3to4": ("ddp", "fused-sdpa", 3, 4, "float32"),
}
WORLD_SIZE = 2


def _spec(depth: int, dtype: str) -> ModelSpec:
    return ModelSpec("Llama-2-7b-hf", n_layer=depth, seq=32, dtype=dtype, device="meta", tiny=True)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    """(extended graph, direct trace, traced graph, the case) of one `CASES` entry."""
    strategy, executors, traced, depth, dtype = CASES[request.param]
    parallel = DataParallel(strategy, WORLD_SIZE)
    extended = analyze_spec(_spec(depth, dtype), traced_layers=traced, executors=executors, parallel=parallel)
    direct = analyze_spec(_spec(depth, dtype), traced_layers=0, executors=executors, parallel=parallel)
    shallow = analyze_spec(_spec(traced, dtype), traced_layers=0, executors=executors, parallel=parallel)  # cached
    return extended, direct, shallow, CASES[request.param]


def _collectives(graph) -> Counter:
    return Counter(op.symbol for op in graph.ops if "collective" in op.op_tags)


def test_extended_graph_notes_say_it_was_traced_shallower(case):
    extended, _, _, (_, _, traced, depth, _) = case
    assert f"Llama-2-7b-hf: traced {traced} of {depth} layers" in " ".join(extended.notes)
    assert any(f"extended from {traced} traced layers to {depth} " in note for note in extended.notes)


def test_extended_graph_is_the_direct_trace_up_to_names(case):
    extended, direct, _, _ = case
    assert structural_differences(extended, direct) == []


def test_extended_graph_has_the_direct_traces_collectives(case):
    extended, direct, shallow, (strategy, *_) = case
    expected = {"fsdp": {"torch_all_gather_prim_impl", "torch_reduce_scatter_prim_impl", "torch_wait_prim_impl"},
                "ddp": {"torch_all_reduce_prim_impl", "torch_wait_prim_impl"}}[strategy]
    assert set(_collectives(direct)) == expected
    assert _collectives(extended) == _collectives(direct)
    # the copies brought their layer's collectives: the shallow trace has fewer of each
    assert all(_collectives(shallow)[symbol] < count for symbol, count in _collectives(direct).items())


def test_extended_graph_predicts_the_direct_traces_memory(case):
    extended, direct, _, _ = case
    assert extended.saved_activation_bytes == direct.saved_activation_bytes
    assert simulate_peak_bytes(extended) == simulate_peak_bytes(direct)


def test_extended_graph_plans_like_the_direct_trace_under_a_forcing_budget(case):
    extended, direct, _, _ = case
    # 3 saved-bytes budgets: the least feasible, midway to save-all, save-all. (Step-peak budgets
    # leave the ILP at its time limit here, and under DDP the backward's gradients set the peak
    # whatever is saved.)
    points = [remat_opt.pareto_curve(graph, 3, device_spec="H100") for graph in (extended, direct)]
    # The ILP prices ops in quanta of time_quantum_s: equally optimal plans may differ by that per op.
    resolution_s = ILPOptions().time_quantum_s * len(direct.forward_ops)
    assert [p.swept_budget_bytes for p in points[0]] == [p.swept_budget_bytes for p in points[1]]
    middle = points[1][1]
    assert middle.swept_budget_bytes < points[1][2].swept_budget_bytes and middle.extra_time_s > resolution_s  # it recomputes
    for a, b in zip(*points):
        assert (a.plan.status, b.plan.status) == ("optimal", "optimal")
        assert a.extra_time_s == pytest.approx(b.extra_time_s, rel=0, abs=resolution_s)
        assert max(a.saved_bytes, b.saved_bytes) <= a.swept_budget_bytes
