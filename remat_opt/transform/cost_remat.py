"""`CostRemat`: Thunder transform that plans rematerialization under a memory budget and applies it.

At every compilation, in the pre-prologue hook (before autodiff): extract the joint graph on an
isolated copy of the trace (`remat_opt.tracing.extract`), cost it (`costmodels`), solve
(`remat_opt.solvers`), then write `ProxyTag.RECOMPUTE_IN_BACKWARD` on the pre-autodiff proxies the
plan recomputes. Thunder's own autodiff then does the recomputation.

With a fusion executor (nvFuser, the nvFuser stand-in, Thunder's torch.compile executor) Thunder
re-partitions the joint trace after the tags and runs its own rematerialization, so the plan is made
through that pass: the solver plans on the unfused graph and each candidate is realized by a dry run
with its tags (`remat_opt.transform.through_fusion`); the realized bytes are the prediction. Tags are
written by `remat_opt.transform.tags`, ThunderFX subgraphs share a budget (`remat_opt.transform.thunderfx`)
and `explain` finds the plan of the last call (`remat_opt.transform.explain`).
Its recompute times are the unfused ops' own, or, where the cost table timed Thunder's regions
whole (``cost_table="auto"``, ``remat-opt profile``), each op's share of its region's measured time
(`remat_opt.costing.graph_costs`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import warnings
import weakref
from dataclasses import replace

from remat_opt import _compat  # noqa: F401  (before thunder)
from remat_opt.tracing import extract
from remat_opt.tracing.dry_run import dry_run as isolated_dry_run, needs_backward
import thunder  # noqa: E402
from thunder.core.trace import TraceCtx  # noqa: E402
from thunder.core.transform_common import Transform  # noqa: E402

from remat_opt.core.errors import InfeasibleBudgetError  # noqa: E402
from remat_opt.costing.cost_cache import with_auto_costs  # noqa: E402
from remat_opt.distributed.collective_order import ALL_GATHER, check_in_flight  # noqa: E402
from remat_opt.distributed.regather_order import order_fsdp_collectives  # noqa: E402
from remat_opt.planning.plan_file import PlanFile, PlanFileError  # noqa: E402
from remat_opt.planning.planner import PlanRequest, PlannedStep, plan_step  # noqa: E402
from remat_opt.transform.explain import NO_BACKWARD, recorded  # noqa: E402
from remat_opt.transform.ranks import check_transform_order, for_ranks  # noqa: E402
from remat_opt.transform.tags import apply_recompute_tags  # noqa: E402
from remat_opt.transform.through_fusion import ThroughFusion, has_fusion, peak_in_thunders_order  # noqa: E402
from remat_opt.transform.thunderfx import carried_activation_bytes, least_bytes, thunderfx_subgraph  # noqa: E402


def _disable_auto_recompute() -> bool:
    """Turns off `auto_recompute_intermediates` for this compilation; returns whether it was on.

    Thunder reads the option during autodiff (it tags decomposition intermediates as it goes), so
    it would act after the plan and change the saved set; with CostRemat, the plan decides.
    """
    from thunder.core.compile_data import get_compile_data

    cd = get_compile_data()
    if cd is None or not cd.compile_options.get("auto_recompute_intermediates"):
        return False
    cd.compile_options["auto_recompute_intermediates"] = False
    return True


def _trace_key(trace: TraceCtx) -> str:
    return hashlib.sha256(str(trace).encode()).hexdigest()


def _check_single_cost_remat() -> None:
    """Two CostRemat transforms would tag the union of two plans, which neither predicts."""
    from thunder.core.compile_data import get_compile_data

    cd = get_compile_data()
    transforms = (cd.transforms or []) if cd is not None else []
    check_transform_order(transforms, CostRemat)
    count = sum(isinstance(t, CostRemat) for t in transforms)
    if count > 1:
        raise ValueError(f"thunder.jit got {count} CostRemat transforms: pass one (each would plan alone, "
                         "and Thunder would recompute the union of their plans)")


class CostRemat(Transform):
    """Plans which activations to save and which to recompute, under a memory budget.

    Args (keyword-only):
        budget_gb: bound on the predicted peak memory of one training step (parameters, gradients,
            saved activations, transient tensors), in GB (10**9 bytes).
        activation_budget_gb: bound on the bytes saved for backward (inputs and parameters
            excluded), in GB.
        solver: ``"auto"`` (layered from 8 repeated layers, else ILP), ``"ilp"``, ``"layered"``,
            ``"mincut"``, ``"save_all"``, ``"recompute_all"`` or
            ``"per_block"`` (activation checkpointing of every repeated layer).
        cost_table: a measured cost table (path or `costmodels.table.CostTable`) from
            `remat-opt profile`, preferred over formulas where it has an entry; or ``"auto"``: at
            the first compilation on a real device, time the forward ops the cache lacks and keep
            them on disk (`remat_opt.costing.cost_cache`; `explain` says what came from where). Not the
            default: it runs the step's forward ops once more at the first compilation (time and
            memory a user did not ask for); formulas rank ops well without it.
        device_spec: spec sheet to cost for (``"H100"``, ``"H200"``, ``"A100-80GB"``, ``"L40S"``,
            ``"cpu"``); default: the table's device, else the trace's device (a CPU trace: the
            nominal CPU; a CUDA trace: the sheet of that GPU, found by its name).
        time_limit_s: solver time limit per compilation, in wall seconds. The least step peak an
            infeasible budget's error names is searched for as long in CP-SAT's deterministic time
            (`remat_opt.solvers._clock`), so every rank names the same one.
        collectives_in_flight: under Thunder's FSDP, at most this many all-gathers (forward) and
            reduce-scatters (backward) in flight beside the one in use (0: no overlap), each
            reduce-scatter issued right after the op that makes its gradient. None (the
            default) keeps Thunder's order, which issues every all-gather at the forward's start
            and waits for every reduce-scatter at the backward's end: every unsharded weight, then
            every unsharded gradient, is alive at once, a floor no plan goes below. The plan is
            made for the order chosen; a small number trades overlap of communication for memory.
        plan: a plan file written by ``remat-opt fit --out`` (`remat_opt.planning.plan_file`): its
            tags are applied instead of solving, when this compilation is the one it was made for
            (library versions, executors, world size, input shapes, tag targets); otherwise the
            compilation fails with `PlanFileError` saying what differs. It sets
            `collectives_in_flight` and takes no budget or solver.

    With neither budget: the least memory among plans with no extra recompute time. A budget
    below the least memory of any plan raises `InfeasibleBudgetError` at compile time, naming the
    smallest feasible budget in GB.
    """

    def __init__(
        self,
        *,
        budget_gb: float | None = None,
        activation_budget_gb: float | None = None,
        solver: str = "auto",
        cost_table=None,
        device_spec: str | None = None,
        time_limit_s: float = 10.0,
        collectives_in_flight: int | None = None,
        plan: str | os.PathLike | None = None,
    ):
        self.plan_file = None
        if plan is not None:
            self.plan_file, collectives_in_flight = _plan_file(plan, budget_gb, activation_budget_gb, solver,
                                                               collectives_in_flight)
            self.plan_path = str(plan)
        self.request = PlanRequest.from_gb(
            budget_gb=budget_gb,
            activation_budget_gb=activation_budget_gb,
            solver=solver,
            cost_table=cost_table,
            device_spec=device_spec,
            time_limit_s=time_limit_s,
        )
        if self.plan_file is not None:
            self.request = replace(self.request, fixed_tag_targets=tuple(self.plan_file.tag_targets))
        self.collectives_in_flight = check_in_flight(collectives_in_flight)
        self._dry_run = functools.partial(isolated_dry_run, collectives_in_flight=collectives_in_flight)
        self._cache: dict[tuple, PlannedStep] = {}
        # ThunderFX: the saved bytes of the latest plan of each Dynamo subgraph this transform planned
        self._subgraph_saved_bytes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def transform_traces_pre_prologue(self, prologue_trace, computation_trace, epilogue_trace, **kwargs):
        executors_list = kwargs.get("executors_list") or thunder.get_default_executors()
        _check_single_cost_remat()
        if _disable_auto_recompute():
            warnings.warn(
                "CostRemat: auto_recompute_intermediates=True is ignored; the plan decides what is recomputed",
                stacklevel=2,
            )
        if not needs_backward(computation_trace):  # no_grad, frozen, integer inputs: nothing to plan
            return prologue_trace, recorded(computation_trace, NO_BACKWARD), epilogue_trace
        # RECOMPUTE_IN_BACKWARD tags already on the trace (torch.utils.checkpoint regions, a user's
        # own tags) are honoured: the dry run sees them, so the plan only adds to them.
        # ad hoc executors are named after their id(), which changes from one jit to the next
        names = tuple(ex.name for ex in executors_list if not ex.name.startswith("__ad_hoc"))
        key = (_trace_key(computation_trace), names)
        step = self._cache.get(key)
        if step is None:
            forward_trace, backward_trace = self._dry_run(computation_trace, executors_list)
            if backward_trace is None:
                return prologue_trace, recorded(computation_trace, NO_BACKWARD), epilogue_trace
            graph = region_graph = extract.build_joint_graph(forward_trace, backward_trace, names)
            if self.plan_file is not None:  # the plan is given: check it is this compilation's, solve nothing
                _check_plan_file(self.plan_file, self.plan_path, graph)
                planner, region_graph = functools.partial(plan_step, graph), None
            elif has_fusion(graph):  # Thunder's fusion pass re-partitions after the tags: plan through it
                through = ThroughFusion(computation_trace, executors_list, names, graph, self._dry_run)
                graph, planner = through.graph, through.plan
            else:
                planner, region_graph = functools.partial(plan_step, graph), None
            request, costs_note = with_auto_costs(self.request, graph, region_graph)
            if region_graph is not None:  # regions the table timed whole price the unfused ops (costing)
                request = replace(request, region_graph=region_graph)
            try:
                step = for_ranks(self._plan(graph, planner, thunderfx_subgraph(), request))
            except InfeasibleBudgetError as e:
                if self.collectives_in_flight is None and request.peak_budget_bytes is not None and _gathers(graph):
                    e.add_note("CostRemat: Thunder issues every FSDP all-gather at the forward's start and waits for "
                               "every reduce-scatter at the backward's end, a floor no plan goes below; "
                               "CostRemat(collectives_in_flight=1) lowers it")
                raise
            step = peak_in_thunders_order(step, computation_trace, executors_list, names, self._dry_run)
            if costs_note:
                step = replace(step, remarks=(*step.remarks, costs_note))
            self._cache[key] = step
            for note, warn in extract.fallback_notes(graph.ops):
                if warn:
                    warnings.warn(f"CostRemat: {note}", stacklevel=2)
        else:
            step = step.as_cached()
        if (subgraph := thunderfx_subgraph()) is not None:
            self._subgraph_saved_bytes[subgraph] = step.plan.saved_bytes + carried_activation_bytes(subgraph, step.graph)
        apply_recompute_tags(computation_trace, step.plan.recomputed_tag_targets)
        return prologue_trace, recorded(computation_trace, step), epilogue_trace

    def transform_trace_post_optimization(self, computation_trace, **kwargs):
        """FSDP's collectives where the plan's peak has them: backward re-gathers just before first use
        (Thunder issues them all at the backward's start), and with `collectives_in_flight`, at most
        that many all-gathers or reduce-scatters in flight (`remat_opt.distributed.regather_order`)."""
        return order_fsdp_collectives(computation_trace, self.collectives_in_flight)

    def _plan(self, graph, planner, subgraph, request: PlanRequest) -> PlannedStep:
        """Plans one compilation. Under ThunderFX the model's budget is shared by Dynamo's subgraphs:
        each is planned, in the order they first run (the forward order), under the budget less the
        bytes the other subgraphs' plans save (all of them are alive together at the start of the
        backward). Exact for `activation_budget_gb`; for `budget_gb` the other subgraphs' saved bytes
        are taken off this subgraph's peak budget, a bound that ignores their transients."""
        if subgraph is None:
            return planner(request)
        other_bytes = [b for g, b in self._subgraph_saved_bytes.items() if g is not subgraph]
        others, carried = sum(other_bytes), carried_activation_bytes(subgraph, graph)
        taken = {"peak_budget_bytes": others, "activation_budget_bytes": others + carried}
        budgets = {name: getattr(request, name) for name in taken if getattr(request, name) is not None}
        note = (f"CostRemat under ThunderFX: {len(other_bytes)} other Dynamo subgraph(s) of this model, planned "
                f"first, save {others:,} B, and this one saves {carried:,} B of activations it receives")
        short = [n for n, b in budgets.items() if taken[n] > b]
        if short:  # the budget is gone before this subgraph: say how much it needs in all
            error = InfeasibleBudgetError(short[0], budgets[short[0]],
                                          taken[short[0]] + least_bytes(graph, request, short[0]), in_gb=True)
            error.add_note(note)
            raise error
        try:
            return planner(replace(request, **{n: b - taken[n] for n, b in budgets.items()}))
        except InfeasibleBudgetError as e:
            e.add_note(note)
            raise

    def __repr__(self) -> str:
        if self.plan_file is not None:
            return f"CostRemat(plan={self.plan_path!r})"
        in_flight = "" if self.collectives_in_flight is None else f", collectives_in_flight={self.collectives_in_flight}"
        return f"CostRemat({self.request.describe()}{in_flight})"


