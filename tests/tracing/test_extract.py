"""Joint-graph extraction: predicted saved-for-backward bytes equal measured bytes, to the byte."""

from __future__ import annotations

import functools

import networkx as nx
import pytest
import thunder
import torch
from conftest import FAMILIES, executor_list
from thunder.core.proxies import TensorProxy

import remat_opt
from remat_opt.core import graph as g
from remat_opt.models.examples import block
from remat_opt.tracing.capture import GraphCapture, analyze
from remat_opt.tracing.dry_run import Origin
from remat_opt.validation.measure import measure_saved_bytes
from remat_opt.models.by_name import ModelSpec, build_model

pytestmark = pytest.mark.slow  # Thunder compilations: minutes in all (the fast subset is -m "not slow")

EXECUTOR_KINDS = ("default", "fused")


def _model(name: str, device: str = "cpu"):
    if name == "block":
        return block(batch=2, seq=32, device=device)
    return build_model(ModelSpec(name, n_layer=1, device=device, tiny=True))


@functools.cache
def compiled(name: str, executors: str):
    """One real compilation with `GraphCapture`, its measured saved bytes and the jitted model."""
    model, inputs = _model(name)
    capture = GraphCapture()
    jitted = thunder.jit(model, transforms=[capture], executors=executor_list(executors))
    measured = measure_saved_bytes(jitted, *inputs)
    return capture, measured, jitted, inputs


# Every family with the fused SDPA (what the CPU runs and CostRemat's tests use); Thunder's default
# executors on the block and tiny Llama-2 (the other families' default compilations matched as well,
# to the byte; left out to keep the suite's time: one compilation each).
DEFAULT_EXECUTOR_NAMES = ("block", "Llama-2-7b-hf")
# Llama-3, Gemma, Phi-2 and Pythia (one compilation each) run in the extended tier (README).
CASES = [pytest.param(n, e, id=f"{n}-{e}", marks=() if n in DEFAULT_EXECUTOR_NAMES else pytest.mark.extended)
         for n in ("block", *FAMILIES) for e in EXECUTOR_KINDS if e == "fused" or n in DEFAULT_EXECUTOR_NAMES]


@pytest.mark.parametrize(("name", "executors"), CASES)
def test_predicted_saved_bytes_equal_measured(name, executors):
    capture, measured, _, _ = compiled(name, executors)
    graph = capture.graph
    assert graph.saved_activation_bytes == measured.activation_bytes
    assert graph.saved_bytes == measured.saved_bytes
    assert graph.notes == ()


@pytest.mark.parametrize(("name", "executors"), CASES)
def test_dry_run_saves_what_thunder_saves(name, executors):
    capture, measured, jitted, _ = compiled(name, executors)
    real_saved = [p for p in thunder.last_traces(jitted)[-1].bound_symbols[-1].args[1][0] if isinstance(p, TensorProxy)]
    predicted = [capture.graph.tensors[s.name] for s in capture.graph.saved]
    assert [tuple(p.shape) for p in real_saved] == [t.shape for t in predicted]
    assert [str(p.dtype) for p in real_saved] == [str(p.dtype) for p in capture.forward_trace.bound_symbols[-1].args[1][0]]
    assert len(real_saved) == measured.n_saved_tensors


def _proxy_names(trace) -> set[str]:
    names = set()

    def visit(bsyms):
        for bsym in bsyms:
            names.update(p.name for p in bsym.flat_proxy_outs)
            visit(bsym.subsymbols)

    visit(trace.bound_symbols)
    return names | {p.name for p in trace.args if hasattr(p, "name")}


@pytest.mark.parametrize(("name", "executors"), CASES)
def test_tag_targets_are_pre_autodiff_proxies(name, executors):
    capture, _, _, _ = compiled(name, executors)
    names = _proxy_names(capture.computation_trace)
    taggable = [s for s in capture.graph.saved if s.taggable]
    assert taggable, "a transformer block must have recomputable activations"
    assert all(s.tag_target in names for s in taggable)
    for s in capture.graph.saved:
        assert s.taggable == (s.reason in ("activation", g.REASON_AUXILIARY))


def _traces_text(jitted) -> tuple[str, str]:
    strip = lambda trace: str(trace).split("\n", 1)[1]  # noqa: E731  (drop the "took N ms" header)
    return strip(thunder.last_traces(jitted)[-1]), strip(thunder.last_backward_traces(jitted)[-1])


@pytest.mark.parametrize("name", ["block", "Llama-2-7b-hf"])
def test_analysis_leaves_the_real_compilation_unchanged(name):
    _, _, with_capture, inputs = compiled(name, "fused")
    model, _ = _model(name)
    plain = thunder.jit(model, executors=executor_list("fused"))
    plain(*inputs)
    assert _traces_text(with_capture) == _traces_text(plain)


