"""`CostRemat`: Thunder transform that plans rematerialization under a memory budget and applies it.

At every compilation, in the pre-prologue hook (before autodiff): extract the joint graph on an
isolated copy of the trace (`remat_opt.tracing.extract`), cost it (`costmodels`), solve
(`remat_opt.solvers`), then write `ProxyTag.RECOMPUTE_IN_BACKWARD` on the pre-autodiff proxies the
plan recomputes. Thunder's own autodiff then does the recomputation.

With a fusion executor (nvFuser, the nvFuser stand-in, Thunder's torch.compile executor) Thunder
re-partitions the joint trace after the tags and runs its own rematerialization, so the plan is made
through that pass: the solver plans on the unfused graph and each candidate is realized by a dry run
with its tags (`_ThroughFusion`, `remat_opt.planning.fusion_search`); the realized bytes are the prediction.
Its recompute times are the unfused ops' own, or, where the cost table timed Thunder's regions
whole (``cost_table="auto"``, ``remat-opt profile``), each op's share of its region's measured time
(`remat_opt.costing.graph_costs`).
"""

from __future__ import annotations

import functools
import hashlib
import warnings
import weakref
from dataclasses import replace

from remat_opt import _compat  # noqa: F401  (before thunder)
from remat_opt.tracing import extract
import thunder  # noqa: E402
import torch  # noqa: E402
from thunder.core.proxies import ProxyTag, TensorProxy  # noqa: E402
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace  # noqa: E402
from thunder.core.transform_common import Transform  # noqa: E402

from remat_opt.costing.cost_cache import with_auto_costs  # noqa: E402
from remat_opt.transform.ranks import check_transform_order, for_ranks, regather_units  # noqa: E402
from remat_opt.core.errors import InfeasibleBudgetError  # noqa: E402
from remat_opt.planning import fusion_search as fs  # noqa: E402
from remat_opt.core.plan import RECOMPUTE, SAVE, simulate_peak_bytes  # noqa: E402
from remat_opt.distributed.collective_order import ALL_GATHER, check_in_flight  # noqa: E402
from remat_opt.distributed.regather_order import order_fsdp_collectives  # noqa: E402
from remat_opt.planning.planner import FusionOutcome, PlanRequest, PlannedStep, plan_step  # noqa: E402

# The plan behind each computation trace CostRemat returned. Thunder keeps that trace in its cache
# entry and reports it again on every cache hit (`thunder.last_traces`), so `explain(jitted)` finds
# the plan of the compilation that ran last, whichever function or transform instance made it.
_PLANS: weakref.WeakKeyDictionary[TraceCtx, PlannedStep | None] = weakref.WeakKeyDictionary()
_NO_BACKWARD = None  # the value `_PLANS` keeps for a compilation that computes no gradient


def _proxies_by_name(trace: TraceCtx) -> dict[str, list[TensorProxy]]:
    found: dict[str, list[TensorProxy]] = {}

    def visit(bsyms):
        for bsym in bsyms:
            for p in bsym.flat_proxy_outs:
                if isinstance(p, TensorProxy):
                    found.setdefault(p.name, []).append(p)
            visit(bsym.subsymbols)

    visit(trace.bound_symbols)
    return found


