"""Planning a compilation whose executors fuse (nvFuser, its stand-in, Thunder's torch.compile
executor): Thunder re-partitions the joint trace after the tags and runs its own rematerialization,
so the solver plans on the unfused graph and each candidate is realized by a dry run with its tags
(`ThroughFusion`, the loop in `remat_opt.planning.fusion_search`); the realized bytes are the
prediction. Also the step peak of a re-gathering FSDP plan in the order Thunder runs it
(`peak_in_thunders_order`)."""

from __future__ import annotations

from dataclasses import replace

from remat_opt import _compat  # noqa: F401  (before thunder)
from remat_opt.core.errors import InfeasibleBudgetError
from remat_opt.tracing import extract
from remat_opt.tracing.dry_run import dry_run as isolated_dry_run

from remat_opt.core.simulation import simulate_peak_bytes  # noqa: E402
from remat_opt.planning import fusion_search as fs  # noqa: E402
from remat_opt.planning.fusion_model import SavedBytesModel  # noqa: E402
from remat_opt.planning.planner import FusionOutcome, PlanRequest, PlannedStep, costed_problem, plan_step  # noqa: E402
from remat_opt.solvers.peak_model import peak_model_of  # noqa: E402
from remat_opt.transform.ranks import regather_units  # noqa: E402
from remat_opt.transform.tags import tagged_dry_run, untagged  # noqa: E402


def has_fusion(graph) -> bool:
    return any("fusion" in op.op_tags for op in graph.ops)


