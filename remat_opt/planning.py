"""From a `JointGraph` and a request (budgets, solver, costs) to a checked `RematPlan`.

The one place that joins the cost model and the solvers; `CostRemat` calls it at compile time and
`remat_opt.analyze(...).plan()` calls it offline. No Thunder imports.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from costmodels.api import CostModel
from costmodels.table import CostTable, load_table

from remat_opt.graph import JointGraph
from remat_opt.plan import RematPlan
from remat_opt.problem import RecomputeProblem
from remat_opt.solvers import SOLVERS, BaselineOptions, ILPOptions, MinCutOptions, minimum_saved_bytes, pareto

SOLVER_CHOICES = ("auto", *SOLVERS)
GB = 10**9  # budgets are in decimal gigabytes, as torch.cuda memory reports and litgpt print them


@dataclass(frozen=True)
class PlanRequest:
    """What to plan for (validated once, when the transform is created).

    Attributes:
        peak_budget_bytes: bound on the simulated peak of one step.
        activation_budget_bytes: bound on saved-for-backward bytes (inputs excluded).
        solver: a key of `SOLVERS`, or ``"auto"`` (ILP).
        table: measured cost table, or None.
        device: device spec name, or None (the table's, else the graph's device).
        time_limit_s: solver time limit.
    """

    peak_budget_bytes: int | None = None
    activation_budget_bytes: int | None = None
    solver: str = "auto"
    table: CostTable | None = None
    device: str | None = None
    time_limit_s: float = 10.0

    @classmethod
    def from_gb(cls, *, budget_gb=None, activation_budget_gb=None, **kwargs) -> PlanRequest:
        """`create` with budgets in GB (10**9 bytes), as `CostRemat` and `JointGraph.plan` take them."""
        return cls.create(
            peak_budget_bytes=None if budget_gb is None else round(budget_gb * GB),
            activation_budget_bytes=None if activation_budget_gb is None else round(activation_budget_gb * GB),
            **kwargs,
        )

    @classmethod
    def create(cls, *, cost_table=None, **kwargs) -> PlanRequest:
        """Builds a request, checking every option; `cost_table` may be a path."""
        for name in ("peak_budget_bytes", "activation_budget_bytes"):
            value = kwargs.get(name)
            if value is not None and value < 0:
                raise ValueError(f"{name.replace('_bytes', '')} must not be negative, got {value} bytes")
        solver = kwargs.get("solver", "auto")
        if solver not in SOLVER_CHOICES:
            raise ValueError(f"unknown solver {solver!r}; use one of {', '.join(SOLVER_CHOICES)}")
        if kwargs.get("time_limit_s", 10.0) <= 0:
            raise ValueError(f"time_limit_s must be positive, got {kwargs['time_limit_s']}")
        table = load_table(Path(cost_table)) if isinstance(cost_table, (str, Path)) else cost_table
        return cls(table=table, **kwargs)

    def describe(self) -> str:
        parts = []
        if self.peak_budget_bytes is not None:
            parts.append(f"budget_gb={self.peak_budget_bytes / 1e9:g}")
        if self.activation_budget_bytes is not None:
            parts.append(f"activation_budget_gb={self.activation_budget_bytes / 1e9:g}")
        parts.append(f"solver={self.solver!r}")
        if self.device:
            parts.append(f"device={self.device!r}")
        return ", ".join(parts)


@dataclass(frozen=True)
class PlannedStep:
    """A plan with what it was made from (for `explain`)."""

    graph: JointGraph
    problem: RecomputeProblem
    plan: RematPlan
    costs: CostModel
    request: PlanRequest
    cached: bool = False
    notes: tuple[str, ...] = field(default=())

    def as_cached(self) -> PlannedStep:
        return replace(self, cached=True)


def forward_op_times_s(costs: CostModel, graph: JointGraph) -> dict[str, float]:
    """Predicted (or measured) seconds of every forward op: what recomputing it costs."""
    return {op.name: costs.op_cost(op).time_s for op in graph.forward_ops}


def _solver_options(request: PlanRequest):
    if request.solver == "mincut":
        return MinCutOptions()
    if request.solver in ("save_all", "recompute_all"):
        return BaselineOptions()
    return ILPOptions(time_limit_s=request.time_limit_s)


def _zero_time_plan(graph: JointGraph, costs: CostModel, request: PlanRequest) -> RematPlan:
    """Least saved bytes among plans that recompute only free ops (views: no kernel launched)."""
    times = forward_op_times_s(costs, graph)
    free = {op.name for op in graph.forward_ops if costs.op_cost(op).kernels == 0}
    paid_targets = {t for op in graph.forward_ops if op.name not in free for t in op.tag_units}
    problem = RecomputeProblem.from_graph(graph, times, pinned=paid_targets)
    options = ILPOptions(time_limit_s=request.time_limit_s)
    floor_bytes = minimum_saved_bytes(problem, options)
    return SOLVERS["ilp"](problem, budget_bytes=floor_bytes, options=options)


def plan_graph(graph: JointGraph, request: PlanRequest) -> PlannedStep:
    """Costs `graph`, solves under the request's budgets, and returns the checked plan."""
    start_s = time.perf_counter()
    costs = CostModel(graph, device=request.device, table=request.table)
    problem = RecomputeProblem.from_graph(graph, forward_op_times_s(costs, graph))
    if request.peak_budget_bytes is None and request.activation_budget_bytes is None:
        plan = _zero_time_plan(graph, costs, request)
    else:
        solver = SOLVERS["ilp" if request.solver == "auto" else request.solver]
        plan = solver(
            problem,
            budget_bytes=request.activation_budget_bytes,
            peak_budget_bytes=request.peak_budget_bytes,
            options=_solver_options(request),
        )
    note = f"planned in {time.perf_counter() - start_s:.2f} s"
    return PlannedStep(graph=graph, problem=problem, plan=plan, costs=costs, request=request, notes=(note,))


def pareto_front(graph: JointGraph, request: PlanRequest, n_points: int, budget: str = "saved"):
    """Pareto points of `graph` costed as `request` says (see `remat_opt.solvers.pareto`)."""
    if n_points < 2:
        raise ValueError(f"n_points must be at least 2 (least memory and save-all), got {n_points}")
    costs = CostModel(graph, device=request.device, table=request.table)
    return pareto(graph, forward_op_times_s(costs, graph), n_points, budget=budget)
