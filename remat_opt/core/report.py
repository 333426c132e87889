"""Readable and machine-readable reports of a `JointGraph` (pure: no thunder, no torch)."""

from __future__ import annotations

from collections.abc import Iterable

from remat_opt.core.graph import JointGraph, OpNode


_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def format_bytes(n_bytes: int | float) -> str:
    """Formats a byte count with a binary unit and two decimals.

    Args:
        n_bytes: Number of bytes; may be negative (a delta).

    Returns:
        For example ``"512 B"``, ``"1.50 KiB"``, ``"6.00 MiB"``, ``"2.25 GiB"``.
    """
    magnitude = abs(n_bytes)
    for unit, size in _UNITS:
        if magnitude >= size:
            return f"{n_bytes / size:.2f} {unit}"
    return f"{int(n_bytes)} B"


def saved_storage_owners(graph: JointGraph, saved_names: Iterable[str] | None = None) -> dict[str, OpNode | None]:
    """Distinct non-input storages behind `saved_names` (default: everything saved) -> the op that
    allocated each (None when no top-level op did)."""
    names = graph.saved_names if saved_names is None else saved_names
    storages = dict.fromkeys(graph.tensors[n].storage for n in names if not graph.is_input_storage(n))
    return {s: graph.producers.get(s) for s in storages}


def storage_kind(op: OpNode, storage: str) -> str:
    """What allocated `storage`: `op`'s symbol, or for a fusion region (``nvFusion7``), the member
    that computed it, as ``"mul (fused)"`` (region names differ from layer to layer; members do not)."""
    if not op.members:
        return op.symbol
    member = next((m for m in reversed(op.members) if storage in m.outputs), None)
    return f"{member.symbol} (fused)" if member is not None else "fusion region"


def saved_groups(graph: JointGraph) -> list[dict]:
    """Saved activation storages grouped by what allocated them (`storage_kind`).

    Every storage is counted once, in the group of its owner, so the group bytes sum to
    `graph.saved_activation_bytes`.
    """
    owners = saved_storage_owners(graph)
    groups: dict[str, dict] = {}
    for name in graph.saved_names:
        if graph.is_input_storage(name):
            continue
        owner = graph.tensors[name].storage
        kind = storage_kind(owners[owner], owner) if owners[owner] else "?"
        group = groups.setdefault(kind, {"tensors": 0, "storages": set()})
        group["tensors"] += 1
        group["storages"].add(owner)
    rows = []
    for symbol, group in groups.items():
        n_bytes = sum(graph.tensors[s].storage_bytes for s in group["storages"])
        rows.append({"op": symbol, "tensors": group["tensors"], "storages": len(group["storages"]), "bytes": n_bytes})
    return sorted(rows, key=lambda r: (-r["bytes"], r["op"]))


def top_saved(graph: JointGraph, top: int) -> list[dict]:
    """The `top` largest saved activation storages, with their tag target and reason."""
    by_storage: dict[str, dict] = {}
    for saved in graph.saved:
        if graph.is_input_storage(saved.name):
            continue
        tensor = graph.tensors[saved.name]
        owner = graph.tensors[tensor.storage]
        if owner.name in by_storage:
            continue
        op = graph.producers.get(owner.name)
        by_storage[owner.name] = {
            "name": saved.name,
            "storage": owner.name,
            "shape": list(owner.shape),
            "dtype": owner.dtype,
            "bytes": owner.storage_bytes,
            "producer": (op.symbol if not op.members else f"{op.symbol}: {storage_kind(op, owner.name)}") if op else None,
            "tag_target": saved.tag_target,
            "taggable": saved.taggable,
            "reason": saved.reason,
        }
    return sorted(by_storage.values(), key=lambda r: (-r["bytes"], r["name"]))[:top]


def inspect_report(graph: JointGraph, *, model: dict | None = None, analysis_s: float | None = None,
                   top: int = 10) -> dict:
    """Everything `remat-opt inspect` prints, as JSON-ready data (`model`: `models.describe_model`)."""
    input_storages = {graph.tensors[n].storage for n in graph.saved_names if graph.is_input_storage(n)}
    return {
        "model": model,
        "executors": list(graph.executors),
        "saved_tensors": len(graph.saved),
        "saved_activation_bytes": graph.saved_activation_bytes,
        "saved_activation_storages": len({graph.tensors[n].storage for n in graph.saved_names}) - len(input_storages),
        "saved_input_bytes": graph.saved_bytes - graph.saved_activation_bytes,
        "saved_bytes": graph.saved_bytes,
        "forward_ops": len(graph.forward_ops),
        "backward_ops": len(graph.backward_ops),
        "groups": saved_groups(graph),
        "top": top_saved(graph, top),
        "notes": list(graph.notes),
        "analysis_s": analysis_s,
    }


def render_table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return [fmt.format(*header), *(fmt.format(*map(str, r)) for r in rows)]


def format_model(description: dict) -> str:
    """``Llama-2-7b-hf n_layer=2 seq=128 batch=1 float32 on meta`` from `remat_opt.models.by_name.describe_model`."""
    sizes = " ".join(f"{k}={description[k]}" for k in ("n_layer", "seq", "batch") if k in description)
    text = " ".join(p for p in (description.get("name", "?"), sizes, description.get("dtype", "")) if p)
    return text + (f" on {description['device']}" if "device" in description else "")


def render_inspect(report: dict) -> str:
    """Human-readable `remat-opt inspect` output."""
    total = report["saved_activation_bytes"]
    lines = [
        format_model(report["model"] or {}),
        f"executors: {', '.join(report['executors'])}",
        f"saved for backward: {format_bytes(total)} of activations in "
        f"{report['saved_activation_storages']} storages ({report['saved_tensors']} tensors), "
        f"plus {format_bytes(report['saved_input_bytes'])} of inputs and parameters (alive anyway)",
        "",
        "by producing op:",
    ]
    rows = [
        [g["op"], g["tensors"], g["storages"], format_bytes(g["bytes"]), f"{100 * g['bytes'] / max(total, 1):.1f}%"]
        for g in report["groups"]
    ]
    lines += ["  " + line for line in render_table(rows, ["op", "tensors", "storages", "bytes", "share"])]
    lines += ["", f"largest saved storages (top {len(report['top'])}):"]
    rows = [
        [t["name"], "x".join(map(str, t["shape"])), t["dtype"], format_bytes(t["bytes"]), t["producer"],
         t["tag_target"] or "-", t["reason"]]
        for t in report["top"]
    ]
    header = ["tensor", "shape", "dtype", "bytes", "producer", "tag target", "reason"]
    lines += ["  " + line for line in render_table(rows, header)]
    lines += [f"note: {n}" for n in report["notes"]]
    if report["analysis_s"] is not None:
        lines.append(f"analysis took {report['analysis_s']:.1f} s")
    return "\n".join(lines)
