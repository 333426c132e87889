"""What-if analyses behind ``notebooks/what_if.ipynb`` (pure: no Thunder imports).

    costed = cost_graph(graph, "H100")           # the graph's ops priced on one device
    sweep = peak_sweep(costed, 8, label="H100")  # plans from the least peak to save-all
    plot_sweeps([sweep], "Llama-2-7b")           # peak GB and saved GB vs extra step ms
    sdpa_case(costed)                            # what recomputing SDPA frees and costs (#1646)
    saved_bytes_by_layer(graph, plan.saved_names)
    plans_at_peak_budgets(costed, (40, 50, 60))  # feasible? peak, saved, extra ms, what is rerun

GB are 10**9 bytes, as budgets everywhere in remat-opt. Times are seconds unless a name says ``_ms``.
Figures are `matplotlib.figure.Figure` objects made without pyplot, so they show inline in a
notebook (as a cell's value) whatever backend is active, and never pile up in pyplot's registry.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from remat_opt.costing.graph_costs import CostModel
from remat_opt.executors import EXECUTOR_CHOICES
from costmodels.formulas import SDPA_FORMS
from remat_opt.core.graph import REASON_AUXILIARY, JointGraph, OpNode
from remat_opt.core.plan import RematPlan
from remat_opt.planning.planner import PlanRequest, forward_op_times_s, sweep_problem
from remat_opt.core.problem import RecomputeProblem
from remat_opt.core.report import saved_storage_owners, storage_kind
from remat_opt.analysis.training_step import Parameters, TrainingStepPrediction, predict_training_step
from remat_opt.solvers import (
    ILPOptions,
    InfeasibleBudgetError,
    ParetoPoint,
    solve_ilp,
)
from remat_opt.core.errors import GB
from remat_opt.core.layers import find_repeated_blocks, forward_layer_labels

# Thunder issue #1646 (Llama-2-7b, seq 4096, micro-batch 1, 32 layers, bf16, one real H100): the
# blanket recompute rule re-ran the SDPA forward in the backward (lightning-thunder issue #1646).
THUNDER_1646_STEP_MS = {"sdpa saved": 341.78, "sdpa recomputed": 350.15}
THUNDER_1646_MEMORY_GB = {"sdpa saved": 64.18, "sdpa recomputed": 64.17}

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


SWEEP_POINTS_ENV = "REMAT_OPT_WHATIF_POINTS"
TIME_LIMIT_ENV = "REMAT_OPT_WHATIF_TIME_LIMIT_S"
TRACED_LAYERS_ENV = "REMAT_OPT_WHATIF_TRACED_LAYERS"
EXECUTORS_ENV = "REMAT_OPT_WHATIF_EXECUTORS"


def _env_number(name: str, default: str, minimum: float, kind=int):
    value = os.environ.get(name, default)
    try:
        number = kind(value)
    except ValueError:
        number = None
    if number is None or not number >= minimum:
        raise ValueError(f"{name} must be a number >= {minimum:g}, got {value!r}")
    return number


def default_sweep_points() -> int:
    """Budgets per sweep: 8, or ``REMAT_OPT_WHATIF_POINTS`` (the test suite runs the notebook with 2)."""
    return _env_number(SWEEP_POINTS_ENV, "8", 2)


def model_graph(name: str, **kwargs) -> JointGraph:
    """`remat_opt.models.graphs.analyze_model` on meta with the nvFuser stand-in (the GPU step's fusion
    regions and Thunder's rematerialization) and 4 traced layers.

    ``REMAT_OPT_WHATIF_EXECUTORS`` (an `--executors` choice) and ``REMAT_OPT_WHATIF_TRACED_LAYERS``
    change both: the test suite runs the notebook with ``fused-sdpa`` and 3 layers, its cheapest
    traces (the stand-in's regions span layer boundaries, so it needs 4: `tests/core/test_deepen.py`).
    """
    from remat_opt.models.graphs import analyze_model

    executors = os.environ.get(EXECUTORS_ENV, "").strip() or None
    if executors is not None and executors not in EXECUTOR_CHOICES:
        raise ValueError(f"{EXECUTORS_ENV} must be one of {', '.join(EXECUTOR_CHOICES)}, got {executors!r}")
    kwargs.setdefault("executors", executors)
    return analyze_model(name, traced_layers=_env_number(TRACED_LAYERS_ENV, "4", 3), **kwargs)


def ilp_options() -> ILPOptions:
    """The solver's options here: a 10 s limit per solve, or ``REMAT_OPT_WHATIF_TIME_LIMIT_S`` (the
    test suite runs the notebook with 1 s: plans may then be feasible rather than proven optimal)."""
    return ILPOptions(time_limit_s=_env_number(TIME_LIMIT_ENV, "10", 0.1, float))


def peak_sweep(costed: CostedGraph, n_points: int | None = None, *, label: str = "") -> Sweep:
    """Solves the ILP at `n_points` peak budgets (what `remat_opt.pareto_curve(graph, budget_kind="peak")` does).

    A budget the solver finds no plan for is reported in `Sweep.unsolved` instead of raising, so
    one hard budget does not lose the rest of the curve.

    Args:
        costed: the graph priced on a device.
        n_points: number of budgets (at least 2: the least peak and save-all); default:
            `default_sweep_points()`.
        label: legend label; default: the device name.

    Returns:
        The `Sweep`.
    """
    errors: list = []
    n_points = default_sweep_points() if n_points is None else n_points
    request = PlanRequest(time_limit_s=ilp_options().time_limit_s)
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


# --------------------------------------------------------------------------------------------
# The SDPA case (Thunder #1646)
# --------------------------------------------------------------------------------------------


def sdpa_forward_ops(graph: JointGraph) -> tuple[OpNode, ...]:
    """The forward ops that are fused attention kernels (`SDPA_FORWARD_SYMBOLS`)."""
    return tuple(op for op in graph.forward_ops if op.symbol in SDPA_FORWARD_SYMBOLS)


def sdpa_units(problem: RecomputeProblem) -> tuple[str, ...]:
    """Allowed recompute units made of SDPA forward ops only, in forward order."""
    sdpa = {op.name for op in sdpa_forward_ops(problem.graph)}
    return tuple(u.name for u in problem.units.values() if u.allowed and u.ops and set(u.ops) <= sdpa)


def count_sdpa_recomputed(graph: JointGraph, plan: RematPlan) -> int:
    """How many SDPA forward ops `plan` reruns in the backward."""
    sdpa = {op.name for op in sdpa_forward_ops(graph)}
    return sum(op in sdpa for op in plan.recompute_ops)


def sdpa_auxiliary_bytes(graph: JointGraph) -> int:
    """Saved bytes of SDPA's auxiliary outputs (logsumexp, RNG state), distinct storages.

    They are what #1646's rule freed: it reran the SDPA kernel for them and kept its output saved.
    """
    names = set(graph.saved_names)
    auxiliary = [
        out for op in sdpa_forward_ops(graph) for out in op.outputs
        if out in names and (origin := graph.origins.get(out)) is not None and origin.reason == REASON_AUXILIARY
    ]
    return graph.storage_bytes(auxiliary)


def sdpa_verdict(sweeps: Iterable[Sweep]) -> str:
    """Whether the solver reruns an SDPA forward at any budget of the sweeps, in one sentence."""
    sweeps = list(sweeps)
    picks = [f"{s.label} at {p.swept_budget_bytes / GB:.2f} GB ({n} SDPA ops)"
             for s in sweeps for p, n in zip(s.points, s.sdpa_recomputed) if n]
    n_plans = sum(len(s.points) for s in sweeps)
    if not picks:
        return f"The solver reruns no SDPA forward in any of the {n_plans} plans of the sweeps."
    return f"The solver reruns SDPA in {len(picks)} of {n_plans} plans: " + "; ".join(picks) + "."


@dataclass(frozen=True)
class SdpaCase:
    """Recomputing every SDPA forward in the backward, against save-all.

    Attributes:
        n_sdpa_ops: SDPA forward ops in the graph.
        units: the recompute units tagged (SDPA ops only).
        saved_freed_bytes: saved bytes the SDPA plan frees (output and auxiliaries).
        peak_freed_bytes: how much lower its simulated step peak is.
        auxiliary_bytes: the part of the saved bytes that is SDPA auxiliaries (#1646 freed these).
        extra_time_s: what the SDPA plan adds to a step (rerunning the SDPA forwards).
        step_time_s: predicted save-all step time.
    """

    n_sdpa_ops: int
    units: tuple[str, ...]
    saved_freed_bytes: int
    peak_freed_bytes: int
    auxiliary_bytes: int
    extra_time_s: float
    step_time_s: float


def sdpa_case(costed: CostedGraph) -> SdpaCase:
    """Plans that tag only the SDPA units vs save-all (`RecomputeProblem.plan_for` on both)."""
    problem = costed.problem
    units = sdpa_units(problem)
    save_all = problem.plan_for((), solver="save_all", status="heuristic", solve_time_s=0.0)
    sdpa = problem.plan_for(units, solver="sdpa_only", status="heuristic", solve_time_s=0.0)
    return SdpaCase(
        n_sdpa_ops=len(sdpa_forward_ops(costed.graph)),
        units=units,
        saved_freed_bytes=save_all.saved_bytes - sdpa.saved_bytes,
        peak_freed_bytes=save_all.peak_bytes - sdpa.peak_bytes,
        auxiliary_bytes=sdpa_auxiliary_bytes(costed.graph),
        extra_time_s=sdpa.extra_time_s,
        step_time_s=costed.step_time_s,
    )


def sdpa_case_rows(case: SdpaCase) -> list[dict[str, str]]:
    """#1646 as measured, as it happened by our model (auxiliaries freed), and the SDPA plan.

    The "% of measured step" column compares with the measured Llama-2-7b step on one H100, so it
    means something for that model and device only.
    """
    measured_step_ms = THUNDER_1646_STEP_MS["sdpa saved"]
    measured_ms = THUNDER_1646_STEP_MS["sdpa recomputed"] - measured_step_ms
    measured_gb = THUNDER_1646_MEMORY_GB["sdpa saved"] - THUNDER_1646_MEMORY_GB["sdpa recomputed"]
    extra_ms = case.extra_time_s * 1e3
    predicted = {"extra ms": f"{extra_ms:.2f}",
                 "% of predicted step": f"{100 * extra_ms / (case.step_time_s * 1e3):.2f}",
                 "% of measured step": f"{100 * extra_ms / measured_step_ms:.2f}"}
    return [
        {"what": "Thunder #1646, measured on one H100", "GB freed": f"{measured_gb:.2f}",
         "extra ms": f"{measured_ms:.2f}", "% of predicted step": "-",
         "% of measured step": f"{100 * measured_ms / measured_step_ms:.2f}"},
        {"what": "SDPA rerun for its auxiliaries only, output kept (as #1646), predicted",
         "GB freed": f"{case.auxiliary_bytes / GB:.3f}", **predicted},
        {"what": f"tag the {len(case.units)} SDPA units (output and auxiliaries freed), predicted",
         "GB freed": f"{case.saved_freed_bytes / GB:.3f} (peak {case.peak_freed_bytes / GB:.3f})", **predicted},
    ]


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


def plan_at_peak_gb(costed: CostedGraph, budget_gb: float) -> RematPlan:
    """The ILP plan under a step-peak budget (as `remat_opt.plan_graph(graph, budget_gb=..., device_spec=...)`).

    Raises:
        InfeasibleBudgetError: the budget is below the smallest feasible peak (named in GB).
    """
    try:
        return solve_ilp(costed.problem, peak_budget_bytes=round(budget_gb * GB), options=ilp_options())
    except InfeasibleBudgetError as e:
        raise e.to_gb() from e


def plans_at_peak_budgets(costed: CostedGraph, budgets_gb: Iterable[float]) -> list[BudgetOutcome]:
    """`plan_at_peak_gb` at each budget; an infeasible budget gives its error message, not a raise."""
    outcomes = []
    for budget_gb in budgets_gb:
        try:
            outcomes.append(BudgetOutcome(budget_gb=budget_gb, plan=plan_at_peak_gb(costed, budget_gb)))
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


def plot_sweeps(sweeps: Sequence[Sweep], title: str = ""):
    """Peak GB (left) and saved GB (right) against predicted extra step time, one line per sweep.

    Returns:
        A `matplotlib.figure.Figure` (no pyplot: a notebook shows it as a cell's value).
    """
    from matplotlib.figure import Figure

    from remat_opt.analysis.curves import style_curve_axes

    fig = Figure(figsize=(11, 4.2))
    peak_ax, saved_ax = fig.subplots(1, 2)
    for sweep in sweeps:
        extra_ms = [p.extra_time_s * 1e3 for p in sweep.points]
        peak_ax.plot(extra_ms, [p.peak_bytes / GB for p in sweep.points], marker="o", label=sweep.label)
        saved_ax.plot(extra_ms, [p.saved_bytes / GB for p in sweep.points], marker="s", label=sweep.label)
    for ax, what in ((peak_ax, "predicted step peak"), (saved_ax, "saved for backward")):
        style_curve_axes(ax, f"{what} (GB)")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_saved_bytes(breakdowns: Mapping[str, Mapping[str, int]], title: str = "", *, horizontal: bool = False):
    """Grouped bars of saved GB per key (layer or op kind), one bar colour per plan.

    Args:
        breakdowns: plan name -> (key -> bytes), e.g. ``{"save-all": ..., "50 GB plan": ...}``.
        title: figure title.
        horizontal: bars along y (long key lists such as op kinds).
    """
    import numpy as np
    from matplotlib.figure import Figure

    keys = list(dict.fromkeys(k for b in breakdowns.values() for k in b))
    fig = Figure(figsize=(11, max(3.5, 0.28 * len(keys)) if horizontal else 4))
    ax = fig.subplots()
    width = 0.8 / max(1, len(breakdowns))
    for i, (name, breakdown) in enumerate(breakdowns.items()):
        where = np.arange(len(keys)) + i * width
        values = [breakdown.get(k, 0) / GB for k in keys]
        (ax.barh if horizontal else ax.bar)(where, values, width, label=name)
    ticks = np.arange(len(keys)) + 0.4 - width / 2
    if horizontal:
        ax.set_yticks(ticks, keys, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("saved for backward (GB)")
    else:
        ax.set_xticks(ticks, keys, rotation=90, fontsize=7)
        ax.set_ylabel("saved for backward (GB)")
    ax.margins(**({"x": 0.1} if horizontal else {"y": 0.25}))  # room for the legend
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right" if horizontal else "upper center", ncols=1 if horizontal else len(breakdowns))
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def write_llama2_7b_h100_png(png_path: str | Path, *, sweep: Sweep | None = None, n_points: int = 8) -> Path:
    """Writes the Llama-2-7b (32 layers, seq 4096, bf16) H100 peak-budget Pareto curve as a PNG.

    Args:
        png_path: where to write, e.g. ``"docs/pareto_llama2_7b_h100.png"``.
        sweep: an H100 `peak_sweep` of that graph; None analyzes and sweeps it (minutes: traces).
        n_points: budgets when sweeping here.

    Returns:
        `png_path` as a `Path`.
    """
    from remat_opt.analysis.curves import plot_curve

    if sweep is None:
        from remat_opt.models.graphs import analyze_model

        graph = analyze_model("Llama-2-7b-hf", seq=4096, batch=1, dtype="bfloat16")
        sweep = peak_sweep(cost_graph(graph, "H100"), n_points, label="H100")
    title = "Llama-2-7b-hf, 32 layers, seq 4096, micro-batch 1, bf16, costed for H100 (peak budgets)"
    with tempfile.TemporaryDirectory() as tmp:  # plot_curve also writes an SVG; only the PNG is kept
        png, _ = plot_curve(sweep.points, png_path, Path(tmp) / "pareto.svg", title)
    return png


# --------------------------------------------------------------------------------------------
# The seed benchmark (Thunder's benchmark_litgpt.py, #1646), predicted
# --------------------------------------------------------------------------------------------


def benchmark_parameters(name: str, parallel=None, **spec) -> Parameters:
    """The trainable parameters of litgpt config `name` (built on meta): what AdamW keeps states for;
    one rank's under `parallel` (`remat_opt.distributed.data_parallel.DataParallel`: FSDP shards them)."""
    from remat_opt.models.by_name import ModelSpec, trainable_parameters

    numels, dtype = trainable_parameters(ModelSpec(name, **spec))
    return Parameters(numels, dtype).per_rank(parallel)


@dataclass(frozen=True)
class SeedPrediction:
    """#1646's two runs of `benchmark_litgpt.py` predicted: SDPA kept (save-all) and SDPA rerun in the
    backward for its logsumexp with its output kept (the blanket rule #1646 reported).

    Attributes:
        kept: the save-all iteration (`remat_opt.analysis.training_step.TrainingStepPrediction`).
        rerun_peak_bytes: the peak with the SDPA auxiliaries not saved (freed at the peak when it
            comes before the backward starts freeing saved tensors; otherwise the same peak).
        rerun_time_s: the iteration time plus rerunning every SDPA forward.
    """

    kept: TrainingStepPrediction
    rerun_peak_bytes: int
    rerun_time_s: float


def seed_prediction(costed: CostedGraph, parameters: Parameters) -> SeedPrediction:
    """Predicts #1646's iterations for `costed` (Llama-2-7b, seq 4096, bf16 on an H100 for the seed)."""
    kept = predict_training_step(costed.graph, CostModel(costed.graph, costed.device), parameters)
    # every auxiliary is saved (and not yet freed) from the forward's end until the backward starts
    freed = sdpa_auxiliary_bytes(costed.graph) if kept.peak_phase in ("loss", "loss backward") else 0
    return SeedPrediction(kept, kept.peak_bytes - freed, kept.time_s + sdpa_case(costed).extra_time_s)


def seed_rows(seed: SeedPrediction) -> list[dict[str, str]]:
    """Predicted vs measured peak and iteration time of #1646's two runs, with the error."""
    rows = []
    for label, key, peak_bytes, time_s in (
        ("SDPA kept (save-all)", "sdpa saved", seed.kept.peak_bytes, seed.kept.time_s),
        ("SDPA rerun for its logsumexp, output kept (#1646's rule)", "sdpa recomputed", seed.rerun_peak_bytes,
         seed.rerun_time_s),
    ):
        measured_gb, measured_ms = THUNDER_1646_MEMORY_GB[key], THUNDER_1646_STEP_MS[key]
        rows.append({
            "run": label,
            "peak GB predicted / measured": f"{peak_bytes / GB:.2f} / {measured_gb:.2f}",
            "error": f"{100 * (peak_bytes / GB / measured_gb - 1):+.1f}%",
            "ms predicted / measured": f"{time_s * 1e3:.1f} / {measured_ms:.2f}",
            "error ": f"{100 * (time_s * 1e3 / measured_ms - 1):+.1f}%",
        })
    return rows


def seed_breakdown_rows(seed: SeedPrediction) -> list[dict[str, str]]:
    """What the save-all prediction is made of: live memory at the peak and time, term by term."""
    step = seed.kept
    memory = [{"term": f"memory at the peak ({step.peak_phase}): {k}", "value": f"{v / GB:.3f} GB"}
              for k, v in step.memory_terms.items()]
    time = [{"term": f"time: {k}", "value": f"{v * 1e3:.2f} ms"} for k, v in step.time_terms.items()]
    phases = [{"term": f"peak of phase: {k}", "value": f"{v / GB:.3f} GB"} for k, v in step.phase_peaks.items()]
    return memory + phases + time
