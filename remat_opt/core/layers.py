"""Where the repeated layers of a joint graph are: the one home of layer detection.

Transformer graphs repeat one block per layer. `find_repeated_blocks` finds the longest periodic
run of forward-op signatures (symbol, shapes, dtypes, attributes, tags, taggability);
`find_layers` also finds the backward blocks (matched to forward layers through the saved tensors
they read), the *satellites* of each layer (ops outside the blocks that serve one layer only: the
collectives of its weights, which Thunder's wait sorting moves to the forward's start and the
backward's end) and assigns every op, tensor and tag target to its layer; `forward_layer_labels`
names the layer of each forward op for reports. Used by the solvers (ties between blocks), by
`remat_opt.core.deepen` (copying a layer) and by `remat_opt.analysis.whatif` (memory per layer).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from remat_opt.core.graph import JointGraph, OpNode


class LayerError(ValueError):
    """The graph's layers cannot be found; the message says what broke."""


@dataclass(frozen=True, slots=True)
class RepeatedBlocks:
    """`count` consecutive blocks of `period` forward ops starting at forward op index `start`."""

    start: int
    period: int
    count: int

    def block_of(self, index: int) -> int | None:
        offset = index - self.start
        if offset < 0 or offset >= self.period * self.count:
            return None
        return offset // self.period


def op_kind(op: OpNode):
    """An op's symbol; for a fusion region (``TorchCompile7``, ``nvFusion3``), its members' symbols.

    Fusion regions are numbered through the trace, so equal regions in two layers differ by name.
    """
    return ("fusion", tuple(op_kind(m) for m in op.members)) if op.members else op.symbol


def _signature(graph: JointGraph, op: OpNode) -> tuple:
    def meta(names):
        return tuple((graph.tensors[n].shape, graph.tensors[n].dtype) for n in names)

    origins = tuple(
        (o.taggable, o.reason) if (o := graph.origins.get(n)) is not None else None for n in op.outputs
    )
    return (op_kind(op), meta(op.outputs), meta(op.inputs), repr(op.attrs), tuple(sorted(op.op_tags)), origins)


def op_signature_codes(graph: JointGraph, ops) -> np.ndarray:
    """One integer per op; equal codes mean equal signatures (symbol, shapes, dtypes, attributes, tags)."""
    codes: dict[tuple, int] = {}
    return np.array([codes.setdefault(_signature(graph, op), len(codes)) for op in ops], dtype=np.int64)