def _all_tags(trace):
    def visit(bsyms):
        for bsym in bsyms:
            yield from bsym.tags
            for p in (*bsym.flat_proxy_args, *bsym.flat_proxy_outs):
                yield from p.tags
            yield from visit(bsym.subsymbols)

    return list(visit(trace.bound_symbols))


def test_no_origin_markers_leak_into_thunder_traces():
    capture, _, jitted, _ = compiled("Llama-2-7b-hf", "fused")
    traces = [*thunder.last_traces(jitted), *thunder.last_backward_traces(jitted), capture.computation_trace]
    assert not [t for trace in traces for t in _all_tags(trace) if isinstance(t, Origin)]


def test_gradients_unchanged_by_analysis():
    # The shared compiled model is only read here: a fresh input, its gradients cleared before and
    # after, so no other test sees (or leaves) accumulated gradients, whatever the order.
    captured_model = compiled("block", "fused")[2]
    model, (x,) = _model("block")  # seeded: the same weights and input as the compiled block's
    x_captured = x.detach().clone().requires_grad_(True)
    params = list(captured_model.parameters())
    for p in params:
        p.grad = None
    try:
        captured_model(x_captured).sum().backward()
        model(x).sum().backward()
        for (name, p), (_, q) in zip(model.named_parameters(), captured_model.named_parameters(), strict=True):
            torch.testing.assert_close(q.grad, p.grad, msg=name)
        torch.testing.assert_close(x_captured.grad, x.grad)
    finally:
        for p in params:
            p.grad = None


def test_fused_sdpa_logsumexp_is_an_auxiliary_output():
    capture, _, _, _ = compiled("block", "fused")
    graph = capture.graph
    aux = [s for s in graph.saved if s.reason == g.REASON_AUXILIARY and graph.producers[s.name].symbol == "remat_sdpa_cpu_fwd"]
    assert len(aux) == 1
    (lse,) = aux
    assert graph.tensors[lse.name].dtype == "float32" and len(graph.tensors[lse.name].shape) == 3
    assert lse.origin_symbol == "scaled_dot_product_attention"
    sdpa_out = [s for s in graph.saved if graph.producers.get(s.name) and graph.producers[s.name].symbol == "remat_sdpa_cpu_fwd" and s is not lse]
    assert [s.tag_target for s in sdpa_out] == [lse.tag_target]


def test_decomposed_sdpa_saves_attention_matrix_and_fused_does_not():
    seq = 32
    for executors, expect in (("default", True), ("fused", False)):
        graph = compiled("block", executors)[0].graph
        shapes = {graph.tensors[n].shape[-2:] for n in graph.saved_names}
        assert ((seq, seq) in shapes) is expect, executors


class DropoutMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x):
        return self.fc2(torch.nn.functional.dropout(torch.relu(self.fc1(x)), p=0.25, training=True))


def test_random_ops_are_never_taggable():
    graph = analyze(DropoutMLP(), torch.randn(4, 16, requires_grad=True))
    random = [s for s in graph.saved if s.reason == g.REASON_RANDOM]
    # the dropout output (input of fc2) is saved; tagging it would re-run the whole dropout
    assert [(s.origin_symbol, s.taggable) for s in random] == [("dropout", False)]
    assert graph.tensors[random[0].name].shape == (4, 32)


def test_graph_structure():
    graph = compiled("Llama-3-8B", "fused")[0].graph
    assert nx.is_directed_acyclic_graph(graph.nx)
    for s in graph.saved:
        if s.name in graph.input_names:
            continue
        assert not graph.producers[s.name].is_backward
        assert any(op.is_backward for op in graph.consumers[s.name])
    views = [t for t in graph.tensors.values() if t.storage != t.name and t.kind != "internal"]
    assert views, "litgpt's qkv split, reshapes and transposes are views"
    assert all(graph.tensors[t.storage].storage == t.storage for t in views)


def test_meta_device_7b_layer_has_no_attention_matrix_saved():
    seq = 512
    model, inputs = build_model(ModelSpec("Llama-2-7b-hf", n_layer=1, seq=seq, dtype="bfloat16", device="meta"))
    graph = analyze(model, *inputs, executors=executor_list("fused"))
    assert not [n for n in graph.saved_names if graph.tensors[n].shape[-2:] == (seq, seq)]
    assert graph.notes == ()
    hidden = 1 * seq * 4096 * 2
    assert graph.saved_activation_bytes > 10 * hidden  # qkv, MLP, norms of a real 7B layer


def test_analyze_reports_a_failing_forward_in_one_line():
    class Broken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.fc(x) @ torch.ones(3, 3)

    from remat_opt.tracing.capture import ModelTraceError

    with pytest.raises(ModelTraceError, match="tracing Broken failed"):
        analyze(Broken(), torch.randn(2, 8))


