"""Global min-cut (a networkx graph, OR-Tools' max flow): least saved bytes plus recompute time
priced in bytes (Lagrangian).

The cut graph (node names from `cut_node`): ``source`` is what the forward computed, ``sink`` is
what the backward reads; nodes on the sink side are recomputed.

* each forward tensor t is split into ``t:in -> t:out`` with capacity = bytes of its storage
  (0 for views of inputs): cutting it means saving t;
* each allowed unit U (tag target) has ``source -> unit:U`` of capacity ``weight * time(U)``:
  U on the sink side means U is tagged, paying its time priced at `weight` bytes per second;
* infinite edges, each with a ``reason``: ``t:out -> sink`` (the backward reads t);
  ``op:o -> unit:U`` for o in U (a tagged unit re-runs all its ops); ``unit:U -> op:o`` for the
  smallest unit U of o (a re-run op is paid for); ``x:out -> op:o`` (re-running o reads x);
  ``op:o <-> y:in`` (a re-run op rewrites its outputs, and only a re-run op does);
  ``source -> y:in`` for outputs of ops no allowed unit re-runs.

Sweeping the weight from ~0 (least saved bytes) to large (save everything) traces a Pareto front
of (saved bytes, recompute time); with a budget, the least-time plan of the sweep that meets it is
returned (exactly evaluated: saved bytes by storage, simulated peak). The cut over-prices views
aliasing one storage and units whose ops are not all needed; the exact evaluation corrects both.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import networkx as nx
import numpy as np
from ortools.graph.python import max_flow

from remat_opt.core.plan import RematPlan

from remat_opt.core.problem import RecomputeProblem
from remat_opt.solvers._common import Budgets, InfeasibleBudgetError, checked, evaluate_units
from remat_opt.solvers.blocks import Ties, choose_ties

SOURCE, SINK = "source", "sink"


@dataclass(frozen=True, slots=True)
class MinCutOptions:
    """Options of `solve_mincut`.

    Attributes:
        weight_bytes_per_s: price of one second of recompute, in bytes. None: with a budget,
            sweep; without, `default_weight` (the forward's bytes written per second).
        n_weights: weights in a sweep (geometric grid, see `weight_grid`).
        refine_steps: bisection steps between the best feasible weight and the next one.
        tie_blocks: contract repeated blocks into one (True, False, None: when at least
            `min_tied_blocks` repeat); merging nodes restricts the cut to block-uniform plans.
        min_tied_blocks: fewest repetitions for automatic tying.
    """

    weight_bytes_per_s: float | None = None
    n_weights: int = 12
    refine_steps: int = 4
    tie_blocks: bool | None = None
    min_tied_blocks: int = 4


def cut_node(name: str, side: str | None = None) -> str:
    """Node name: ``f"{tensor}:in"``/``f"{tensor}:out"``, ``f"op:{op}"`` (side ``"op"``) or
    ``f"unit:{unit}"`` (no side)."""
    if side is None:
        return f"unit:{name}"
    return f"op:{name}" if side == "op" else f"{name}:{side}"


def _add_edge(g: nx.DiGraph, u: str, v: str, *, capacity: int | None = None, reason: str | None = None) -> None:
    """Adds an edge (capacity None: infinite, with a `reason`); parallel finite edges add up."""
    if u == v:
        return
    if g.has_edge(u, v):
        data = g.edges[u, v]
        if capacity is None:
            data.pop("capacity", None)
            data.setdefault("reason", reason)
        elif "capacity" in data:
            data["capacity"] += capacity
        return
    if capacity is None:
        g.add_edge(u, v, reason=reason)
    else:
        g.add_edge(u, v, capacity=capacity)


def build_cut_graph(problem: RecomputeProblem, weight_bytes_per_s: float, ties: Ties = Ties()) -> nx.DiGraph:
    """The flow network described in the module docstring; tied names share one node.

    Each ``source -> unit:U`` edge also carries ``seconds`` (U's recompute time), so `set_weight`
    can re-price the same graph.
    """
    tensor, op_node = (lambda t: ties.of("tensor", t)), (lambda o: cut_node(ties.of("op", o), "op"))
    g = nx.DiGraph()
    g.add_nodes_from((SOURCE, SINK))
    for t in problem.forward_tensors:
        storage = problem.storage_of(t)
        capacity = problem.storage_bytes(storage) if storage else 0
        _add_edge(g, cut_node(tensor(t), "in"), cut_node(tensor(t), "out"), capacity=capacity)
    for t in problem.needed_by_backward:
        _add_edge(g, cut_node(tensor(t), "out"), SINK, reason=f"the backward reads {t}")
    for op in problem.graph.forward_ops:
        units = problem.units_of_op.get(op.name, ())
        for y in op.outputs:
            if not units:
                reason = f"no allowed tag target re-runs {op.name}"
                _add_edge(g, SOURCE, cut_node(tensor(y), "in"), reason=reason)
                continue
            _add_edge(g, op_node(op.name), cut_node(tensor(y), "in"), reason=f"re-running {op.name} rewrites {y}")
            _add_edge(g, cut_node(tensor(y), "in"), op_node(op.name), reason=f"only re-running {op.name} rewrites {y}")
        for x in op.inputs if units else ():
            if x in problem.graph.producers:
                _add_edge(g, cut_node(tensor(x), "out"), op_node(op.name), reason=f"re-running {op.name} reads {x}")
        for name in units:
            _add_edge(g, op_node(op.name), cut_node(ties.of("unit", name)), reason=f"tagging {name} re-runs {op.name}")
        if units:
            paid = f"re-running {op.name} tags {units[0]}"
            _add_edge(g, cut_node(ties.of("unit", units[0])), op_node(op.name), reason=paid)
    for name in problem.allowed_units:
        node = cut_node(ties.of("unit", name))
        _add_edge(g, SOURCE, node, capacity=0)
        g.edges[SOURCE, node]["seconds"] = g.edges[SOURCE, node].get("seconds", 0.0) + problem.units[name].time_s
    set_weight(g, weight_bytes_per_s)
    return g


def set_weight(g: nx.DiGraph, weight_bytes_per_s: float) -> None:
    """Prices recompute at `weight_bytes_per_s`: ``source -> U`` capacity = weight * seconds."""
    for _, _, data in g.out_edges(SOURCE, data=True):
        if "seconds" in data:
            data["capacity"] = round(weight_bytes_per_s * data["seconds"])


def _infinite_path(g: nx.DiGraph) -> str:
    infinite = g.edge_subgraph((u, v) for u, v, d in g.edges(data=True) if "capacity" not in d)
    path = nx.shortest_path(infinite, SOURCE, SINK)
    return " -> ".join(f"{u}->{v} ({g.edges[u, v]['reason']})" for u, v in zip(path, path[1:]))


def mincut_units(
    problem: RecomputeProblem, weight_bytes_per_s: float, ties: Ties = Ties(), graph: nx.DiGraph | None = None
) -> tuple[str, ...]:
    """Units on the sink side of a minimum cut at one weight (the units to recompute).

    Args:
        problem: the recompute problem.
        weight_bytes_per_s: price of a second of recompute, in bytes.
        ties: names sharing one node.
        graph: a graph from `build_cut_graph` with the same ties, re-priced in place.
    """
    g = graph if graph is not None else build_cut_graph(problem, weight_bytes_per_s, ties)
    set_weight(g, weight_bytes_per_s)
    sink_side = _sink_side(g)
    return tuple(u for u in problem.allowed_units if cut_node(ties.of("unit", u)) in sink_side)


def _sink_side(g: nx.DiGraph) -> set[str]:
    """The sink side of the minimum cut whose sink side is least (the nodes that reach the sink in
    the residual graph of a maximum flow: the same for every maximum flow, and the side
    `networkx.minimum_cut` returns), by OR-Tools' max flow on int64 capacities.

    Saving every tensor is a cut of at most ``total`` (the tensor edges' bytes), so an edge above
    that is never cut by a minimum cut: capping the infinite edges and the recompute prices at
    ``total + 1`` changes no minimum cut (and keeps every sum within int64).

    Raises:
        ValueError: an infinite path joins source and sink (no finite cut).
    """
    total = sum(d["capacity"] for _, _, d in g.edges(data=True) if "capacity" in d and "seconds" not in d)
    cap = total + 1
    index = {node: i for i, node in enumerate(g)}
    tails, heads, capacities = [], [], []
    for u, v, d in g.edges(data=True):
        tails.append(index[u])
        heads.append(index[v])
        capacities.append(min(d.get("capacity", cap), cap))
    flow = max_flow.SimpleMaxFlow()
    flow.add_arcs_with_capacity(np.array(tails, dtype=np.int32), np.array(heads, dtype=np.int32),
                                np.array(capacities, dtype=np.int64))
    status = flow.solve(index[SOURCE], index[SINK])
    if status != flow.OPTIMAL:
        raise RuntimeError(f"min-cut: OR-Tools' max flow ended {status} on {len(index)} nodes")
    if flow.optimal_flow() > total:
        raise ValueError(f"min-cut: an infinite path joins source and sink: {_infinite_path(g)}")
    nodes = list(index)
    return {nodes[i] for i in flow.get_sink_side_min_cut()}


def default_weight(problem: RecomputeProblem) -> float:
    """Bytes the forward writes per second of forward time: recompute what frees more than that."""
    graph = problem.graph
    fresh = [o for op in graph.forward_ops for o in op.outputs if graph.tensors[o].storage == o]
    written = sum(graph.tensors[o].nbytes for o in fresh)
    seconds = sum(problem.op_time_s.get(op.name, 0.0) for op in graph.forward_ops)
    return written / seconds if seconds > 0 else 1.0


def weight_grid(problem: RecomputeProblem, n_weights: int) -> list[float]:
    """Geometric weights from 'recompute is nearly free' to 'recompute costs more than all bytes'."""
    times = [problem.units[u].time_s for u in problem.allowed_units if problem.units[u].time_s > 0]
    sizes = [problem.storage_bytes(s) for s in {problem.storage_of(t) for t in problem.forward_tensors} - {None}]
    if not times or not sizes:
        return [1.0]
    low = max(min(s for s in sizes if s > 0) if any(sizes) else 1, 1) / sum(times)
    high = max(sum(sizes), 1) / min(times)
    if n_weights <= 1:
        return [low]
    ratio = (high / low) ** (1 / (n_weights - 1))
    return [low * ratio**i for i in range(n_weights)]


def mincut_sweep(
    problem: RecomputeProblem, n_weights: int = 12, ties: Ties = Ties()
) -> list[tuple[float, tuple[str, ...]]]:
    """``(weight, units)`` for each weight of `weight_grid`: a (saved bytes, time) Pareto front."""
    g = build_cut_graph(problem, 0.0, ties)
    return [(w, mincut_units(problem, w, ties, g)) for w in weight_grid(problem, n_weights)]


@dataclass(frozen=True, slots=True)
class _Candidate:
    weight: float | None
    units: tuple[str, ...]
    saved_bytes: int
    peak_bytes: int
    extra_time_s: float


def _evaluate(problem: RecomputeProblem, weight: float | None, units, with_peak: bool) -> _Candidate:
    found = evaluate_units(problem, units, with_peak=with_peak)
    return _Candidate(weight, found.units, found.saved_bytes, found.peak_bytes, found.extra_time_s)


def _best_within(problem, budgets: Budgets, options: MinCutOptions, ties: Ties) -> _Candidate:
    """Least-time candidate of the sweep (plus save-all and recompute-all) within the budgets."""
    with_peak = budgets.peak_bytes is not None
    sweep = [_evaluate(problem, w, units, with_peak) for w, units in mincut_sweep(problem, options.n_weights, ties)]
    baselines = [_evaluate(problem, None, units, with_peak) for units in ((), problem.allowed_units)]
    candidates = sweep + baselines
    feasible = [c for c in candidates if budgets.admits(c.saved_bytes, c.peak_bytes)]
    if not feasible:
        if budgets.activation_bytes is not None and all(c.saved_bytes > budgets.activation_bytes for c in candidates):
            minimum = min(c.saved_bytes for c in candidates)
            raise InfeasibleBudgetError("activation_budget_bytes", budgets.activation_bytes, minimum, solver="mincut")
        within = [c for c in candidates if budgets.activation_bytes is None or c.saved_bytes <= budgets.activation_bytes]
        minimum = min(c.peak_bytes for c in within)
        raise InfeasibleBudgetError("peak_budget_bytes", budgets.peak_bytes, minimum, solver="mincut")
    best = min(feasible, key=lambda c: (c.extra_time_s, c.saved_bytes))
    above = [c.weight for c in sweep if best.weight is not None and c.weight > best.weight and c not in feasible]
    if best.weight is None or not above:
        return best
    low, high = best.weight, min(above)
    graph = build_cut_graph(problem, low, ties)
    for _ in range(options.refine_steps):
        middle = math.sqrt(low * high)
        candidate = _evaluate(problem, middle, mincut_units(problem, middle, ties, graph), with_peak)
        if budgets.admits(candidate.saved_bytes, candidate.peak_bytes):
            best = min(best, candidate, key=lambda c: (c.extra_time_s, c.saved_bytes))
            low = middle
        else:
            high = middle
    return best


def solve_mincut(
    problem: RecomputeProblem,
    *,
    activation_budget_bytes: int | None = None,
    peak_budget_bytes: int | None = None,
    options: MinCutOptions = MinCutOptions(),
) -> RematPlan:
    """Min-cut plan: at one weight, or the least-time plan of a weight sweep within the budgets.

    Args:
        problem: the recompute problem.
        activation_budget_bytes: bound on saved bytes.
        peak_budget_bytes: bound on the simulated peak.
        options: `MinCutOptions`.

    Returns:
        A checked `RematPlan` (status ``"heuristic"``).

    Raises:
        InfeasibleBudgetError: no plan of the sweep meets the budgets (names the least reached).
    """
    start = time.perf_counter()
    budgets = Budgets(activation_budget_bytes, peak_budget_bytes)
    ties = choose_ties(problem, options.tie_blocks, options.min_tied_blocks)
    if options.weight_bytes_per_s is not None or (activation_budget_bytes is None and peak_budget_bytes is None):
        weight = options.weight_bytes_per_s or default_weight(problem)
        best = _evaluate(problem, weight, mincut_units(problem, weight, ties), peak_budget_bytes is not None)
        if not budgets.admits(best.saved_bytes, best.peak_bytes):
            if activation_budget_bytes is not None and best.saved_bytes > activation_budget_bytes:
                kind, budget, minimum = "activation_budget_bytes", activation_budget_bytes, best.saved_bytes
            else:
                kind, budget, minimum = "peak_budget_bytes", peak_budget_bytes, best.peak_bytes
            raise InfeasibleBudgetError(kind, budget, minimum, solver=f"mincut at weight {weight:.3g} B/s")
    else:
        best = _best_within(problem, budgets, options, ties)
    plan = problem.plan_for(
        best.units,
        solver="mincut",
        status="heuristic",
        solve_time_s=0.0,
        activation_budget_bytes=activation_budget_bytes,
        peak_budget_bytes=peak_budget_bytes,
        notes=(f"weight {best.weight:.4g} bytes/s" if best.weight else "baseline candidate",),
    )
    plan = replace(plan, solve_time_s=time.perf_counter() - start)  # building the plan included
    return checked(problem, plan)
