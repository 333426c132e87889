"""Deep models from a few traced layers: extend a joint graph by repeating one layer.

Thunder's tracing time grows with depth (a 32-layer Llama-2-7b takes ~6 minutes on 2 cores), yet
every layer of a transformer compiles to the same ops. `extend_layers(graph, extra_layers)` takes
the joint graph of a model traced with a few layers and returns the graph of the same model with
`extra_layers` more: it copies one middle layer (the *template*) forward and backward with fresh
tensor and tag-target names, and rewires its neighbours, so that planning, peak simulation and
`explain` see the whole depth. `analyze_model` traces a litgpt config with 4 layers on the meta
device and extends it to the config's depth.

How layers are found: the forward ops and, separately, the backward ops each form one periodic run
(`find_periodic_run`); backward blocks are matched to forward layers through the saved tensors they
read. An op in a layer reads tensors of its own layer, of a neighbour (the residual stream forward,
the incoming gradient backward), or of no layer (inputs shared by all layers, such as RoPE tables).
Copies keep each read's layer offset. Anything that breaks this (an op outside the layers reading
the template, a tag target spread over layers) raises `DeepenError` rather than guessing.

`structural_differences(a, b)` compares two graphs up to renaming; the tests check an extended
graph against a direct trace of the same depth with it.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import cached_property

from remat_opt.graph import JointGraph, OpNode, TensorOrigin
from remat_opt.solvers.blocks import RepeatedBlocks, find_periodic_run, find_repeated_blocks, op_kind, op_signature_codes

COPY_SEPARATOR = "@L"  # copy names read "t123@L7": template tensor t123 in layer 7 ("@2L" when taken)


class DeepenError(ValueError):
    """The graph's layers cannot be found or replicated; the message says what broke."""


@dataclass(frozen=True)
class _Layers:
    """Which layer every op, tensor and tag target of a traced graph belongs to (absent: none)."""

    graph: JointGraph
    forward: RepeatedBlocks
    backward: RepeatedBlocks
    backward_layer_of_block: tuple[int, ...]
    op_layer: dict[str, int]
    tensor_layer: dict[str, int] = field(default_factory=dict)
    tag_layer: dict[str, int | None] = field(default_factory=dict)

    def block_ops(self, layer: int, backward: bool) -> tuple[OpNode, ...]:
        """The ops of `layer`'s forward (or backward) block, in trace order."""
        if backward:
            if layer not in self.backward_layer_of_block:
                raise DeepenError(f"layer {layer} has no backward block")
            run, ops, block = self.backward, self.graph.backward_ops, self.backward_layer_of_block.index(layer)
        else:
            run, ops, block = self.forward, self.graph.forward_ops, layer
        start = run.start + block * run.period
        return ops[start : start + run.period]

    @cached_property
    def covered(self) -> frozenset[int]:
        """Layers with a full forward block and a full backward block."""
        return frozenset(range(self.forward.count)) & frozenset(self.backward_layer_of_block)


def _backward_layers(graph: JointGraph, forward_layer: dict[str, int], run: RepeatedBlocks) -> tuple[int, ...]:
    """The forward layer of each backward block: the layer whose tensors it reads most."""
    producers = graph.producers
    layers = []
    for block in range(run.count):
        ops = graph.backward_ops[run.start + block * run.period : run.start + (block + 1) * run.period]
        read = Counter(
            forward_layer[producers[name].name]
            for op in ops
            for name in op.inputs
            if name in producers and producers[name].name in forward_layer
        )
        if not read:
            raise DeepenError(f"backward block {block} reads no tensor of a forward layer")
        layers.append(read.most_common(1)[0][0])
    if any(b - a != -1 for a, b in zip(layers, layers[1:])):
        raise DeepenError(f"backward blocks do not run through the layers in reverse: {layers}")
    return tuple(layers)


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
        for target in op.tag_units:
            seen.setdefault(target, set()).add(op_layer.get(op.name))
    return {t: (layers.pop() if len(layers) == 1 else None) for t, layers in seen.items()}


def find_layers(graph: JointGraph, *, min_layers: int = 3) -> _Layers:
    """Finds the repeated layers of `graph` (forward and backward blocks), or raises `DeepenError`."""
    forward = find_repeated_blocks(graph, min_count=min_layers)
    backward = find_periodic_run(op_signature_codes(graph, graph.backward_ops), min_count=min_layers)
    if forward is None or backward is None:
        side = "forward" if forward is None else "backward"
        n_ops = len(graph.forward_ops if forward is None else graph.backward_ops)
        raise DeepenError(
            f"no block of the {n_ops} {side} ops repeats {min_layers} or more times: trace at least {min_layers} "
            "layers, or the whole depth when fusion regions span several layers"
        )
    op_layer = {op.name: forward.block_of(op.index) for op in graph.forward_ops if forward.block_of(op.index) is not None}
    backward_layers = _backward_layers(graph, op_layer, backward)
    for op in graph.backward_ops:
        block = backward.block_of(op.index)
        if block is not None:
            op_layer[op.name] = backward_layers[block]
    tensor_layer = _input_layers(graph, op_layer)
    for op in graph.ops:
        if op.name in op_layer:
            written = [*op.outputs, *(out for member in op.members for out in member.outputs)]
            tensor_layer.update(dict.fromkeys(written, op_layer[op.name]))
    return _Layers(graph, forward, backward, backward_layers, op_layer, tensor_layer, _tag_layers(graph, op_layer))


