"""`fit`: the fastest training configuration that fits N GPUs of one kind, before renting them.

For a litgpt model at a sequence length, `fit` tries every configuration of:

* the micro-batch size (gradient accumulation makes up the global batch, when one is given);
* data parallelism over the ranks: Thunder's FSDP (ZeRO-3) with at most k collectives in flight
  (or in Thunder's own order), or DDP, under ``thunder.jit``; or torch's FSDP1 with one unit per
  block under ThunderFX, as Thunder's benchmark runs large models, with every block checkpointed or
  CostRemat's block plan (`analysis.torch_fsdp`, `analysis.thunder_1370`); one GPU runs none;

and for each the fastest CostRemat plan (`solver="auto"`) whose predicted per-rank peak of the
**whole iteration** fits the device's memory less a margin. The iteration is Thunder's
`benchmark_litgpt.py` one (`remat_opt.analysis.training_step`): parameters, gradients, AdamW's two
moments, the step's activations and transients, the eager loss, the cuBLAS workspace, every block
rounded up as the CUDA caching allocator does. Its time: `accumulation` jitted steps with the
collectives overlapping compute (`training_step.overlapped_step`), the loss after each, then one
optimizer step. Nothing is fitted to a measured run; where the terms come from is in
`training_step` and `costmodels`.

Configurations that cannot fit are cut early: a proven floor of the step peak (the peak model's
plan-independent bytes) plus the iteration's resident terms above the limit rules a configuration
out without solving, and a micro-batch that does not fit rules out the larger ones under the same
parallelism (activations grow with the micro-batch; nothing shrinks).
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

from remat_opt.core.errors import InfeasibleBudgetError
from remat_opt.core.plan import RematPlan
from remat_opt.distributed.data_parallel import DataParallel

GB = 1e9
DEFAULT_MICRO_BATCHES = (1, 2, 4, 8)
DEFAULT_IN_FLIGHT = (1, 2, None)  # FSDP: collectives in flight beside the one in use (None: Thunder's order)
DEFAULT_MEMORY_MARGIN = 0.05
HOPPER = ("H100-SXM", "H200")
MAX_BUDGET_ROUNDS = 4  # solves per configuration that lower the step budget by the iteration's overshoot
BLOCK_MENU_POINTS = 6  # torch FSDP1: ILP plans of one block at this many saved and block-peak budgets each
GPUS_PER_NODE = 8  # more GPUs than this: collectives cross nodes over InfiniBand


class FitError(ValueError):
    """A `fit` request that cannot be searched; the message says what was wrong and what works."""


@dataclass(frozen=True, slots=True)
class GPUs:
    """``count`` devices of one kind.

    Attributes:
        count: how many (the world size).
        device_spec: the spec sheet's name (`costmodels.devices`), e.g. ``"H100-SXM"``.
        memory_bytes: the memory of one device (NVML's total, or the limit the user gave).
    """

    count: int
    device_spec: str
    memory_bytes: int

    def describe(self) -> str:
        return f"{self.count} x {self.device_spec} ({gb(self.memory_bytes)} GB each)"

    @property
    def spec(self):
        """The device spec the costs use: the sheet's, with collectives over InfiniBand NDR (one
        400 Gb/s port per GPU, as in a DGX H100) when the GPUs span nodes (more than
        `GPUS_PER_NODE`): a ring's time is set by its slowest link."""
        from costmodels.devices import get_device_spec, with_interconnect
        from costmodels.interconnect import INFINIBAND_NDR

        if self.device_spec == "cpu":
            return "cpu"  # the cost model's CPU (a profiled calibration, else the nominal one)
        spec = get_device_spec(self.device_spec)
        return with_interconnect(spec, INFINIBAND_NDR) if self.count > GPUS_PER_NODE else spec

    @property
    def cuda_arch(self) -> str | None:
        """What `training_step.predict_training_step` takes: ``"sm90"`` for Hopper (its cuBLAS
        workspace), ``"other"`` for other GPUs, None for the CPU."""
        if self.device_spec == "cpu":
            return None
        return "sm90" if self.device_spec in HOPPER else "other"


def parse_gpus(text: str, memory_gb: float | None = None) -> GPUs:
    """``"8xH100"`` (or ``"H100"``: one, ``"64x a100"``, ``"2xcpu"`` with `memory_gb`) as `GPUs`.

    Raises:
        FitError: the text is not ``[N x]KIND``, the kind is unknown, or its memory is unknown and
            `memory_gb` not given.
    """
    from costmodels.devices import DEVICE_SPEC_CHOICES, GPU_SPECS, device_spec_name

    match = re.fullmatch(r"\s*(?:(\d+)\s*[xX*]\s*)?([A-Za-z][\w.-]*)\s*", text or "")
    if match is None:
        raise FitError(f"--gpus {text!r} is not COUNTxKIND; write e.g. 8xH100, 64xH100 or 8xA100 "
                       f"(kinds: {', '.join(DEVICE_SPEC_CHOICES)})")
    count = int(match.group(1) or 1)
    if count < 1:
        raise FitError(f"--gpus {text!r}: the GPU count must be at least 1")
    try:
        spec_name = device_spec_name(match.group(2))
    except ValueError as e:
        raise FitError(f"--gpus {text!r}: unknown GPU kind {match.group(2)!r}; use one of "
                       f"{', '.join(DEVICE_SPEC_CHOICES)} (or a spec name: {', '.join(GPU_SPECS)})") from e
    if memory_gb is not None:
        if not memory_gb > 0:
            raise FitError(f"--memory-gb must be positive, got {memory_gb!r}")
        memory_bytes = round(memory_gb * GB)
    else:
        memory_bytes = GPU_SPECS[spec_name].memory_bytes if spec_name in GPU_SPECS else 0
        if not memory_bytes:
            raise FitError(f"--gpus {text!r}: the memory of a {spec_name} device is not known; give it with --memory-gb")
    return GPUs(count, spec_name, memory_bytes)


