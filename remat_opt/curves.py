"""Pareto curves of a remat plan sweep as CSV, PNG and SVG (pure functions; no Thunder imports).

    points = remat_opt.pareto_curve(graph, 8, device_spec="H100")
    write_csv(points, "pareto_out/pareto.csv")
    plot_curve(points, "pareto_out/pareto.png", "pareto_out/pareto.svg", "Llama-2-7b-hf on H100")

`points` are `remat_opt.solvers.pareto.ParetoPoint`s (anything with ``budget_bytes``, ``peak_bytes``,
``saved_bytes``, ``extra_time_s`` and ``plan.recomputed_tag_targets``).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

GB = 10**9

CSV_COLUMNS = (
    "budget_bytes",
    "budget_gb",
    "peak_bytes",
    "peak_gb",
    "saved_bytes",
    "saved_gb",
    "extra_time_ms",
    "recomputed_tags",
    "solver_status",
)


def point_row(point) -> dict:
    """One CSV row (a dict keyed by `CSV_COLUMNS`) for a `ParetoPoint`."""
    plan = getattr(point, "plan", None)
    return {
        "budget_bytes": point.budget_bytes,
        "budget_gb": f"{point.budget_bytes / GB:.6f}",
        "peak_bytes": point.peak_bytes,
        "peak_gb": f"{point.peak_bytes / GB:.6f}",
        "saved_bytes": point.saved_bytes,
        "saved_gb": f"{point.saved_bytes / GB:.6f}",
        "extra_time_ms": f"{point.extra_time_s * 1e3:.6f}",
        "recomputed_tags": len(plan.recomputed_tag_targets) if plan is not None else "",
        "solver_status": getattr(plan, "status", ""),
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
    from remat_opt.report import render_table

    header = ["budget GB", "peak GB", "saved GB", "extra ms", "tags", "status"]
    rows = []
    for p in points:
        r = point_row(p)
        rows.append([f"{p.budget_bytes / GB:.4g}", f"{p.peak_bytes / GB:.4g}", f"{p.saved_bytes / GB:.4g}",
                     f"{p.extra_time_s * 1e3:.3f}", str(r["recomputed_tags"]), str(r["solver_status"])])
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
