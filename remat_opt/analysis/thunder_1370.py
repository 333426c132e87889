"""Lightning-thunder PR #1370's multi-GPU run, predicted: ``benchmark_litgpt.py --compile
thunder-dynamo --checkpoint_activations=True --distributed_mode=fsdp --shard_mode zero3``,
micro-batch 1, on 8 H100s, at the config's block size (`THUNDER_1370_MEMORY_GB`: the PR's
``max_memory_allocated`` figures, for comparison only, never for fitting).

What that command runs (``thunder/benchmarks/benchmark_litgpt.py``): the litgpt model in bf16,
torch's FSDP1 (``FULL_SHARD``, one unit per ``Block``, ``use_orig_params=True``), every block
wrapped in ``checkpoint_wrapper``, Dynamo with Thunder as its backend (one Thunder graph per block;
Thunder turns the checkpoint into recompute tags over the whole block), the eager cross-entropy and
``torch.optim.AdamW(fused=True)``. `remat_opt.analysis.torch_fsdp` walks that iteration; this module
traces one block of the named config on meta and prices its plans: per-block checkpointing (the
PR's run), save-all, and the block plans CostRemat could choose instead (a Pareto sweep of the
block's graph), uniform over the blocks or with the last blocks saving more.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from costmodels.interconnect import collective_time_s, ring_bytes_per_rank
from remat_opt.analysis.training_step import CUBLAS_WORKSPACE_BYTES as TRAINING_STEP_CUBLAS_WORKSPACE_BYTES
from remat_opt.analysis.torch_fsdp import (BlockActivations, Fsdp1StepTimes, Fsdp1Units, HeadShapes,
                                           IterationPrediction, predict_fsdp1_iteration)
from remat_opt.core.graph import JointGraph
from remat_opt.core.plan import RematPlan
from remat_opt.core.problem import RecomputeProblem
from remat_opt.costing.graph_costs import CostModel

# lightning-thunder PR #1370 (2024-10-30), 8 H100s, the command above: per-rank peak memory, GB (1e9 B).
THUNDER_1370_MEMORY_GB = {"Llama-3-70B": 78.77}
# The same flags run the next day (PR #1261's thread, 2024-10-31, container 20241028) recorded
# Llama-3-70B as out of memory with ThunderFX and with Inductor.
THUNDER_1261_LLAMA3_70B = "OOM with thunder+dynamo and with inductor"
CUBLAS_WORKSPACE_BYTES = TRAINING_STEP_CUBLAS_WORKSPACE_BYTES["sm90"]  # H100s
CHECKPOINT_WRAPPER = ("*",)  # the tags of `BenchmarkCase.checkpoint`'s plan: torch reruns the whole block


@dataclass(frozen=True)
class BlockPlan:
    """One plan of a block's graph, priced: its activation terms and the time its recompute adds."""

    label: str
    tag_targets: tuple[str, ...]
    activations: BlockActivations
    recompute_time_s: float


