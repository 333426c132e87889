"""What-if analyses behind ``notebooks/what_if.ipynb`` (pure: no Thunder imports).

    costed = cost_graph(graph, "H100")           # the graph's ops priced on one device
    sweep = peak_sweep(costed, 8, label="H100")  # plans from the least peak to save-all
    saved_bytes_by_layer(graph, plan.saved_names)
    plans_at_peak_budgets(costed, (40, 50, 60))  # feasible? peak, saved, extra ms, what is rerun

Figures are in `remat_opt.analysis.plots`, the case of Thunder #1646 in
`remat_opt.analysis.thunder_1646`. GB are 10**9 bytes, as budgets everywhere in remat-opt. Times
are seconds unless a name says ``_ms``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from remat_opt.costing.graph_costs import CostModel
from costmodels.formulas import SDPA_FORMS
from remat_opt.core.graph import JointGraph, OpNode
from remat_opt.core.plan import RematPlan
from remat_opt.planning.planner import PlanRequest, forward_op_times_s, resolve_solver, solver_options, sweep_problem
from remat_opt.core.problem import RecomputeProblem
from remat_opt.core.report import saved_storage_owners, storage_kind
from remat_opt.solvers import SOLVERS, InfeasibleBudgetError, ParetoPoint
from remat_opt.core.errors import GB
from remat_opt.core.layers import find_repeated_blocks, forward_layer_labels

SDPA_FORWARD_SYMBOLS = frozenset(symbol for symbol, form in SDPA_FORMS.items() if not form.backward)


def graph_summary(graph: JointGraph) -> str:
    """One line: ops, layers found, save-all saved activations (GB), and the graph's notes."""
    blocks = find_repeated_blocks(graph)
    layers = f"{blocks.count} identical blocks of {blocks.period} forward ops" if blocks else "no repeated layers"
    summary = (f"{len(graph.forward_ops)} forward and {len(graph.backward_ops)} backward ops, {layers}; "
               f"saved activations (save-all) {graph.saved_activation_bytes / GB:.2f} GB")
    return "; ".join((summary, *graph.notes))


# --------------------------------------------------------------------------------------------
# A graph priced on one device
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CostedGraph:
    """A joint graph with its ops priced on one device.

    Attributes:
        graph: the joint graph.
        device: the device spec name it is priced for (``"H100"``, ``"H200"``, ...).
        problem: the recompute problem, with forward op times from the cost model.
        step_time_s: predicted time of one save-all step: every forward and backward op at its
            cost-model time, one after another (no overlap, no fusion beyond the trace's).
    """

    graph: JointGraph
    device: str
    problem: RecomputeProblem
    step_time_s: float


def cost_graph(graph: JointGraph, device: str) -> CostedGraph:
    """Prices every op of `graph` on `device` (formulas on the device's spec sheet).

    Args:
        graph: the joint graph.
        device: a device spec name, e.g. ``"H100"`` or ``"H200"``.

    Returns:
        The `CostedGraph`.
    """
    costs = CostModel(graph, device)
    problem = RecomputeProblem.from_graph(graph, forward_op_times_s(costs, graph))
    step_time_s = sum(costs.op_cost(op).time_s for op in graph.ops)
    return CostedGraph(graph=graph, device=device, problem=problem, step_time_s=step_time_s)


# --------------------------------------------------------------------------------------------
# Pareto sweep over peak budgets
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sweep:
    """Plans at evenly spaced peak budgets, from the least simulated peak found to save-all's.

    Attributes:
        label: legend label (a device or a model name).
        points: one `ParetoPoint` per budget the solver found a plan for, smallest budget first.
        unsolved: ``"<budget> GB: <error>"`` for each budget it found none for.
        step_time_s: predicted save-all step time of the costed graph.
        sdpa_recomputed: per point, how many SDPA forward ops its plan reruns.
    """

    label: str
    points: tuple[ParetoPoint, ...]
    unsolved: tuple[str, ...]
    step_time_s: float
    sdpa_recomputed: tuple[int, ...]