def apply_recompute_tags(trace: TraceCtx, tag_targets) -> None:
    """Tags the proxies named `tag_targets` (top-level or subsymbol outputs) for recomputation."""
    proxies = _proxies_by_name(trace)
    missing = [t for t in tag_targets if t not in proxies]
    if missing:
        raise RuntimeError(f"CostRemat: tag targets not found in the computation trace: {missing[:5]}")
    for target in tag_targets:
        for p in proxies[target]:
            p.tags.add(ProxyTag.RECOMPUTE_IN_BACKWARD)


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
        solver: ``"auto"`` (ILP), ``"ilp"``, ``"mincut"``, ``"save_all"`` or ``"recompute_all"``.
        cost_table: a measured cost table (path or `costmodels.table.CostTable`) from
            `remat-opt profile`, preferred over formulas where it has an entry; or ``"auto"``: at
            the first compilation on a real device, time the forward ops the cache lacks and keep
            them on disk (`remat_opt.costing.cost_cache`; `explain` says what came from where). Not the
            default: it runs the step's forward ops once more at the first compilation (time and
            memory a user did not ask for); formulas rank ops well without it.
        device_spec: spec sheet to cost for (``"H100"``, ``"H200"``, ``"A100-80GB"``, ``"L40S"``,
            ``"cpu"``); default: the table's device, else the trace's device (a CPU trace: the
            nominal CPU; a CUDA trace: the sheet of that GPU, found by its name).
        time_limit_s: solver time limit per compilation.
        collectives_in_flight: under Thunder's FSDP, at most this many all-gathers (forward) and
            reduce-scatters (backward) in flight beside the one in use (0: no overlap). None (the
            default) keeps Thunder's order, which issues every all-gather at the forward's start
            and waits for every reduce-scatter at the backward's end: every unsharded weight, then
            every unsharded gradient, is alive at once, a floor no plan goes below. The plan is
            made for the order chosen; a small number trades overlap of communication for memory.

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
    ):
        self.request = PlanRequest.from_gb(
            budget_gb=budget_gb,
            activation_budget_gb=activation_budget_gb,
            solver=solver,
            cost_table=cost_table,
            device_spec=device_spec,
            time_limit_s=time_limit_s,
        )
        self.collectives_in_flight = check_in_flight(collectives_in_flight)
        self._dry_run = functools.partial(extract.dry_run, collectives_in_flight=collectives_in_flight)
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
        if not extract.needs_backward(computation_trace):  # no_grad, frozen, integer inputs: nothing to plan
            return prologue_trace, _recorded(computation_trace, _NO_BACKWARD), epilogue_trace
        # RECOMPUTE_IN_BACKWARD tags already on the trace (torch.utils.checkpoint regions, a user's
        # own tags) are honoured: the dry run sees them, so the plan only adds to them.
        # ad hoc executors are named after their id(), which changes from one jit to the next
        names = tuple(ex.name for ex in executors_list if not ex.name.startswith("__ad_hoc"))
        key = (_trace_key(computation_trace), names)
        step = self._cache.get(key)
        if step is None:
            forward_trace, backward_trace = self._dry_run(computation_trace, executors_list)
            if backward_trace is None:
                return prologue_trace, _recorded(computation_trace, _NO_BACKWARD), epilogue_trace
            graph = region_graph = extract.build_joint_graph(forward_trace, backward_trace, names)
            if _has_fusion(graph):  # Thunder's fusion pass re-partitions after the tags: plan through it
                through = _ThroughFusion(computation_trace, executors_list, names, graph, self._dry_run)
                graph, planner = through.graph, through.plan
            else:
                planner, region_graph = functools.partial(plan_step, graph), None
            request, costs_note = with_auto_costs(self.request, graph, region_graph)
            if region_graph is not None:  # regions the table timed whole price the unfused ops (costing)
                request = replace(request, region_graph=region_graph)
            try:
                step = for_ranks(self._plan(graph, planner, _thunderfx_subgraph(), request))
            except InfeasibleBudgetError as e:
                if self.collectives_in_flight is None and request.peak_budget_bytes is not None and _gathers(graph):
                    e.add_note("CostRemat: Thunder issues every FSDP all-gather at the forward's start and waits for "
                               "every reduce-scatter at the backward's end, a floor no plan goes below; "
                               "CostRemat(collectives_in_flight=1) lowers it")
                raise
            step = _peak_in_thunders_order(step, computation_trace, executors_list, names, self._dry_run)
            if costs_note:
                step = replace(step, remarks=(*step.remarks, costs_note))
            self._cache[key] = step
            for note, warn in extract.fallback_notes(graph.ops):
                if warn:
                    warnings.warn(f"CostRemat: {note}", stacklevel=2)
        else:
            step = step.as_cached()
        if (subgraph := _thunderfx_subgraph()) is not None:
            self._subgraph_saved_bytes[subgraph] = step.plan.saved_bytes + _carried_activation_bytes(subgraph, step.graph)
        apply_recompute_tags(computation_trace, step.plan.recomputed_tag_targets)
        return prologue_trace, _recorded(computation_trace, step), epilogue_trace

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
        others, carried = sum(other_bytes), _carried_activation_bytes(subgraph, graph)
        taken = {"peak_budget_bytes": others, "activation_budget_bytes": others + carried}
        budgets = {name: getattr(request, name) for name in taken if getattr(request, name) is not None}
        note = (f"CostRemat under ThunderFX: {len(other_bytes)} other Dynamo subgraph(s) of this model, planned "
                f"first, save {others:,} B, and this one saves {carried:,} B of activations it receives")
        short = [n for n, b in budgets.items() if taken[n] > b]
        if short:  # the budget is gone before this subgraph: say how much it needs in all
            error = InfeasibleBudgetError(short[0], budgets[short[0]],
                                          taken[short[0]] + _least_bytes(graph, request, short[0]), in_gb=True)
            error.add_note(note)
            raise error
        try:
            return planner(replace(request, **{n: b - taken[n] for n, b in budgets.items()}))
        except InfeasibleBudgetError as e:
            e.add_note(note)
            raise

    def __repr__(self) -> str:
        in_flight = "" if self.collectives_in_flight is None else f", collectives_in_flight={self.collectives_in_flight}"
        return f"CostRemat({self.request.describe()}{in_flight})"


