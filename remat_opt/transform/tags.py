"""Thunder's ``RECOMPUTE_IN_BACKWARD`` tags from a plan: written on the pre-autodiff proxies a plan
names (`apply_recompute_tags`), or tried in a dry run and removed again (`tagged_dry_run`)."""

from __future__ import annotations

from dataclasses import replace

from remat_opt import _compat  # noqa: F401  (before thunder)
from remat_opt.tracing import extract
from remat_opt.tracing.dry_run import dry_run as isolated_dry_run
from thunder.core.proxies import ProxyTag, TensorProxy  # noqa: E402
from thunder.core.trace import TraceCtx  # noqa: E402

from remat_opt.core.plan import RECOMPUTE, SAVE  # noqa: E402


def proxies_by_name(trace: TraceCtx) -> dict[str, list[TensorProxy]]:
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
    proxies = proxies_by_name(trace)
    missing = [t for t in tag_targets if t not in proxies]
    if missing:
        raise RuntimeError(f"CostRemat: tag targets not found in the computation trace: {missing[:5]}")
    for target in tag_targets:
        for p in proxies[target]:
            p.tags.add(ProxyTag.RECOMPUTE_IN_BACKWARD)


def tagged_dry_run(computation_trace, executors_list, names, tag_targets, dry_run=isolated_dry_run):
    """The joint graph Thunder's passes make of `computation_trace` with `tag_targets` tagged; the
    tags are removed again."""
    proxies = proxies_by_name(computation_trace)
    added = [p for t in tag_targets for p in proxies.get(t, ()) if ProxyTag.RECOMPUTE_IN_BACKWARD not in p.tags]
    apply_recompute_tags(computation_trace, tag_targets)
    try:
        return extract.build_joint_graph(*dry_run(computation_trace, executors_list), names)
    finally:
        for p in added:
            p.tags.discard(ProxyTag.RECOMPUTE_IN_BACKWARD)


def untagged(plan):
    return replace(plan, recomputed_tag_targets=(), recompute_ops=(), extra_time_s=0.0,
                   decisions=tuple(replace(d, action=SAVE) if d.action == RECOMPUTE else d for d in plan.decisions))