DEFAULT_SWEEP_POINTS = 8  # budgets per sweep: the least peak found, save-all's, and evenly between
DEFAULT_TIME_LIMIT_S = 10.0  # the solver's limit per budget
DEFAULT_TRACED_LAYERS = 4  # the nvFuser stand-in's regions span layer boundaries: it needs 4


def model_graph(name: str, *, traced_layers: int = DEFAULT_TRACED_LAYERS, executors=None, **kwargs) -> JointGraph:
    """`remat_opt.models.graphs.analyze_model` on meta: by default with the nvFuser stand-in (the GPU
    step's fusion regions and Thunder's rematerialization) from 4 traced layers. The test suite runs
    the notebook with ``executors="fused-sdpa"`` and 3 layers, its cheapest traces."""
    from remat_opt.models.graphs import analyze_model

    return analyze_model(name, traced_layers=traced_layers, executors=executors, **kwargs)


def peak_sweep(costed: CostedGraph, n_points: int = DEFAULT_SWEEP_POINTS, *, label: str = "",
               time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> Sweep:
    """Solves the ILP at `n_points` peak budgets (what `remat_opt.pareto_curve(graph, budget_kind="peak")` does).

    A budget the solver finds no plan for is reported in `Sweep.unsolved` instead of raising, so
    one hard budget does not lose the rest of the curve.

    Args:
        costed: the graph priced on a device.
        n_points: number of budgets (at least 2: the least peak and save-all).
        label: legend label; default: the device name.

    Returns:
        The `Sweep`.
    """
    errors: list = []
    request = PlanRequest.create(time_limit_s=time_limit_s)
    points = sweep_problem(costed.problem, request, budget_kind="peak", n_points=n_points, errors=errors)
    unsolved = [f"{bound_bytes / GB:.6g} GB: {e}" for bound_bytes, e in errors]
    return Sweep(
        label=label or costed.device,
        points=tuple(points),
        unsolved=tuple(unsolved),
        step_time_s=costed.step_time_s,
        sdpa_recomputed=tuple(count_sdpa_recomputed(costed.graph, p.plan) for p in points),
    )


def sweep_rows(sweep: Sweep) -> list[dict[str, str]]:
    """One display row per point: budget, peak, saved, extra ms and % of the step, SDPA reruns."""
    return [
        {
            "peak budget GB": f"{p.swept_budget_bytes / GB:.2f}",
            "peak GB": f"{p.peak_bytes / GB:.2f}",
            "saved GB": f"{p.saved_bytes / GB:.2f}",
            "extra ms": f"{p.extra_time_s * 1e3:.2f}",
            "extra % of step": f"{100 * p.extra_time_s / sweep.step_time_s:.2f}",
            "SDPA ops rerun": str(n_sdpa),
        }
        for p, n_sdpa in zip(sweep.points, sweep.sdpa_recomputed)
    ]


def endpoint_rows(sweeps: Iterable[Sweep]) -> list[dict[str, str]]:
    """Per sweep, its least-memory point and its save-all point (the ends of the curve)."""
    rows = []
    for sweep in (s for s in sweeps if s.points):  # a sweep without points: see `sweep_notes`
        low, high = sweep.points[0], sweep.points[-1]
        rows.append({
            "curve": sweep.label,
            "least peak GB": f"{low.peak_bytes / GB:.2f}",
            "its saved GB": f"{low.saved_bytes / GB:.2f}",
            "its extra ms": f"{low.extra_time_s * 1e3:.2f}",
            "its extra %": f"{100 * low.extra_time_s / sweep.step_time_s:.2f}",
            "save-all peak GB": f"{high.peak_bytes / GB:.2f}",
            "save-all saved GB": f"{high.saved_bytes / GB:.2f}",
            "predicted step ms": f"{sweep.step_time_s * 1e3:.1f}",
        })
    return rows


def relabel(sweep: Sweep, label: str) -> Sweep:
    """The same sweep under another legend label (to compare models in one plot)."""
    return replace(sweep, label=label)


def sweep_notes(sweeps: Iterable[Sweep]) -> str:
    """Markdown: the budgets each sweep found no plan for, with the solver's message."""
    lines = [f"- {s.label}: no plan at {u}" for s in sweeps for u in s.unsolved]
    return "\n".join(lines) or "Every budget of every sweep has a plan."


def sdpa_forward_ops(graph: JointGraph) -> tuple[OpNode, ...]:
    """The forward ops that are fused attention kernels (`SDPA_FORWARD_SYMBOLS`)."""
    return tuple(op for op in graph.forward_ops if op.symbol in SDPA_FORWARD_SYMBOLS)


def count_sdpa_recomputed(graph: JointGraph, plan: RematPlan) -> int:
    """How many SDPA forward ops `plan` reruns in the backward."""
    sdpa = {op.name for op in sdpa_forward_ops(graph)}
    return sum(op in sdpa for op in plan.recompute_ops)


# --------------------------------------------------------------------------------------------
# Saved memory per layer and per op kind
# --------------------------------------------------------------------------------------------


def _saved_bytes_by(graph: JointGraph, saved_names, key_of_op, order: Sequence[str] = ()) -> dict[str, int]:
    totals: dict[str, int] = dict.fromkeys(order, 0)
    for storage, op in saved_storage_owners(graph, saved_names).items():
        key = key_of_op(op, storage) if op is not None else "?"
        totals[key] = totals.get(key, 0) + graph.tensors[storage].storage_bytes
    return totals


def saved_bytes_by_layer(graph: JointGraph, saved_names: Iterable[str] | None = None) -> dict[str, int]:
    """Saved storage bytes by the layer of the op that allocated each storage.

    Args:
        graph: the joint graph.
        saved_names: the saved tensors (a plan's `saved_names`); default: save-all.

    Returns:
        ``{"before": ..., "layer 0": ..., ..., "after": ...}`` in model order, summing to the
        plan's saved bytes.
    """
    layers = forward_layer_labels(graph)
    order = list(dict.fromkeys(layers[op.name] for op in graph.forward_ops))
    return _saved_bytes_by(graph, saved_names, lambda op, _: layers[op.name], order)


def saved_bytes_by_kind(graph: JointGraph, saved_names: Iterable[str] | None = None) -> dict[str, int]:
    """Saved storage bytes by the symbol of the op that allocated each storage, largest first; in a
    fusion region (``nvFusion7``), the member that computed it, as ``"mul (fused)"``.

    Args:
        graph: the joint graph.
        saved_names: the saved tensors (a plan's `saved_names`); default: save-all.
    """
    totals = _saved_bytes_by(graph, saved_names, storage_kind)
    return dict(sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])))