@dataclass(frozen=True)
class BenchmarkCase:
    """One config under the PR's command: its FSDP1 units, head shapes and one traced block."""

    name: str
    seq: int
    units: Fsdp1Units
    head: HeadShapes
    block_graph: JointGraph
    checkpoint_graph: JointGraph
    problem: RecomputeProblem
    costs: CostModel
    workspace_bytes: int = CUBLAS_WORKSPACE_BYTES
    micro_batch: int = 1

    def block_plan(self, label: str, plan: RematPlan) -> BlockPlan:
        """`plan` (of the block's graph) priced: its activation terms and recompute time."""
        tags = plan.recomputed_tag_targets
        activations = BlockActivations.from_graph(self.block_graph, tags, hidden_input=self.block_graph.input_names[0])
        return BlockPlan(label, tags, activations, plan.extra_time_s)

    def save_all(self) -> BlockPlan:
        return self.block_plan("save-all", self.problem.plan_for((), solver="save_all", status="heuristic",
                                                                 solve_time_s=0.0))

    def checkpoint(self) -> BlockPlan:
        """Per-block checkpointing as the PR ran it: the block in ``checkpoint_wrapper``, which
        Thunder compiles as one checkpoint op whose backward reruns the block's forward (its graph
        has the rerun ops in the backward)."""
        graph = self.checkpoint_graph
        activations = BlockActivations.from_graph(graph, (), hidden_input=graph.input_names[0])
        rerun_s = _step_time_s(graph, CostModel(graph, device_spec=self.costs.device_spec)) - self.block_step_time_s
        return BlockPlan("per-block checkpointing", CHECKPOINT_WRAPPER, activations, rerun_s)

    def recompute_all(self) -> BlockPlan:
        """Tags on every op of the block (CostRemat's per-block checkpointing, as Thunder's tags run it)."""
        return self.block_plan("every op tagged", self.problem.plan_for(
            self.problem.allowed_units, solver="per_block", status="heuristic", solve_time_s=0.0))

    def predict(self, plans: BlockPlan | list[BlockPlan]) -> IterationPrediction:
        """The iteration's peak with `plans` (one for every block, or one per block in forward order)."""
        acts = plans.activations if isinstance(plans, BlockPlan) else [p.activations for p in plans]
        return predict_fsdp1_iteration(self.units, acts, self.head, workspace_bytes=self.workspace_bytes)

    @property
    def block_step_time_s(self) -> float:
        """One block's forward and backward (save-all), from the cost model."""
        return _step_time_s(self.block_graph, self.costs)

    def step_times(self, plan: BlockPlan) -> Fsdp1StepTimes:
        """What a micro-step with `plan` in every block runs (`torch_fsdp.fsdp1_micro_step_time`):
        the block's ops priced by the cost model, the root's linear and the eager loss by their
        formulas, each unit's collectives as rings over the device spec's interconnect."""
        forward_s = sum(self.costs.op_cost(op).time_s for op in self.block_graph.forward_ops)
        link, world_size = self.costs.device_spec.interconnect, self.units.world_size

        def ring_s(kind: str, unit: str) -> float:
            return collective_time_s(ring_bytes_per_rank(kind, self.units.unsharded_bytes(unit), world_size), 1, link)

        return Fsdp1StepTimes(
            block_forward_s=forward_s, block_backward_s=self.block_step_time_s - forward_s + plan.recompute_time_s,
            head_s=self.head_time_s, block_all_gather_s=ring_s("all_gather", "block"),
            block_reduce_scatter_s=ring_s("reduce_scatter", "block"), root_all_gather_s=ring_s("all_gather", "root"),
            root_reduce_scatter_s=ring_s("reduce_scatter", "root"))

    @property
    def head_time_s(self) -> float:
        """``lm_head`` (its forward, and its backward as two matmuls of the same size) and the eager
        loss, by their formulas on the device spec (``ln_f`` and the embedding left out: they move a
        few [tokens, hidden] tensors, against the head's [tokens, vocab] ones)."""
        from costmodels.devices import roofline_time_s
        from costmodels.formulas import OpArgs, TensorMeta, formula_cost
        from remat_opt.analysis.training_step import loss_op_args

        hidden = self.units.root_numels["ln_f"]
        vocab = self.units.root_numels["lm_head"] // hidden
        tokens, dtype, spec = self.micro_batch * self.seq, self.units.dtype, self.costs.device_spec
        logits = TensorMeta.of((tokens, vocab), dtype)
        linear = OpArgs("linear", inputs=(TensorMeta.of((tokens, hidden), dtype), TensorMeta.of((vocab, hidden), dtype)),
                        outputs=(logits,))
        loss_s = sum(roofline_time_s(formula_cost(args), spec) for args in loss_op_args(logits).values())
        return 3 * roofline_time_s(formula_cost(linear), spec) + loss_s


def _step_time_s(graph: JointGraph, costs: CostModel) -> float:
    return sum(costs.op_cost(op).time_s for op in graph.ops)


def benchmark_case(name: str = "Llama-3-70B", *, seq: int | None = None, world_size: int = 8,
                   dtype: str = "bfloat16", executors=None, device_spec: str = "h100") -> BenchmarkCase:
    """The litgpt config `name` under the PR's command over `world_size` ranks at `seq` (default:
    the config's block size, as the benchmark runs it), one block traced on meta."""
    from remat_opt.models.by_name import ModelSpec, litgpt_config

    config, _ = litgpt_config(ModelSpec(name, dtype=dtype))
    return case_of_config(config, seq=seq or config.block_size, world_size=world_size, dtype=dtype,
                          executors=executors, device_spec=device_spec, name=name)