class _Renamer:
    """Names of tensors and tag targets in the extended graph, layer by layer.

    Layers 0..T keep their traced names, layers T+1..T+k are copies of the template T named
    ``f"{name}@L{layer}"``, and traced layers above T move up by k, keeping their names.
    """

    def __init__(self, layers: _Layers, template: int, extra_layers: int):
        self.layers, self.template, self.extra = layers, template, extra_layers
        self.separator = _free_separator([*layers.graph.tensors, *layers.tag_layer])
        self._to_template: dict[int, dict[str, str]] = {}
        self._from_template: dict[int, dict[str, str]] = {}

    def extended_layer(self, layer: int) -> int:
        return layer if layer <= self.template else layer + self.extra

    def is_copy(self, extended_layer: int) -> bool:
        return self.template < extended_layer <= self.template + self.extra

    def traced_layer(self, extended_layer: int) -> int:
        return extended_layer if extended_layer <= self.template else extended_layer - self.extra

    def _alignment(self, layer: int) -> tuple[dict[str, str], dict[str, str]]:
        """(layer's tensor -> template's tensor, and back), from the ops of both, position by position."""
        if layer not in self._to_template:
            if layer not in self.layers.covered:
                raise DeepenError(f"layer {layer} is not fully inside the repeated blocks")
            pairs: dict[str, str] = {}
            for backward in (False, True):
                for op, twin in zip(self.layers.block_ops(layer, backward), self.layers.block_ops(self.template, backward)):
                    _pair_tensors(pairs, op, twin, self.layers.tensor_layer, layer)
            self._to_template[layer] = pairs
            self._from_template[layer] = {t: n for n, t in pairs.items()}
        return self._to_template[layer], self._from_template[layer]

    def name(self, extended_layer: int, template_name: str) -> str:
        """The extended graph's name for `template_name`'s counterpart in `extended_layer`."""
        if self.is_copy(extended_layer):
            return f"{template_name}{self.separator}{extended_layer}"
        return self._alignment(self.traced_layer(extended_layer))[1][template_name]

    def resolve(self, tensor: str, reader_layer: int | None, reader_extended: int | None) -> str:
        """The name that a reader in `reader_extended` (traced as `reader_layer`) reads for `tensor`.

        A read keeps its layer offset; a reader outside the layers reads the layer's new position.
        """
        layer = self.layers.tensor_layer.get(tensor)
        if layer is None:
            return tensor
        target = self.extended_layer(layer) if reader_layer is None else reader_extended + layer - reader_layer
        if not self.is_copy(target) and self.traced_layer(target) == layer:
            return tensor
        if not 0 <= target < self.layers.forward.count + self.extra:
            raise DeepenError(f"{tensor} would be read from layer {target}, outside the model")
        template_name = self._alignment(layer)[0][tensor]
        try:
            return self.name(target, template_name)
        except KeyError as e:
            raise DeepenError(f"{template_name} has no counterpart in layer {target}") from e

    def tag(self, target: str | None, extended_layer: int) -> str | None:
        """A tag target's name for a copy in `extended_layer` (tags outside the template keep theirs)."""
        if target is None or not self.is_copy(extended_layer):
            return target
        layer = self.layers.tag_layer.get(target)
        if layer is None:
            return target
        if layer != self.template:
            raise DeepenError(f"tag target {target} of layer {layer} is used by the template layer {self.template}")
        return f"{target}{self.separator}{extended_layer}"


def _free_separator(names: list[str]) -> str:
    """`COPY_SEPARATOR`, or ``"@2L"``, ``"@3L"``, ... when names already hold it (a graph extended twice)."""
    separator, generation = COPY_SEPARATOR, 1
    while any(separator in name for name in names):
        generation += 1
        separator = COPY_SEPARATOR.replace("@", f"@{generation}")
    return separator


