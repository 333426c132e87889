"""The plan of a compilation as a readable table and as data, for `remat_opt.explain(jitted)` and
`remat-opt plan` (no Thunder imports here; `remat_opt.explain` finds a jitted function's `CostRemat`
lazily). Named `explanation` so that importing it never shadows the `remat_opt.explain` function."""

from __future__ import annotations

from dataclasses import dataclass

from remat_opt.planning.planner import PlannedStep
from remat_opt.core.plan import INPUT, RECOMPUTE
from remat_opt.core.report import format_bytes, render_table


@dataclass(frozen=True, slots=True)
class ExplainRow:
    """One tensor the backward needs: saved, recomputed or an input."""

    tensor: str
    producer: str | None
    shape: tuple[int, ...]
    dtype: str
    storage: str
    storage_bytes: int
    action: str
    recompute_ms: float
    tag_target: str | None
    reason: str
    # of `recompute_ms`: the `OpCost.source` of its ops joined by "+" ("measured", "formula",
    # "measured region", "region share"; "-": not recomputed)
    cost_source: str = "-"


@dataclass(frozen=True)
class Explanation:
    """The plan of one compilation: rows, totals and solver status."""

    rows: tuple[ExplainRow, ...]
    summary: str
    solver: str
    status: str
    gap: float | None
    saved_bytes: int
    save_all_bytes: int
    peak_bytes: int
    save_all_peak_bytes: int
    extra_time_s: float
    recomputed_tag_targets: tuple[str, ...]
    cached: bool
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "rows"}
        data["recomputed_tag_targets"] = list(self.recomputed_tag_targets)
        data["notes"] = list(self.notes)
        data["rows"] = [{k: getattr(r, k) for k in r.__slots__} for r in self.rows]
        return data

    def totals(self) -> list[str]:
        """Saved bytes, predicted peak, extra time and solver status, one line each."""
        gap = "" if self.gap is None else f", gap {self.gap:.2%}"
        return [
            f"saved for backward: {format_bytes(self.saved_bytes)} (save-all {format_bytes(self.save_all_bytes)})",
            f"predicted step peak: {format_bytes(self.peak_bytes)} (save-all {format_bytes(self.save_all_peak_bytes)})",
            f"extra recompute time: {self.extra_time_s * 1e3:.3f} ms; "
            f"{len(self.recomputed_tag_targets)} tags; solver {self.solver} ({self.status}{gap})"
            + ("; plan reused from cache" if self.cached else ""),
            *(f"note: {note}" for note in self.notes),
        ]

    def by_producer(self) -> list[dict]:
        """Tensors grouped by (producing symbol, action): count and bytes, the most bytes first.

        Each storage counts once, in the group of the first row that holds it, so the saved groups
        sum to `saved_bytes`.
        """
        groups: dict[tuple[str, str], dict] = {}
        counted: set[tuple[str, str]] = set()
        for r in self.rows:
            if r.action != INPUT:
                group = groups.setdefault((r.producer or "-", r.action), {"tensors": 0, "bytes": 0})
                group["tensors"] += 1
                if (r.action, r.storage) not in counted:
                    counted.add((r.action, r.storage))
                    group["bytes"] += r.storage_bytes
        rows = [{"producer": p, "action": a, **g} for (p, a), g in groups.items()]
        return sorted(rows, key=lambda r: (r["action"], -r["bytes"], r["producer"]))

    def summary_table(self) -> str:
        """`by_producer` as a table, then `totals` (what `remat-opt plan --summary` prints)."""
        rows = [[r["producer"], r["action"], str(r["tensors"]), format_bytes(r["bytes"])] for r in self.by_producer()]
        return "\n".join([*render_table(rows, ["producer", "action", "tensors", "bytes"]), "", *self.totals()])

    def __str__(self) -> str:
        rows = [
            [r.tensor, r.producer or "-", "x".join(map(str, r.shape)), r.dtype, format_bytes(r.storage_bytes),
             r.action, f"{r.recompute_ms:.3f} ({r.cost_source})" if r.action == RECOMPUTE else "-", r.tag_target or "-",
             r.reason]
            for r in self.rows
            if r.action != INPUT
        ]
        header = ["tensor", "producer", "shape", "dtype", "bytes", "action", "recompute ms (cost)", "tag target", "reason"]
        return "\n".join([*render_table(rows, header), "", *self.totals()])


