"""Synthetic joint graphs for tests and benchmarks: seeded random DAGs, chains, diamonds, stacks.

They are real `JointGraph` objects (ops, tensors with storages, origins, a saved list, a backward
that reads the saved tensors and writes gradients), so solvers, checker and simulator run the
same code paths as on traced models. Random DAGs include views aliasing their input's storage,
random ops, ``dont_recompute`` ops, multi-output ops (one tag target or several, like ``split``),
consecutive ops sharing one tag target, nested units (`OpNode.tag_units` naming an enclosing
decomposition, as for ``mean``), inputs and parameters saved for backward, and backward views of
saved tensors. Chains, diamonds and stacks leave `tag_units` empty (the outputs' tag targets).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from remat_opt.core.graph import (
    REASON_FORWARD_OUTPUT,
    REASON_INPUT,
    REASON_RANDOM,
    JointGraph,
    OpNode,
    TensorNode,
    TensorOrigin,
)

ELEMENT_BYTES = 4


@dataclass
class _Builder:
    """Accumulates ops, tensors and origins; names are generated in order."""

    ops: list[OpNode] = field(default_factory=list)
    tensors: dict[str, TensorNode] = field(default_factory=dict)
    origins: dict[str, TensorOrigin] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)
    n_backward: int = 0

    def tensor(self, name: str, numel: int, kind: str, base: str | None = None) -> str:
        storage = self.tensors[base].storage if base else name
        storage_bytes = self.tensors[storage].storage_bytes if base else numel * ELEMENT_BYTES
        nbytes = numel * ELEMENT_BYTES
        self.tensors[name] = TensorNode(name, (numel,), "float32", "cpu", nbytes, storage, storage_bytes, kind)
        return name

    def input(self, name: str, numel: int) -> str:
        self.inputs.append(self.tensor(name, numel, "input"))
        return name

    def forward(self, symbol, inputs, outputs, tags=frozenset(), targets=None, taggable=True, reason="activation"):
        index = sum(not op.is_backward for op in self.ops)
        op = OpNode(f"fwd{index}", symbol, False, index, tuple(inputs), tuple(outputs), op_tags=frozenset(tags))
        self.ops.append(op)
        for out, target in zip(outputs, targets or [f"p_{o}" for o in outputs]):
            self.origins[out] = TensorOrigin(out, target, symbol, taggable, reason)

    def backward(self, symbol, inputs, outputs, tags=frozenset()):
        self.ops.append(OpNode(f"bwd{self.n_backward}", symbol, True, self.n_backward, tuple(inputs), tuple(outputs),
                               op_tags=frozenset(tags)))
        self.n_backward += 1

    def graph(self, saved: list[str], outputs: list[str]) -> JointGraph:
        inputs = set(self.inputs)
        saved_nodes = tuple(
            TensorOrigin(n, None, None, False, REASON_INPUT) if n in inputs else self.origins[n] for n in saved
        )
        fwd = [op for op in self.ops if not op.is_backward]
        bwd = [op for op in self.ops if op.is_backward]
        return JointGraph(
            ops=tuple(fwd + bwd),
            tensors=dict(self.tensors),
            saved=saved_nodes,
            input_names=tuple(self.inputs),
            forward_output_names=tuple(outputs),
            origins=dict(self.origins),
        )


def _nest(b: _Builder, groups: random.Random, i: int, state: list) -> None:
    """Gives the last op its `tag_units`: its outputs' tag targets, after the tag target of an
    enclosing decomposition (2-3 consecutive ops) when one is open."""
    if state[1] == 0 and groups.random() < 0.2:
        state[:] = [f"d{i}", groups.randint(2, 3)]
    op = b.ops[-1]
    own = tuple(dict.fromkeys(b.origins[o].tag_target for o in op.outputs))
    b.ops[-1] = replace(op, tag_units=((state[0],) if state[1] else ()) + own)
    state[1] = max(0, state[1] - 1)


def _random_forward(b: _Builder, rng: random.Random, n_ops: int, groups: random.Random) -> list[str]:
    """Random forward ops; returns the forward tensors written, in order."""
    written: list[str] = []
    previous_target, nesting = None, [None, 0]
    for i in range(n_ops):
        pool = b.inputs + written
        args = rng.sample(pool[-5:], k=min(len(pool[-5:]), rng.choice((1, 1, 2))))
        kind = rng.choices(("plain", "view", "random", "pinned", "multi"), weights=(60, 18, 7, 5, 10))[0]
        numel = rng.choice((64, 128, 256, 512, 1024))
        name = f"t{i}"
        share = previous_target is not None and written and written[-1] in args and rng.random() < 0.25
        target = previous_target if share else f"p{i}"
        if kind == "view":
            view_numel = max(1, b.tensors[args[0]].nbytes // ELEMENT_BYTES // rng.choice((1, 2)))
            out = [b.tensor(name, view_numel, "forward", base=args[0])]
            b.forward("reshape", args[:1], out, targets=[target])
        elif kind == "random":
            out = [b.tensor(name, numel, "forward")]
            b.forward("uniform", args, out, tags={"random"}, targets=[target], taggable=False, reason=REASON_RANDOM)
        elif kind == "multi":
            out = [b.tensor(f"{name}a", numel, "forward"), b.tensor(f"{name}b", rng.choice((16, numel)), "forward")]
            targets = [target, f"p{i}b"] if rng.random() < 0.5 else [target, target]
            b.forward("split", args, out, targets=targets)
        else:
            out = [b.tensor(name, numel, "forward")]
            tags = {"dont_recompute"} if kind == "pinned" else ()
            b.forward("mul" if kind == "plain" else "pinned_op", args, out, tags=tags, targets=[target])
        _nest(b, groups, i, nesting)
        written.extend(out)
        previous_target = target
    return written


def _backward_for(b: _Builder, rng: random.Random, saved: list[str], output: str,
                  grad_numels: tuple[int, ...] = (64, 256, 1024), periodic: bool = False) -> None:
    """A backward reading every saved tensor (some through backward views), writing gradients;
    `periodic`: no views and one gradient size, so that repeated layers' backwards repeat too."""
    cotangent = b.tensor("g_out", b.tensors[output].nbytes // ELEMENT_BYTES, "cotangent")
    grad = cotangent
    for i, name in enumerate(saved):
        read = name
        if not periodic and b.tensors[name].kind != "input" and rng.random() < 0.2:  # a backward view of a saved tensor
            read = b.tensor(f"bv{i}", b.tensors[name].nbytes // ELEMENT_BYTES, "backward", base=name)
            b.backward("reshape", [name], [read])
        new = b.tensor(f"g{i}", grad_numels[0] if periodic else rng.choice(grad_numels), "backward")
        b.backward("mul", [grad, read], [new])
        grad = new
        if b.tensors[name].kind == "input":  # the parameter's gradient, returned
            b.backward("sum", [grad], [b.tensor(f"grad_{name}", b.tensors[name].nbytes // ELEMENT_BYTES, "backward")])


def random_joint_graph(seed: int, *, n_ops: tuple[int, int] = (5, 13)) -> JointGraph:
    """A seeded random joint graph with between ``n_ops[0]`` and ``n_ops[1]`` forward ops."""
    rng = random.Random(seed)
    b = _Builder()
    b.input("x", rng.choice((128, 256)))
    for k in range(rng.randint(1, 2)):
        b.input(f"w{k}", rng.choice((64, 256)))
    written = _random_forward(b, rng, rng.randint(*n_ops), random.Random(seed * 7919 + 1))
    output = written[-1]
    b.origins[output] = TensorOrigin(output, b.origins[output].tag_target, "mul", False, REASON_FORWARD_OUTPUT)
    candidates = [t for t in written if t != output]
    saved = [t for t in candidates if rng.random() < 0.6] + [w for w in b.inputs if rng.random() < 0.5]
    if output and rng.random() < 0.3:
        saved.append(output)
    rng.shuffle(saved)
    _backward_for(b, rng, saved, output)
    return b.graph(saved, [output])


def chain_graph(n: int, numel: int = 256) -> JointGraph:
    """Checkmate's linear graph: x -> t0 -> ... -> t{n-1}; the backward reads every t_i."""
    b = _Builder()
    previous = b.input("x", numel)
    written = []
    for i in range(n):
        out = b.tensor(f"t{i}", numel, "forward")
        b.forward("mul", [previous], [out])
        written.append(previous := out)
    b.origins[written[-1]] = TensorOrigin(written[-1], f"p_{written[-1]}", "mul", False, REASON_FORWARD_OUTPUT)
    saved = written[:-1][::-1]
    _backward_for(b, random.Random(0), saved, written[-1])
    return b.graph(saved, [written[-1]])


def diamond_graph(numel: int = 256) -> JointGraph:
    """x -> a -> (b, c) -> d -> out; the backward reads a, b, c, d (a shared recompute ancestor)."""
    b = _Builder()
    x = b.input("x", numel)
    for name, args in (("a", [x]), ("b", ["a"]), ("c", ["a"]), ("d", ["b", "c"]), ("out", ["d"])):
        b.forward("mul", args, [b.tensor(name, numel, "forward")])
    b.origins["out"] = TensorOrigin("out", "p_out", "mul", False, REASON_FORWARD_OUTPUT)
    saved = ["d", "c", "b", "a"]
    _backward_for(b, random.Random(0), saved, "out")
    return b.graph(saved, ["out"])


def stacked_blocks_graph(n_blocks: int, seed: int = 0, block_ops: int = 10, *,
                         inner_numels: tuple[int, ...] = (128, 256, 512),
                         grad_numels: tuple[int, ...] = (64, 256, 1024),
                         gathered_weights: bool = False) -> JointGraph:
    """`n_blocks` copies of one random residual block (like transformer layers), then a head; the
    backward reads the saved tensors last layer first. Activations dominate the step's memory
    (as in a transformer) with large `inner_numels` and small `grad_numels`. With
    `gathered_weights`, each block's first op also reads its layer's weight, gathered from a shard
    by an async collective issued at the forward's start, as Thunder orders FSDP's all-gathers, and
    the backward repeats per layer (`core.layers.find_layers` finds the layers and the gathers as
    their satellites)."""
    rng = random.Random(seed)
    choices = (("mul", "add", "exp"), (0, 1, 2), inner_numels)
    recipe = [tuple(rng.choice(c) for c in choices) for _ in range(block_ops)]
    b = _Builder()
    stream = b.input("x", 256)
    saved = []
    weights = []
    for layer in range(n_blocks if gathered_weights else 0):
        shard = b.input(f"w{layer}_shard", 64)
        weight = b.tensor(f"w{layer}", 256, "forward")
        b.forward("all_gather", [shard], [weight], tags={"collective", "holds_inputs"}, taggable=False,
                  reason="collective")
        weights.append(weight)
    for layer in range(n_blocks):
        local = [stream]
        for j, (symbol, back, numel) in enumerate(recipe):
            args = [local[-1]] + ([local[-1 - back]] if back and len(local) > back else [])
            args += [weights[layer]] if weights and j == 0 else []
            out = b.tensor(f"l{layer}_{j}", numel if j < block_ops - 1 else 256, "forward")
            b.forward(symbol, args, [out])
            local.append(out)
            if (j + layer * 0) % 3 != 2:
                saved.append(out)
        stream = local[-1]
    head = b.tensor("logits", 256, "forward")
    b.forward("mul", [stream], [head], targets=["p_logits"], taggable=False, reason=REASON_FORWARD_OUTPUT)
    saved = saved[::-1]
    _backward_for(b, random.Random(seed), saved, head, grad_numels, periodic=gathered_weights)
    return b.graph(saved, [head])


def random_problem(seed: int, *, n_ops: tuple[int, int] = (4, 11)):
    """A `RecomputeProblem` over `random_joint_graph(seed)` with random whole-microsecond op times.

    Whole microseconds make float sums of times compare exactly with the ILP's integer times.
    """
    from remat_opt.core.problem import RecomputeProblem

    graph = random_joint_graph(seed, n_ops=n_ops)
    rng = random.Random(seed)
    return RecomputeProblem.from_graph(graph, {op.name: rng.randint(1, 50) * 1e-6 for op in graph.forward_ops})


def proxy_op_time_s(graph: JointGraph, *, bytes_per_s: float = 1e10, overhead_s: float = 5e-6) -> dict[str, float]:
    """FLOP-free op times for tests and examples: bytes written / `bytes_per_s` + `overhead_s`.

    Views write nothing new (their output storage is an input's), so they cost only the overhead.
    This is not a cost model (`remat_opt.costing.graph_costs` is): it only gives solver tests plausible times.
    """
    times = {}
    for op in graph.forward_ops:
        fresh = [o for o in op.outputs if graph.tensors[o].storage == o]
        times[op.name] = sum(graph.tensors[o].nbytes for o in fresh) / bytes_per_s + overhead_s
    return times
