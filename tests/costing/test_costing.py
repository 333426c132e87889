"""Which spec sheet a graph is costed for when none is named (`remat_opt.costing.graph_costs.resolve_device_spec`)."""

from dataclasses import replace

import pytest
import torch
from synthetic import chain_graph

from costmodels.devices import GPU_SPECS, NOMINAL_CPU
from remat_opt.costing.graph_costs import CostModel
from remat_opt.analysis.offline import plan_graph


def _on(graph, device: str):
    return replace(graph, tensors={n: replace(t, device=device) for n, t in graph.tensors.items()})


@pytest.mark.parametrize(
    ("cuda_name", "spec"),
    [("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA H200", "H200"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
     ("NVIDIA L40S", "L40S")],
    ids=["h100", "h200", "a100", "l40s"],
)
def test_a_cuda_graph_is_costed_for_its_gpu(monkeypatch, cuda_name, spec):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: asked.append(device) or cuda_name)
    graph = _on(chain_graph(4), "cuda:1")
    assert CostModel(graph).device_spec is GPU_SPECS[spec]
    assert asked == [torch.device("cuda:1")]  # the graph's own device, not device 0


def test_an_unknown_gpu_gets_a_message_naming_the_choices(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GeForce RTX 4090")
    graph = _on(chain_graph(4), "cuda:0")
    with pytest.raises(ValueError, match="'NVIDIA GeForce RTX 4090', which has no spec sheet: pass device_spec= one of "
                                         "H100-SXM, H200, A100-80GB, L40S"):  # fmt: skip
        plan_graph(graph, activation_budget_gb=1.0)
    assert CostModel(graph, "H100").device_spec is GPU_SPECS["H100-SXM"]  # naming one works


def test_a_cuda_graph_without_a_gpu_here_needs_a_named_spec(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="no CUDA device here says which GPU: pass device_spec= one of H100-SXM"):
        CostModel(_on(chain_graph(4), "cuda:0"))


def test_cpu_and_meta_graphs():
    assert CostModel(chain_graph(4)).device_spec is NOMINAL_CPU
    with pytest.raises(ValueError, match="the graph is on 'meta': name the device spec to cost for"):
        CostModel(_on(chain_graph(4), "meta"))
