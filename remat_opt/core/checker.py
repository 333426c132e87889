"""The independent plan checker (`check_plan`): everything a plan claims, re-derived from the
`JointGraph` and the plan's tag targets alone (`remat_opt.core.plan.derive`), written apart from
the solvers so that it can catch them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from remat_opt.core.graph import JointGraph
from remat_opt.core.plan import Derivation, derive, INPUT, RECOMPUTE, RematPlan, SAVE, storage_bytes_of, tag_target_ops
from remat_opt.core.simulation import simulate_peak_bytes


def _check_allowed(graph: JointGraph, op_names: Iterable[str], pinned, targets) -> list[str]:
    """No random, pinned, non-taggable or forward-output-writing op may be recomputed."""
    errors = [f"pinned tag target {t} is tagged" for t in sorted(set(targets) & pinned)]
    by_name = {op.name: op for op in graph.forward_ops}
    outputs = set(graph.forward_output_names)
    for name in sorted(op_names, key=lambda n: by_name[n].index):
        op = by_name[name]
        if op.op_tags & {"random", "dont_recompute"}:
            errors.append(f"op {name} ({op.symbol}) is {sorted(op.op_tags & {'random', 'dont_recompute'})}")
        if "collective" in op.op_tags and "regather" not in op.op_tags:
            errors.append(f"op {name} ({op.symbol}) is a collective other than an FSDP weight's all-gather")
        for out in op.outputs:
            origin = graph.origins.get(out)
            if out in outputs:
                errors.append(f"op {name} writes forward output {out}: it cannot be recomputed")
            elif origin is None or not origin.taggable:
                errors.append(f"op {name} output {out} is not taggable ({origin.reason if origin else 'no origin'})")
    return errors


def _check_recompute_order(graph: JointGraph, plan: RematPlan, saved: set[str]) -> list[str]:
    """Each recomputed op's inputs are saved, inputs, or recomputed earlier in `recompute_ops`."""
    by_name = {op.name: op for op in graph.forward_ops}
    available = set(graph.input_names) | saved
    errors = []
    for name in plan.recompute_ops:
        op = by_name.get(name)
        if op is None:
            errors.append(f"recompute op {name} is not a forward op")
            continue
        missing = [i for i in op.inputs if i not in available]
        if missing:
            errors.append(f"recompute op {name} reads {missing}: neither saved nor recomputed before it")
        available.update(op.outputs)
    return errors


def _check_decisions(graph: JointGraph, plan: RematPlan, derivation: Derivation) -> list[str]:
    errors = []
    by_name = {d.name: d for d in plan.decisions}
    saved, inputs = set(derivation.saved), set(graph.input_names)
    for name in derivation.needed:
        want = INPUT if name in inputs else SAVE if name in saved else RECOMPUTE
        got = by_name.get(name)
        if got is None:
            errors.append(f"needed tensor {name} has no decision (expected {want})")
        elif got.action != want:
            errors.append(f"tensor {name}: plan says {got.action}, the graph implies {want}")
    extra = set(by_name) - set(derivation.needed)
    if extra:
        errors.append(f"decisions for tensors nothing needs: {sorted(extra)[:10]}")
    return errors


def _check_totals(graph, plan, derivation, op_time_s) -> list[str]:
    errors = []
    if set(plan.saved_names) != set(derivation.saved):
        diff = set(plan.saved_names) ^ set(derivation.saved)
        errors.append(f"saved_names differ from the graph's implied saved set on {sorted(diff)[:10]}")
    saved_bytes = storage_bytes_of(graph, derivation.saved)
    if plan.saved_bytes != saved_bytes:
        errors.append(f"saved_bytes={plan.saved_bytes} but the saved storages hold {saved_bytes} bytes")
    if tuple(plan.recompute_ops) != derivation.demanded_ops:
        errors.append(f"recompute_ops {plan.recompute_ops[:8]}... differ from {derivation.demanded_ops[:8]}...")
    if op_time_s is not None:
        extra = sum(op_time_s[n] for n in derivation.demanded_ops)
        if abs(extra - plan.extra_time_s) > 1e-9 * max(1.0, extra) + 1e-12:
            errors.append(f"extra_time_s={plan.extra_time_s} but the recomputed ops take {extra}")
    return errors


def check_plan(
    graph: JointGraph,
    plan: RematPlan,
    *,
    activation_budget_bytes: int | None = None,
    peak_budget_bytes: int | None = None,
    pinned: Iterable[str] = (),
    op_time_s: Mapping[str, float] | None = None,
) -> list[str]:
    """Checks a plan against the graph alone; an empty list means feasible and consistent.

    Args:
        graph: the joint graph the plan is for.
        plan: the plan.
        activation_budget_bytes: bound on saved bytes (default: the plan's `activation_budget_bytes`).
        peak_budget_bytes: bound on the simulated peak (default: the plan's `peak_budget_bytes`).
        pinned: tag targets the user forbids recomputing.
        op_time_s: op times; when given, `extra_time_s` is checked too.

    Returns:
        One message per violation.
    """
    activation_budget_bytes = plan.activation_budget_bytes if activation_budget_bytes is None else activation_budget_bytes
    peak_budget_bytes = plan.peak_budget_bytes if peak_budget_bytes is None else peak_budget_bytes
    known = set(tag_target_ops(graph))
    errors = [f"tag target {t} names no forward op's output" for t in plan.recomputed_tag_targets if t not in known]
    derivation = derive(graph, plan.recomputed_tag_targets)
    errors += [f"needed tensor {n} is neither saved, recomputed nor an input" for n in derivation.unavailable]
    errors += _check_allowed(graph, derivation.recomputed_ops, frozenset(pinned), plan.recomputed_tag_targets)
    errors += _check_recompute_order(graph, plan, set(plan.saved_names))
    errors += _check_decisions(graph, plan, derivation)
    errors += _check_totals(graph, plan, derivation, op_time_s)
    if activation_budget_bytes is not None and plan.saved_bytes > activation_budget_bytes:
        errors.append(f"saved_bytes={plan.saved_bytes} > activation_budget_bytes={activation_budget_bytes}")
    if not derivation.unavailable:
        peak = simulate_peak_bytes(graph, plan.recomputed_tag_targets)
        if peak != plan.peak_bytes:
            errors.append(f"peak_bytes={plan.peak_bytes} but the simulated peak is {peak}")
        if peak_budget_bytes is not None and peak > peak_budget_bytes:
            errors.append(f"simulated peak {peak} > peak_budget_bytes={peak_budget_bytes}")
    return errors