def _gathers(graph) -> bool:
    return any(op.symbol == ALL_GATHER for op in graph.ops)


def _has_fusion(graph) -> bool:
    return any("fusion" in op.op_tags for op in graph.ops)


class _ThroughFusion:
    """Plans a compilation whose executors fuse (nvFuser, its stand-in, torch.compile): the solver
    plans on the unfused joint graph and Thunder's own pass realizes each plan in a dry run, in a
    loop (`remat_opt.planning.fusion_search`); the realized bytes are the prediction."""

    def __init__(self, computation_trace, executors_list, names, fused_graph, dry_run=extract.dry_run):
        from thunder.extend import FusionExecutor

        self.trace, self.executors, self.names = computation_trace, executors_list, names
        self.fused_graph, self.dry_run = fused_graph, dry_run
        unfused = [ex for ex in executors_list if not isinstance(ex, FusionExecutor)]
        self.graph = extract.build_joint_graph(*dry_run(computation_trace, unfused), names)
        self._realized: dict[tuple[str, ...], object] = {}  # tag targets -> realized fused graph
        self._tried_units: set[str] = set()  # units `refine` added once (for the saved tensors they name)

    def realized_graph(self, tag_targets):
        key = tuple(sorted(tag_targets))
        if key not in self._realized:
            self._realized[key] = self.fused_graph if not key else _tagged_dry_run(
                self.trace, self.executors, self.names, key, self.dry_run)
        return self._realized[key]

    def realize(self, step: PlannedStep) -> fs.Realized:
        return self.realize_tags(step.plan.recomputed_tag_targets)

    def plan(self, request: PlanRequest) -> PlannedStep:
        save_all = self.realize_tags(())
        targets = {name: getattr(request, name) for name in (fs.ACTIVATION, fs.PEAK)
                   if getattr(request, name) is not None}
        no_budget = replace(request, activation_budget_bytes=None, peak_budget_bytes=None)
        free = plan_step(self.graph, no_budget)  # recomputes only what costs no time (views)
        free_realized = self.realize(free)
        if all(free_realized.value(n) <= t for n, t in targets.items()) or \
                all(save_all.value(n) <= t for n, t in targets.items()):
            # the budget holds without recomputing anything that costs time: the smaller of the
            # zero-time plan and no tags at all
            use_free = free_realized.saved_bytes <= save_all.saved_bytes and all(
                free_realized.value(n) <= t for n, t in targets.items())
            step = free if use_free else replace(free, plan=_untagged(free.plan))
            return self._finish(step, free_realized if use_free else save_all, save_all, (), request)
        solver_save_all = fs.Realized(self.graph.saved_activation_bytes, free.plan.peak_bytes)
        first_guess = {fs.ACTIVATION: lambda t: t * solver_save_all.saved_bytes // max(save_all.saved_bytes, 1),
                       fs.PEAK: lambda t: t + solver_save_all.peak_bytes - save_all.peak_bytes}
        result = fs.search_budgets(
            targets,
            plan_at=lambda budgets: plan_step(self.graph, replace(request, **budgets)),
            realize=self.realize,
            extra_time_s=lambda step: step.plan.extra_time_s,
            solver_value=lambda step, name: step.plan.saved_bytes if name == fs.ACTIVATION else step.plan.peak_bytes,
            first_guess={n: max(first_guess[n](t), 0) for n, t in targets.items()},
            first_slope={fs.ACTIVATION: save_all.saved_bytes / max(solver_save_all.saved_bytes, 1)},
            refine=self.refine,
        )
        return self._finish(result.plan, result.realized, save_all, result.rounds, request)

    def refine(self, step: PlannedStep, overshoot: dict[str, int]) -> PlannedStep | None:
        """`step` plus the units of what Thunder's pass still saves, enough to cover the overshoot."""
        tagged = step.problem.effective_units(step.plan.recomputed_tag_targets)
        realized = self.realized_graph(step.plan.recomputed_tag_targets)
        # a unit tried before that left its tensor saved would be chosen again: skip it
        more = fs.units_to_add(step.problem.units, {*tagged, *self._tried_units}, realized, max(overshoot.values()))
        self._tried_units.update(more)
        plan = step.problem.plan_for((*tagged, *more), solver=step.plan.solver.split("+")[0] + "+fusion",
                                     status="heuristic", solve_time_s=step.plan.solve_time_s)
        if set(plan.recomputed_tag_targets) == set(step.plan.recomputed_tag_targets):
            return None
        return replace(step, plan=plan)

    def realize_tags(self, tag_targets) -> fs.Realized:
        graph = self.realized_graph(tag_targets)
        try:
            peak_bytes = simulate_peak_bytes(graph)
        except ValueError:  # a name the backward defines again (rematerialization moved an op): such a
            peak_bytes = _UNKNOWN_PEAK_BYTES  # plan is never chosen under a peak budget
        return fs.Realized(graph.saved_activation_bytes, peak_bytes)

    def _finish(self, step: PlannedStep, realized, save_all, rounds, request: PlanRequest) -> PlannedStep:
        """The step to keep: the plan with Thunder's realized figures, the user's request (not the
        budget the solver was given in the winning round), and what the search did."""
        graph = self.realized_graph(step.plan.recomputed_tag_targets)
        outcome = FusionOutcome(save_all=save_all, solver_saved_bytes=step.plan.saved_bytes,
                                solver_peak_bytes=step.plan.peak_bytes, realized_graph=graph,
                                rounds=tuple(r.describe() for r in rounds))
        unknown_peak = realized.peak_bytes == _UNKNOWN_PEAK_BYTES
        peak_bytes = step.plan.peak_bytes if unknown_peak else realized.peak_bytes
        plan = replace(step.plan, saved_bytes=realized.saved_bytes, peak_bytes=peak_bytes,
                       saved_names=tuple(graph.saved_names), activation_budget_bytes=request.activation_budget_bytes,
                       peak_budget_bytes=request.peak_budget_bytes)
        remark = (f"planned through Thunder's fusion pass ({len(rounds) + 1} dry run(s) with tags): it saves "
                  f"{realized.saved_bytes:,} B, step peak {realized.peak_bytes:,} B, as predicted here; the solver's "
                  f"unfused model said {step.plan.saved_bytes:,} B and {step.plan.peak_bytes:,} B; Thunder alone with "
                  f"these executors saves {save_all.saved_bytes:,} B (peak {save_all.peak_bytes:,} B)")
        if unknown_peak:
            remark += ("; the step peak shown is the solver's: Thunder's backward defines a saved tensor's name "
                       "again (its rematerialization moved an op), which the peak simulation cannot follow")
        return replace(step, plan=plan, request=request, fusion=outcome, remarks=(*step.remarks, remark))


