"""A whole training iteration as Thunder's `thunder/benchmarks/benchmark_litgpt.py` runs it, predicted.

The joint graph covers what `thunder.jit` runs: the model's forward and backward. The benchmark's
iteration has more, and `torch.cuda.max_memory_allocated` sees all of it:

* the loss, in eager PyTorch outside the jitted model: ``cross_entropy(logits.reshape(-1, V),
  targets)`` is ``log_softmax`` (its output saved by autograd) and ``nll_loss``; its backward is
  ``nll_loss_backward`` (a zero-filled ``[N, V]`` gradient) then ``_log_softmax_backward_data`` (the
  logits' gradient, which Thunder's backward takes in);
* ``torch.optim.AdamW(fused=True)``: ``exp_avg`` and ``exp_avg_sq`` are ``zeros_like(param)`` (the
  parameters' dtype), made at the first ``step()`` and alive from then on, so every later iteration
  carries them through its forward and backward; the step is one ``_fused_adamw_`` over the lists;
* ``zero_grad(set_to_none=True)`` frees the gradients after the step; the previous iteration's
  ``logits`` stay referenced until the next forward returns;
* the CUDA caching allocator counts every block rounded up to 512 bytes, and cuBLAS takes a
  workspace through it once (32 MiB on sm90: ``4096 * 8`` KiB, torch's default
  ``CUBLAS_WORKSPACE_CONFIG`` for Hopper in ``ATen/cuda/CublasHandlePool.cpp``).

`predict_training_step` adds these to the simulated step of a graph and returns the peak and the
iteration time with their breakdowns. Nothing is fitted to a measurement: every term comes from
shapes, dtypes, the cost formulas and the device's spec sheet. Not modelled: blocks the allocator
leaves unsplit (it may hand out up to 1 MiB more than asked for a large tensor), the
parameters' `step` counters (one float32 scalar per tensor), the loss's reductions (scalars), data
loading, and the host: the iteration time is the GPU's busy time, as if kernels ran back to back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from costmodels.devices import DeviceSpec, roofline_time_s
from costmodels.formulas import ITEMSIZE, OpArgs, TensorMeta, formula_cost
from remat_opt.costing.graph_costs import CostModel
from remat_opt.core.graph import JointGraph
from remat_opt.core.plan import derive
from remat_opt.core.simulation import MEMORY_KINDS, round_up_bytes, simulate_step

CUDA_BLOCK_BYTES = 512  # c10/cuda/CUDACachingAllocator.cpp: kMinBlockSize, every size rounds up to it
CUBLAS_WORKSPACE_BYTES = {"sm90": 4096 * 8 * 1024, "other": 4096 * 1024 * 2 + 16 * 1024 * 8}


@dataclass(frozen=True)
class Parameters:
    """The trainable parameters: how many tensors, their element counts, and their dtype."""

    numels: tuple[int, ...]
    dtype: str

    @property
    def bytes(self) -> int:
        return sum(self.numels) * ITEMSIZE[self.dtype]

    def per_rank(self, parallel=None) -> Parameters:
        """What one rank's optimizer keeps states for under `parallel` (a
        `remat_opt.distributed.data_parallel.DataParallel`): FSDP a 1/N shard of each tensor, DDP all of it."""
        if parallel is None or parallel.strategy == "ddp":
            return self
        world_size = parallel.world_size
        uneven = [n for n in self.numels if n % world_size]
        if uneven:
            raise ValueError(f"FSDP over {world_size} ranks: a parameter of {uneven[0]} elements does not split evenly "
                             f"({len(uneven)} in all); use a world size dividing every parameter's first dimension")
        return Parameters(tuple(n // world_size for n in self.numels), self.dtype)

    def rounded_bytes(self, granularity_bytes: int) -> int:
        return sum(round_up_bytes(n * ITEMSIZE[self.dtype], granularity_bytes) for n in self.numels)


@dataclass(frozen=True)
class TrainingStepPrediction:
    """A benchmark iteration's predicted peak and time.

    Attributes:
        peak_bytes: the largest live bytes over an iteration after the first (optimizer states alive).
        peak_phase: where it happens (``"forward"``, ``"loss"``, ``"loss backward"``, ``"backward"``,
            ``"optimizer step"``).
        memory_terms: what is live at the peak, by term, summing to `peak_bytes`.
        phase_peaks: each phase's largest live bytes.
        time_terms: the iteration's predicted time by term, seconds.
        notes: how terms were derived.
    """

    peak_bytes: int
    peak_phase: str
    memory_terms: dict[str, int]
    phase_peaks: dict[str, int]
    time_terms: dict[str, float]
    notes: tuple[str, ...] = field(default=())

    @property
    def time_s(self) -> float:
        return sum(self.time_terms.values())


def _logits(graph: JointGraph) -> TensorMeta:
    """The jitted model's output: the largest forward output (``[batch, seq, vocab]``)."""
    outputs = [graph.tensors[name] for name in graph.forward_output_names]
    if not outputs:
        raise ValueError("the graph has no forward output to take the loss of")
    logits = max(outputs, key=lambda t: t.nbytes)
    return TensorMeta.of(logits.shape, logits.dtype)


