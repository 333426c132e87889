"""CostRemat under ThunderFX (``thunder.dynamo``): Dynamo may split a model into several Thunder
subgraphs, which share one budget, planned in the order they first run."""

from __future__ import annotations

from dataclasses import replace

from remat_opt import _compat  # noqa: F401  (before thunder)
import torch  # noqa: E402

from remat_opt.core.errors import InfeasibleBudgetError  # noqa: E402
from remat_opt.planning.planner import PlanRequest, plan_step  # noqa: E402


def least_bytes(graph, request: PlanRequest, name: str) -> int:
    """The smallest budget `name` any plan of `graph` meets on its own."""
    try:
        plan = plan_step(graph, replace(request, **{name: 0})).plan
    except InfeasibleBudgetError as e:
        return e.minimum
    return plan.peak_bytes if name == "peak_budget_bytes" else plan.saved_bytes


def carried_activation_bytes(subgraph, graph) -> int:
    """Bytes of the inputs of a ThunderFX subgraph that it saves and that are activations of the
    model (computed by an earlier subgraph: Dynamo's example value has a ``grad_fn``); the plan
    counts them as inputs, but without this subgraph they would be freed after the forward."""
    carried = set()
    for node in subgraph.graph.nodes:
        example = getattr(node.meta.get("grapharg"), "example", None) if node.op == "placeholder" else None
        if isinstance(example, torch.Tensor) and example.grad_fn is not None:
            carried.add(node.name)
    return graph.storage_bytes([n for n in graph.saved_names if n in carried])


def thunderfx_subgraph():
    """The fx GraphModule being compiled when ThunderFX (``thunder.dynamo``) compiles one of its
    subgraphs, else None."""
    from thunder.core.compile_data import get_compile_data

    fn = getattr(get_compile_data(), "fn", None)
    return fn if isinstance(fn, torch.fx.GraphModule) else None
