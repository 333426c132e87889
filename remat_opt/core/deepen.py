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

Layers are found by `remat_opt.core.layers`; `remat_opt.validation.graph_diff.structural_differences` compares an
extended graph with a direct trace; `remat_opt.models.graphs.analyze_model` traces and extends.
"""

from __future__ import annotations

from dataclasses import replace

from remat_opt.core.graph import JointGraph, OpNode, TensorOrigin
from remat_opt.core.layers import LayerError, Layers, find_layers, op_kind

COPY_SEPARATOR = "@L"  # copy names read "t123@L7": template tensor t123 in layer 7 ("@2L" when taken)


class DeepenError(LayerError):
    """The graph's layers cannot be found or replicated; the message says what broke."""


class _Renamer:
    """Names of tensors and tag targets in the extended graph, layer by layer.

    Layers 0..T keep their traced names, layers T+1..T+k are copies of the template T named
    ``f"{name}@L{layer}"``, and traced layers above T move up by k, keeping their names.
    """

    def __init__(self, layers: Layers, template: int, extra_layers: int):
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
            twins = [
                *(zip(self.layers.block_ops(layer, b), self.layers.block_ops(self.template, b)) for b in (False, True)),
                _satellite_twins(self.layers, layer, self.template),
            ]
            for op, twin in (pair for ops in twins for pair in ops):
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


def _satellite_twins(layers: Layers, layer: int, template: int) -> list[tuple[OpNode, OpNode]]:
    """`layer`'s satellites paired with the template's in trace order, when they are the same ops
    (the first and last layers' may differ: their tensors are then read only by their own layer)."""
    mine, theirs = layers.satellites(layer), layers.satellites(template)
    if [op_kind(op) for op in mine] != [op_kind(op) for op in theirs]:
        return []
    return list(zip(mine, theirs))


def _choose_template(layers: Layers) -> int:
    """The first layer with both neighbours repeated whose tensors nothing outside the layers reads."""
    read_from_outside = {
        layers.tensor_layer.get(name) for op in layers.graph.ops if op.name not in layers.op_layer for name in op.inputs
    }
    for layer in sorted(layers.covered):
        if {layer - 1, layer + 1} <= layers.covered and layer not in read_from_outside:
            _check_nothing_written_outside_for(layers, layer)
            return layer
    raise DeepenError(
        f"no middle layer to replicate among the fully repeated layers {sorted(layers.covered)}; "
        "trace one or two more layers"
    )


def _check_nothing_written_outside_for(layers: Layers, layer: int) -> None:
    """Raises `DeepenError` when an op outside the layers writes a tensor that only `layer` reads
    (such as a fusion region taking in every layer's weights, as the nvFuser stand-in makes of DDP's
    forward): copying the layer would need a part of that op."""
    producers = layers.graph.producers
    for op in layers.graph.ops:
        if layers.op_layer.get(op.name) != layer:
            continue
        for name in op.inputs:
            writer = producers.get(name)
            if writer is None or writer.name in layers.op_layer or layers.tensor_layer.get(name) is not None:
                continue
            readers = {layers.op_layer.get(reader.name) for reader in layers.graph.consumers[name]}
            if readers == {layer}:
                raise DeepenError(f"{writer.name} ({writer.symbol}) writes {name} outside the layers, read by layer {layer} "
                                  "alone: copying the layer would need a part of that op")


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


def _neighbour_run(layers: Layers, ops: tuple[OpNode, ...], index: int, step: int) -> tuple[int | None, list[OpNode]]:
    """The group of the satellite at `index` and the run of that group's satellites from it in
    direction `step` (in trace order); (None, []) when `index` holds no satellite."""
    group, run = None, []
    while 0 <= index < len(ops) and layers.satellite_group.get(ops[index].name) is not None:
        if group is not None and layers.satellite_group[ops[index].name] != group:
            break
        group = layers.satellite_group[ops[index].name]
        run.append(ops[index])
        index += step
    return group, run[::step]


def _satellite_segments(layers: Layers, template: int) -> dict[str, tuple[tuple[OpNode, ...], bool]]:
    """The template group's satellites as runs of consecutive ops, by first and last op name, each
    with whether its copies go before it (the groups' runs descend there) or after it (they
    ascend), as a direct trace of the deeper model orders them; a neighbour group's run must match."""
    ops, found = layers.graph.ops, {}
    index = 0
    while index < len(ops):
        if layers.satellite_group.get(ops[index].name) != template:
            index += 1
            continue
        end = index
        while end < len(ops) and layers.satellite_group.get(ops[end].name) == template:
            end += 1
        segment = ops[index:end]
        (before_group, before), (after_group, after) = (_neighbour_run(layers, ops, index - 1, -1),
                                                        _neighbour_run(layers, ops, end, 1))
        if template + 1 in (before_group, after_group):
            descending, twin = before_group == template + 1, before if before_group == template + 1 else after
        elif template - 1 in (before_group, after_group):
            descending, twin = after_group == template - 1, after if after_group == template - 1 else before
        else:
            raise DeepenError(f"{segment[0].name} ({segment[0].symbol}) and {len(segment) - 1} more ops serve only layer "
                              f"{template} outside its blocks, with no other layer's beside them: cannot tell where copies go")
        if [op_kind(op) for op in twin] != [op_kind(op) for op in segment]:
            raise DeepenError(f"{segment[0].name} ({segment[0].symbol}) and {len(segment) - 1} more ops serve only layer "
                              f"{template} outside its blocks, but the neighbour layer's beside them differ")
        found[segment[0].name] = found[segment[-1].name] = (segment, descending)
        index = end
    return found


