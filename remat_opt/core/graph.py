"""The joint forward-backward graph: a pure data model (no thunder, no torch).

A `JointGraph` holds what the planner needs from one Thunder compilation:

* `ops`: every op of the final forward and backward execution traces, in trace order, each with its
  side (`is_backward`), input and output tensor names and non-tensor arguments. Fusion regions
  (`nvFusion0`, `TorchCompile1`, ...) keep their member ops in `members`.
* `tensors`: every tensor by name with shape, dtype, bytes and **storage identity**: `storage` names
  the tensor that owns the memory (itself for a fresh allocation, its base for a view or alias), and
  `storage_bytes` is the size of that memory. Memory is counted by storage, never by tensor.
* `saved`: the forward tensors that the backward reads, in the order Thunder saves them, each with
  the pre-autodiff proxy a `RECOMPUTE_IN_BACKWARD` tag would have to go on, or why none can.
  `origins` holds the same record for every tensor a forward op writes (saved or not), which is
  what a recompute chain through unsaved intermediates needs.

`JointGraph.nx` is the same graph as a bipartite `networkx.DiGraph` (op nodes and tensor nodes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import networkx as nx

# Why a saved tensor cannot carry a RECOMPUTE_IN_BACKWARD tag of its own.
REASON_INPUT = "input or parameter: always alive, costs nothing extra"
REASON_FORWARD_OUTPUT = "forward output: alive anyway"
REASON_RANDOM = "random op: recomputing it would draw new numbers"
REASON_AUXILIARY = "auxiliary output of a grad rule: only recomputable with its whole op"
REASON_NO_ORIGIN = "no pre-autodiff producer found"


@dataclass(frozen=True, slots=True)
class TensorNode:
    """One tensor of the final traces.

    Attributes:
        name: proxy name, shared by the forward and backward traces.
        shape: sizes.
        dtype: dtype name, e.g. ``"bfloat16"``.
        device: device string, e.g. ``"cpu"``, ``"meta"``, ``"cuda:0"``.
        nbytes: bytes of this tensor's elements (numel * itemsize).
        storage: name of the tensor that owns this tensor's memory (itself when fresh).
        storage_bytes: bytes of that memory.
        kind: ``"input"`` (parameters, inputs), ``"forward"``, ``"cotangent"``, ``"backward"`` or
            ``"internal"`` (inside a fusion region, never materialized).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    nbytes: int
    storage: str
    storage_bytes: int
    kind: str


@dataclass(frozen=True, slots=True)
class OpNode:
    """One op (bound symbol) of the final forward or backward trace.

    Attributes:
        name: unique id, ``f"{'bwd' if is_backward else 'fwd'}{index}"``.
        symbol: Thunder symbol name, e.g. ``"linear"``, ``"nvFusion0"``, ``"cudnn_sdpa_fwd"``.
        is_backward: which trace it runs in.
        index: position among the ops of its trace.
        inputs: names of tensor inputs, in argument order (repeats kept).
        outputs: names of tensor outputs.
        attrs: non-tensor arguments as ``(key, value)`` pairs (``"arg3"`` or a keyword name).
        members: for fusion regions, the fused ops in order (their tensors are ``internal``).
        op_tags: op properties that matter to planning: ``"random"``, ``"dont_recompute"``,
            ``"matmul"``, ``"fusion"``, ``"collective"`` (``"regather"``: an FSDP weight's all-gather
            or its wait), ``"holds_inputs"`` (an async collective: its outputs, futures, keep its
            inputs' memory alive until they die at the wait).
        tag_units: (forward ops) the tag targets whose ``RECOMPUTE_IN_BACKWARD`` tag makes Thunder
            re-run this op, shallowest pre-autodiff ancestor first. Tagging target X recomputes
            every forward op with X in its `tag_units` (the needed ones): that set is X's unit.
        workspace_bytes: bytes the op allocates beyond its outputs, alive only while it runs (the
            forward outputs a fallback op's vjp rebuilds); 0 for most ops.
    """

    name: str
    symbol: str
    is_backward: bool
    index: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    members: tuple[OpNode, ...] = ()
    op_tags: frozenset[str] = frozenset()
    tag_units: tuple[str, ...] = ()
    workspace_bytes: int = 0


