"""Pareto curves of a remat plan sweep as CSV, PNG and SVG (pure functions; no Thunder imports).

    points = remat_opt.pareto_curve(graph, 8, device_spec="H100")
    write_csv(points, "pareto_out/pareto.csv")
    plot_curve(points, "pareto_out/pareto.png", "pareto_out/pareto.svg", "Llama-2-7b-hf on H100")

`points` are `remat_opt.solvers.pareto.ParetoPoint`s (anything with ``budget_kind``,
``swept_budget_bytes``, ``peak_bytes``, ``saved_bytes``, ``extra_time_s`` and
``plan.recomputed_tag_targets``).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from remat_opt.core.errors import GB

CSV_COLUMNS = (
    "budget_kind",
    "swept_budget_bytes",
    "swept_budget_gb",
    "peak_bytes",
    "peak_gb",
    "saved_bytes",
    "saved_gb",
    "extra_time_ms",
    "recomputed_tags",
    "solver_status",
    "solver",
    "gap",
)


def point_row(point) -> dict:
    """One CSV row (a dict keyed by `CSV_COLUMNS`) for a `ParetoPoint`."""
    plan = getattr(point, "plan", None)
    return {
        "budget_kind": point.budget_kind,
        "swept_budget_bytes": point.swept_budget_bytes,
        "swept_budget_gb": f"{point.swept_budget_bytes / GB:.6f}",
        "peak_bytes": point.peak_bytes,
        "peak_gb": f"{point.peak_bytes / GB:.6f}",
        "saved_bytes": point.saved_bytes,
        "saved_gb": f"{point.saved_bytes / GB:.6f}",
        "extra_time_ms": f"{point.extra_time_s * 1e3:.6f}",
        "recomputed_tags": len(plan.recomputed_tag_targets) if plan is not None else "",
        "solver_status": getattr(plan, "status", ""),
        "solver": getattr(plan, "solver", ""),
        # the plan's relative optimality gap (certified by the solver's lower bound); empty: unknown
        "gap": "" if getattr(plan, "gap", None) is None else f"{plan.gap:.6f}",
    }


def write_csv(points: Sequence, path: str | Path) -> Path:
    """Writes one row per point (header `CSV_COLUMNS`) to `path`, creating its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for point in points:
            writer.writerow(point_row(point))
    return path


def render_points(points: Sequence) -> str:
    """The points as a text table (what `remat-opt pareto` prints)."""
    from remat_opt.core.report import render_table

    kinds = {p.budget_kind for p in points}
    header = [f"{kinds.pop() if len(kinds) == 1 else 'swept'} budget GB", "peak GB", "saved GB", "extra ms", "tags",
              "status", "gap"]
    rows = []
    for p in points:
        r = point_row(p)
        gap = "" if r["gap"] == "" else f"{float(r['gap']):.2%}"  # certified by the solver's lower bound
        rows.append([f"{p.swept_budget_bytes / GB:.4g}", f"{p.peak_bytes / GB:.4g}", f"{p.saved_bytes / GB:.4g}",
                     f"{p.extra_time_s * 1e3:.3f}", str(r["recomputed_tags"]), str(r["solver_status"]), gap])
    return "\n".join(render_table(rows, header))


def style_curve_axes(ax, ylabel: str) -> None:
    """Labels, zero-based y, grid and legend of a memory-vs-extra-time plot (shared by every curve)."""
    ax.set_xlabel("predicted extra step time (ms)")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()