def find_periodic_run(codes: np.ndarray, *, min_block_ops: int = 8, min_count: int = 2) -> RepeatedBlocks | None:
    """The periodic run of `codes` covering the most entries (shortest period on ties), or None."""
    best, best_cover = None, 0
    for period in range(min_block_ops, len(codes) // min_count + 1):
        eq = np.concatenate(([False], codes[:-period] == codes[period:], [False]))
        edges = np.flatnonzero(np.diff(eq.astype(np.int8)))
        if len(edges) == 0:
            continue
        starts, ends = edges[0::2], edges[1::2]
        longest = int(np.argmax(ends - starts))
        count = (int(ends[longest] - starts[longest]) + period) // period
        if count >= min_count and (count - 1) * period > best_cover:
            best, best_cover = RepeatedBlocks(int(starts[longest]), period, count), (count - 1) * period
    return best


def find_repeated_blocks(graph: JointGraph, *, min_block_ops: int = 8, min_count: int = 2) -> RepeatedBlocks | None:
    """The periodic run of forward ops covering the most ops (shortest period on ties), or None.

    Args:
        graph: the joint graph.
        min_block_ops: shortest block considered.
        min_count: fewest repetitions considered.
    """
    codes = op_signature_codes(graph, graph.forward_ops)
    return find_periodic_run(codes, min_block_ops=min_block_ops, min_count=min_count)


def forward_layer_labels(graph: JointGraph) -> dict[str, str]:
    """Forward op name -> ``"layer k"`` (the k-th repeated block), ``"before"`` or ``"after"``.

    Layers are `find_repeated_blocks`' periodic run; a graph without one is all ``"before"``.
    """
    blocks = find_repeated_blocks(graph)
    labels = {}
    for op in graph.forward_ops:
        block = blocks.block_of(op.index) if blocks is not None else None
        if block is not None:
            labels[op.name] = f"layer {block}"
        else:
            labels[op.name] = "before" if blocks is None or op.index < blocks.start else "after"
    return labels


def block_sequence(ops) -> tuple[OpNode, ...]:
    """The ops whose periodic run marks the layers: all but collectives. Thunder's wait sorting
    moves an FSDP weight's all-gather and wait, and a gradient's reduction, out of the layers (in
    the blocks of one trace, at the edges of another); they join their layer as satellites."""
    return tuple(op for op in ops if "collective" not in op.op_tags)


@dataclass(frozen=True)
class Layers:
    """Which layer every op, tensor and tag target of a traced graph belongs to (absent: none).

    `forward` and `backward` index `block_sequence` of the forward and backward ops; `op_layer`
    holds the blocks' ops and the satellites (`satellite_layer`): ops outside the blocks that feed
    one layer only or only carry its results away (see `find_layers`). A satellite's group is the
    layer the trace orders it with: its own, or the next one (`_feeders`).
    """

    graph: JointGraph
    forward: RepeatedBlocks
    backward: RepeatedBlocks
    backward_layer_of_block: tuple[int, ...]
    op_layer: dict[str, int]
    tensor_layer: dict[str, int] = field(default_factory=dict)
    tag_layer: dict[str, int | None] = field(default_factory=dict)
    satellite_layer: dict[str, int] = field(default_factory=dict)
    satellite_group: dict[str, int] = field(default_factory=dict)

    def block_ops(self, layer: int, backward: bool) -> tuple[OpNode, ...]:
        """The ops of `layer`'s forward (or backward) block, in trace order (satellites excluded)."""
        if backward:
            if layer not in self.backward_layer_of_block:
                raise LayerError(f"layer {layer} has no backward block")
            run, ops, block = self.backward, self.backward_sequence, self.backward_layer_of_block.index(layer)
        else:
            run, ops, block = self.forward, self.forward_sequence, layer
        start = run.start + block * run.period
        return ops[start : start + run.period]

    @cached_property
    def forward_sequence(self) -> tuple[OpNode, ...]:
        return block_sequence(self.graph.forward_ops)

    @cached_property
    def backward_sequence(self) -> tuple[OpNode, ...]:
        return block_sequence(self.graph.backward_ops)

    def satellites(self, layer: int) -> tuple[OpNode, ...]:
        """`layer`'s satellites, in trace order."""
        return tuple(op for op in self.graph.ops if self.satellite_layer.get(op.name) == layer)

    @cached_property
    def covered(self) -> frozenset[int]:
        """Layers with a full forward block and a full backward block."""
        return frozenset(range(self.forward.count)) & frozenset(self.backward_layer_of_block)


def _backward_layers(graph: JointGraph, forward_layer: dict[str, int], run: RepeatedBlocks,
                     sequence: tuple[OpNode, ...]) -> tuple[int, ...]:
    """The forward layer of each backward block: consecutive layers in reverse, the run that reads
    most tensors of its own layers (block by block, the most-read layer would do, but fusion regions
    that span a layer boundary make a block read two layers almost equally)."""
    producers = graph.producers
    reads = []
    for block in range(run.count):
        ops = sequence[run.start + block * run.period : run.start + (block + 1) * run.period]
        read = Counter(
            forward_layer[producers[name].name]
            for op in ops
            for name in op.inputs
            if name in producers and producers[name].name in forward_layer
        )
        if not read:
            raise LayerError(f"backward block {block} reads no tensor of a forward layer")
        reads.append(read)
    tops = range(run.count - 1, max(forward_layer.values(), default=0) + 1)
    scores = {top: sum(read[top - block] for block, read in enumerate(reads)) for top in tops}
    best = max(scores.values(), default=0)
    if best == 0 or list(scores.values()).count(best) > 1:
        most_read = [read.most_common(1)[0][0] for read in reads]
        raise LayerError(f"backward blocks do not run through the layers in reverse: {most_read}")
    top = max(scores, key=scores.get)
    return tuple(range(top, top - run.count, -1))


def _input_layers(graph: JointGraph, op_layer: dict[str, int]) -> dict[str, int]:
    """Inputs (parameters) read by the forward ops of exactly one layer belong to it."""
    found = {}
    for name in graph.input_names:
        readers = [op for op in graph.consumers.get(name, ()) if not op.is_backward]
        layers = {op_layer.get(op.name) for op in readers}
        if len(layers) == 1 and None not in layers:
            found[name] = layers.pop()
    return found


def _tag_layers(graph: JointGraph, op_layer: dict[str, int]) -> dict[str, int | None]:
    """Tag target -> its layer, or None when ops outside one layer carry it."""
    seen: dict[str, set] = {}
    for op in graph.forward_ops:
        for target in _tag_targets_of(graph, op):
            seen.setdefault(target, set()).add(op_layer.get(op.name))
    return {t: (layers.pop() if len(layers) == 1 else None) for t, layers in seen.items()}


def _tag_targets_of(graph: JointGraph, op) -> list[str]:
    """Every tag target `op` carries: its own `tag_units`, its fusion members' (a region's
    members keep the tags of the ops they were), and its outputs' origins (what a region's
    recomputation is tagged by)."""
    targets = [*op.tag_units, *(t for member in op.members for t in member.tag_units)]
    origins = (graph.origins.get(name) for name in op.outputs)
    return [*targets, *(o.tag_target for o in origins if o is not None and o.tag_target)]


def _feeders(graph: JointGraph, op_layer: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Ops outside the blocks that feed one layer only (an FSDP weight's all-gather and wait, the
    weight's broadcast, a layer's slice of the RoPE tables, zeros a backward pads), as op name ->
    (layer, group): they read nothing a block writes, and only blocks and other such feeders read
    their outputs: one layer's forward block (their layer) and that layer's backward block or the
    next one's (their group: with fusion regions across layer boundaries, a layer's first norm
    weight is read by the previous layer's forward block; the trace orders it with its group)."""
    written = {name for op in graph.ops if op.name in op_layer for name in op.outputs}
    reads: dict[str, tuple[set, set]] = {}  # feeder -> layers reading it (forward, backward)
    for op in reversed(graph.ops):  # readers come later in the trace
        if op.name in op_layer or any(name in written for name in op.inputs):
            continue
        forward, backward, readers = set(), set(), [r for name in op.outputs for r in graph.consumers.get(name, ())]
        for reader in readers:
            if reader.name in op_layer:
                (backward if reader.is_backward else forward).add(op_layer[reader.name])
            elif reader.name in reads:
                forward.update(reads[reader.name][0])
                backward.update(reads[reader.name][1])
            else:
                break
        else:
            lag = min(backward) - min(forward) if forward and backward else 0
            if readers and len(forward) <= 1 and len(backward) <= 1 and lag in (-1, 0, 1):
                reads[op.name] = (forward, backward)
    return {name: (min(forward or backward), min(backward or forward)) for name, (forward, backward) in reads.items()}


def _drains(graph: JointGraph, op_layer: dict[str, int]) -> dict[str, int]:
    """Ops outside the blocks that only carry one layer's results away: they read only tensors that
    layer or other such drains write, and only such drains read theirs (a gradient's division,
    reduction and wait under FSDP or DDP)."""
    producers = graph.producers
    found: dict[str, int] = {}
    for op in graph.ops:
        if op.name in op_layer or not op.inputs:
            continue
        writers = {op_layer.get(p.name, found.get(p.name)) if (p := producers.get(name)) else None for name in op.inputs}
        if len(writers) == 1 and None not in writers:
            found[op.name] = writers.pop()
    for op in reversed(graph.ops):  # drop those read by anything else (the head reads the last layer)
        if op.name in found:
            readers = {found.get(r.name) for name in op.outputs for r in graph.consumers.get(name, ())}
            if readers - {found[op.name]}:
                del found[op.name]
    return found


def find_layers(graph: JointGraph, *, min_layers: int = 3) -> Layers:
    """Finds the repeated layers of `graph` (forward and backward blocks of `block_sequence`, and
    the satellites of each layer), or raises `LayerError`."""
    forward_ops, backward_ops = block_sequence(graph.forward_ops), block_sequence(graph.backward_ops)
    forward = find_periodic_run(op_signature_codes(graph, forward_ops), min_count=min_layers)
    backward = find_periodic_run(op_signature_codes(graph, backward_ops), min_count=min_layers)
    if forward is None or backward is None:
        side = "forward" if forward is None else "backward"
        n_ops = len(forward_ops if forward is None else backward_ops)
        if any(op.members for op in graph.ops):
            advice = (f"fusion regions span layer boundaries, so trace at least {min_layers + 1} layers "
                      "(or every layer)")
        else:
            advice = f"trace at least {min_layers} layers"
        raise LayerError(f"no block of the {n_ops} {side} ops repeats {min_layers} or more times: {advice}")
    op_layer = {op.name: forward.block_of(i) for i, op in enumerate(forward_ops) if forward.block_of(i) is not None}
    backward_layers = _backward_layers(graph, op_layer, backward, backward_ops)
    for i, op in enumerate(backward_ops):
        block = backward.block_of(i)
        if block is not None:
            op_layer[op.name] = backward_layers[block]
    feeders = _feeders(graph, op_layer)
    satellite_layer = {**{name: layer for name, (layer, _) in feeders.items()}, **_drains(graph, op_layer)}
    satellite_group = {**satellite_layer, **{name: group for name, (_, group) in feeders.items()}}
    op_layer.update(satellite_layer)
    tensor_layer = _input_layers(graph, op_layer)
    for op in graph.ops:
        if op.name in op_layer:
            written = [*op.outputs, *(out for member in op.members for out in member.outputs)]
            tensor_layer.update(dict.fromkeys(written, op_layer[op.name]))
    return Layers(graph, forward, backward, backward_layers, op_layer, tensor_layer, _tag_layers(graph, op_layer),
                  satellite_layer, satellite_group)