def saved_gb_rows(breakdowns: Mapping[str, Mapping[str, int]]) -> list[dict[str, str]]:
    """Display rows, one per key of the breakdowns (plans as columns), in GB."""
    keys = list(dict.fromkeys(k for b in breakdowns.values() for k in b))
    return [{"": key, **{f"{name} GB": f"{b.get(key, 0) / GB:.3f}" for name, b in breakdowns.items()}} for key in keys]


# --------------------------------------------------------------------------------------------
# Plans at peak budgets
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BudgetOutcome:
    """The plan at one peak budget, or why there is none.

    Attributes:
        budget_gb: the peak budget.
        plan: the plan, or None when there is none.
        message: the solver's error, or "": for an infeasible budget it names the smallest feasible
            budget; otherwise the solver found no plan in its time limit (feasibility unknown).
        infeasible: whether the solver proved the budget infeasible.
    """

    budget_gb: float
    plan: RematPlan | None
    message: str = ""
    infeasible: bool = False


def plan_at_peak_gb(costed: CostedGraph, budget_gb: float, *, time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> RematPlan:
    """The plan under a step-peak budget, by the solver ``"auto"`` picks (as `remat_opt.plan_graph(graph,
    budget_gb=..., device_spec=...)`: layered for deep graphs, else the ILP).

    Raises:
        InfeasibleBudgetError: the budget is below the smallest feasible peak (named in GB).
    """
    solver = resolve_solver("auto", costed.problem)
    options = solver_options(PlanRequest.create(time_limit_s=time_limit_s), solver)
    try:
        return SOLVERS[solver](costed.problem, peak_budget_bytes=round(budget_gb * GB), options=options)
    except InfeasibleBudgetError as e:
        raise e.to_gb() from e


def plans_at_peak_budgets(costed: CostedGraph, budgets_gb: Iterable[float], *,
                          time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> list[BudgetOutcome]:
    """`plan_at_peak_gb` at each budget; an infeasible budget gives its error message, not a raise."""
    outcomes = []
    for budget_gb in budgets_gb:
        try:
            plan = plan_at_peak_gb(costed, budget_gb, time_limit_s=time_limit_s)
            outcomes.append(BudgetOutcome(budget_gb=budget_gb, plan=plan))
        except (InfeasibleBudgetError, TimeoutError) as e:
            infeasible = isinstance(e, InfeasibleBudgetError)
            outcomes.append(BudgetOutcome(budget_gb=budget_gb, plan=None, message=str(e), infeasible=infeasible))
    return outcomes


def recomputed_by_kind(costed: CostedGraph, plan: RematPlan, *, free: bool = False) -> dict[str, int]:
    """How many ops of each symbol `plan` reruns in the backward, most first.

    Args:
        costed: the costed graph the plan was made for.
        plan: the plan.
        free: count the ops that cost no time (views, metadata only) instead of the others.
    """
    symbols = {op.name: op.symbol for op in costed.graph.forward_ops}
    times = costed.problem.op_time_s
    chosen = [symbols[op] for op in plan.recompute_ops if (float(times[op]) == 0.0) == free]
    return dict(Counter(chosen).most_common())


def format_counts(counts: Mapping[str, int]) -> str:
    """``{"mul": 64, "to": 32}`` -> ``"mul (64), to (32)"`` (``"nothing"`` when empty)."""
    return ", ".join(f"{key} ({n})" for key, n in counts.items()) or "nothing"


def describe_recomputed(costed: CostedGraph, plan: RematPlan) -> str:
    """What `plan` reruns by op kind: ops that cost time, then the free views."""
    paid, free = recomputed_by_kind(costed, plan), recomputed_by_kind(costed, plan, free=True)
    return format_counts(paid) + (f"; free views: {format_counts(free)}" if free else "")


def budget_rows(costed: CostedGraph, outcomes: Iterable[BudgetOutcome]) -> list[dict[str, str]]:
    """Display rows: budget, feasible?, peak, saved, extra ms, what is recomputed (or the error)."""
    rows = []
    for o in outcomes:
        feasible = "yes" if o.plan is not None else "no" if o.infeasible else "no plan found"
        row = {"budget GB": f"{o.budget_gb:g}", "feasible": feasible}
        if o.plan is None:
            row.update({"peak GB": "-", "saved GB": "-", "extra ms": "-", "recomputed": o.message})
        else:
            row.update({
                "peak GB": f"{o.plan.peak_bytes / GB:.2f}",
                "saved GB": f"{o.plan.saved_bytes / GB:.2f}",
                "extra ms": f"{o.plan.extra_time_s * 1e3:.2f}",
                "recomputed": describe_recomputed(costed, o.plan),
            })
        rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------
# Display: tables and figures
# --------------------------------------------------------------------------------------------


def markdown_table(rows: Sequence[Mapping[str, object]]) -> str:
    """Rows (dicts with the same keys) as a Markdown table; ``"(no rows)"`` when empty."""
    if not rows:
        return "(no rows)"
    header = list(rows[0])

    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *(line(r[k] for k in header) for r in rows)])