@dataclass(frozen=True, slots=True)
class TensorOrigin:
    """Where a forward tensor comes from, for tagging: a saved tensor, or one a recompute passes.

    Attributes:
        name: its name in the traces.
        tag_target: name of the pre-autodiff proxy a ``RECOMPUTE_IN_BACKWARD`` tag must go on to
            stop saving this tensor (for an auxiliary output: the primal output of its op), or None.
        origin_symbol: pre-autodiff symbol that produces the tag target (or the tensor).
        taggable: whether a tag on ``tag_target`` can make Thunder recompute this tensor.
        reason: why it is saved as it is (see the ``REASON_*`` constants); "activation" otherwise.
    """

    name: str
    tag_target: str | None
    origin_symbol: str | None
    taggable: bool
    reason: str


@dataclass(frozen=True)
class JointGraph:
    """Forward and backward of one compilation as one graph (see the module docstring)."""

    ops: tuple[OpNode, ...]
    tensors: dict[str, TensorNode]
    saved: tuple[TensorOrigin, ...]
    input_names: tuple[str, ...]
    forward_output_names: tuple[str, ...]
    origins: dict[str, TensorOrigin] = field(default_factory=dict)
    executors: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @cached_property
    def forward_ops(self) -> tuple[OpNode, ...]:
        return tuple(op for op in self.ops if not op.is_backward)

    @cached_property
    def backward_ops(self) -> tuple[OpNode, ...]:
        return tuple(op for op in self.ops if op.is_backward)

    @cached_property
    def producers(self) -> dict[str, OpNode]:
        """Tensor name -> the top-level op that writes it (inputs have none)."""
        return {out: op for op in self.ops for out in op.outputs}

    @cached_property
    def consumers(self) -> dict[str, tuple[OpNode, ...]]:
        """Tensor name -> the top-level ops that read it, in trace order."""
        readers: dict[str, list[OpNode]] = {}
        for op in self.ops:
            for name in dict.fromkeys(op.inputs):
                readers.setdefault(name, []).append(op)
        return {name: tuple(ops) for name, ops in readers.items()}

    @cached_property
    def ops_by_tag_target(self) -> dict[str, tuple[OpNode, ...]]:
        """Tag target -> the forward ops its tag re-runs (read-only; `core.plan.tag_target_ops`)."""
        by_target: dict[str, list[OpNode]] = {}
        for op in self.forward_ops:
            targets = op.tag_units or tuple(
                dict.fromkeys(o.tag_target for o in map(self.origins.get, op.outputs) if o and o.tag_target)
            )
            for target in targets:
                by_target.setdefault(target, []).append(op)
        return {target: tuple(ops) for target, ops in by_target.items()}

    @cached_property
    def nx(self) -> nx.DiGraph:
        """Bipartite DiGraph: op nodes (``op=True``) and tensor nodes, edges along data flow."""
        g = nx.DiGraph()
        for tensor in self.tensors.values():
            if tensor.kind != "internal":
                g.add_node(tensor.name, op=False, tensor=tensor)
        for op in self.ops:
            g.add_node(op.name, op=True, node=op)
            g.add_edges_from((name, op.name) for name in op.inputs)
            g.add_edges_from((op.name, name) for name in op.outputs)
        return g

    @cached_property
    def recompute_units(self) -> dict[str, tuple[OpNode, ...]]:
        """Tag target -> the forward ops that tagging it would re-run (see `OpNode.tag_units`)."""
        units: dict[str, list[OpNode]] = {}
        for op in self.forward_ops:
            for unit in op.tag_units:
                units.setdefault(unit, []).append(op)
        return {unit: tuple(ops) for unit, ops in units.items()}

    @cached_property
    def saved_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.saved)

    def storage_bytes(self, names: Iterable[str]) -> int:
        """Bytes of the distinct storages behind `names` (views of one base count once)."""
        storages = {self.tensors[n].storage for n in names}
        return sum(self.tensors[s].storage_bytes for s in storages)

    def is_input_storage(self, name: str) -> bool:
        """Whether `name`'s memory belongs to an input or parameter (always alive)."""
        return self.tensors[self.tensors[name].storage].kind == "input"

    @cached_property
    def saved_bytes(self) -> int:
        """Distinct storage bytes of everything saved for backward, inputs and parameters included."""
        return self.storage_bytes(self.saved_names)

    @cached_property
    def saved_activation_bytes(self) -> int:
        """Distinct storage bytes saved for backward that are not inputs or parameters."""
        return self.storage_bytes(n for n in self.saved_names if not self.is_input_storage(n))