def test_offline_plan_and_pareto_on_the_graph():
    graph = compiled("Llama-2-7b-hf", "fused")[0].graph
    half = graph.saved_activation_bytes // 2
    plan = remat_opt.plan_graph(graph, activation_budget_gb=half / 1e9, device_spec="cpu")
    assert plan.saved_bytes <= half and plan.recomputed_tag_targets
    points = remat_opt.pareto_curve(graph, 4, device_spec="cpu")
    assert len(points) == 4
    assert points[-1].saved_bytes == graph.saved_activation_bytes and points[-1].extra_time_s == 0
    assert [p.extra_time_s for p in points] == sorted((p.extra_time_s for p in points), reverse=True)
    with pytest.raises(ValueError, match="n_points must be at least 2"):
        remat_opt.pareto_curve(graph, 1, device_spec="cpu")


def test_thunderfx_graph_of_a_block_is_the_one_its_compilation_saves_from():
    from thunder.dynamo import ThunderCompiler

    from remat_opt.tracing.capture import ModelTraceError, analyze_thunderfx

    model, (x,) = block(batch=2, seq=32)
    graph = analyze_thunderfx(model, x, executors=executor_list("fused"))
    real = torch._dynamo.optimize(backend=ThunderCompiler(executors=executor_list("fused")))(model)
    measured = measure_saved_bytes(real, x)
    torch._dynamo.reset()
    assert graph.saved_activation_bytes == measured.activation_bytes
    with pytest.raises(ModelTraceError, match="ThunderFX tracing of Linear failed"):
        analyze_thunderfx(torch.nn.Linear(4, 4).requires_grad_(False), torch.zeros(2, 4))


class _DryRunTwice(thunder.core.transform_common.Transform):
    """In the pre-prologue hook: the joint graph of each executor list from a dry run that reuses the
    autodiff of the dry run before (`dry_run._JOINT`), and from one that redoes it; also with a tag."""

    def __init__(self):
        self.graphs = []

    def transform_traces_pre_prologue(self, prologue_trace, computation_trace, epilogue_trace, **kwargs):
        from thunder.extend import FusionExecutor

        from remat_opt.tracing import dry_run as dr
        from remat_opt.tracing.extract import build_joint_graph
        from remat_opt.transform.tags import tagged_dry_run

        fused = kwargs["executors_list"]
        unfused = [ex for ex in fused if not isinstance(ex, FusionExecutor)]
        self.executor_lists = [unfused, fused, unfused]

        def graph(executors_list, fresh: bool):
            if fresh:
                dr._JOINT._latest = None
            names = tuple(ex.name for ex in executors_list)
            return build_joint_graph(*dr.dry_run(computation_trace, executors_list), names)

        for executors_list in self.executor_lists:
            self.graphs.append((graph(executors_list, fresh=False), graph(executors_list, fresh=True)))
        first = self.graphs[0][0]
        target = next(s.tag_target for s in first.saved if s.taggable)
        names = tuple(ex.name for ex in self.executor_lists[0])
        tagged = tagged_dry_run(computation_trace, self.executor_lists[0], names, (target,))
        self.graphs.append((tagged, graph(self.executor_lists[0], fresh=False)))
        return prologue_trace, computation_trace, epilogue_trace


def test_a_dry_run_reusing_the_autodiff_gives_the_graph_of_a_fresh_one():
    """CostRemat's two untagged dry runs (with and without the fusion executor) share one autodiff:
    each graph equals a fresh dry run's, to every op, tensor and origin, and a dry run with a tag
    does not reuse the untagged autodiff (nor leave it in place for the next)."""
    model, inputs = _model("block")
    probe = _DryRunTwice()
    thunder.jit(model, transforms=[probe], executors=executor_list("nvfuser-standin"))(*inputs)
    for reused, fresh in probe.graphs[:3]:
        assert reused == fresh
    assert any("fusion" in op.op_tags for op in probe.graphs[1][0].ops)
    tagged, untagged = probe.graphs[3]
    assert tagged.saved_names != untagged.saved_names
    assert untagged == probe.graphs[0][0]


def test_waits_are_sorted_only_where_a_distributed_prim_is():
    """The dry run skips claiming ops for Thunder's wait sorting when no bound symbol, at any depth,
    is a distributed prim (a wait is one, however deep an executor's decomposition puts it)."""
    from types import SimpleNamespace as Bsym

    from thunder.core.prims import PrimIDs as Prims
    from thunder.distributed.prims import PrimIDs

    from remat_opt.tracing.dry_run import _has_distributed_prims

    def bsym(sym_id, *subsymbols):
        return Bsym(sym=Bsym(id=sym_id), subsymbols=list(subsymbols))

    assert not _has_distributed_prims([bsym(Prims.ADD, bsym(Prims.MUL)), bsym("torch.nn.functional.linear")])
    assert _has_distributed_prims([bsym(Prims.ADD), bsym("synchronize", bsym(Prims.MUL, bsym(PrimIDs.WAIT)))])
