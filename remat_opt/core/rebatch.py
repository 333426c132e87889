"""`rebatch`: the joint graph at any micro-batch size from the graphs traced at two sizes.

A transformer's trace does not change with the micro-batch size except in sizes: the same ops in
the same order, the same tensors, with the batch dimension (alone, or folded into another one, as
``logits.reshape(-1, vocab)`` folds it into ``batch x seq``) scaled. Given the graphs traced at
two micro-batches ``a < b``, every size that differs between them is taken as linear in the batch,
``v(m) = v(a) + (v(b) - v(a)) (m - a) / (b - a)``: tensor shapes, bytes and storage bytes, op
workspaces, and integer arguments of ops (a reshape's target shape). Anything else that differs
(an op, a name, a dtype, a non-integer argument) means the graph does not scale this way:
`RebatchError` says what.

Micro-batch 1 is not on that line: Thunder traces size-1 dimensions differently (litgpt tiny
Llama-2: 576 tensors at micro-batch 1, 571 at 2, 3 and 4, named alike from 2 on), so the sizes
come from micro-batches 2 and 3 and micro-batch 1 is traced itself. Exact where sizes are linear
in the batch, which two traces cannot prove by themselves: `tests/core/test_rebatch.py` checks the
graph at micro-batch 4 against a direct trace. Pure: no Thunder, no torch.
"""

from __future__ import annotations

from dataclasses import replace

from remat_opt.core.graph import JointGraph, OpNode, TensorNode


class RebatchError(ValueError):
    """The two graphs differ in more than sizes linear in the batch; the message names the first difference."""


class _Line:
    """Sizes at micro-batches `low` and `high` -> the size at `batch`."""

    def __init__(self, low: int, high: int, batch: int):
        self.low, self.high, self.batch = low, high, batch

    def __call__(self, one: int, two: int, where: str = "a size") -> int:
        if one == two:
            return one
        step, rest = divmod((two - one) * (self.batch - self.low), self.high - self.low)
        value = one + step
        if rest or value < 0:
            raise RebatchError(f"{where}: {one} at micro-batch {self.low} and {two} at {self.high} are not on a line "
                               f"through micro-batch {self.batch} in whole non-negative sizes")
        return value


def _sizes(one, two, line: _Line, where: str):
    """A size, or a nested tuple of sizes, at the line's batch."""
    if isinstance(one, bool) or isinstance(two, bool):
        if one != two:
            raise RebatchError(f"{where}: {one!r} at micro-batch {line.low}, {two!r} at {line.high}")
        return one
    if isinstance(one, int) and isinstance(two, int):
        return line(one, two, where)
    if isinstance(one, tuple) and isinstance(two, tuple) and len(one) == len(two):
        return tuple(_sizes(a, b, line, where) for a, b in zip(one, two))
    if one != two:
        raise RebatchError(f"{where}: {one!r} at micro-batch {line.low}, {two!r} at {line.high}")
    return one


def _tensor(one: TensorNode, two: TensorNode, line: _Line) -> TensorNode:
    where = f"tensor {one.name}"
    if (one.dtype, one.device, one.storage, one.kind) != (two.dtype, two.device, two.storage, two.kind) \
            or len(one.shape) != len(two.shape):
        raise RebatchError(f"{where} differs beyond its sizes between micro-batch {line.low} and {line.high}")
    return replace(one, shape=_sizes(one.shape, two.shape, line, where), nbytes=line(one.nbytes, two.nbytes, where),
                   storage_bytes=line(one.storage_bytes, two.storage_bytes, where))


def _op(one: OpNode, two: OpNode, line: _Line) -> OpNode:
    where = f"op {one.name} ({one.symbol})"
    same = ("name", "symbol", "is_backward", "index", "inputs", "outputs", "op_tags", "tag_units")
    if any(getattr(one, f) != getattr(two, f) for f in same) or len(one.members) != len(two.members) \
            or [k for k, _ in one.attrs] != [k for k, _ in two.attrs]:
        raise RebatchError(f"{where} differs beyond its sizes between micro-batch {line.low} and {line.high}")
    attrs = tuple((k, _sizes(a, b, line, f"{where}, argument {k}")) for (k, a), (_, b) in zip(one.attrs, two.attrs))
    members = tuple(_op(a, b, line) for a, b in zip(one.members, two.members))
    return replace(one, attrs=attrs, members=members,
                   workspace_bytes=line(one.workspace_bytes, two.workspace_bytes, where))


def rebatch(low: tuple[int, JointGraph], high: tuple[int, JointGraph], batch: int) -> JointGraph:
    """The graph at micro-batch `batch` from ``(micro-batch, graph)`` of the same model traced at two
    sizes (2 and 3: see the module docstring).

    Raises:
        RebatchError: the graphs differ in more than sizes (their ops, tensors or saved sets), or a
            size is not linear in the batch; trace at `batch` instead.
        ValueError: the micro-batches are not positive integers with ``low < high``.
    """
    (low_batch, at_low), (high_batch, at_high) = low, high
    values = (low_batch, high_batch, batch)
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values) or low_batch >= high_batch:
        raise ValueError(f"micro-batches must be positive integers with low < high, got {values}")
    if batch in (low_batch, high_batch):
        return at_low if batch == low_batch else at_high
    if len(at_low.ops) != len(at_high.ops) or at_low.tensors.keys() != at_high.tensors.keys():
        raise RebatchError(f"the graphs at micro-batch {low_batch} and {high_batch} have different ops or tensors "
                           f"({len(at_low.ops)} vs {len(at_high.ops)} ops, {len(at_low.tensors)} vs "
                           f"{len(at_high.tensors)} tensors)")
    same = ("saved", "input_names", "forward_output_names", "origins", "executors")
    differing = [f for f in same if getattr(at_low, f) != getattr(at_high, f)]
    if differing:
        raise RebatchError(f"the graphs at micro-batch {low_batch} and {high_batch} differ in {differing[0]}")
    line = _Line(low_batch, high_batch, batch)
    ops = tuple(_op(a, b, line) for a, b in zip(at_low.ops, at_high.ops))
    tensors = {name: _tensor(t, at_high.tensors[name], line) for name, t in at_low.tensors.items()}
    note = (f"micro-batch {batch}: sizes taken as linear in the batch from the graphs traced at {low_batch} "
            f"and {high_batch}")
    return replace(at_low, ops=ops, tensors=tensors, notes=(*at_low.notes, note))
