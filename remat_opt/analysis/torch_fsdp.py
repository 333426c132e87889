"""A training iteration under torch's `FullyShardedDataParallel` (FSDP1) with one unit per
transformer block, as Thunder's ``benchmark_litgpt.py --compile thunder-dynamo --distributed_mode
fsdp`` runs it, predicted event by event for one rank.

Thunder's own FSDP (``thunder.jit`` with its transform) puts the whole model in one graph and is
what `remat_opt.distributed` models. Under ThunderFX the benchmark wraps the model in torch's FSDP1
instead (``auto_wrap_policy`` = one unit per litgpt ``Block``, ``use_orig_params=True``, the root
unit holding what is left: ``wte``, ``ln_f``, ``lm_head``), optionally wraps every block in
``checkpoint_wrapper``, and hands the model to Dynamo, which compiles each unit's module as its own
graph (FSDP's hooks run eagerly between them) with Thunder. So the iteration is a chain of small
graphs with FSDP's memory moves around each, and one block's graph decides everything activations
contribute. What FSDP1 does, read in ``torch/distributed/fsdp`` (``_flat_param.py``,
``_runtime_utils.py``):

* each unit's parameters are one flat parameter: every parameter starts at a 16-byte boundary
  (``align_addresses`` with ``use_orig_params``) and the total is padded to a multiple of the world
  size; a rank keeps one shard of it, and the optimizer sees the parameters as views of the shard;
* a unit's all-gather makes its unsharded flat parameter; it is freed after the unit's forward
  (``FULL_SHARD``) except for the root's (``_post_forward_reshard``: "Do not free the root's
  parameters in the post-forward"), and gathered again before the unit's backward, where
  ``BACKWARD_PRE`` prefetch gathers the next unit's as well;
* the parameters the graphs see are views (``torch.split``) of the unsharded flat parameter, so the
  gradients of a unit's parameters wait in autograd until every one of them is computed, then
  ``split``'s backward concatenates them into the flat gradient (a new tensor); the post-backward hook
  frees the unsharded parameter, reduce-scatters the flat gradient into a new shard and frees it. The
  root's first gradient (``lm_head``) is made at the start of the backward and waits to its end
  (``wte``);
* ``torch.optim.AdamW(fused=True)``: two moments per parameter in its dtype, alive from the first step;
  the step updates in place; ``zero_grad(set_to_none=True)`` frees the gradient shards.

`predict_fsdp1_iteration` walks these events with the block's activation terms taken from the joint
graph of one block (`BlockActivations`) and returns the largest live bytes and what makes it up.
Nothing is fitted to a measurement. Not modelled: the caching allocator's unsplit blocks and
fragmentation (``max_memory_allocated`` counts neither), NCCL's internal buffers, and the host running
ahead of the GPU (an all-gather issued early allocates early; FSDP1's rate limiter keeps at most two
in flight, which `BACKWARD_PRE` prefetch already counts in the backward).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from costmodels.formulas import ITEMSIZE
from remat_opt.analysis.training_step import CUDA_BLOCK_BYTES, OverlappedStep
from remat_opt.core.graph import JointGraph
from remat_opt.core.plan import derive
from remat_opt.core.simulation import round_up_bytes, simulate_step

FLAT_PARAM_ALIGNMENT_BYTES = 16  # torch/distributed/fsdp/_flat_param.py: _get_aligned_numel


def flat_param_numel(numels: tuple[int, ...], itemsize: int, world_size: int) -> int:
    """Elements of FSDP1's padded unsharded flat parameter of one unit (``use_orig_params=True``).

    Every parameter starts at a 16-byte boundary (padding before it when needed) and the total is
    padded to a multiple of `world_size`, so that every rank's shard has the same size."""
    aligned = max(1, FLAT_PARAM_ALIGNMENT_BYTES // itemsize)
    total = 0
    for numel in numels:
        total += -total % aligned
        total += numel
    return total + -total % world_size


@dataclass(frozen=True)
class Fsdp1Units:
    """The FSDP1 units of a model: `n_blocks` identical block units and the root.

    Attributes:
        block_numels: element counts of one block's parameters.
        root_numels: element counts of the root's parameters, by name (``wte``, ``ln_f``, ``lm_head``
            for litgpt), in the order the backward makes their gradients (``lm_head`` first).
        n_blocks: number of block units.
        dtype: the parameters' dtype.
        world_size: ranks.
        buffer_bytes: the model's buffers (not sharded; litgpt's RoPE ``cos``/``sin``).
    """

    block_numels: tuple[int, ...]
    root_numels: dict[str, int]
    n_blocks: int
    dtype: str
    world_size: int
    buffer_bytes: int = 0

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    def unsharded_bytes(self, unit: str) -> int:
        """Bytes of the padded unsharded flat parameter of ``"block"`` or ``"root"`` (also the flat gradient's)."""
        numels = self.block_numels if unit == "block" else tuple(self.root_numels.values())
        return flat_param_numel(numels, self.itemsize, self.world_size) * self.itemsize

    def shard_bytes(self, unit: str) -> int:
        """One rank's shard of a unit's flat parameter (also of its gradient after the reduce-scatter)."""
        return self.unsharded_bytes(unit) // self.world_size

    def moment_bytes(self) -> int:
        """One AdamW moment over this rank's parameter views (the shards without their end padding)."""
        return (self.n_blocks * _unpadded_share(self.block_numels, self.world_size)
                + _unpadded_share(tuple(self.root_numels.values()), self.world_size)) * self.itemsize


def _unpadded_share(numels: tuple[int, ...], world_size: int) -> int:
    """Elements of real parameters in one rank's shard (rank 0's: the padding sits at the end)."""
    return min(sum(numels), -(-sum(numels) // world_size))


@dataclass(frozen=True)
class BlockActivations:
    """What one block's graph adds to the live bytes, beyond its inputs and parameters.

    Attributes:
        forward_bytes: the most live during its forward (its output and what it saves included).
        carried_bytes: what stays alive from its forward to its backward: the tensors it saves
            and its input when the backward reads it.
        backward_bytes: the most live during its backward (what it saved, the incoming gradient,
            recomputed tensors, the gradients it makes).
        end_bytes: live when its backward returns: the parameters' and the input's gradients.
        input_bytes: its input's bytes when the backward reads it (part of `carried_bytes`; the
            graph counts it as an input, outside `backward_bytes`), else 0.
        recompute_ops: forward ops its backward reruns.
    """

    forward_bytes: int
    carried_bytes: int
    backward_bytes: int
    end_bytes: int
    input_bytes: int = 0
    recompute_ops: int = 0

    @classmethod
    def from_graph(cls, graph: JointGraph, tag_targets=(), *, hidden_input: str = "x",
                   granularity_bytes: int = CUDA_BLOCK_BYTES) -> BlockActivations:
        """The terms of the joint graph of one block (traced alone, its hidden state as the input
        named `hidden_input`) under the plan's `tag_targets` (every forward op's: checkpointing)."""
        if hidden_input not in graph.input_names:
            raise ValueError(f"the block's graph has no input {hidden_input!r}; its inputs: "
                             f"{', '.join(graph.input_names[:6])}")
        timeline = simulate_step(graph, tag_targets, allocation_granularity_bytes=granularity_bytes, by_kind=False)
        derivation = derive(graph, tag_targets)
        n_forward = len(graph.forward_ops)
        events = [b - timeline.baseline_bytes for b in timeline.live_bytes]
        hidden = graph.tensors[hidden_input]
        input_bytes = round_up_bytes(hidden.storage_bytes, granularity_bytes) if hidden_input in derivation.needed else 0
        saved_bytes = sum(round_up_bytes(graph.tensors[s].storage_bytes, granularity_bytes)
                          for s in {graph.tensors[n].storage for n in derivation.saved}
                          if graph.tensors[s].kind != "input")
        return cls(forward_bytes=max(events[:n_forward]), carried_bytes=saved_bytes + input_bytes,
                   backward_bytes=max(events[n_forward:]), end_bytes=events[-1], input_bytes=input_bytes,
                   recompute_ops=len(derivation.demanded_ops))


@dataclass(frozen=True)
class HeadShapes:
    """The root unit's activations: the hidden state ``[B, T, C]``, the logits ``[B, T, V]``."""

    hidden_bytes: int
    logits_bytes: int
    norm_stat_bytes: int = 0


@dataclass(frozen=True)
class IterationPrediction:
    """One rank's predicted peak over an iteration after the first (optimizer moments alive).

    Attributes:
        peak_bytes: the largest live bytes.
        peak_event: where (``"backward of block 0: flat gradient"``, ...).
        terms: what is live there, by term, summing to `peak_bytes`.
        event_bytes: every event's live bytes, in order.
        notes: how terms were derived.
    """

    peak_bytes: int
    peak_event: str
    terms: dict[str, int]
    event_bytes: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def allocated_during_bytes(self) -> int:
        """Of `peak_bytes`, what the iteration itself allocated: without what was alive when it began
        (shards, moments, buffers, workspace, the previous iteration's logits), as a profiler of the
        iteration alone counts it."""
        return self.peak_bytes - sum(self.terms.get(term, 0) for term in ALIVE_BEFORE_THE_ITERATION)


ALIVE_BEFORE_THE_ITERATION = ("parameter shards", "AdamW moments", "buffers", "workspace", "previous logits")


def predict_fsdp1_iteration(units: Fsdp1Units, block: BlockActivations | list[BlockActivations],
                            head: HeadShapes, *, workspace_bytes: int = 0,
                            granularity_bytes: int = CUDA_BLOCK_BYTES) -> IterationPrediction:
    """Walks one iteration of ``benchmark_litgpt.py``'s loop (forward, eager cross-entropy, backward,
    fused AdamW step) under FSDP1 ``FULL_SHARD`` and returns its peak for one rank.

    Args:
        units: the FSDP1 units.
        block: every block's activation terms (one for all blocks, or one per block in forward order).
        head: the root's activation shapes.
        workspace_bytes: alive throughout (cuBLAS's workspace on CUDA).
        granularity_bytes: allocator block size every tensor rounds up to.
    """
    blocks = block if isinstance(block, list) else [block] * units.n_blocks
    if len(blocks) != units.n_blocks:
        raise ValueError(f"{len(blocks)} block plans for {units.n_blocks} blocks")
    r = lambda n: round_up_bytes(n, granularity_bytes)  # noqa: E731
    itemsize = units.itemsize
    block_full, root_full = units.unsharded_bytes("block"), units.unsharded_bytes("root")
    block_shard, root_shard = units.shard_bytes("block"), units.shard_bytes("root")
    logits, hidden = r(head.logits_bytes), r(head.hidden_bytes)
    root_grads = {name: r(n * itemsize) for name, n in units.root_numels.items()}
    first_root_grads = sum(v for k, v in root_grads.items() if k != "wte")
    resident = {
        "parameter shards": units.n_blocks * block_shard + root_shard,
        "AdamW moments": 2 * r(units.moment_bytes()),
        "buffers": r(units.buffer_bytes),
        "workspace": workspace_bytes,
    }
    head_saved = 2 * hidden + r(head.norm_stat_bytes)  # ln_f's input and statistic, lm_head's input
    events: dict[str, dict[str, int]] = {}

    def at(label: str, **terms: int) -> None:
        named = {**resident, **{k.replace("_", " "): v for k, v in terms.items()}}
        events[label] = {k: v for k, v in named.items() if v}

    carried = [b.carried_bytes for b in blocks]
    for k, b in enumerate(blocks):  # forward: the previous iteration's logits are still referenced
        at(f"forward of block {k}", previous_logits=logits, root_parameters=root_full,
           carried_by_earlier_blocks=sum(carried[:k]), block_input=hidden, block_parameters=block_full,
           block_activations=b.forward_bytes)
    chain = sum(carried)
    at("head forward (logits)", previous_logits=logits, root_parameters=root_full, carried_by_blocks=chain,
       head_saved=head_saved, logits=logits)
    at("loss backward", root_parameters=root_full, carried_by_blocks=chain, head_saved=head_saved,
       logits=logits, log_softmax_output=logits, nll_loss_gradient=logits, logits_gradient=logits)
    at("head backward (lm_head gradient)", root_parameters=root_full, carried_by_blocks=chain,
       head_saved=head_saved, logits=logits, logits_gradient=logits, root_gradients_waiting=first_root_grads,
       hidden_gradient=hidden)
    shards = 0
    for k in reversed(range(units.n_blocks)):
        b = blocks[k]
        common = dict(logits=logits, root_parameters=root_full, root_gradients_waiting=first_root_grads,
                      carried_by_earlier_blocks=sum(carried[:k]), gradient_shards=shards,
                      block_parameters=block_full, prefetched_block_parameters=block_full if k else 0,
                      block_input=b.input_bytes)
        at(f"backward of block {k}", **common, block_activations=b.backward_bytes)
        at(f"backward of block {k}: flat gradient", **common, block_activations=b.end_bytes,
           flat_gradient=block_full)
        shards += block_shard
    at("embedding backward: root flat gradient", logits=logits, root_parameters=root_full,
       root_gradients_waiting=first_root_grads + root_grads.get("wte", 0), gradient_shards=shards,
       flat_gradient=root_full)
    at("optimizer step", logits=logits, gradient_shards=shards + root_shard)
    totals = {label: sum(terms.values()) for label, terms in events.items()}
    peak_event = max(totals, key=totals.get)
    notes = (
        f"{units.n_blocks} block units of {units.unsharded_bytes('block'):,} B unsharded and a root of "
        f"{root_full:,} B, {units.world_size} ranks, {units.dtype}",
        f"every tensor rounded up to {granularity_bytes} B",
    )
    return IterationPrediction(totals[peak_event], peak_event, events[peak_event], totals, notes)


@dataclass(frozen=True)
class Fsdp1StepTimes:
    """What one micro-step of the FSDP1 iteration runs, seconds: compute per block and for the root,
    and each unit's collectives (a ring over the unsharded flat parameter or gradient).

    Attributes:
        block_forward_s: one block's forward.
        block_backward_s: one block's backward, with what its plan reruns.
        head_s: the root's compute between the last block's forward and its backward (``ln_f``,
            ``lm_head``, the eager loss and their backward).
        block_all_gather_s, block_reduce_scatter_s: one block unit's collectives.
        root_all_gather_s, root_reduce_scatter_s: the root unit's.
    """

    block_forward_s: float
    block_backward_s: float
    head_s: float
    block_all_gather_s: float
    block_reduce_scatter_s: float
    root_all_gather_s: float
    root_reduce_scatter_s: float


def fsdp1_micro_step_time(n_blocks: int, times: Fsdp1StepTimes) -> OverlappedStep:
    """One forward and backward under FSDP1 ``FULL_SHARD`` (one unit per block) on two streams.

    Derived from what FSDP1 issues (``torch/distributed/fsdp/_runtime_utils.py``), not fitted: the
    collectives run one at a time on their own stream, in the order the host issues them; compute
    runs a unit once its all-gather has finished. Forward: the root's all-gather, then each block's,
    issued when the host reaches the block (it runs ahead of the GPU) but at most two in flight
    (``limit_all_gathers``: block k's waits for block k-2's compute to end). Backward
    (``BACKWARD_PRE``): the last block's all-gather, then at the start of each block's backward the
    next block's all-gather, and after it that block's reduce-scatter; the root's reduce-scatter
    last, and the iteration waits for every reduce-scatter. Not modelled: collectives and compute
    slowing each other down, the embedding's forward and backward (a gather and a scatter-add)."""
    comm_end = 0.0
    compute = 0.0
    comm_s = 0.0

    def collective(issued_s: float, duration_s: float) -> float:
        nonlocal comm_end, comm_s
        comm_end = max(comm_end, issued_s) + duration_s
        comm_s += duration_s
        return comm_end

    forward_ends: list[float] = []
    root_ready = collective(0.0, times.root_all_gather_s)
    for k in range(n_blocks):
        issued = forward_ends[k - 2] if k >= 2 else 0.0
        gathered = collective(issued, times.block_all_gather_s)
        compute = max(compute, gathered, root_ready) + times.block_forward_s
        forward_ends.append(compute)
    compute += times.head_s
    gathered = collective(compute, times.block_all_gather_s) if n_blocks else 0.0
    for k in reversed(range(n_blocks)):
        start = max(compute, gathered)
        prefetched = collective(start, times.block_all_gather_s) if k else 0.0
        compute = start + times.block_backward_s
        collective(compute, times.block_reduce_scatter_s)
        gathered = prefetched
    collective(compute, times.root_reduce_scatter_s)
    compute_s = n_blocks * (times.block_forward_s + times.block_backward_s) + times.head_s
    return OverlappedStep(max(compute, comm_end), compute_s, comm_s)
