"""Reference plans every solver is compared with: Checkmate's checkpoint-all and recompute-all, and
per-block activation checkpointing (what ``torch.utils.checkpoint`` around every transformer block
does, what large training runs use)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from remat_opt.core.layers import LayerError, find_layers, find_repeated_blocks
from remat_opt.core.plan import RematPlan
from remat_opt.core.problem import RecomputeProblem
from remat_opt.solvers._common import Budgets, checked, raise_if_over


@dataclass(frozen=True, slots=True)
class BaselineOptions:
    """Baselines take no options; the dataclass keeps the solver signature uniform."""


def _fixed_plan(problem, units, name, activation_budget_bytes, peak_budget_bytes) -> RematPlan:
    start = time.perf_counter()
    plan = problem.plan_for(
        units,
        solver=name,
        status="heuristic",
        solve_time_s=0.0,
        activation_budget_bytes=activation_budget_bytes,
        peak_budget_bytes=peak_budget_bytes,
    )
    # Building the plan (demand walk, peak simulation) is the whole solve: time it, not the call's arguments.
    plan = replace(plan, solve_time_s=time.perf_counter() - start)
    budgets = Budgets(activation_budget_bytes, peak_budget_bytes)
    raise_if_over(plan, budgets, minimum_saved=plan.saved_bytes, minimum_peak=plan.peak_bytes)
    return checked(problem, plan)


def solve_fixed(problem: RecomputeProblem, tag_targets, *, name: str, activation_budget_bytes: int | None = None,
                peak_budget_bytes: int | None = None) -> RematPlan:
    """The plan that recomputes the units of `tag_targets` (a plan made elsewhere, e.g. a plan
    file's); raises if it is over a budget, or if a target is not an allowed unit of `problem`."""
    unknown = [t for t in tag_targets if t not in problem.units]
    if unknown:
        raise ValueError(f"{name}: tag targets that are no recompute unit of this graph: {unknown[:3]}")
    problem.check_allowed(tag_targets)
    return _fixed_plan(problem, tuple(tag_targets), name, activation_budget_bytes, peak_budget_bytes)


def solve_save_all(
    problem: RecomputeProblem,
    *,
    activation_budget_bytes: int | None = None,
    peak_budget_bytes: int | None = None,
    options: BaselineOptions = BaselineOptions(),
) -> RematPlan:
    """Saves every tensor the backward reads (Thunder's default); raises if over a budget."""
    return _fixed_plan(problem, (), "save_all", activation_budget_bytes, peak_budget_bytes)


def solve_recompute_all(
    problem: RecomputeProblem,
    *,
    activation_budget_bytes: int | None = None,
    peak_budget_bytes: int | None = None,
    options: BaselineOptions = BaselineOptions(),
) -> RematPlan:
    """Tags every allowed unit: everything recomputable is recomputed; raises if over a budget."""
    return _fixed_plan(problem, problem.allowed_units, "recompute_all", activation_budget_bytes, peak_budget_bytes)


def per_block_units(problem: RecomputeProblem) -> tuple[str, ...]:
    """The units per-block checkpointing recomputes: every allowed unit inside one repeated layer
    (`inside_units_by_layer`). What leaves a layer (its output, the next block's input) is kept, as
    is everything outside the layers (embedding, final norm, head, loss) and what may not be
    recomputed (random ops, collectives).

    Raises:
        LayerError: the graph has no repeated layers (the message says what to trace).
    """
    inside = {u for units in inside_units_by_layer(problem).values() for u in units}
    return tuple(u for u in problem.allowed_units if u in inside)


def inside_units_by_layer(problem: RecomputeProblem, forward_layer: dict[str, int] | None = None) -> dict[int, tuple[str, ...]]:
    """Layer -> its allowed units (forward order) whose ops all lie in that layer
    (`remat_opt.core.layers.find_layers`: its forward block and satellites, an FSDP weight's gather
    included, which is then re-gathered) and whose outputs only that layer's forward reads: what a
    layer can recompute without touching another layer.

    `forward_layer`: `forward_layers` of the graph, when the caller has it.

    Raises:
        LayerError: the graph has no repeated layers (the message says what to trace).
    """
    graph = problem.graph
    forward_layer = forward_layers(graph) if forward_layer is None else forward_layer
    reader_layers: dict[str, set[int | None]] = {}
    for op in graph.forward_ops:
        for name in op.inputs:
            reader_layers.setdefault(name, set()).add(forward_layer.get(op.name))
    inside: dict[int, list[str]] = {}
    for name in problem.allowed_units:
        unit = problem.units[name]
        unit_layers = {forward_layer.get(op) for op in unit.ops}
        if len(unit_layers) != 1 or None in unit_layers:
            continue  # outside the layers, or across two
        (layer,) = unit_layers
        if not any(reader_layers.get(out, set()) - {layer} for out in unit.outputs):
            inside.setdefault(layer, []).append(name)
    return {layer: tuple(units) for layer, units in sorted(inside.items())}


def forward_layers(graph) -> dict[str, int]:
    """Forward op name -> its layer: `find_layers`' blocks and satellites, or, in a graph whose
    backward does not repeat, the forward's repeated blocks alone."""
    return forward_layers_and_satellites(graph)[0]


def forward_layers_and_satellites(graph) -> tuple[dict[str, int], frozenset[str]]:
    """`forward_layers`, and the forward ops among them that are satellites (outside the blocks,
    serving one layer: an FSDP weight's all-gather; none where the backward does not repeat)."""
    try:
        layers = find_layers(graph)
        forward = {op.name: layers.op_layer[op.name] for op in graph.forward_ops if op.name in layers.op_layer}
        return forward, frozenset(name for name in layers.satellite_layer if name in forward)
    except LayerError as e:
        run = find_repeated_blocks(graph)
        if run is None:
            raise LayerError(f"per-block checkpointing needs the graph's repeated layers: {e}") from e
    blocks = {op.name: run.block_of(i) for i, op in enumerate(graph.forward_ops) if run.block_of(i) is not None}
    return blocks, frozenset()


def solve_per_block(
    problem: RecomputeProblem,
    *,
    activation_budget_bytes: int | None = None,
    peak_budget_bytes: int | None = None,
    options: BaselineOptions = BaselineOptions(),
) -> RematPlan:
    """Per-block activation checkpointing (`per_block_units`): each layer keeps what it hands on
    and recomputes the rest in the backward; raises if over a budget."""
    return _fixed_plan(problem, per_block_units(problem), "per_block", activation_budget_bytes, peak_budget_bytes)