def case_of_config(config, *, seq: int, world_size: int, dtype: str, executors=None, device_spec="h100",
                   device: str = "meta", name: str = "", micro_batch: int = 1,
                   workspace_bytes: int | None = None) -> BenchmarkCase:
    """`benchmark_case` of a litgpt `Config` (any size; `device` ``"cpu"`` traces real tensors with
    the CPU's executors, as a CPU run compiles them) at `micro_batch` sequences per step;
    `workspace_bytes` (default: an H100's cuBLAS workspace on a GPU spec, none on the CPU) is alive
    throughout."""
    import torch
    from litgpt import GPT
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    from remat_opt.executors import resolve_executors
    from remat_opt.planning.planner import forward_op_times_s
    from remat_opt.tracing.capture import analyze_thunderfx

    torch_dtype = getattr(torch, dtype)
    one_block = replace(config, n_layer=1, block_size=max(seq, 1))
    with torch.device(device):
        model = GPT(one_block).to(torch_dtype)
    block, transformer = model.transformer.h[0], model.transformer
    cos, sin = model.cos[:seq].unsqueeze(0), model.sin[:seq].unsqueeze(0)
    _, executor_list = resolve_executors(executors, device)

    def trace(module):
        x = torch.zeros(micro_batch, seq, config.n_embd, device=device, dtype=torch_dtype, requires_grad=True)
        return analyze_thunderfx(module, x, cos, sin, executors=executor_list)

    graph, checkpoint_graph = trace(block), trace(checkpoint_wrapper(block))
    costs = CostModel(graph, device_spec=device_spec)
    problem = RecomputeProblem.from_graph(graph, forward_op_times_s(costs, graph))
    root = {"lm_head": model.lm_head.weight.numel(), "ln_f": transformer.ln_f.weight.numel(),
            "wte": transformer.wte.weight.numel()}
    itemsize = torch.empty((), dtype=torch_dtype).element_size()
    units = Fsdp1Units(tuple(p.numel() for p in block.parameters()), root, config.n_layer, dtype, world_size,
                       buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()))
    tokens = micro_batch * seq
    head = HeadShapes(hidden_bytes=tokens * config.n_embd * itemsize,
                      logits_bytes=tokens * config.padded_vocab_size * itemsize, norm_stat_bytes=tokens * 4)
    on_cpu = device == "cpu" or str(getattr(device_spec, "name", device_spec)).startswith("cpu")
    workspace = workspace_bytes if workspace_bytes is not None else 0 if on_cpu else CUBLAS_WORKSPACE_BYTES
    return BenchmarkCase(name or config.name, seq, units, head, graph, checkpoint_graph, problem, costs, workspace,
                         micro_batch)


def block_menu(case: BenchmarkCase, n_points: int = 8, *, time_limit_s: float = 10.0) -> list[BlockPlan]:
    """Per-block checkpointing, every op tagged, save-all, and the block graph's Pareto plans (exact
    ILP, least recompute time) at `n_points` saved-bytes budgets and `n_points` block-peak budgets
    between the least and save-all's, slowest first; plans with the same tags once."""
    from remat_opt.solvers.ilp_model import ILPOptions
    from remat_opt.solvers.pareto import ACTIVATION, PEAK, sweep_budgets, sweep_points

    options = ILPOptions(time_limit_s=time_limit_s)
    plans = [case.checkpoint(), case.recompute_all()]
    for kind, what in ((ACTIVATION, "saved"), (PEAK, "block peak")):
        budgets, known = sweep_budgets(case.problem, n_points, kind, options)
        points = sweep_points(case.problem, budgets, budget_kind=kind, solver="ilp", options=options, known=known)
        plans += [case.block_plan(f"ILP at {p.swept_budget_bytes / 1e9:.2f} GB {what}", p.plan)
                  for p in points if p.plan is not None]
    plans.append(case.save_all())
    unique, seen = [], set()  # plans with the same terms and time (the same tags among them) once
    for plan in plans:
        a = plan.activations
        key = (a.carried_bytes, a.forward_bytes, a.backward_bytes, a.end_bytes, round(plan.recompute_time_s, 9))
        if key not in seen:
            seen.add(key)
            unique.append(plan)
    return sorted(unique, key=lambda p: -p.recompute_time_s)


@dataclass(frozen=True)
class Assignment:
    """Block plans over the chain: the first blocks run `first`, the last `n_last` run `last`."""

    first: BlockPlan
    last: BlockPlan
    n_last: int
    prediction: IterationPrediction
    recompute_time_s: float

    def describe(self, n_blocks: int) -> str:
        if self.n_last == 0 or self.first.tag_targets == self.last.tag_targets:
            return f"{self.first.label}, all {n_blocks} blocks"
        if self.n_last == n_blocks:
            return f"{self.last.label}, all {n_blocks} blocks"
        return f"{self.first.label} in blocks 0-{n_blocks - self.n_last - 1}, {self.last.label} in the last {self.n_last}"


def assignments(case: BenchmarkCase, menu: list[BlockPlan], *, uniform_only: bool = False) -> list[Assignment]:
    """Every uniform plan, and (unless `uniform_only`) every split where the last blocks save more
    than the first (their backward runs first, before the gradient shards pile up). Under ThunderFX
    every block runs one compiled graph, so only a uniform plan applies as is; a split needs one
    graph per plan."""
    n = case.units.n_blocks
    out = []
    for i, first in enumerate(menu):
        for last in menu[i:] if not uniform_only else (first,):
            for n_last in range(0, n + 1) if last is not first else (0,):
                plans = [first] * (n - n_last) + [last] * n_last
                time_s = (n - n_last) * first.recompute_time_s + n_last * last.recompute_time_s
                out.append(Assignment(first, last, n_last, case.predict(plans), time_s))
    return out


def fastest_under(candidates: list[Assignment], budget_bytes: int) -> Assignment | None:
    """The assignment with the least recompute time whose peak fits `budget_bytes` (None: none fits)."""
    fitting = [a for a in candidates if a.prediction.peak_bytes <= budget_bytes]
    return min(fitting, key=lambda a: (a.recompute_time_s, a.prediction.peak_bytes), default=None)