def _cost_source(step: PlannedStep, op_names) -> str:
    """Where the recompute time of these ops came from: a measured table, formulas, or both."""
    sources = sorted({step.costs.op_cost(op).source for op in op_names})
    return "+".join(sources) if sources else "-"


def _reason(step: PlannedStep, name: str, action: str, storage_bytes: int) -> str:
    origin = step.graph.origins.get(name)
    if action == INPUT:
        return "input or parameter"
    if action != RECOMPUTE and storage_bytes == 0:
        return "saved at no cost: its storage is counted with another tensor or an input"
    if action == RECOMPUTE:
        request = step.request
        if request.peak_budget_bytes is None and request.activation_budget_bytes is None:
            return "recomputed: re-derived at no cost (a view), which saves its memory"
        return "recomputed: cheaper than its memory under the budget"
    if origin is not None and not origin.taggable:
        return origin.reason
    unit = step.problem.unit_of_tensor.get(name)
    if unit is not None and not step.problem.units[unit].allowed:
        return step.problem.units[unit].reason
    return "saved: recomputing it costs more time than the budget requires"


def explain_step(step: PlannedStep) -> Explanation:
    """Builds the `Explanation` of a planned compilation."""
    graph, plan, times = step.graph, step.plan, step.problem.op_time_s
    rows = []
    for d in plan.decisions:
        tensor = graph.tensors[d.name]
        producer = graph.producers.get(d.name)
        rows.append(
            ExplainRow(
                tensor=d.name,
                producer=producer.symbol if producer else None,
                shape=tensor.shape,
                dtype=tensor.dtype,
                storage=d.storage,
                storage_bytes=d.storage_bytes,
                action=d.action,
                recompute_ms=1e3 * sum(times.get(op, 0.0) for op in d.recompute_ops),
                tag_target=d.tag_target,
                reason=_reason(step, d.name, d.action, d.storage_bytes),
                cost_source=_cost_source(step, d.recompute_ops) if d.action == RECOMPUTE else "-",
            )
        )
    save_all = step.problem.plan_for((), solver="save_all", status="baseline", solve_time_s=0.0)
    if step.fusion is not None:  # what Thunder's own fusion pass saves without tags, not the unfused graph
        save_all = step.fusion.save_all
    return Explanation(
        rows=tuple(rows),
        summary=plan.summary(),
        solver=plan.solver,
        status=plan.status,
        gap=plan.gap,
        saved_bytes=plan.saved_bytes,
        save_all_bytes=save_all.saved_bytes,
        peak_bytes=plan.peak_bytes,
        save_all_peak_bytes=save_all.peak_bytes,
        extra_time_s=plan.extra_time_s,
        recomputed_tag_targets=plan.recomputed_tag_targets,
        cached=step.cached,
        notes=(*step.remarks, *_source_legend(rows), *graph.notes),
    )


_LEGEND = {
    "measured region": "'measured region': a fusion region timed whole, through the callable Thunder built for it",
    "region share": ("'region share': an unfused op's own time scaled by how its fusion regions, timed whole, compare "
                     "with their ops' own times (a recomputed op runs fused in the backward)"),
}


def _source_legend(rows) -> list[str]:
    """What the cost sources of the recomputed rows that come from whole-region measurements mean."""
    used = {source for r in rows for source in r.cost_source.split("+")}
    return [text for source, text in _LEGEND.items() if source in used]
