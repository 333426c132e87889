"""Comparing two joint graphs up to renaming (`structural_differences`).

The tests and `benchmarks/deepen_check.py` check an extended graph (`remat_opt.deepen`) against a
direct trace of the same depth with it.
"""

from __future__ import annotations

from remat_opt.graph import JointGraph, OpNode
from remat_opt.layers import op_kind


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