@dataclass(frozen=True, slots=True)
class Configuration:
    """One way to run the iteration.

    Attributes:
        micro_batch: sequences per jitted step on each rank.
        accumulation: jitted steps per optimizer step (gradient accumulation).
        parallel: FSDP or DDP over the ranks; None on one GPU.
        torch_fsdp: None: ``thunder.jit`` of the whole model (Thunder's FSDP or DDP transform);
            ``"checkpoint"`` or ``"costremat"``: torch's FSDP1 with one unit per block under
            ThunderFX (`analysis.torch_fsdp`), every block in ``checkpoint_wrapper`` or running
            CostRemat's fastest fitting block plan.
    """

    micro_batch: int
    accumulation: int
    parallel: DataParallel | None
    torch_fsdp: str | None = None

    @property
    def world_size(self) -> int:
        return self.parallel.world_size if self.parallel else 1

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.accumulation * self.world_size

    def describe(self) -> str:
        if self.parallel is None:
            how = "1 GPU"
        elif self.torch_fsdp is not None:
            plan = "per-block checkpointing" if self.torch_fsdp == "checkpoint" else "CostRemat block plan"
            how = f"torch FSDP1 x{self.parallel.world_size} (ThunderFX), {plan}"
        elif self.parallel.strategy == "ddp":
            how = f"DDP x{self.parallel.world_size}"
        else:
            k = self.parallel.collectives_in_flight
            order = "Thunder's order" if k is None else f"{k} in flight"
            how = f"FSDP x{self.parallel.world_size}, {order}"
        steps = "" if self.accumulation == 1 else f" x {self.accumulation} steps"
        return f"{how}, micro-batch {self.micro_batch}{steps}"


STRATEGIES = ("fsdp", "ddp", "fsdp1")  # fsdp1: torch's FSDP1 under ThunderFX, one unit per block