def _pair_tensors(pairs: dict[str, str], op: OpNode, twin: OpNode, tensor_layer: dict[str, int], layer: int) -> None:
    """Pairs `op`'s tensors of `layer` with `twin`'s, position by position (members included)."""
    if op_kind(op) != op_kind(twin):
        raise DeepenError(f"{op.name} ({op.symbol}) does not match {twin.name} ({twin.symbol})")
    ops = [(op, twin), *zip(op.members, twin.members)]
    for a, b in ops:
        for x, y in [*zip(a.outputs, b.outputs), *zip(a.inputs, b.inputs)]:
            if tensor_layer.get(x) != layer:
                continue
            if pairs.setdefault(x, y) != y:
                raise DeepenError(f"{x} pairs with both {pairs[x]} and {y}")


def _choose_template(layers: _Layers) -> int:
    """The first layer with both neighbours repeated whose tensors nothing outside the layers reads."""
    read_from_outside = {
        layers.tensor_layer.get(name) for op in layers.graph.ops if op.name not in layers.op_layer for name in op.inputs
    }
    for layer in sorted(layers.covered):
        if {layer - 1, layer + 1} <= layers.covered and layer not in read_from_outside:
            return layer
    raise DeepenError(
        f"no middle layer to replicate among the fully repeated layers {sorted(layers.covered)}; "
        "trace one or two more layers"
    )


class _OpWriter:
    """Appends renamed ops to the extended forward and backward, numbering them as extract does."""

    def __init__(self, renamer: _Renamer):
        self.renamer = renamer
        self.ops: dict[bool, list[OpNode]] = {False: [], True: []}

    def _renamed(self, op: OpNode, name: str, index: int, layer: int | None, extended: int | None) -> OpNode:
        def rename(tensors):
            return tuple(self.renamer.resolve(t, layer, extended) for t in tensors)

        members = tuple(
            self._renamed(m, f"{name}.{i}", i, layer, extended) for i, m in enumerate(op.members)
        )
        tag_units = tuple(self.renamer.tag(t, extended) for t in op.tag_units) if extended is not None else op.tag_units
        return replace(
            op, name=name, index=index, inputs=rename(op.inputs), outputs=rename(op.outputs),
            members=members, tag_units=tag_units,
        )

    def write(self, op: OpNode, layer: int | None, extended: int | None) -> None:
        """Appends `op` (traced in `layer`) as an op of `extended` (None: outside the layers)."""
        ops = self.ops[op.is_backward]
        name = f"{'bwd' if op.is_backward else 'fwd'}{len(ops)}"
        ops.append(self._renamed(op, name, len(ops), layer, extended))

    def write_copies(self, template_ops: tuple[OpNode, ...], template: int, copies: range) -> None:
        for extended in copies:
            for op in template_ops:
                self.write(op, template, extended)


def _extended_ops(layers: _Layers, renamer: _Renamer) -> tuple[OpNode, ...]:
    """Forward: copies after the template's block, ascending; backward: before it, descending."""
    template, extra = renamer.template, renamer.extra
    copies_up = range(template + 1, template + extra + 1)
    writer = _OpWriter(renamer)
    last_forward = layers.block_ops(template, backward=False)[-1].name
    first_backward = layers.block_ops(template, backward=True)[0].name
    for op in layers.graph.ops:
        if op.name == first_backward:
            writer.write_copies(layers.block_ops(template, backward=True), template, reversed(copies_up))
        layer = layers.op_layer.get(op.name)
        writer.write(op, layer, None if layer is None else renamer.extended_layer(layer))
        if op.name == last_forward:
            writer.write_copies(layers.block_ops(template, backward=False), template, copies_up)
    return (*writer.ops[False], *writer.ops[True])


def _with_copies(names, layers: _Layers, renamer: _Renamer, copy) -> list:
    """`names` with, after each template-layer entry, its copies (`copy(entry, extended_layer)`)."""
    out = []
    for entry in names:
        out.append(entry)
        name = entry.name if isinstance(entry, TensorOrigin) else entry
        if layers.tensor_layer.get(name) == renamer.template:
            out.extend(copy(entry, extended) for extended in range(renamer.template + 1, renamer.template + renamer.extra + 1))
    return out


def _extended_tensors(layers: _Layers, renamer: _Renamer) -> dict:
    def storage_of(tensor, layer, extended):
        return renamer.resolve(tensor.storage, layer, extended)

    tensors = {}
    for name, tensor in layers.graph.tensors.items():
        layer = layers.tensor_layer.get(name)
        extended = None if layer is None else renamer.extended_layer(layer)
        tensors[name] = replace(tensor, storage=storage_of(tensor, layer, extended))
    for name, tensor in layers.graph.tensors.items():
        if layers.tensor_layer.get(name) == renamer.template:
            for extended in range(renamer.template + 1, renamer.template + renamer.extra + 1):
                copy = renamer.resolve(name, renamer.template, extended)
                tensors[copy] = replace(tensor, name=copy, storage=storage_of(tensor, renamer.template, extended))
    return tensors


