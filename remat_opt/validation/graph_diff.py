"""Comparing two joint graphs up to renaming (`structural_differences`).

The tests and `benchmarks/deepen_check.py` check an extended graph (`remat_opt.core.deepen`) against a
direct trace of the same depth with it.
"""

from __future__ import annotations

from remat_opt.core.graph import JointGraph, OpNode
from remat_opt.core.layers import op_kind


class _Matcher:
    """Binds names of graph `a` to names of graph `b` as ops are walked in step; records conflicts."""

    def __init__(self):
        self.names: dict[str, str] = {}
        self.tags: dict[str, str] = {}
        self.diffs: list[str] = []

    def bind(self, table: dict[str, str], x: str, y: str, where: str) -> None:
        if table.setdefault(x, y) != y:
            self.diffs.append(f"{where}: {x} maps to {table[x]} and to {y}")

    def ops(self, a: OpNode, b: OpNode) -> None:
        def key(op):
            return (op_kind(op), op.is_backward, repr(op.attrs), op.op_tags, len(op.inputs), len(op.outputs))

        if key(a) != key(b):
            self.diffs.append(f"{a.name} ({a.symbol}) differs from {b.name} ({b.symbol})")
            return
        for x, y in [*zip(a.inputs, b.inputs), *zip(a.outputs, b.outputs)]:
            self.bind(self.names, x, y, a.name)
        for x, y in zip(a.tag_units, b.tag_units):
            self.bind(self.tags, x, y, a.name)
        for m, n in zip(a.members, b.members):
            self.ops(m, n)


def _tensor_differences(a: JointGraph, b: JointGraph, names: dict[str, str]) -> list[str]:
    diffs = []
    for x, y in names.items():
        s, t = a.tensors[x], b.tensors[y]
        if (s.shape, s.dtype, s.nbytes, s.kind, s.storage_bytes) != (t.shape, t.dtype, t.nbytes, t.kind, t.storage_bytes):
            diffs.append(f"tensor {x} {s.shape} {s.dtype} {s.kind} differs from {y} {t.shape} {t.dtype} {t.kind}")
        elif names.get(s.storage, s.storage) != t.storage:
            diffs.append(f"storage of {x} is {s.storage}, of {y} is {t.storage}")
    return diffs


def _saved_differences(a: JointGraph, b: JointGraph, m: _Matcher) -> list[str]:
    diffs = []
    mapped = {m.names.get(n, n) for n in a.saved_names}
    if mapped != set(b.saved_names):
        diffs.append(f"saved sets differ: {len(mapped - set(b.saved_names))} only in a, {len(set(b.saved_names) - mapped)} only in b")
    b_saved = {s.name: s for s in b.saved}
    for s in a.saved:
        t = b_saved.get(m.names.get(s.name, s.name))
        if t is None:
            continue
        target = m.tags.get(s.tag_target, s.tag_target) if s.tag_target else None
        if (s.taggable, s.reason, s.origin_symbol) != (t.taggable, t.reason, t.origin_symbol) or (
            t.tag_target and target != t.tag_target
        ):
            diffs.append(f"origin of saved {s.name} ({s.reason}, {s.tag_target}) differs from {t.name} ({t.reason}, {t.tag_target})")
    return diffs


def structural_differences(a: JointGraph, b: JointGraph, *, limit: int = 10) -> list[str]:
    """How `a` and `b` differ up to a renaming of tensors and tag targets (empty: the same graph).

    Walks both op lists in step, binding names on first sight; then compares every bound tensor
    (shape, dtype, kind, storage), the saved sets and their origins, inputs and outputs.
    """
    for side in ("forward_ops", "backward_ops"):
        if len(getattr(a, side)) != len(getattr(b, side)):
            return [f"{side}: {len(getattr(a, side))} vs {len(getattr(b, side))}"]
    m = _Matcher()
    for x, y in zip(a.ops, b.ops):
        m.ops(x, y)
    diffs = m.diffs + _tensor_differences(a, b, m.names) + _saved_differences(a, b, m)
    for side in ("input_names", "forward_output_names"):
        if len(getattr(a, side)) != len(getattr(b, side)):
            diffs.append(f"{side}: {len(getattr(a, side))} vs {len(getattr(b, side))}")
    return diffs[:limit]


def saved_signatures(graph: JointGraph, saved_names=None) -> dict[str, dict[tuple, int]]:
    """Per layer (`layers.forward_layer_labels` of the producing op), how many saved tensors of each
    ``(producer kind, shape, dtype)`` a graph saves: what two runs of the same model can be matched
    by when their names differ (the nvFuser stand-in's prediction against a real nvFuser run, whose
    regions number differently). Parameters and inputs are left out.

    Args:
        graph: the joint graph.
        saved_names: the saved tensors (a plan's `saved_names`); default: the graph's.
    """
    from remat_opt.core.layers import forward_layer_labels

    labels = forward_layer_labels(graph)
    by_layer: dict[str, dict[tuple, int]] = {}
    for name in graph.saved_names if saved_names is None else saved_names:
        producer = graph.producers.get(name)
        if producer is None or producer.is_backward:
            continue
        tensor = graph.tensors[name]
        key = (op_kind(producer), tuple(tensor.shape), tensor.dtype)
        counts = by_layer.setdefault(labels.get(producer.name, "before"), {})
        counts[key] = counts.get(key, 0) + 1
    return by_layer


def saved_set_differences(predicted: dict[str, dict[tuple, int]], measured: dict[str, dict[tuple, int]]) -> list[str]:
    """Lines naming, per layer, the saved ``(producer kind, shape, dtype)`` whose counts differ
    between two `saved_signatures` (empty: the same saved set up to names)."""
    lines = []
    for layer in dict.fromkeys([*predicted, *measured]):
        p, m = predicted.get(layer, {}), measured.get(layer, {})
        for key in sorted(set(p) | set(m), key=repr):
            if p.get(key, 0) != m.get(key, 0):
                kind, shape, dtype = key
                lines.append(f"{layer}: {_kind_text(kind)} {list(shape)} {dtype}: predicted {p.get(key, 0)}, "
                             f"measured {m.get(key, 0)}")
    return lines


def _kind_text(kind) -> str:
    """`op_kind` for people: a fusion region by its size and last member."""
    if isinstance(kind, tuple):
        last = kind[1][-1] if kind[1] else "?"
        return f"fusion of {len(kind[1])} ops ending in {_kind_text(last)}"
    return str(kind)