class ThroughFusion:
    """Plans a compilation whose executors fuse (nvFuser, its stand-in, torch.compile): the solver
    plans on the unfused joint graph and Thunder's own pass realizes each plan in a dry run, in a
    loop (`remat_opt.planning.fusion_search`); the realized bytes are the prediction."""

    def __init__(self, computation_trace, executors_list, names, fused_graph, dry_run=isolated_dry_run):
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
            self._realized[key] = self.fused_graph if not key else tagged_dry_run(
                self.trace, self.executors, self.names, key, self.dry_run)
        return self._realized[key]

    @property
    def tagged_dry_runs(self) -> int:
        """Dry runs with tags so far (Thunder alone with these executors is the compilation's first)."""
        return sum(1 for tags in self._realized if tags)

    def realize(self, step: PlannedStep) -> fs.Realized:
        return self.realize_tags(step.plan.recomputed_tag_targets)

    def plan(self, request: PlanRequest) -> PlannedStep:
        # one plan per budget (the search asks again); an infeasible probe needs the solver's least
        # peak within 0.2%, not to the byte (a 7B layer's: 1.7 s, was 6.7 s)
        request = replace(request, deterministic=True, minimum_peak_tolerance=2e-3)
        save_all = self.realize_tags(())
        targets = {name: getattr(request, name) for name in (fs.ACTIVATION, fs.PEAK)
                   if getattr(request, name) is not None}
        no_budget = replace(request, activation_budget_bytes=None, peak_budget_bytes=None)
        # one costed problem for every solve (the budgets do not enter it): its peak model, learned
        # rows and least peak are kept per problem
        costed = costed_problem(self.graph, request)
        free = plan_step(self.graph, no_budget, costed)  # recomputes only what costs no time (views)
        model = _RealizedModel(self.graph, self.fused_graph, save_all, free)
        holds_untagged = all(save_all.value(n) <= t for n, t in targets.items())
        if holds_untagged and model.predict(free).saved_bytes >= save_all.saved_bytes:
            # the zero-time plan's tags (views) are predicted to save nothing Thunder's pass does not
            # already drop: no tags, no dry run
            return self._finish(replace(free, plan=untagged(free.plan)), save_all, save_all, (), request)
        if holds_untagged or model.holds(free, targets):
            free_realized = self.realize(free)
            if holds_untagged or all(free_realized.value(n) <= t for n, t in targets.items()):
                # the budget holds without recomputing anything that costs time: the smaller of the
                # zero-time plan and no tags at all
                use_free = free_realized.saved_bytes <= save_all.saved_bytes and all(
                    free_realized.value(n) <= t for n, t in targets.items())
                step = free if use_free else replace(free, plan=untagged(free.plan))
                return self._finish(step, free_realized if use_free else save_all, save_all, (), request)
        solve = _remembered(lambda budgets: plan_step(self.graph, replace(request, **budgets), costed))
        extra_time_s = lambda step: step.plan.extra_time_s  # noqa: E731
        result = fs.search_with_model(
            targets, solve, self.realize, extra_time_s, predict=model.predict,
            observe=lambda step, realized: model.observe(
                step, self.realized_graph(step.plan.recomputed_tag_targets), realized),
            top_scale=model.top_scale(targets), first_scale=model.first_scale(targets),
            floor_scale=model.floor_scale(targets),
            plan_key=lambda step: frozenset(step.plan.recomputed_tag_targets))
        if result is None:  # the model did not find a plan that holds: search with dry runs
            solver_save_all = fs.Realized(self.graph.saved_activation_bytes, free.plan.peak_bytes)
            first_guess = {fs.ACTIVATION: lambda t: t * solver_save_all.saved_bytes // max(save_all.saved_bytes, 1),
                           fs.PEAK: lambda t: t + solver_save_all.peak_bytes - save_all.peak_bytes}
            result = fs.search_budgets(
                targets,
                plan_at=solve,
                realize=self.realize,
                extra_time_s=extra_time_s,
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
            peak_bytes = UNKNOWN_PEAK_BYTES  # plan is never chosen under a peak budget
        return fs.Realized(graph.saved_activation_bytes, peak_bytes)

    def _finish(self, step: PlannedStep, realized, save_all, rounds, request: PlanRequest) -> PlannedStep:
        """The step to keep: the plan with Thunder's realized figures, the user's request (not the
        budget the solver was given in the winning round), and what the search did."""
        graph = self.realized_graph(step.plan.recomputed_tag_targets)
        outcome = FusionOutcome(save_all=save_all, solver_saved_bytes=step.plan.saved_bytes,
                                solver_peak_bytes=step.plan.peak_bytes, realized_graph=graph,
                                rounds=tuple(r.describe() for r in rounds), tagged_dry_runs=self.tagged_dry_runs)
        unknown_peak = realized.peak_bytes == UNKNOWN_PEAK_BYTES
        peak_bytes = step.plan.peak_bytes if unknown_peak else realized.peak_bytes
        plan = replace(step.plan, saved_bytes=realized.saved_bytes, peak_bytes=peak_bytes,
                       saved_names=tuple(graph.saved_names), activation_budget_bytes=request.activation_budget_bytes,
                       peak_budget_bytes=request.peak_budget_bytes)
        remark = (f"planned through Thunder's fusion pass ({self.tagged_dry_runs} dry run(s) with tags): it saves "
                  f"{realized.saved_bytes:,} B, step peak {realized.peak_bytes:,} B, as predicted here; the solver's "
                  f"unfused model said {step.plan.saved_bytes:,} B and {step.plan.peak_bytes:,} B; Thunder alone with "
                  f"these executors saves {save_all.saved_bytes:,} B (peak {save_all.peak_bytes:,} B)")
        if unknown_peak:
            remark += ("; the step peak shown is the solver's: Thunder's backward defines a saved tensor's name "
                       "again (its rematerialization moved an op), which the peak simulation cannot follow")
        return replace(step, plan=plan, request=request, fusion=outcome, remarks=(*step.remarks, remark))


UNKNOWN_PEAK_BYTES = 2**62


def _remembered(plan_at):
    """`plan_at` (budgets by name -> a plan) answering each budget once, its errors included: the
    search asks some budgets again, and a solve that found no plan (infeasible, or out of time)
    costs the most."""
    answers: dict[tuple, tuple[object, BaseException | None]] = {}

    def solve(budgets: dict[str, int]):
        key = tuple(sorted(budgets.items()))
        if key not in answers:
            try:
                answers[key] = (plan_at(dict(budgets)), None)
            except (InfeasibleBudgetError, TimeoutError) as error:
                answers[key] = (None, error)
        plan, error = answers[key]
        if error is not None:
            raise error
        return plan

    return solve


class _RealizedModel:
    """What Thunder's pass is predicted to make of a plan: saved bytes from `SavedBytesModel`, the step
    peak as those bytes plus what the latest realized plan had alive at its peak beyond its saved
    bytes (`transient_bytes`).

    The step peak through the pass follows Thunder's saved bytes, not the solver's: on one
    Llama-2-7b layer at seq 4096 through the stand-in (2026-12-07), the realized peak less the
    realized saved bytes stayed within 1.52-1.61 GB over ten plans whose solver peaks less realized
    peaks ranged over 0.37-0.64 GB. With the solver's peak plus an offset the search needed 7-9 dry
    runs per step-peak budget; with this model 1 at 2.095 and 2.15 GB, 5 and 8 at 2.045 and 2.02 GB;
    since the search bisects from its floor (`fusion_search._least_time_predicted_to_hold`), 1, 1, 2
    and 1 (the least realized peak found is now 1.96 GB).
    """

    def __init__(self, unfused, fused, save_all: fs.Realized, free: PlannedStep):
        self.saved = SavedBytesModel(unfused)
        self.saved.observe(unfused.saved_names, fused)
        self.unfused, self.free = unfused, free
        self.peak_offset_bytes = save_all.peak_bytes - free.plan.peak_bytes  # solver's peak -> Thunder's
        self.transient_bytes = save_all.peak_bytes - save_all.saved_bytes

    def predict(self, step: PlannedStep) -> fs.Realized:
        saved = self.saved.saved_bytes(step.plan.saved_names)
        return fs.Realized(saved, saved + self.transient_bytes)

    def holds(self, step: PlannedStep, targets) -> bool:
        predicted = self.predict(step)
        return all(predicted.value(n) <= t for n, t in targets.items())

    def observe(self, step: PlannedStep, realized_graph, realized: fs.Realized) -> None:
        self.saved.observe(step.plan.saved_names, realized_graph)
        if realized.peak_bytes != UNKNOWN_PEAK_BYTES:
            self.peak_offset_bytes = realized.peak_bytes - step.plan.peak_bytes
            self.transient_bytes = realized.peak_bytes - realized.saved_bytes

    def first_scale(self, targets) -> float:
        """The scale of `targets` the solver's budgets are expected to need: the solver's save-all bytes
        against what the model predicts of them (activations), the realized peak less the offset (step peak)."""
        saved = self.unfused.saved_activation_bytes / max(self.saved.saved_bytes(self.unfused.saved_names), 1)
        scales = {fs.ACTIVATION: lambda t: saved, fs.PEAK: lambda t: (t - self.peak_offset_bytes) / max(t, 1)}
        return min(scales[n](t) for n, t in targets.items())

    def floor_scale(self, targets) -> float:
        """A scale of `targets` below which the solver has no plan: under a step-peak target, the
        least step peak of the solver's peak model (what is alive whatever is saved)."""
        if fs.PEAK not in targets:
            return 0.0
        return float(peak_model_of(self.free.problem).const.max()) / max(targets[fs.PEAK], 1)

    def top_scale(self, targets) -> float:
        """A scale of `targets` at which the solver's budgets hold its save-all plan."""
        top = {fs.ACTIVATION: self.unfused.saved_activation_bytes, fs.PEAK: self.free.plan.peak_bytes}
        return max(top[n] / max(t, 1) for n, t in targets.items()) * 1.01


def peak_in_thunders_order(step: PlannedStep, computation_trace, executors_list, names,
                            dry_run=isolated_dry_run) -> PlannedStep:
    """A plan that re-gathers FSDP weights, with the step peak of the order Thunder runs it in.

    With re-gather tags, Thunder's wait sorting also issues some gradients' reduce-scatters in the
    middle of the backward (their buffers held to the waits at its end), which the graph traced
    without tags does not show; a dry run with the plan's tags does (re-gathers placed as CostRemat
    places them). Other plans are returned as they are.
    """
    if step.fusion is not None or not regather_units(step):
        return step
    graph = tagged_dry_run(computation_trace, executors_list, names, step.plan.recomputed_tag_targets, dry_run)
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