def plot_curve(points: Sequence, png_path: str | Path, svg_path: str | Path, title: str = "") -> tuple[Path, Path]:
    """Plots peak GB and saved GB against predicted extra step time (ms) to a PNG and an SVG.

    Uses matplotlib's Agg backend (no display needed); creates the output folders.
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    png_path, svg_path = Path(png_path), Path(svg_path)
    for p in (png_path, svg_path):
        p.parent.mkdir(parents=True, exist_ok=True)
    extra_ms = [p.extra_time_s * 1e3 for p in points]
    peak_gb = [p.peak_bytes / GB for p in points]
    saved_gb = [p.saved_bytes / GB for p in points]

    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        ax.plot(extra_ms, peak_gb, marker="o", label="predicted step peak")
        ax.plot(extra_ms, saved_gb, marker="s", linestyle="--", label="saved for backward")
        style_curve_axes(ax, "GB (10^9 bytes)")
        if title:
            ax.set_title(title, fontsize=9)
        fig.tight_layout()
        fig.savefig(png_path, dpi=120)
        fig.savefig(svg_path)
    finally:
        plt.close(fig)
    return png_path, svg_path


def plot_timeline(timelines: dict, png_path: str | Path, title: str = "", measured: dict | None = None) -> Path:
    """Draws the predicted live memory over one training step, one panel per timeline (e.g.
    ``{"save-all": ..., "plan": ...}``, `remat_opt.core.simulation.PeakTimeline` values), stacked by
    `remat_opt.core.simulation.MEMORY_KINDS`, with the forward/backward boundary and the peak marked; each panel
    also draws the other timelines' totals, dashed, for comparison. `measured` (same keys, live bytes
    in time order, e.g. `remat_opt.validation.measure.PeakMeasurement.timeline_bytes`) adds a last panel with
    the measured curves and the predicted peaks. Returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    from remat_opt.core.simulation import MEMORY_KINDS

    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    names = list(timelines)
    peak = max(t.peak_bytes for t in timelines.values())
    scale, unit = next((f, u) for f, u in ((GB, "GB"), (10**6, "MB"), (10**3, "kB"), (1, "B")) if peak >= f or f == 1)
    n_panels = len(names) + (1 if measured else 0)
    fig, axes = plt.subplots(n_panels, 1, figsize=(9, 2.8 * n_panels + 0.6), sharex=False, squeeze=False)
    try:
        for ax, name in zip(axes[:, 0], names):
            timeline = timelines[name]
            layers = list(zip(*timeline.kind_bytes)) if timeline.kind_bytes else []
            x = range(len(timeline.live_bytes))
            ax.stackplot(x, *[[b / scale for b in layer] for layer in layers], labels=MEMORY_KINDS, alpha=0.85)
            for other in names:
                if other != name:
                    totals = [b / scale for b in timelines[other].live_bytes]
                    ax.plot(range(len(totals)), totals, "k--", linewidth=0.8, label="total of the other panel")
            if "backward start" in timeline.labels:
                ax.axvline(timeline.labels.index("backward start"), color="grey", linewidth=0.8)
            ax.plot([timeline.peak_index], [timeline.peak_bytes / scale], "rv")
            ax.annotate(f"peak {timeline.peak_bytes / scale:.3g} {unit}", (timeline.peak_index, timeline.peak_bytes / scale),
                        textcoords="offset points", xytext=(4, 4), fontsize=8)
            ax.set_title(f"{name}: forward | backward (ops in order)", fontsize=9)
            ax.set_ylabel(f"{unit} (10^{len(str(scale)) - 1} bytes)" if scale > 1 else "bytes")
            ax.grid(alpha=0.3)
        if measured:
            ax = axes[-1, 0]
            for i, (name, series) in enumerate(measured.items()):
                color = f"C{i}"
                ax.plot(range(len(series)), [b / scale for b in series], color=color, linewidth=0.9,
                        label=f"{name}: measured")
                if name in timelines:
                    ax.axhline(timelines[name].peak_bytes / scale, color=color, linestyle=":", linewidth=0.9)
            ax.set_title("measured (allocator events in time order); dotted: predicted peaks", fontsize=9)
            ax.set_ylabel(f"{unit} (10^{len(str(scale)) - 1} bytes)" if scale > 1 else "bytes")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="upper left")
        handles, labels = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=4, frameon=False)
        if title:
            fig.suptitle(title, fontsize=9)
        fig.tight_layout(rect=(0, 0.08, 1, 1))
        fig.savefig(png_path, dpi=120)
    finally:
        plt.close(fig)
    return png_path