_UNKNOWN_PEAK_BYTES = 2**62


def _peak_in_thunders_order(step: PlannedStep, computation_trace, executors_list, names,
                            dry_run=extract.dry_run) -> PlannedStep:
    """A plan that re-gathers FSDP weights, with the step peak of the order Thunder runs it in.

    With re-gather tags, Thunder's wait sorting also issues some gradients' reduce-scatters in the
    middle of the backward (their buffers held to the waits at its end), which the graph traced
    without tags does not show; a dry run with the plan's tags does (re-gathers placed as CostRemat
    places them). Other plans are returned as they are.
    """
    if step.fusion is not None or not regather_units(step):
        return step
    graph = _tagged_dry_run(computation_trace, executors_list, names, step.plan.recomputed_tag_targets, dry_run)
    try:
        peak_bytes = simulate_peak_bytes(graph)
    except ValueError:  # a name the backward defines again: keep the solver's figure
        return step
    if peak_bytes == step.plan.peak_bytes:
        return step
    remark = (f"step peak {peak_bytes:,} B in the order Thunder runs this plan (a dry run with its tags: its wait "
              f"sorting moves some reduce-scatters into the backward); the solver's graph said {step.plan.peak_bytes:,} B")
    budget = step.request.peak_budget_bytes
    if budget is not None and peak_bytes > budget:
        remark += f"; that is above budget_gb={budget / 1e9:g}: lower the budget to make room"
    return replace(step, plan=replace(step.plan, peak_bytes=peak_bytes), remarks=(*step.remarks, remark))