def extend_layers(
    graph: JointGraph, extra_layers: int, *, min_layers: int = 3, traced_layers: int | None = None
) -> JointGraph:
    """The joint graph of the same model with `extra_layers` more layers (see the module docstring).

    Args:
        graph: a graph traced with at least `min_layers` repeated layers (4 leaves room for the
            template's neighbours when the backward blocks are out of phase with the forward).
        extra_layers: how many copies of the template layer to insert (0 returns `graph`).
        min_layers: fewest repeated blocks accepted.
        traced_layers: the layers the trace had, when known: finding another count is an error.

    Raises:
        DeepenError: the layers cannot be found or replicated faithfully.
    """
    if extra_layers < 0:
        raise ValueError(f"extra_layers must not be negative, got {extra_layers}")
    if extra_layers == 0:
        return graph
    layers = find_layers(graph, min_layers=min_layers)
    if traced_layers is not None and layers.forward.count != traced_layers:
        raise DeepenError(f"found {layers.forward.count} repeated layers in a trace of {traced_layers}; trace every layer")
    template = _choose_template(layers)
    renamer = _Renamer(layers, template, extra_layers)

    def copy_origin(origin: TensorOrigin, extended: int) -> TensorOrigin:
        name = renamer.resolve(origin.name, template, extended)
        return replace(origin, name=name, tag_target=renamer.tag(origin.tag_target, extended))

    origins = _with_copies(graph.origins.values(), layers, renamer, copy_origin)
    return JointGraph(
        ops=_extended_ops(layers, renamer),
        tensors=_extended_tensors(layers, renamer),
        saved=tuple(_with_copies(graph.saved, layers, renamer, copy_origin)),
        input_names=tuple(_with_copies(graph.input_names, layers, renamer, lambda n, e: renamer.resolve(n, template, e))),
        forward_output_names=tuple(
            _with_copies(graph.forward_output_names, layers, renamer, lambda n, e: renamer.resolve(n, template, e))
        ),
        origins={o.name: o for o in origins},
        executors=graph.executors,
        notes=(
            *graph.notes,
            f"extended from {layers.forward.count} traced layers to {layers.forward.count + extra_layers} "
            f"(layer {template} repeated {extra_layers} more times)",
        ),
    )


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


DEFAULT_TRACED_LAYERS = 4


def analyze_spec(spec, *, traced_layers: int = DEFAULT_TRACED_LAYERS, executors: str = "fused-sdpa") -> JointGraph:
    """The joint graph of `spec` (a `remat_opt.models.ModelSpec` of a litgpt config) at full depth.

    Traces `min(depth, traced_layers)` layers and extends the graph to the spec's depth (its
    `n_layer`, else the config's); `traced_layers=0` traces every layer.
    """
    from remat_opt.cli import executors_for
    from remat_opt.extract import analyze
    from remat_opt.models import build_model, litgpt_config

    if traced_layers < 0 or traced_layers in (1, 2):
        raise ValueError(f"traced_layers must be 0 (all) or at least 3, got {traced_layers}")
    depth = litgpt_config(spec)[0].n_layer
    traced = depth if traced_layers == 0 else min(depth, traced_layers)
    start_s = time.perf_counter()
    model, inputs = build_model(replace(spec, n_layer=traced))
    graph = analyze(model, *inputs, executors=executors_for(executors))
    if traced == depth:
        return graph
    graph = extend_layers(graph, depth - traced, traced_layers=traced)
    note = f"{spec.name}: traced {traced} of {depth} layers in {time.perf_counter() - start_s:.1f} s"
    return replace(graph, notes=(*graph.notes, note))


def analyze_model(
    name: str,
    *,
    seq: int,
    batch: int = 1,
    dtype: str = "bfloat16",
    n_layer: int | None = None,
    traced_layers: int = DEFAULT_TRACED_LAYERS,
    executors: str = "fused-sdpa",
    tiny: bool = False,
) -> JointGraph:
    """The joint graph of a litgpt config at full depth, traced on meta with `traced_layers` layers.

    Args:
        name: litgpt config name, e.g. ``"Llama-2-7b-hf"``.
        seq: sequence length.
        batch: micro-batch size.
        dtype: ``"bfloat16"``, ``"float32"`` or ``"float16"``.
        n_layer: depth to plan for (default: the config's).
        traced_layers: layers actually traced (0: all; shallower models are traced whole).
        executors: ``"fused-sdpa"``, ``"default"`` or ``"torch-compile"`` (see `remat-opt inspect`).
        tiny: shrink the config's width (tests).
    """
    from remat_opt.models import ModelSpec

    spec = ModelSpec(name=name, n_layer=n_layer, seq=seq, batch=batch, dtype=dtype, device="meta", tiny=tiny)
    return analyze_spec(spec, traced_layers=traced_layers, executors=executors)
