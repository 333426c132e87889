"""`explain(jitted)`: the plan of the compilation a `thunder.jit` function ran last. CostRemat
records each plan beside the computation trace it returns (`recorded`); Thunder keeps that trace in
its cache entry and reports it again on every cache hit (`thunder.last_traces`)."""

from __future__ import annotations

import weakref

from remat_opt import _compat  # noqa: F401  (before thunder)
import thunder  # noqa: E402
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace  # noqa: E402

from remat_opt.planning.planner import PlannedStep  # noqa: E402


# The plan behind each computation trace CostRemat returned. Thunder keeps that trace in its cache
# entry and reports it again on every cache hit (`thunder.last_traces`), so `explain(jitted)` finds
# the plan of the compilation that ran last, whichever function or transform instance made it.
_PLANS: weakref.WeakKeyDictionary[TraceCtx, PlannedStep | None] = weakref.WeakKeyDictionary()

NO_BACKWARD = None  # the value `_PLANS` keeps for a compilation that computes no gradient


def recorded(computation_trace: TraceCtx, step: PlannedStep | None) -> TraceCtx:
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
    from remat_opt.transform.cost_remat import CostRemat

    if not any(isinstance(t, CostRemat) for t in transforms):
        raise ValueError("explain(): this function was not compiled with transforms=[CostRemat(...)]")
    try:
        traces = thunder.last_traces(jitted)
    except Exception:
        traces = None
    steps = [_PLANS[t] for t in traces or () if t in _PLANS]
    if not steps:
        raise ValueError("explain(): nothing compiled yet; call the jitted function once first")
    if steps[-1] is NO_BACKWARD:
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
