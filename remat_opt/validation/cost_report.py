"""Predicted against measured: the roofline of the formulas compared with a cost table's times."""

from __future__ import annotations

import math
from dataclasses import dataclass

from costmodels.devices import cpu_device_spec, get_device_spec
from costmodels.formulas import is_measured
from costmodels.table import CostTable, op_key
from remat_opt.costing.graph_costs import CostModel, op_args
from remat_opt.core.graph import JointGraph


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):  # ties share their average rank
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman rank correlation of two equally long lists (ties get average ranks)."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"spearman needs two lists of equal length >= 2, got {len(xs)} and {len(ys)}")
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / var if var else float("nan")


def rank_agreement(predicted_s: dict[str, float], measured_s: dict[str, float], keys=None) -> float:
    """Spearman of two per-key time maps (e.g. a cost table's and the in-step times of
    `remat_opt.validation.step_timing`) over the keys both have, and only those in `keys` when given."""
    shared = [k for k in predicted_s if k in measured_s and (keys is None or k in keys)]
    if len(shared) < 2:
        return float("nan")
    return spearman([predicted_s[k] for k in shared], [measured_s[k] for k in shared])


@dataclass(frozen=True, slots=True)
class Comparison:
    """Roofline prediction against measurement, per distinct op and in total.

    Attributes:
        rows: ``(op key, symbol, predicted_s, measured_s)`` per measured distinct op.
        spearman: rank correlation of predicted and measured over `rows`.
        predicted_total_s: roofline time of every op of the graph, repeats included.
        measured_total_s: measured time of every op, the roofline where an op was not measured.
        measured_ops: ops of the graph with a measured time.
        ops: ops of the graph.
    """

    rows: tuple[tuple[str, str, float, float], ...]
    spearman: float
    predicted_total_s: float
    measured_total_s: float
    measured_ops: int
    ops: int


def compare(graph: JointGraph, table: CostTable) -> Comparison:
    """Compares the roofline on the table's device (calibration or sheet) with the table's times."""
    device = cpu_device_spec(table.calibration, table.device) if table.calibration else get_device_spec(table.device)
    predicted = CostModel(graph, device)
    measured = CostModel(graph, device, table)
    rows = {}
    for op in graph.ops:
        cost = measured.op_cost(op)
        if is_measured(cost.source):
            key = op_key(op_args(graph, op))
            rows.setdefault(key, (key, op.symbol, predicted.op_cost(op).time_s, cost.time_s))
    rows = tuple(rows.values())
    return Comparison(
        rows=rows,
        spearman=spearman([r[2] for r in rows], [r[3] for r in rows]) if len(rows) > 1 else float("nan"),
        predicted_total_s=predicted.total_time_s(),
        measured_total_s=measured.total_time_s(),
        measured_ops=sum(is_measured(measured.op_cost(op).source) for op in graph.ops),
        ops=len(graph.ops),
    )


def format_comparison(comparison: Comparison, *, per_op: bool = True) -> str:
    """Text report: one line per distinct measured op (slowest first), then Spearman and totals."""
    lines = []
    if per_op:
        lines.append(f"{'predicted_ms':>12} {'measured_ms':>12} {'ratio':>6}  op")
        for key, _symbol, pred, meas in sorted(comparison.rows, key=lambda r: -r[3]):
            lines.append(f"{pred * 1e3:12.4f} {meas * 1e3:12.4f} {pred / meas:6.2f}  {key[:140]}")
    measured = f"{comparison.measured_ops}/{comparison.ops}"
    lines.append(f"distinct ops measured: {len(comparison.rows)}; ops measured: {measured}")
    lines.append(f"Spearman rank correlation (roofline vs measured, per distinct op): {comparison.spearman:.3f}")
    lines.append(
        f"forward+backward total: predicted {comparison.predicted_total_s * 1e3:.3f} ms, "
        f"measured {comparison.measured_total_s * 1e3:.3f} ms "
        f"(ratio {comparison.predicted_total_s / comparison.measured_total_s:.2f})"
    )
    return "\n".join(lines)