def _untagged(plan):
    return replace(plan, recomputed_tag_targets=(), recompute_ops=(), extra_time_s=0.0,
                   decisions=tuple(replace(d, action=SAVE) if d.action == RECOMPUTE else d for d in plan.decisions))


def _tagged_dry_run(computation_trace, executors_list, names, tag_targets, dry_run=extract.dry_run):
    """The joint graph Thunder's passes make of `computation_trace` with `tag_targets` tagged; the
    tags are removed again."""
    proxies = _proxies_by_name(computation_trace)
    added = [p for t in tag_targets for p in proxies.get(t, ()) if ProxyTag.RECOMPUTE_IN_BACKWARD not in p.tags]
    apply_recompute_tags(computation_trace, tag_targets)
    try:
        return extract.build_joint_graph(*dry_run(computation_trace, executors_list), names)
    finally:
        for p in added:
            p.tags.discard(ProxyTag.RECOMPUTE_IN_BACKWARD)




def _least_bytes(graph, request: PlanRequest, name: str) -> int:
    """The smallest budget `name` any plan of `graph` meets on its own."""
    try:
        plan = plan_step(graph, replace(request, **{name: 0})).plan
    except InfeasibleBudgetError as e:
        return e.minimum
    return plan.peak_bytes if name == "peak_budget_bytes" else plan.saved_bytes


def _carried_activation_bytes(subgraph, graph) -> int:
    """Bytes of the inputs of a ThunderFX subgraph that it saves and that are activations of the
    model (computed by an earlier subgraph: Dynamo's example value has a ``grad_fn``); the plan
    counts them as inputs, but without this subgraph they would be freed after the forward."""
    carried = set()
    for node in subgraph.graph.nodes:
        example = getattr(node.meta.get("grapharg"), "example", None) if node.op == "placeholder" else None
        if isinstance(example, torch.Tensor) and example.grad_fn is not None:
            carried.add(node.name)
    return graph.storage_bytes([n for n in graph.saved_names if n in carried])


def _thunderfx_subgraph():
    """The fx GraphModule being compiled when ThunderFX (``thunder.dynamo``) compiles one of its
    subgraphs, else None."""
    from thunder.core.compile_data import get_compile_data

    fn = getattr(get_compile_data(), "fn", None)
    return fn if isinstance(fn, torch.fx.GraphModule) else None


def _recorded(computation_trace: TraceCtx, step: PlannedStep | None) -> TraceCtx:
    """A copy of the trace, with its provenance, that `explain` finds `step` by (None: no gradient)."""
    new_trace = from_trace(computation_trace)
    new_trace.bound_symbols = list(computation_trace.bound_symbols)
    summary = step.plan.summary() if step is not None else "no gradient computed: nothing planned"
    new_trace.set_provenance(TraceProvenance(f"CostRemat ({summary})"))
    _PLANS[new_trace] = step
    return new_trace


def last_planned_step(jitted) -> PlannedStep:
    """The plan of the compilation `jitted` (a `thunder.jit` result with a `CostRemat`) ran last.

    Raises:
        TypeError: `jitted` is not a `thunder.jit` result.
        ValueError: it has no CostRemat, or has not been called yet.
    """
    try:
        transforms = thunder.compile_data(jitted).transforms or []
    except Exception as e:  # thunder raises various errors for objects it did not compile
        raise TypeError(f"explain() takes a thunder.jit result compiled with transforms=[CostRemat(...)], "
                        f"got {type(jitted).__name__}") from e
    if not any(isinstance(t, CostRemat) for t in transforms):
        raise ValueError("explain(): this function was not compiled with transforms=[CostRemat(...)]")
    try:
        traces = thunder.last_traces(jitted)
    except Exception:
        traces = None
    steps = [_PLANS[t] for t in traces or () if t in _PLANS]
    if not steps:
        raise ValueError("explain(): nothing compiled yet; call the jitted function once first")
    if steps[-1] is _NO_BACKWARD:
        raise ValueError(
            "explain(): the latest call computed no gradient (torch.no_grad, a frozen model or only "
            "integer inputs), so nothing was planned; call it once with gradients to see a plan"
        )
    return steps[-1]


def explain(jitted):
    """The plan of the compilation `jitted` ran last (a `thunder.jit` result with a `CostRemat`).

    Returns:
        An `remat_opt.planning.explanation.Explanation`: ``print()`` it for the table, ``.to_dict()`` for data.
    """
    from remat_opt.planning.explanation import explain_step

    return explain_step(last_planned_step(jitted))
