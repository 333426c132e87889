"""Offline planning on a joint graph, as `CostRemat` would plan it at compile time: `plan_graph` at
one budget, `pareto_curve` across budgets. Both build the `PlanRequest` every entry point builds and
hand it to the one planner (`remat_opt.planning.planner`), ``cost_table="auto"`` included (timed
on the graph's device, as ``remat-opt plan --cost-table auto`` does)."""

from __future__ import annotations

import sys

from remat_opt.core.graph import JointGraph
from remat_opt.core.plan import RematPlan
from remat_opt.costing.cost_cache import with_auto_costs
from remat_opt.planning.planner import PlanRequest, plan_step, sweep
from remat_opt.solvers.pareto import ACTIVATION, ParetoPoint


def _with_costs(graph: JointGraph, request: PlanRequest) -> PlanRequest:
    """`request` with ``cost_table="auto"`` resolved to a table timed on the graph's device (the
    note says how many ops were timed or came from the cache)."""
    request, note = with_auto_costs(request, graph)
    if note:
        print(note, file=sys.stderr)
    return request


def plan_graph(graph: JointGraph, *, budget_gb: float | None = None, activation_budget_gb: float | None = None,
               solver: str = "auto", device_spec: str | None = None, cost_table=None,
               time_limit_s: float = 10.0) -> RematPlan:
    """Plans `graph` offline, as `CostRemat` with the same options would at compile time.

    Args:
        graph: a joint graph (`remat_opt.analyze`, `remat_opt.analyze_model`).
        budget_gb: bound on the predicted peak of one training step, GB (10**9 bytes).
        activation_budget_gb: bound on the bytes saved for backward (inputs excluded), GB.
        solver: ``"auto"`` (layered from 8 repeated layers, else ILP), ``"ilp"``, ``"layered"``,
            ``"mincut"``, ``"save_all"``, ``"recompute_all"`` or
            ``"per_block"`` (activation checkpointing of every repeated layer).
        device_spec: spec sheet to cost for (``"h100"``, ``"h200"``, ``"a100"``, ``"l40s"``, ``"cpu"``
            or a spec name); default: the cost table's device, else the graph's (a CPU graph).
        cost_table: a measured cost table (path or `costmodels.table.CostTable`), or ``"auto"``.
        time_limit_s: solver time limit.

    Returns:
        The checked `RematPlan` (``print(plan.summary())``).

    Raises:
        InfeasibleBudgetError: the budget is below the least memory of any plan (named in GB).
    """
    request = PlanRequest.from_gb(budget_gb=budget_gb, activation_budget_gb=activation_budget_gb, solver=solver,
                                  device_spec=device_spec, cost_table=cost_table, time_limit_s=time_limit_s)
    return plan_step(graph, _with_costs(graph, request)).plan


def pareto_curve(graph: JointGraph, n_points: int = 8, *, budget_kind: str = ACTIVATION, solver: str = "auto",
                 device_spec: str | None = None, cost_table=None, time_limit_s: float = 10.0) -> list[ParetoPoint]:
    """Plans at `n_points` budgets from the least memory to save-all: memory against extra time.

    Args:
        graph: a joint graph (`remat_opt.analyze`, `remat_opt.analyze_model`).
        n_points: how many budgets (at least 2).
        budget_kind: sweep the bytes saved for backward (``"activation"``, as `activation_budget_gb`)
            or the step peak (``"peak"``, as `budget_gb`).
        solver, device_spec, cost_table, time_limit_s: as in `plan_graph`.

    Returns:
        `ParetoPoint`s (budget kind and value, peak and saved bytes, extra seconds, plan), smallest
        budget first.
    """
    request = PlanRequest.create(solver=solver, device_spec=device_spec, cost_table=cost_table,
                                 time_limit_s=time_limit_s)
    return sweep(graph, _with_costs(graph, request), budget_kind=budget_kind, n_points=n_points)