def configurations(gpus: GPUs, *, global_batch: int | None = None, micro_batches: Sequence[int] | None = None,
                   strategies: Sequence[str] = STRATEGIES,
                   collectives_in_flight: Sequence[int | None] = DEFAULT_IN_FLIGHT) -> list[Configuration]:
    """Every configuration to try, by parallelism then ascending micro-batch.

    Without `global_batch` each micro-batch runs without accumulation (the global batch is then
    ``micro_batch x world size``); with it, the micro-batches that divide the per-rank batch.

    Raises:
        FitError: `global_batch` does not split over the GPUs, a given micro-batch cannot make up
            the global batch, or an unknown strategy.
    """
    world = gpus.count
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        raise FitError(f"unknown strategy {unknown[0] if unknown else '(none)'!r}; use any of {', '.join(STRATEGIES)} "
                       "(fsdp1: torch's FSDP1 under ThunderFX)")
    if any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in micro_batches or ()):
        raise FitError(f"micro-batch sizes must be positive integers, got {list(micro_batches)}")
    if global_batch is not None:
        if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
            raise FitError(f"--global-batch must be a positive integer, got {global_batch!r}")
        if global_batch % world:
            low, high = global_batch // world * world, -(-global_batch // world) * world
            raise FitError(f"--global-batch {global_batch} does not split over {world} GPUs; use a multiple of "
                           f"{world} ({', '.join(str(b) for b in dict.fromkeys((low, high)) if b)})")
        per_rank = global_batch // world
        if micro_batches:
            bad = [m for m in micro_batches if per_rank % m]
            if bad:
                raise FitError(f"micro-batch {bad[0]} cannot make up --global-batch {global_batch} on {world} GPUs "
                               f"({per_rank} sequences per rank is not a multiple of {bad[0]}); use micro-batches "
                               f"dividing {per_rank}")
            sizes = sorted(set(micro_batches))
        else:
            sizes = [m for m in range(1, per_rank + 1) if per_rank % m == 0 and m & (m - 1) == 0 or m == per_rank]
            sizes = sorted(set(m for m in sizes if m <= max(DEFAULT_MICRO_BATCHES)) or {1})
        steps = {m: per_rank // m for m in sizes}
    else:
        sizes = sorted(set(micro_batches or DEFAULT_MICRO_BATCHES))
        steps = dict.fromkeys(sizes, 1)
    if world == 1:
        parallels: list[DataParallel | None] = [None]
    else:
        parallels = []
        if "fsdp" in strategies:
            parallels += [DataParallel("fsdp", world, k) for k in dict.fromkeys(collectives_in_flight)]
        if "ddp" in strategies:
            parallels.append(DataParallel("ddp", world))
    configs = [Configuration(m, steps[m], parallel) for parallel in parallels for m in sizes]
    if world > 1 and "fsdp1" in strategies:
        configs += [Configuration(m, steps[m], DataParallel("fsdp", world), how)
                    for how in ("checkpoint", "costremat") for m in sizes]
    return configs


@dataclass(frozen=True)
class FitRow:
    """One configuration's outcome.

    Attributes:
        config: the configuration.
        fits: whether a plan was found whose predicted iteration peak is within the limit.
        peak_bytes: the predicted per-rank iteration peak of the chosen plan (fitting), else of the
            least-peak plan found; None when the floor alone rules it out.
        peak_phase: where in the iteration the fitting plan peaks (`TrainingStepPrediction.peak_phase`).
        floor_bytes: a proven lower bound on the iteration peak of any plan (resident terms plus
            the step's plan-independent bytes).
        over_bytes: by how much the least found peak (or the floor) exceeds the limit (0 when it fits).
        step_time_s: predicted time of one optimizer step (all micro-steps), None when not fitting.
        tokens_per_s_per_gpu: ``micro_batch x accumulation x seq / step_time_s``.
        exposed_communication_s: per optimizer step, collective time compute waits for.
        recompute_s: per optimizer step, time spent rerunning forward ops.
        recomputed: what the plan reruns, by op kind (``"mul (64), linear (32)"``), re-gathers apart.
        regathers: FSDP all-gathers the plan reruns in the backward (weights re-gathered).
        gap: the plan's certified gap on recompute time (None: unknown).
        step_budget_bytes: the step-peak budget the plan was solved for (what ``CostRemat(budget_gb=)``
            takes); None for save-all.
        plan: the plan (None: save-all, or not fitting).
        note: why it does not fit, or what was special.
        seconds: time spent on this configuration.
        block_tag_targets: torch FSDP1 configurations: the tags of the plan every block runs
            (``("*",)``: the whole block checkpointed).
    """

    config: Configuration
    fits: bool
    peak_bytes: int | None
    floor_bytes: int
    over_bytes: int = 0
    peak_phase: str = ""
    step_time_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    exposed_communication_s: float = 0.0
    recompute_s: float = 0.0
    recomputed: str = "nothing"
    regathers: int = 0
    gap: float | None = 0.0
    step_budget_bytes: int | None = None
    plan: RematPlan | None = field(default=None, repr=False)
    note: str = ""
    seconds: float = 0.0
    block_tag_targets: tuple[str, ...] = ()


@dataclass(frozen=True)
class FitResult:
    """The ranked outcomes: fitting configurations fastest first (tokens/s per GPU), then the
    others by how far they are over.

    Attributes:
        model: what was planned (name, sequence length, dtype, executors).
        gpus: the devices.
        limit_bytes: per-rank memory the iteration must fit (memory less the margin).
        memory_margin: the fraction of memory held back.
        rows: ranked.
        notes: what the search skipped and how terms were derived.
        seconds: time to answer.
    """

    model: str
    seq: int
    gpus: GPUs
    limit_bytes: int
    memory_margin: float
    rows: tuple[FitRow, ...]
    notes: tuple[str, ...]
    seconds: float
    request: ModelRequest | None = None

    @property
    def best(self) -> FitRow | None:
        return self.rows[0] if self.rows and self.rows[0].fits else None

    @property
    def best_thunder_jit(self) -> FitRow | None:
        """The fastest fitting configuration under ``thunder.jit`` (the ones plan files cover)."""
        return next((r for r in self.rows if r.fits and r.config.torch_fsdp is None), None)


def rank_rows(rows: Sequence[FitRow]) -> tuple[FitRow, ...]:
    """Fitting rows by tokens/s per GPU (highest first), then the rest by overshoot (least first)."""
    fitting = sorted((r for r in rows if r.fits), key=lambda r: -r.tokens_per_s_per_gpu)
    others = sorted((r for r in rows if not r.fits), key=lambda r: r.over_bytes)
    return (*fitting, *others)


# --------------------------------------------------------------------------------------------
# One configuration
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelRequest:
    """The model `fit` plans: a litgpt config at a sequence length.

    Attributes:
        name: litgpt config name.
        seq: sequence length.
        dtype: parameter and activation dtype (bfloat16 unless given).
        n_layer: override the depth (smaller what-ifs, tests).
        tiny: shrink the config to a tiny model of its family (tests).
        executors: a ``--executors`` choice (None: the meta device's default, the nvFuser stand-in).
        traced_layers: layers traced before extending to full depth (`models.graphs.analyze_spec`).
    """

    name: str
    seq: int
    dtype: str = "bfloat16"
    n_layer: int | None = None
    tiny: bool = False
    executors: str | None = None
    traced_layers: int | None = None

    def spec(self, micro_batch: int):
        from remat_opt.models.by_name import ModelSpec

        return ModelSpec(self.name, n_layer=self.n_layer, seq=self.seq, batch=micro_batch, dtype=self.dtype,
                         device="meta", tiny=self.tiny)


REBATCH_FROM = (2, 3)  # micro-batches traced for the others above them (`core.rebatch`)


def _graph(request: ModelRequest, config: Configuration):
    """One rank's joint graph of `config`: traced at micro-batches 1 to 3, above that sized from the
    graphs at 2 and 3 (`core.rebatch`), or traced where they differ in more than sizes."""
    from remat_opt.core.rebatch import RebatchError, rebatch

    if config.micro_batch <= max(REBATCH_FROM):
        return _traced(request, config.micro_batch, config.parallel)
    low, high = REBATCH_FROM
    try:
        return rebatch((low, _traced(request, low, config.parallel)), (high, _traced(request, high, config.parallel)),
                       config.micro_batch)
    except RebatchError as e:
        graph = _traced(request, config.micro_batch, config.parallel)
        return replace(graph, notes=(*graph.notes, f"traced at micro-batch {config.micro_batch}: {e}"))


@functools.lru_cache(maxsize=4)
def _traced(request: ModelRequest, micro_batch: int, parallel: DataParallel | None):
    """The graph traced at `micro_batch` (`models.graphs.analyze_spec`), kept for the next few
    configurations: the graphs at 2 and 3 size every larger micro-batch, and the plan file of the
    chosen configuration needs its graph again."""
    from remat_opt.analysis.whatif import DEFAULT_TRACED_LAYERS
    from remat_opt.models.graphs import analyze_spec

    traced = DEFAULT_TRACED_LAYERS if request.traced_layers is None else request.traced_layers
    return analyze_spec(request.spec(micro_batch), traced_layers=traced, executors=request.executors, parallel=parallel)


@functools.lru_cache(maxsize=8)
def _trainable(request: ModelRequest) -> tuple[tuple[int, ...], str]:
    from remat_opt.models.by_name import trainable_parameters

    return trainable_parameters(request.spec(1))


def _parameters(request: ModelRequest, config: Configuration):
    """One rank's trainable parameters under `config` (FSDP: its shards; torch's FSDP1 pads a unit's
    flat parameter, so every tensor's share rounds up)."""
    from remat_opt.analysis.training_step import Parameters

    numels, dtype = _trainable(request)
    if config.torch_fsdp is not None:
        return Parameters(tuple(-(-n // config.world_size) for n in numels), dtype)
    return Parameters(numels, dtype).per_rank(config.parallel)


def states_floor_bytes(parameters, cuda_arch: str | None) -> int:
    """Parameters, their gradients and AdamW's two moments (in the parameters' dtype), one rank's:
    all alive at the optimizer step, so a floor of any plan's iteration peak, known before tracing."""
    from remat_opt.analysis.training_step import CUDA_BLOCK_BYTES, CUBLAS_WORKSPACE_BYTES

    if cuda_arch is None:
        return 4 * parameters.bytes
    return 4 * parameters.rounded_bytes(CUDA_BLOCK_BYTES) + CUBLAS_WORKSPACE_BYTES[cuda_arch]


def evaluate_configuration(request: ModelRequest, config: Configuration, gpus: GPUs, limit_bytes: int, *,
                           time_limit_s: float = 10.0) -> FitRow:
    """The fastest plan of `config` whose predicted iteration peak is at most `limit_bytes`, or, when
    none is, how far the least-peak plan found is over."""
    from remat_opt.analysis.training_step import predict_training_step
    from remat_opt.analysis.whatif import cost_graph
    from remat_opt.costing.graph_costs import CostModel
    from remat_opt.solvers.peak_model import peak_model_of

    start_s = time.perf_counter()
    parameters = _parameters(request, config)
    states = states_floor_bytes(parameters, gpus.cuda_arch)
    if states > limit_bytes:  # ruled out before tracing
        return FitRow(config=config, fits=False, peak_bytes=None, floor_bytes=states, over_bytes=states - limit_bytes,
                      note=f"parameters, gradients and AdamW moments alone take {gb(states)} GB per rank (proven)",
                      seconds=time.perf_counter() - start_s)
    if config.torch_fsdp is not None:
        row = _evaluate_torch_fsdp(request, config, gpus, limit_bytes, parameters, states, time_limit_s)
        return replace(row, seconds=time.perf_counter() - start_s)
    graph = _graph(request, config)
    costed = cost_graph(graph, gpus.spec)
    costs = CostModel(graph, gpus.spec)
    predict = functools.partial(predict_training_step, graph, costs, parameters, cuda_arch=gpus.cuda_arch)
    save_all = predict()
    resident = sum(v for k, v in save_all.memory_terms.items() if k in ("AdamW moments", "cuBLAS workspace"))
    floor = resident + int(peak_model_of(costed.problem).const.max())
    done = dict(config=config, floor_bytes=floor)
    if save_all.peak_bytes <= limit_bytes:
        row = _fitting_row(request, config, graph, costs, costed, None, save_all, floor)
    elif floor > limit_bytes:
        row = FitRow(fits=False, peak_bytes=None, over_bytes=floor - limit_bytes,
                     note=f"any plan peaks at {gb(floor)} GB or more (proven){_floor_cause(costed.problem)}", **done)
    else:
        row = _search_budget(request, config, graph, costs, costed, predict, limit_bytes, save_all, resident,
                             floor, time_limit_s, gpus.cuda_arch)
    return replace(row, seconds=time.perf_counter() - start_s)


@functools.lru_cache(maxsize=8)
def _torch_fsdp_case(request: ModelRequest, world_size: int, micro_batch: int, gpus: GPUs):
    """One block of the model traced through ThunderFX on meta, with FSDP1's units over `world_size`."""
    from remat_opt.analysis.thunder_1370 import case_of_config
    from remat_opt.analysis.training_step import CUBLAS_WORKSPACE_BYTES
    from remat_opt.models.by_name import litgpt_config

    config, _ = litgpt_config(request.spec(micro_batch))
    workspace = CUBLAS_WORKSPACE_BYTES[gpus.cuda_arch] if gpus.cuda_arch is not None else 0
    return case_of_config(config, seq=request.seq, world_size=world_size, dtype=request.dtype,
                          executors=request.executors, device_spec=gpus.spec, micro_batch=micro_batch,
                          workspace_bytes=workspace, name=request.name)


@functools.lru_cache(maxsize=8)
def _block_menu(request: ModelRequest, world_size: int, micro_batch: int, gpus: GPUs, time_limit_s: float):
    from remat_opt.analysis.thunder_1370 import block_menu

    return tuple(block_menu(_torch_fsdp_case(request, world_size, micro_batch, gpus), n_points=BLOCK_MENU_POINTS,
                            time_limit_s=time_limit_s))


def _evaluate_torch_fsdp(request, config, gpus, limit_bytes, parameters, states_bytes, time_limit_s) -> FitRow:
    """`config` under torch's FSDP1 and ThunderFX (`analysis.thunder_1370`): every block checkpointed,
    or the fastest of the block's plans (one plan for all blocks: ThunderFX compiles one graph for
    them) whose predicted iteration peak fits."""
    from costmodels.devices import roofline_time_s
    from costmodels.formulas import formula_cost
    from remat_opt.analysis.thunder_1370 import CHECKPOINT_WRAPPER
    from remat_opt.analysis.torch_fsdp import fsdp1_micro_step_time
    from remat_opt.analysis.training_step import adamw_op_args

    key = (request, config.world_size, config.micro_batch, gpus)
    case = _torch_fsdp_case(*key)
    if config.torch_fsdp == "checkpoint":
        plans = (case.checkpoint(),)
    else:  # CostRemat's own plans: tags (torch's checkpoint_wrapper is the other row)
        plans = tuple(p for p in _block_menu(*key, time_limit_s) if p.tag_targets != CHECKPOINT_WRAPPER)
    predicted = [(plan, case.predict(plan)) for plan in plans]
    fitting = [(p, pred) for p, pred in predicted if pred.peak_bytes <= limit_bytes]
    done = dict(config=config, floor_bytes=states_bytes, gap=None)
    if not fitting:
        plan, least = min(predicted, key=lambda pp: pp[1].peak_bytes)
        return FitRow(fits=False, peak_bytes=least.peak_bytes, over_bytes=least.peak_bytes - limit_bytes,
                      peak_phase=least.peak_event,
                      note=f"least peak of {len(plans)} block plan(s) ({plan.label}) at {least.peak_event}", **done)
    plan, prediction = min(fitting, key=lambda pp: (pp[0].recompute_time_s, pp[1].peak_bytes))
    n_blocks = case.units.n_blocks
    micro_step = fsdp1_micro_step_time(n_blocks, case.step_times(plan))
    optimizer_s = roofline_time_s(formula_cost(adamw_op_args(parameters, parameters.dtype)), case.costs.device_spec)
    total_s = config.accumulation * micro_step.time_s + optimizer_s
    tokens = config.micro_batch * config.accumulation * request.seq
    rerun = ("every block's forward (checkpoint_wrapper)" if plan.tag_targets == CHECKPOINT_WRAPPER
             else f"{plan.activations.recompute_ops} ops per block ({plan.label})" if plan.activations.recompute_ops
             else "nothing")
    return FitRow(fits=True, peak_bytes=prediction.peak_bytes, peak_phase=prediction.peak_event, step_time_s=total_s,
                  tokens_per_s_per_gpu=tokens / total_s,
                  exposed_communication_s=config.accumulation * micro_step.exposed_communication_s,
                  recompute_s=config.accumulation * n_blocks * plan.recompute_time_s, recomputed=rerun,
                  note=f"block plan: {plan.label}", block_tag_targets=plan.tag_targets, **done)


def _floor_cause(problem) -> str:
    """What makes the step's proven floor, where one term makes half of it or more: the unsharded
    weights Thunder's FSDP gathers at the forward's start, or the unsharded gradients waiting for
    reduce-scatters it issues after the backward's compute."""
    from remat_opt.distributed.collective_order import gathered_weights_alive_bytes, gradients_awaiting_scatter_bytes
    from remat_opt.solvers.peak_model import peak_model_of

    const = peak_model_of(problem).const
    event, n_forward = int(const.argmax()), len(problem.graph.forward_ops)
    if event < n_forward:
        weights = gathered_weights_alive_bytes(problem.graph, event)
        if weights >= const[event] / 2:
            return (f", {gb(weights)} GB of it unsharded weights, which Thunder's FSDP gathers at the forward's start "
                    "(collectives_in_flight lowers it)")
        return ""
    waiting = gradients_awaiting_scatter_bytes(problem.graph, max(event - n_forward - 1, 0))
    if waiting < const[event] / 2:
        return ""
    return (f", {gb(waiting)} GB of it unsharded gradients waiting for their reduce-scatters, which Thunder's FSDP "
            "issues after the backward's last compute (collectives_in_flight issues each after its gradient)")


def _solve(costed, budget_bytes: int, time_limit_s: float) -> RematPlan:
    from remat_opt.planning.planner import PlanRequest, resolve_solver, solver_options
    from remat_opt.solvers import SOLVERS

    solver = resolve_solver("auto", costed.problem)
    options = solver_options(PlanRequest.create(time_limit_s=time_limit_s), solver)
    return SOLVERS[solver](costed.problem, peak_budget_bytes=budget_bytes, options=options)


def _search_budget(request, config, graph, costs, costed, predict, limit_bytes, save_all, resident, floor,
                   time_limit_s, cuda_arch) -> FitRow:
    """Solves at the step budget that leaves room for the iteration's other terms, lowering it by
    each predicted overshoot (the loss's tensors sit beside the step's at its end)."""
    budget = limit_bytes - (save_all.peak_bytes - _step_peak(graph, cuda_arch))
    least: tuple[RematPlan, int] | None = None
    for _ in range(MAX_BUDGET_ROUNDS):
        try:
            plan = _solve(costed, budget, time_limit_s)
        except InfeasibleBudgetError as e:
            floor = max(floor, resident + e.lower_bound)
            if least is None:
                least = _least_plan(costed, e.minimum, predict, time_limit_s)
            break
        except TimeoutError:
            break
        prediction = predict(plan.recomputed_tag_targets)
        if prediction.peak_bytes <= limit_bytes:
            return _fitting_row(request, config, graph, costs, costed, plan, prediction, floor, budget)
        least = (plan, prediction.peak_bytes) if least is None or prediction.peak_bytes < least[1] else least
        budget -= prediction.peak_bytes - limit_bytes
    if least is None:
        return FitRow(config=config, fits=False, peak_bytes=None, floor_bytes=floor, over_bytes=max(0, floor - limit_bytes),
                      note="no plan found within the solver's time limit")
    plan, peak = least
    return FitRow(config=config, fits=False, peak_bytes=peak, floor_bytes=floor, over_bytes=peak - limit_bytes,
                  plan=plan, note=f"least peak found {gb(peak)} GB; no plan proven below {gb(floor)} GB")


def _least_plan(costed, least_step_bytes: int, predict, time_limit_s):
    """The least-peak plan the solver found (at the least budget its error names) and its
    iteration peak, or None."""
    try:
        plan = _solve(costed, least_step_bytes, time_limit_s)
    except (InfeasibleBudgetError, TimeoutError):
        return None
    return plan, predict(plan.recomputed_tag_targets).peak_bytes


def _step_peak(graph, cuda_arch: str | None) -> int:
    """Save-all's step peak as the iteration counts it (blocks of the CUDA allocator on a GPU)."""
    from remat_opt.analysis.training_step import CUDA_BLOCK_BYTES
    from remat_opt.core.simulation import simulate_step

    granularity = CUDA_BLOCK_BYTES if cuda_arch is not None else 1
    return simulate_step(graph, (), allocation_granularity_bytes=granularity, by_kind=False).peak_bytes


def _fitting_row(request, config, graph, costs, costed, plan, prediction, floor, budget=None) -> FitRow:
    from remat_opt.analysis.training_step import overlapped_step
    from remat_opt.analysis.whatif import recomputed_by_kind
    from remat_opt.distributed.collective_order import ALL_GATHER

    tags = plan.recomputed_tag_targets if plan is not None else ()
    step = overlapped_step(graph, costs, tags)
    outside = sum(v for k, v in prediction.time_terms.items() if k.startswith("loss"))
    optimizer = sum(v for k, v in prediction.time_terms.items() if k.startswith("optimizer"))
    total_s = config.accumulation * (step.time_s + outside) + optimizer
    recompute_s = config.accumulation * (plan.extra_time_s if plan is not None else 0.0)
    symbols = {op.name: op.symbol for op in graph.forward_ops}
    regathers = sum(symbols[o] == ALL_GATHER for o in plan.recompute_ops) if plan is not None else 0
    tokens = config.micro_batch * config.accumulation * request.seq
    return FitRow(
        config=config, fits=True, peak_bytes=prediction.peak_bytes, floor_bytes=floor, peak_phase=prediction.peak_phase,
        step_time_s=total_s,
        tokens_per_s_per_gpu=tokens / total_s,
        exposed_communication_s=config.accumulation * step.exposed_communication_s, recompute_s=recompute_s,
        recomputed=_kinds(recomputed_by_kind(costed, plan)) if plan is not None else "nothing", regathers=regathers,
        gap=plan.gap if plan is not None else 0.0, step_budget_bytes=budget, plan=plan,
    )


# --------------------------------------------------------------------------------------------
# The search
# --------------------------------------------------------------------------------------------


def fit(model: str, *, gpus: str | GPUs, seq: int, global_batch: int | None = None,
        memory_margin: float = DEFAULT_MEMORY_MARGIN, memory_gb: float | None = None,
        micro_batches: Sequence[int] | None = None, strategies: Sequence[str] = STRATEGIES,
        collectives_in_flight: Sequence[int | None] = DEFAULT_IN_FLIGHT, dtype: str = "bfloat16",
        n_layer: int | None = None, tiny: bool = False, executors: str | None = None,
        traced_layers: int | None = None, time_limit_s: float = 10.0,
        progress: Callable[[int, int, Configuration, FitRow | None], None] | None = None) -> FitResult:
    """The configurations of training `model` on `gpus`, ranked (see the module docstring).

    Args:
        model: a litgpt config name (``"Llama-3-70B"``).
        gpus: ``"8xH100"`` or `GPUs`.
        seq: sequence length.
        global_batch: sequences per optimizer step over all GPUs (None: each micro-batch without
            accumulation).
        memory_margin: fraction of each device's memory held back (the CUDA context,
            fragmentation, what the model does not see).
        memory_gb: the memory of one device, instead of the spec sheet's (required for ``cpu``).
        micro_batches: the sizes to try (default 1, 2, 4, 8, or the powers of two dividing the
            per-rank batch).
        strategies: any of ``"fsdp"``, ``"ddp"`` (``thunder.jit`` with Thunder's transforms) and
            ``"fsdp1"`` (torch's FSDP1 under ThunderFX, per-block checkpointing or a CostRemat
            block plan); ignored on one GPU.
        collectives_in_flight: FSDP variants to try (None: Thunder's order).
        progress: called before (row None) and after each configuration.

    Raises:
        FitError: the request cannot be searched (one line says why and what works).
    """
    from remat_opt.models.by_name import ModelSpecError, check_spec, litgpt_config

    start_s = time.perf_counter()
    if not 0 <= memory_margin < 1:
        raise FitError(f"--memory-margin must be in [0, 1), got {memory_margin!r}")
    gpus = gpus if isinstance(gpus, GPUs) else parse_gpus(gpus, memory_gb)
    request = ModelRequest(model, seq, dtype, n_layer, tiny, executors, traced_layers)
    try:
        spec = request.spec(1)
        check_spec(spec)
        litgpt_config(spec)
    except (ModelSpecError, ValueError) as e:
        raise FitError(str(e)) from e
    configs = configurations(gpus, global_batch=global_batch, micro_batches=micro_batches, strategies=strategies,
                             collectives_in_flight=collectives_in_flight)
    limit = int(gpus.memory_bytes * (1 - memory_margin))
    rows, notes, ruled_out = [], [], {}
    for i, config in enumerate(configs):
        key = (repr(config.parallel), config.torch_fsdp)
        if key in ruled_out:
            notes.append(f"{config.describe()}: not tried ({ruled_out[key]} does not fit)")
            continue
        if progress:
            progress(i, len(configs), config, None)
        try:
            row = evaluate_configuration(request, config, gpus, limit, time_limit_s=time_limit_s)
        except ValueError as e:  # e.g. FSDP cannot shard a parameter over the ranks
            row = FitRow(config=config, fits=False, peak_bytes=None, floor_bytes=0, over_bytes=0,
                         note=f"cannot run: {str(e).splitlines()[0]}")
        if not row.fits:
            ruled_out[key] = f"micro-batch {config.micro_batch}"
        rows.append(row)
        if progress:
            progress(i, len(configs), config, row)
    notes += _derivation_notes()
    return FitResult(model, seq, gpus, limit, memory_margin, rank_rows(rows), tuple(notes),
                     time.perf_counter() - start_s, request)


def _derivation_notes() -> list[str]:
    return [
        "peak: Thunder's benchmark_litgpt.py iteration per rank (parameters, gradients, AdamW moments in the "
        "parameters' dtype, activations, eager loss, cuBLAS workspace; blocks rounded to 512 B); torch FSDP1: "
        "its iteration walked unit by unit (analysis.torch_fsdp)",
        "time: op formulas on the spec sheet, GEMMs at the achievable share of peak by shape (MAMF table, wave and "
        "tile quantization), collectives on their own stream beside compute (over InfiniBand beyond 8 GPUs); "
        "accumulation steps each run the whole step",
    ]


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def gb(n_bytes: int | None) -> str:
    """Bytes as GB: two decimals from 0.1 GB, three significant digits below (tiny models)."""
    if n_bytes is None:
        return "-"
    return f"{n_bytes / GB:.2f}" if n_bytes >= 0.1 * GB else f"{n_bytes / GB:.3g}"


def result_rows(result: FitResult) -> list[dict[str, str]]:
    """Display rows of the ranked table."""
    rows = []
    for rank, row in enumerate(result.rows, 1):
        peak = gb(row.peak_bytes)
        if row.fits:
            gap = "-" if row.gap is None else f"{row.gap:.1%}"
            rows.append({"#": str(rank), "configuration": row.config.describe(), "peak GB": peak,
                         "step ms": f"{row.step_time_s * 1e3:.1f}", "tokens/s/GPU": f"{row.tokens_per_s_per_gpu:,.0f}",
                         "recomputes": _recomputes(row), "gap": gap})
        else:
            rows.append({"#": "-", "configuration": row.config.describe(), "peak GB": peak,
                         "step ms": "-", "tokens/s/GPU": "-",
                         "recomputes": f"does not fit: over by {gb(row.over_bytes)} GB; {row.note}" if row.over_bytes
                         else row.note, "gap": "-"})
    return rows


def _kinds(counts: dict[str, int], shown: int = 3) -> str:
    """Rerun ops that cost time, by kind, fusion regions together, attention by any executor as
    ``sdpa`` (on meta the stand-in's graphs run it through remat_opt's CPU executor), re-gathers apart:
    ``"12 ops: fusion regions (8), linear (2), mul (1), 1 more"``."""
    from costmodels.formulas import SDPA_FORMS
    from remat_opt.distributed.collective_order import ALL_GATHER

    kinds: dict[str, int] = {}
    for symbol, n in counts.items():
        if symbol == ALL_GATHER:
            continue
        kind = "fusion regions" if re.fullmatch(r"(nvFusion|TorchCompile)\d+", symbol) else \
            "sdpa" if symbol in SDPA_FORMS else symbol
        kinds[kind] = kinds.get(kind, 0) + n
    if not kinds:
        return "nothing"
    ranked = sorted(kinds.items(), key=lambda kv: -kv[1])
    more = f", {len(ranked) - shown} more kinds" if len(ranked) > shown else ""
    return f"{sum(kinds.values())} ops: " + ", ".join(f"{k} ({n})" for k, n in ranked[:shown]) + more


def _recomputes(row: FitRow) -> str:
    if row.config.torch_fsdp is not None:
        return f"+{row.recompute_s * 1e3:.1f} ms: {row.recomputed}" if row.recompute_s else "nothing"
    if row.plan is None:
        return "nothing (save-all)"
    regather = f"; re-gathers {row.regathers} weights" if row.regathers else ""
    return f"+{row.recompute_s * 1e3:.1f} ms: {row.recomputed}{regather}"


def apply_lines(result: FitResult, row: FitRow | None = None, plan_path: str | None = None) -> list[str]:
    """How to run `row` (default: the best configuration): the `thunder.jit` line and the launcher
    command; with `plan_path`, CostRemat applies that plan file instead of planning again."""
    best = row or result.best
    if best is None or not best.fits:
        return []
    config = best.config
    if config.torch_fsdp is not None:
        return _torch_fsdp_lines(result, best)
    options = []
    if plan_path is not None:
        options.append(f"plan={plan_path!r}")
    else:
        if best.step_budget_bytes is not None:
            options.append(f"budget_gb={best.step_budget_bytes / GB:.3f}")
        if config.parallel is not None and config.parallel.collectives_in_flight is not None:
            options.append(f"collectives_in_flight={config.parallel.collectives_in_flight}")
    options.append(f"device_spec={result.gpus.device_spec!r}")
    transforms = [f"CostRemat({', '.join(options)})"]
    if config.parallel is not None:
        transforms.insert(0, "FSDPTransform()" if config.parallel.strategy == "fsdp" else "DDPTransform(process_group)")
    lines = [f"jitted = thunder.jit(model, transforms=[{', '.join(transforms)}])"]
    launcher = "python train.py" if config.world_size == 1 else f"torchrun --nproc-per-node {config.world_size} train.py"
    lines.append(f"{launcher}   # micro-batch {config.micro_batch}, {config.accumulation} accumulation step(s), "
                 f"global batch {config.global_batch}")
    return lines


def _torch_fsdp_lines(result: FitResult, row: FitRow) -> list[str]:
    """Thunder's own benchmark runs the torch FSDP1 configurations (`analysis.torch_fsdp`): with
    per-block checkpointing as is; a CostRemat block plan is not yet applied from a plan file."""
    config, model = row.config, result.request
    command = (f"torchrun --nproc-per-node {config.world_size} thunder/benchmarks/benchmark_litgpt.py "
               f"--model_name {model.name} --block_size {model.seq} --compile thunder-dynamo --distributed_mode fsdp "
               f"--shard_mode zero3 --micro_batch_size {config.micro_batch} --global_batch_size {config.global_batch}")
    if config.torch_fsdp == "checkpoint":
        return [command + " --checkpoint_activations True"]
    if not row.block_tag_targets:  # the block saves everything: the command as it is
        return [command]
    return [command + "   # without checkpointing; the block plan's tags (--json: block_tag_targets) are not "
            "yet applied from a plan file under ThunderFX"]


def plan_file_of(result: FitResult, row: FitRow | None = None):
    """The plan file (`remat_opt.planning.plan_file.PlanFile`) of `row` (default: the best) for
    ``CostRemat(plan=...)``.

    Raises:
        FitError: no configuration fits (there is no plan to write).
    """
    from remat_opt.planning.plan_file import PlanFile

    row = row or result.best
    if row is None or not row.fits:
        raise FitError("no configuration fits, so there is no plan to write; see the table for the closest")
    if row.config.torch_fsdp is not None:
        raise FitError(f"{row.config.describe()} runs under ThunderFX with torch's FSDP1, which plan files do not "
                       "cover yet; run the printed benchmark command (per-block checkpointing needs no plan)")
    model = result.request
    config = row.config
    graph = _graph(model, config)
    tags = row.plan.recomputed_tag_targets if row.plan is not None else ()
    description = {
        "model": {"name": model.name, "seq": model.seq, "dtype": model.dtype, "n_layer": model.n_layer,
                  "tiny": model.tiny, "executors": model.executors},
        "configuration": row.config.describe(), "micro_batch": config.micro_batch,
        "accumulation": config.accumulation, "strategy": config.parallel.strategy if config.parallel else None,
        "gpus": result.gpus.describe(), "limit_bytes": result.limit_bytes,
        "predicted_iteration_peak_bytes": row.peak_bytes, "predicted_step_time_s": row.step_time_s,
        "step_budget_bytes": row.step_budget_bytes, "apply": apply_lines(result, row),
    }
    in_flight = config.parallel.collectives_in_flight if config.parallel else None
    return PlanFile.of(graph, tags, collectives_in_flight=in_flight, description=description)


def result_json(result: FitResult) -> dict:
    """`result` as JSON-ready data."""
    def row_data(row: FitRow) -> dict:
        data = {k: v for k, v in asdict(row).items() if k not in ("config", "plan")}
        data["config"] = {"micro_batch": row.config.micro_batch, "accumulation": row.config.accumulation,
                          "strategy": ("fsdp1" if row.config.torch_fsdp else row.config.parallel.strategy)
                          if row.config.parallel else None,
                          "torch_fsdp": row.config.torch_fsdp, "world_size": row.config.world_size,
                          "collectives_in_flight": row.config.parallel.collectives_in_flight if row.config.parallel else None,
                          "description": row.config.describe()}
        data["recomputed_tag_targets"] = list(row.plan.recomputed_tag_targets) if row.plan else []
        return data

    return {"model": result.model, "seq": result.seq, "gpus": asdict(result.gpus), "limit_bytes": result.limit_bytes,
            "memory_margin": result.memory_margin, "seconds": result.seconds, "notes": list(result.notes),
            "rows": [row_data(r) for r in result.rows], "apply": apply_lines(result)}