def _plan_file(path, budget_gb, activation_budget_gb, solver, collectives_in_flight):
    """``(PlanFile, collectives_in_flight)`` of ``CostRemat(plan=path, ...)``; the other options
    must not contradict it."""
    given = [name for name, value in (("budget_gb", budget_gb), ("activation_budget_gb", activation_budget_gb))
             if value is not None] + (["solver"] if solver != "auto" else [])
    if given:
        raise ValueError(f"CostRemat(plan=...) applies a plan made already: drop {', '.join(given)} "
                         "(or drop plan= to plan at compile time)")
    plan_file = PlanFile.load(path)
    if collectives_in_flight is not None and collectives_in_flight != plan_file.collectives_in_flight:
        raise ValueError(f"CostRemat(plan={str(path)!r}) was made for collectives_in_flight="
                         f"{plan_file.collectives_in_flight}, not {collectives_in_flight}: drop collectives_in_flight")
    return plan_file, plan_file.collectives_in_flight


def _check_plan_file(plan_file: PlanFile, path: str, graph) -> None:
    mismatch = plan_file.mismatch(graph)
    if mismatch:
        raise PlanFileError(f"CostRemat(plan={path!r}) was made for another compilation: {mismatch}")


def _gathers(graph) -> bool:
    return any(op.symbol == ALL_GATHER for op in graph.ops)