def loss_op_args(logits: TensorMeta) -> dict[str, OpArgs]:
    """The eager loss's ops on ``logits.reshape(-1, V)``: ``[N, V]`` log-probabilities, ``[N]`` targets."""
    rows, vocab = (int(logits.numel // logits.shape[-1]), int(logits.shape[-1]))
    flat = TensorMeta.of((rows, vocab), logits.dtype)
    targets = TensorMeta.of((rows,), "int64")
    scalar = TensorMeta.of((), logits.dtype)
    return {
        "log_softmax": OpArgs("log_softmax", inputs=(flat,), outputs=(flat,)),
        "nll_loss": OpArgs("nll_loss", inputs=(flat, targets), outputs=(scalar,)),
        "nll_loss_backward": OpArgs("nll_loss_backward", inputs=(scalar, flat, targets), outputs=(flat,)),
        "_log_softmax_backward_data": OpArgs("_log_softmax_backward_data", inputs=(flat, flat), outputs=(flat,)),
    }


def adamw_op_args(parameters: Parameters, state_dtype: str) -> OpArgs:
    lists = [parameters.dtype, parameters.dtype, state_dtype, state_dtype]  # params, grads, exp_avg, exp_avg_sq
    inputs = tuple(TensorMeta.of((n,), dtype) for dtype in lists for n in parameters.numels)
    return OpArgs("_fused_adamw_", inputs=inputs)


def predict_training_step(
    graph: JointGraph,
    costs: CostModel,
    parameters: Parameters,
    tag_targets=(),
    *,
    optimizer_state_dtype: str | None = None,
    cuda_arch: str | None = "sm90",
) -> TrainingStepPrediction:
    """The benchmark iteration of `graph` (the jitted model) under a plan's `tag_targets`.

    Args:
        graph: the joint graph of the jitted model (its forward output: the logits).
        costs: the cost model of `graph` for the device (its spec prices the loss and optimizer too).
        parameters: the trainable parameters (from `remat_opt.models.by_name.trainable_parameters`).
        tag_targets: the plan's recomputed tag targets (empty: Thunder saves everything it saves).
        optimizer_state_dtype: dtype of AdamW's two moments; default: the parameters' (``zeros_like``).
        cuda_arch: ``"sm90"`` (Hopper) or ``"other"``: the cuBLAS workspace size; None: a CPU step
            (no cuBLAS workspace, no CUDA caching allocator: exact bytes).
    """
    block = CUDA_BLOCK_BYTES if cuda_arch is not None else 1
    spec: DeviceSpec = costs.device_spec
    state_dtype = optimizer_state_dtype or parameters.dtype
    states = Parameters(parameters.numels, state_dtype)
    state_bytes = 2 * states.rounded_bytes(block)
    workspace_bytes = CUBLAS_WORKSPACE_BYTES[cuda_arch] if cuda_arch is not None else 0
    logits = _logits(graph)
    logits_bytes = round_up_bytes(logits.nbytes, block)
    timeline = simulate_step(graph, tag_targets, allocation_granularity_bytes=block)
    events = timeline.live_bytes
    n_forward = len(graph.forward_ops)
    forward_peak = max(range(n_forward), key=events.__getitem__)
    backward_peak = max(range(n_forward, len(events)), key=events.__getitem__)
    # Alive in every phase of an iteration after the first: the moments and the cuBLAS workspace.
    resident = {"AdamW moments": state_bytes, "cuBLAS workspace": workspace_bytes}
    resident = {k: v for k, v in resident.items() if v}
    phases = {  # phase: (event of the jitted step's timeline, what the phase adds to it)
        # the previous iteration's logits are still referenced while this forward runs
        "forward": (forward_peak, {"previous iteration's logits": logits_bytes}),
        # log_softmax's [N, V] output (saved by autograd) beside the logits
        "loss": (n_forward - 1, {"log_softmax output": logits_bytes}),
        # and nll_loss_backward's zero-filled gradient, then the logits' gradient
        "loss backward": (n_forward - 1, {"log_softmax output": logits_bytes, "nll_loss gradient": logits_bytes,
                                          "logits' gradient": logits_bytes}),
        # Thunder's backward: the logits' gradient is its cotangent (in the timeline)
        "backward": (backward_peak, {}),
        # parameters, every gradient, both moments, this iteration's logits: updated in place
        "optimizer step": (len(events) - 1, {}),
    }
    terms_by_phase = {
        phase: {**dict(zip(MEMORY_KINDS, timeline.kind_bytes[event])), **added, **resident}
        for phase, (event, added) in phases.items()
    }
    phase_peaks = {phase: sum(terms.values()) for phase, terms in terms_by_phase.items()}
    peak_phase = max(phase_peaks, key=phase_peaks.get)
    loss = loss_op_args(logits)
    time_terms = {
        **{f"jitted forward + backward: {kind}": t for kind, t in _jitted_time_by_kind(graph, costs).items()},
        "recomputed in the backward": _recompute_time_s(graph, costs, tag_targets),
        "loss forward + backward (eager)": sum(roofline_time_s(formula_cost(a), spec) for a in loss.values()),
        "optimizer step (fused AdamW)": roofline_time_s(formula_cost(adamw_op_args(parameters, state_dtype)), spec),
    }
    notes = (
        f"AdamW moments: 2 x {states.bytes:,} B ({state_dtype}); parameters {parameters.bytes:,} B "
        f"in {len(parameters.numels)} tensors; cuBLAS workspace {workspace_bytes:,} B ({cuda_arch or 'none on CPU'})",
        f"every storage rounded up to {block} B blocks (the CUDA caching allocator)" if cuda_arch is not None
        else "exact bytes (no CUDA caching allocator on the CPU)",
    )
    memory_terms = {k: v for k, v in terms_by_phase[peak_phase].items() if v}
    return TrainingStepPrediction(phase_peaks[peak_phase], peak_phase, memory_terms, phase_peaks, time_terms, notes)


def _jitted_time_by_kind(graph: JointGraph, costs: CostModel) -> dict[str, float]:
    """The jitted step's op times (seconds) by what the formula prices: matmuls, attention, the rest."""
    kinds = {"linear": "matmuls", "matmul": "matmuls", "linear_backward": "matmuls", "addmm": "matmuls",
             "sdpa": "attention", "fusion": "fusion regions"}
    times: dict[str, float] = {}
    for op in graph.ops:
        cost = costs.op_cost(op)
        kind = kinds.get(cost.formula, "attention" if cost.formula.startswith("sdpa") else "other ops")
        times[kind] = times.get(kind, 0.0) + cost.time_s
    return dict(sorted(times.items(), key=lambda kv: -kv[1]))


def _recompute_time_s(graph: JointGraph, costs: CostModel, tag_targets) -> float:
    """Time of the forward ops the tags make Thunder rerun in the backward (0 for save-all)."""
    names = set(derive(graph, tuple(tag_targets)).demanded_ops)
    return sum(costs.op_cost(op).time_s for op in graph.forward_ops if op.name in names)


@dataclass(frozen=True)
class OverlappedStep:
    """One step on two streams: compute, and collectives beside it (a jitted step's,
    `overlapped_step`, or an FSDP1 micro-step's, `torch_fsdp.fsdp1_micro_step_time`).

    Attributes:
        time_s: when the later stream finishes.
        compute_s: busy time of the compute stream (recomputation included).
        communication_s: busy time of the collective stream.
        exposed_communication_s: `time_s` less `compute_s`: collective time compute waited for.
    """

    time_s: float
    compute_s: float
    communication_s: float

    @property
    def exposed_communication_s(self) -> float:
        return self.time_s - self.compute_s


def overlapped_step(graph: JointGraph, costs: CostModel, tag_targets=()) -> OverlappedStep:
    """The jitted step's time with collectives overlapping compute, in the order the step runs
    (`simulate_step`'s events: forward, then the backward with the plan's recomputations, FSDP
    re-gathers included, before their first use).

    Derived, not fitted: ops run one after another on the compute stream; a collective (all-gather,
    reduce-scatter, all-reduce) runs on its own stream, one at a time, starting when the host issues
    it (after the compute work issued before it: its input is ready then) and the stream is free;
    a wait blocks the compute stream until its collective has finished. How many collectives
    overlap is therefore set by where the trace's waits sit (`collectives_in_flight`). Not
    modelled: collectives and compute slowing each other down (shared memory bandwidth and SMs)."""
    from costmodels.formulas import COLLECTIVE_KINDS, WAIT_SYMBOLS

    timeline = simulate_step(graph, tag_targets, by_kind=False)
    ops = {op.name: op for op in graph.ops}
    compute_clock = comm_clock = compute_s = comm_s = 0.0
    finished: dict[str, float] = {}  # a collective's future -> when it finishes
    for label in timeline.labels:
        if label == "backward start":
            continue
        op = ops[label.removeprefix("recompute:")]
        if op.symbol in WAIT_SYMBOLS:
            compute_clock = max(compute_clock, *(finished.get(name, 0.0) for name in op.inputs))
            continue
        time_s = costs.op_cost(op).time_s
        if op.symbol in COLLECTIVE_KINDS:
            comm_clock = max(comm_clock, compute_clock) + time_s
            comm_s += time_s
            for name in op.outputs:
                finished[name] = comm_clock
        else:
            compute_clock += time_s
            compute_s += time_s
    return OverlappedStep(max(compute_clock, comm_clock), compute_s, comm_s)
