"""From a `JointGraph` and a request (budgets, solver, costs) to checked plans.

The one place that joins the cost model and the solvers: `PlanRequest` is what every entry point
builds (`CostRemat`, `remat_opt.plan_graph` and `pareto_curve`, the CLI), `plan_step` plans at one
budget and `sweep` at several. No Thunder imports.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from costmodels.devices import device_spec_name
from costmodels.table import CostTable, load_table
from remat_opt.costing.graph_costs import CostModel
from remat_opt.core.errors import GB, InfeasibleBudgetError
from remat_opt.core.graph import JointGraph
from remat_opt.core.plan import RematPlan
from remat_opt.core.problem import RecomputeProblem
from remat_opt.core.layers import LayerError
from remat_opt.solvers import SOLVERS, BaselineOptions, ILPOptions, LayeredOptions, MinCutOptions, ParetoPoint, minimum_saved_bytes
from remat_opt.solvers.baselines import forward_layers, solve_fixed
from remat_opt.solvers.pareto import ACTIVATION, check_budget_kind, sweep_budgets, sweep_points

SOLVER_CHOICES = ("auto", *SOLVERS)
MAX_BUDGET_GB = 1e6  # a petabyte: larger budgets are typos (and overflow the solver's integers)


def budget_bytes_of(option: str, value_gb) -> int | None:
    """`value_gb` (GB, None: no budget) in bytes, after checking it is a finite number >= 0.

    Raises:
        TypeError: not a number (a string, a bool).
        ValueError: negative, NaN, infinite, or above `MAX_BUDGET_GB`.
    """
    if value_gb is None:
        return None
    if isinstance(value_gb, bool) or not isinstance(value_gb, numbers.Real):
        raise TypeError(f"{option} must be a number of GB, got {type(value_gb).__name__} {value_gb!r:.40}")
    if not math.isfinite(value_gb) or value_gb < 0:
        raise ValueError(f"{option} must be a finite number of GB >= 0, got {value_gb}; omit it for no budget")
    if value_gb > MAX_BUDGET_GB:
        raise ValueError(f"{option}={value_gb:g} GB is above any device ({MAX_BUDGET_GB:g} GB); omit it for no budget")
    return round(value_gb * GB)


@dataclass(frozen=True)
class PlanRequest:
    """What to plan for (validated once, when the transform is created).

    Attributes:
        peak_budget_bytes: bound on the simulated peak of one step.
        activation_budget_bytes: bound on saved-for-backward bytes (inputs excluded).
        solver: a key of `SOLVERS`, or ``"auto"`` (`resolve_solver`: layered for large layered graphs, else ILP).
        table: measured cost table, or None.
        auto_costs: ``cost_table="auto"``: the caller (`CostRemat`, the CLI) times this graph's
            forward ops on its device at the first compilation, caching them on disk
            (`remat_opt.costing.cost_cache`), and plans with that table.
        device_spec: device spec name to cost for, or None (the table's, else the graph's device).
        time_limit_s: solver time limit.
        region_graph: set by `CostRemat` when it plans through a fusion pass: the fused graph whose
            regions the table timed whole price the unfused graph's ops (`remat_opt.costing.graph_costs`).
        fixed_tag_targets: the plan is given (a plan file's tags, `remat_opt.planning.plan_file`):
            these are recomputed, nothing is solved; budgets only check it.
        deterministic: the ILP's limits in deterministic time with one CP-SAT worker (`ILPOptions`):
            the same plan at every solve of one graph, which a search through dry runs needs (with
            8 workers, equal-time plans came back in turn and one step-peak budget of a 7B layer
            took 5, 7 or 7 dry runs in three compilations; deterministic, 5 each time).
        minimum_peak_tolerance: `ILPOptions.minimum_peak_tolerance`: how close to its proven floor
            the least peak an infeasible budget's error names must be (0: to the byte). A search
            through dry runs needs only a floor (a 7B layer's least peak took 6.7 s to the byte,
            1.7 s within 0.2%).
    """

    peak_budget_bytes: int | None = None
    activation_budget_bytes: int | None = None
    solver: str = "auto"
    table: CostTable | None = None
    device_spec: str | None = None
    time_limit_s: float = 10.0
    auto_costs: bool = False
    region_graph: JointGraph | None = field(default=None, compare=False, repr=False)
    fixed_tag_targets: tuple[str, ...] | None = None
    deterministic: bool = False
    minimum_peak_tolerance: float = 0.0

    @classmethod
    def from_gb(cls, *, budget_gb=None, activation_budget_gb=None, **kwargs) -> PlanRequest:
        """`create` with budgets in GB (10**9 bytes), as `CostRemat` and `plan_graph` take them."""
        return cls.create(
            peak_budget_bytes=budget_bytes_of("budget_gb", budget_gb),
            activation_budget_bytes=budget_bytes_of("activation_budget_gb", activation_budget_gb),
            **kwargs,
        )

    @classmethod
    def create(cls, *, cost_table=None, **kwargs) -> PlanRequest:
        """Builds a request, checking every option; `cost_table` may be a path or a `CostTable`."""
        for name in ("peak_budget_bytes", "activation_budget_bytes"):
            value = kwargs.get(name)
            if value is not None and value < 0:
                raise ValueError(f"{name.replace('_bytes', '')} must not be negative, got {value} bytes")
        solver = kwargs.get("solver", "auto")
        if solver not in SOLVER_CHOICES:
            raise ValueError(f"unknown solver {solver!r}; use one of {', '.join(SOLVER_CHOICES)}")
        time_limit_s = kwargs.get("time_limit_s", 10.0)
        if isinstance(time_limit_s, bool) or not isinstance(time_limit_s, numbers.Real) or not time_limit_s > 0 \
                or not math.isfinite(time_limit_s):
            raise ValueError(f"time_limit_s must be a positive number of seconds, got {time_limit_s!r}")
        if kwargs.get("device_spec") is not None:  # checked where it is given, not at the first compilation
            kwargs["device_spec"] = device_spec_name(kwargs["device_spec"])
        if isinstance(cost_table, str) and cost_table == "auto":
            return cls(auto_costs=True, **kwargs)
        return cls(table=_cost_table(cost_table), **kwargs)

    def describe(self) -> str:
        parts = []
        if self.peak_budget_bytes is not None:
            parts.append(f"budget_gb={self.peak_budget_bytes / 1e9:g}")
        if self.activation_budget_bytes is not None:
            parts.append(f"activation_budget_gb={self.activation_budget_bytes / 1e9:g}")
        parts.append(f"solver={self.solver!r}")
        if self.auto_costs:
            parts.append("cost_table='auto'")
        if self.device_spec:
            parts.append(f"device_spec={self.device_spec!r}")
        return ", ".join(parts)


def _cost_table(cost_table) -> CostTable | None:
    if cost_table is None or isinstance(cost_table, CostTable):
        return cost_table
    if isinstance(cost_table, (str, Path)):
        return load_table(Path(cost_table))
    raise TypeError(f"cost_table must be 'auto', a path to a table from `remat-opt profile` or a CostTable, "
                    f"got {type(cost_table).__name__}")


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
    remarks: tuple[str, ...] = field(default=())  # for the user: where costs came from, what Thunder will save
    fusion: FusionOutcome | None = None  # with a fusion executor: what Thunder's own pass made of the plan

    def as_cached(self) -> PlannedStep:
        return replace(self, cached=True)


@dataclass(frozen=True)
class FusionOutcome:
    """A plan made through a fusion executor's pass (`remat_opt.planning.fusion_search`).

    `PlannedStep.graph` and `.problem` are then the unfused joint graph the solver planned on, and
    `.plan`'s ``saved_bytes``, ``peak_bytes`` and ``saved_names`` are what Thunder's pass realizes
    from its tags (a dry run), not the solver's unfused figures, which are kept here.

    Attributes:
        save_all: what Thunder saves with this executor and no tags (its own pass alone).
        solver_saved_bytes: the solver's prediction on the unfused graph.
        solver_peak_bytes: likewise for the step peak.
        realized_graph: the fused joint graph of the dry run with the plan's tags.
        rounds: one line per dry run of the search.
        tagged_dry_runs: dry runs with tags the compilation paid for (the search's, and the
            zero-time plan's when it was checked).
    """

    save_all: object  # fusion_search.Realized
    solver_saved_bytes: int
    solver_peak_bytes: int
    realized_graph: JointGraph
    rounds: tuple[str, ...] = ()
    tagged_dry_runs: int = 0


def forward_op_times_s(costs: CostModel, graph: JointGraph) -> dict[str, float]:
    """Predicted (or measured) seconds of every forward op: what recomputing it costs."""
    return {op.name: costs.op_cost(op).time_s for op in graph.forward_ops}


# Solvers that return one fixed plan: a budget only checks it, and without one it is still the plan.
FIXED_PLAN_SOLVERS = ("save_all", "recompute_all", "per_block")


# ``solver="auto"`` takes the layered solver from this many repeated layers up: the whole-graph
# ILP proves optimality on a few layers in seconds, and runs out of time on a 32-layer 7B graph.
AUTO_LAYERED_MIN_LAYERS = 8


def resolve_solver(solver: str, problem: RecomputeProblem) -> str:
    """The solver ``"auto"`` stands for on `problem`: ``"layered"`` for graphs of at least
    `AUTO_LAYERED_MIN_LAYERS` repeated layers, else ``"ilp"``; other names unchanged."""
    if solver != "auto":
        return solver
    try:
        layer_of = forward_layers(problem.graph)
    except LayerError:
        return "ilp"
    return "layered" if max(layer_of.values(), default=-1) + 1 >= AUTO_LAYERED_MIN_LAYERS else "ilp"


# The layered solver's local search (`solvers.polish`) gets this many simulated events of work per
# second of the request's time limit: the default 10 s gives `LayeredOptions`' 2 million (Llama-2-7b's
# 1,261-event step simulates in about 4 ms on 2 CPU cores, so about 0.6 s of simulation per second of
# limit); a 1 s limit leaves Llama-2-7b's 580 units no round.
POLISH_EVENTS_PER_LIMIT_S = 200_000


def solver_options(request: PlanRequest, solver: str):
    """The options object `solver` takes, from `request` (its time limit)."""
    if solver == "mincut":
        return MinCutOptions()
    if solver in FIXED_PLAN_SOLVERS:
        return BaselineOptions()
    if solver == "layered":  # half the time limit for the lower bound behind its certified gap
        return LayeredOptions(bound_time_limit_s=request.time_limit_s / 2,
                              polish_work_events=round(POLISH_EVENTS_PER_LIMIT_S * request.time_limit_s))
    return ILPOptions(time_limit_s=request.time_limit_s, deterministic=request.deterministic,
                      minimum_peak_tolerance=request.minimum_peak_tolerance)


def _zero_time_plan(problem: RecomputeProblem, costs: CostModel, request: PlanRequest) -> RematPlan:
    """Least saved bytes among plans of `problem` that recompute only free ops (views: no kernel
    launched)."""
    graph = problem.graph
    free = {op.name for op in graph.forward_ops if costs.op_cost(op).kernels == 0}
    # a target whose unit re-runs any paid op (a fusion region's unit too: its tag targets are its
    # members', not the region op's own `tag_units`) is pinned
    paid_targets = {name for name, unit in problem.units.items() if any(op not in free for op in unit.ops)}
    problem = RecomputeProblem.from_graph(graph, problem.op_time_s, pinned=paid_targets)
    options = solver_options(request, "ilp")
    floor_bytes = minimum_saved_bytes(problem, options)
    return SOLVERS["ilp"](problem, activation_budget_bytes=floor_bytes, options=options)


def costed_problem(graph: JointGraph, request: PlanRequest) -> tuple[CostModel, RecomputeProblem]:
    """The cost model and problem `plan_step` solves for `graph` (the request's budgets aside)."""
    costs = CostModel(graph, device_spec=request.device_spec, table=request.table, region_graph=request.region_graph)
    return costs, RecomputeProblem.from_graph(graph, forward_op_times_s(costs, graph))


def plan_step(graph: JointGraph, request: PlanRequest,
              costed: tuple[CostModel, RecomputeProblem] | None = None) -> PlannedStep:
    """Costs `graph`, solves under the request's budgets, and returns the checked plan.

    Args:
        costed: `costed_problem(graph, request)`, when the caller plans the same graph at several
            budgets (built here otherwise).

    Raises:
        InfeasibleBudgetError: no plan meets the budget; the message speaks in GB.
    """
    start_s = time.perf_counter()
    costs, problem = costed if costed is not None else costed_problem(graph, request)
    no_budget = request.peak_budget_bytes is None and request.activation_budget_bytes is None
    if request.fixed_tag_targets is not None:
        plan = solve_fixed(problem, request.fixed_tag_targets, name="plan file",
                           activation_budget_bytes=request.activation_budget_bytes,
                           peak_budget_bytes=request.peak_budget_bytes)
    elif no_budget and request.solver not in FIXED_PLAN_SOLVERS:
        plan = _zero_time_plan(problem, costs, request)
    else:  # `PlanRequest.create` has checked the solver's name
        solver = resolve_solver(request.solver, problem)
        try:
            plan = SOLVERS[solver](
                problem,
                activation_budget_bytes=request.activation_budget_bytes,
                peak_budget_bytes=request.peak_budget_bytes,
                options=solver_options(request, solver),
            )
        except InfeasibleBudgetError as e:
            raise e.to_gb() from e
    note = f"planned in {time.perf_counter() - start_s:.2f} s"
    remarks = (OFFLINE_FUSION_REMARK,) if any("fusion" in op.op_tags for op in graph.ops) else ()
    return PlannedStep(graph=graph, problem=problem, plan=plan, costs=costs, request=request, notes=(note,),
                       remarks=remarks)


# Offline plans on a fused graph (`--executors nvfuser-standin | torch-compile`) are not what Thunder
# would save with their tags; CostRemat, at compile time, plans through the pass.
OFFLINE_FUSION_REMARK = (
    "this graph has fusion regions: Thunder's fusion pass re-partitions after a plan's tags, so this offline "
    "plan's saved bytes and peak are not what Thunder would save with it; CostRemat plans through the pass at "
    "compile time (remat_opt.planning.fusion_search), offline planning does not yet")


def sweep_problem(problem: RecomputeProblem, request: PlanRequest, *, budget_kind: str = ACTIVATION,
                  n_points: int | None = None, budgets_bytes=None, errors: list | None = None) -> list[ParetoPoint]:
    """Plans of `problem` at several budgets of one kind, each as `request` says (solver, time limit):
    `n_points` evenly spaced from the least feasible budget to save-all's, or the given
    `budgets_bytes`. The one sweep behind `pareto_curve`, ``remat-opt pareto`` and the what-if
    notebook (see `remat_opt.solvers.pareto.sweep_points`: a plan never slower than one at a smaller
    budget).

    Args:
        errors: collects ``(bound_bytes, exception)`` for budgets left without a plan; None: raise.

    Raises:
        ValueError: both or neither of `n_points` and `budgets_bytes`, or fewer than 2 points.
        InfeasibleBudgetError: a given budget no plan meets (with `errors` None).
    """
    check_budget_kind(budget_kind)
    if (n_points is None) == (budgets_bytes is None):
        raise ValueError("give n_points (evenly spaced budgets) or budgets_bytes (explicit ones), not both")
    solver = resolve_solver(request.solver, problem)
    options = solver_options(request, solver)
    if budgets_bytes is None:
        if isinstance(n_points, bool) or not isinstance(n_points, int) or n_points < 2:
            raise ValueError(f"n_points must be at least 2 (an integer: least memory and save-all), got {n_points!r}")
        budgets_bytes, known = sweep_budgets(problem, n_points, budget_kind, options)
    else:
        budgets_bytes, known = sorted(budgets_bytes), ()
    return sweep_points(problem, budgets_bytes, budget_kind=budget_kind, solver=solver, options=options, known=known,
                        errors=errors)


def sweep(graph: JointGraph, request: PlanRequest, **kwargs) -> list[ParetoPoint]:
    """`sweep_problem` on `graph` costed as `request` says (device spec, cost table, regions)."""
    costs = CostModel(graph, device_spec=request.device_spec, table=request.table, region_graph=request.region_graph)
    return sweep_problem(RecomputeProblem.from_graph(graph, forward_op_times_s(costs, graph)), request, **kwargs)
