"""Fusion regions as their executor built them at compile time (`RegionCall`): kept beside a joint
graph, outside it, so that the profiler can time regions whole (`remat_opt.costing.profiling`) while
the data model stays free of Thunder's callables (a graph can be pickled, deepened or compared)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

from remat_opt import _compat  # noqa: F401  (before thunder)
from thunder.core.proxies import NumberProxy  # noqa: E402
from thunder.core.symbol import BoundSymbol  # noqa: E402

from remat_opt.core import graph as g  # noqa: E402
from remat_opt.tracing.dry_run import GRAPH_TENSORS  # noqa: E402


@dataclass(frozen=True, slots=True)
class TensorArg:
    """An argument of a `RegionCall` that is a tensor of the graph, by name."""

    name: str


@dataclass(frozen=True, slots=True)
class RegionCall:
    """One fusion region as its executor built it at compile time: the callable the executed trace
    calls (``TorchCompileN``: the torch.compile'd region; ``nvFusionN``: nvFuser's fusion
    definition, or the stand-in's region) and its arguments in order, graph tensors as `TensorArg`
    and any other value as it is. The data model cannot rebuild a region (its members are prims
    whose permutations, lists and pad widths the graph does not keep), so the profiler runs this."""

    fn: Callable
    arguments: tuple


# id(graph) -> op name -> RegionCall, for the graphs `build_joint_graph` made in this process; an
# entry leaves with its graph. A side table keeps the data model free of Thunder's callables (a
# graph can be pickled, deepened or compared).
_REGION_CALLS: dict[int, dict[str, RegionCall]] = {}


def region_calls(graph: g.JointGraph) -> dict[str, RegionCall]:
    """Op name -> `RegionCall` of each fusion region of `graph`; empty for a graph `build_joint_graph`
    did not make in this process (loaded from the graph cache, deepened, recorded elsewhere)."""
    return _REGION_CALLS.get(id(graph), {})


def _region_argument(value):
    if isinstance(value, GRAPH_TENSORS):
        return TensorArg(value.name)
    return value.value if isinstance(value, NumberProxy) else value


def register_region_calls(graph: g.JointGraph, ops: list[tuple[BoundSymbol, g.OpNode]]) -> None:
    calls = {}
    for bsym, op in ops:
        fn = (getattr(bsym, "_call_ctx", None) or {}).get(bsym.sym.name) if bsym.sym.is_fusion else None
        if fn is not None:
            calls[op.name] = RegionCall(fn=fn, arguments=tuple(_region_argument(a) for a in bsym.args))
    if calls:
        _REGION_CALLS[id(graph)] = calls
        weakref.finalize(graph, _REGION_CALLS.pop, id(graph), None)