class _SatelliteWriter:
    """Writes satellites where their group puts them. A satellite of the layer before its group
    (`Layers.satellite_group`) stands, in each group, for that layer's counterpart: the template
    group's copy k holds layer T+k-1's, and the traced group T+1, moved up, holds the last copy's."""

    def __init__(self, layers: Layers, renamer: _Renamer, writer: _OpWriter):
        self.layers, self.renamer, self.writer = layers, renamer, writer
        self._twins: dict[int, dict[str, OpNode]] = {}  # layer -> its satellites' template counterparts

    def _in_template(self, op: OpNode) -> OpNode:
        """`op`'s counterpart among the template's satellites (`op` itself when it is one)."""
        template, layer = self.renamer.template, self.layers.satellite_layer[op.name]
        if layer == template:
            return op
        twins = self._twins.setdefault(layer, {a.name: b for a, b in _satellite_twins(self.layers, layer, template)})
        if op.name not in twins:
            raise DeepenError(f"{op.name} ({op.symbol}) of layer {layer} has no counterpart among layer {template}'s "
                              "satellites: the layers' collectives differ")
        return twins[op.name]

    def write(self, op: OpNode, group: int) -> None:
        """Writes, into extended `group`, the counterpart of `op` (a satellite) that the group holds."""
        lag = self.layers.satellite_group[op.name] - self.layers.satellite_layer[op.name]
        layer, extended = self.layers.satellite_layer[op.name], group - lag
        if extended == self.renamer.extended_layer(layer):
            self.writer.write(op, layer, extended)
        else:
            self.writer.write(self._in_template(op), self.renamer.template, extended)


def _extended_ops(layers: Layers, renamer: _Renamer) -> tuple[OpNode, ...]:
    """Forward: copies after the template's block, ascending; backward: before it, descending;
    the template group's satellites: beside each run of them, in the order the groups' runs go there."""
    template, extra = renamer.template, renamer.extra
    copies_up = range(template + 1, template + extra + 1)
    writer = _OpWriter(renamer)
    satellites = _SatelliteWriter(layers, renamer, writer)
    last_forward = layers.block_ops(template, backward=False)[-1].name
    first_backward = layers.block_ops(template, backward=True)[0].name
    segments = _satellite_segments(layers, template)

    def write_segment_copies(segment, groups):
        for group in groups:
            for satellite in segment:
                satellites.write(satellite, group)

    for op in layers.graph.ops:
        if op.name == first_backward:
            writer.write_copies(layers.block_ops(template, backward=True), template, reversed(copies_up))
        segment, descending = segments.get(op.name, ((), False))
        if descending and op is segment[0]:
            write_segment_copies(segment, reversed(copies_up))
        group = layers.satellite_group.get(op.name)
        if group is not None:
            satellites.write(op, renamer.extended_layer(group))
        else:
            layer = layers.op_layer.get(op.name)
            writer.write(op, layer, None if layer is None else renamer.extended_layer(layer))
        if op.name == last_forward:
            writer.write_copies(layers.block_ops(template, backward=False), template, copies_up)
        if segment and not descending and op is segment[-1]:
            write_segment_copies(segment, copies_up)
    return (*writer.ops[False], *writer.ops[True])


def _with_copies(names, layers: Layers, renamer: _Renamer, copy) -> list:
    """`names` with, after each template-layer entry, its copies (`copy(entry, extended_layer)`)."""
    out = []
    for entry in names:
        out.append(entry)
        name = entry.name if isinstance(entry, TensorOrigin) else entry
        if layers.tensor_layer.get(name) == renamer.template:
            out.extend(copy(entry, extended) for extended in range(renamer.template + 1, renamer.template + renamer.extra + 1))
    return out


def _extended_tensors(layers: Layers, renamer: _Renamer) -> dict:
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
    try:
        layers = find_layers(graph, min_layers=min_layers)
    except LayerError as e:
        raise DeepenError(str(e)) from e
    # With fusion regions the last layer's final region may differ (it feeds the final norm):
    # then it is left outside the repeated blocks, and copies go in before it.
    if traced_layers is not None and layers.forward.count not in (traced_layers, traced_layers - 1):
        raise DeepenError(f"found {layers.forward.count} repeated layers in a trace of {traced_layers}; trace every layer")
    traced = layers.forward.count if traced_layers is None else traced_layers
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
            f"extended from {traced} traced layers to {traced + extra_layers} "
            f"(layer {template} repeated {extra_layers} more times)",
        ),
    )
