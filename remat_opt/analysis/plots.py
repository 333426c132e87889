"""Figures of what-if sweeps and saved-memory breakdowns (`matplotlib.figure.Figure` objects made
without pyplot, so they show inline in a notebook as a cell's value whatever backend is active, and
never pile up in pyplot's registry), and the README's Llama-2-7b H100 Pareto PNG."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from remat_opt.analysis.whatif import Sweep, cost_graph, peak_sweep
from remat_opt.core.errors import GB


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
