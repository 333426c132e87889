"""`CostRemat`: Thunder transform that plans rematerialization under a memory budget and applies it.

At every compilation, in the pre-prologue hook (before autodiff): extract the joint graph on an
isolated copy of the trace (`remat_opt.extract`), cost it (`costmodels`), solve
(`remat_opt.solvers`), then write `ProxyTag.RECOMPUTE_IN_BACKWARD` on the pre-autodiff proxies the
plan recomputes. Thunder's own autodiff then does the recomputation.
"""

from __future__ import annotations

import hashlib
import warnings

from remat_opt import _compat  # noqa: F401  (before thunder)
from remat_opt import extract
import thunder  # noqa: E402
from thunder.core.proxies import ProxyTag, TensorProxy  # noqa: E402
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace  # noqa: E402
from thunder.core.transform_common import Transform  # noqa: E402

from remat_opt.planning import PlanRequest, PlannedStep, plan_graph  # noqa: E402


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


class CostRemat(Transform):
    """Plans which activations to save and which to recompute, under a memory budget.

    Args:
        budget_gb: bound on the predicted peak memory of one training step (parameters, gradients,
            saved activations, transient tensors), in GB (10**9 bytes).
        activation_budget_gb: bound on the bytes saved for backward (inputs and parameters
            excluded), in GB.
        solver: ``"auto"`` (ILP), ``"ilp"``, ``"mincut"``, ``"save_all"`` or ``"recompute_all"``.
        cost_table: a measured cost table (path or `costmodels.table.CostTable`) from
            `remat-opt profile`; preferred over formulas where it has an entry.
        device: device spec name to cost for (``"H100"``, ``"H200"``, ``"A100"``, ``"L40S"``,
            ``"cpu"``); default: the table's device, else the trace's device.
        time_limit_s: solver time limit per compilation.

    With neither budget: the least memory among plans with no extra recompute time.
    """

    def __init__(
        self,
        budget_gb: float | None = None,
        activation_budget_gb: float | None = None,
        solver: str = "auto",
        cost_table=None,
        device: str | None = None,
        time_limit_s: float = 10.0,
    ):
        self.request = PlanRequest.from_gb(
            budget_gb=budget_gb,
            activation_budget_gb=activation_budget_gb,
            solver=solver,
            cost_table=cost_table,
            device=device,
            time_limit_s=time_limit_s,
        )
        self.last: PlannedStep | None = None
        self._cache: dict[tuple, PlannedStep] = {}

    def transform_traces_pre_prologue(self, prologue_trace, computation_trace, epilogue_trace, **kwargs):
        executors_list = kwargs.get("executors_list") or thunder.get_default_executors()
        if _disable_auto_recompute():
            warnings.warn(
                "CostRemat: auto_recompute_intermediates=True is ignored; the plan decides what is recomputed",
                stacklevel=2,
            )
        # RECOMPUTE_IN_BACKWARD tags already on the trace (torch.utils.checkpoint regions, a user's
        # own tags) are honoured: the dry run sees them, so the plan only adds to them.
        # ad hoc executors are named after their id(), which changes from one jit to the next
        names = tuple(ex.name for ex in executors_list if not ex.name.startswith("__ad_hoc"))
        key = (_trace_key(computation_trace), names)
        step = self._cache.get(key)
        if step is None:
            forward_trace, backward_trace = extract.dry_run(computation_trace, executors_list)
            graph = extract.build_joint_graph(forward_trace, backward_trace, names)
            step = plan_graph(graph, self.request)
            self._cache[key] = step
        else:
            step = step.as_cached()
        self.last = step
        apply_recompute_tags(computation_trace, step.plan.recomputed_tag_targets)
        new_trace = from_trace(computation_trace)
        new_trace.bound_symbols = list(computation_trace.bound_symbols)
        new_trace.set_provenance(TraceProvenance(f"CostRemat ({step.plan.summary()})"))
        return prologue_trace, new_trace, epilogue_trace

    def __repr__(self) -> str:
        return f"CostRemat({self.request.describe()})"


def find_cost_remat(jitted) -> CostRemat:
    """The `CostRemat` among the transforms of a `thunder.jit` result (or the transform itself)."""
    if isinstance(jitted, CostRemat):
        return jitted
    transforms = thunder.compile_data(jitted).transforms or []
    found = [t for t in transforms if isinstance(t, CostRemat)]
    if not found:
        raise ValueError("explain(): this function was not compiled with transforms=[CostRemat(...)]")
    return found[0]


def explain(jitted_or_transform):
    """The plan of the last compilation of `jitted` (a `thunder.jit` result with a `CostRemat`).

    Returns:
        An `remat_opt.explanation.Explanation`: ``print()`` it for the table, ``.to_dict()`` for data.
    """
    from remat_opt.explanation import explain_step

    transform = find_cost_remat(jitted_or_transform)
    if transform.last is None:
        raise ValueError("explain(): nothing compiled yet; call the jitted function once first")
    return explain_step(transform.last)
