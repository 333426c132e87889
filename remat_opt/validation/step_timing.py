"""Per-op times inside a real Thunder training step: the yardstick for a cost table, op by op.

A cost table (`remat-opt profile`, `cost_table="auto"`) times each distinct op and fusion region on
random inputs, replayed in the step's order. Whether those times are what the ops cost in the step
itself can only be seen by timing the step: `OpClock` is a Thunder transform that reads a clock
before and after every op of the compiled forward and backward traces (inserted after Thunder's
optimization passes, so fusion regions are timed whole, as they run), and `time_ops_in_step` runs
training steps with it and returns each graph op's median time, grouped by cost-table key.

The clock adds two Python calls per op (well under a microsecond each, outside the timed span
except the call that stops it) and does not change what runs: gradients equal those of the same
compilation without it.

    clock = OpClock()
    jitted = thunder.jit(model, executors=executors, transforms=[clock])
    step = lambda: jitted(*inputs).float().sum().backward()
    times = time_ops_in_step(step, graph, clock, steps=10)   # {op key: median seconds}
"""

from __future__ import annotations

from remat_opt import _compat  # noqa: F401  (before thunder)

import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

from thunder.core.symbol import BoundSymbol, Symbol  # noqa: E402
from thunder.core.trace import TraceCtx, TraceTag, from_trace  # noqa: E402
from thunder.core.transform_common import Transform  # noqa: E402

from costmodels.table import op_key  # noqa: E402
from remat_opt.costing.graph_costs import op_args  # noqa: E402
from remat_opt.tracing.extract import STRUCTURAL_SYMBOLS  # noqa: E402
from remat_opt.core.graph import JointGraph  # noqa: E402
from remat_opt.costing.profiling import gc_paused  # noqa: E402

OpId = tuple[bool, int]  # (is_backward, index among the ops of its trace), as `graph.OpNode` numbers them


def _clock_bsym(name: str, fn: Callable[[], None]) -> BoundSymbol:
    """A bound symbol with no inputs or outputs that calls `fn` where it stands in the trace."""

    def bind_postprocess(bsym: BoundSymbol) -> None:
        bsym._call_ctx = {name: fn}

    return Symbol(name, lambda: None, is_prim=True, _bind_postprocess=bind_postprocess).bind(output=None)


class OpClock(Transform):
    """Times every op of the compiled forward and backward traces while `recording` is on.

    Attributes:
        samples: op id -> the seconds of each recorded call.
        symbols: op id -> the op's symbol name (to check the ops against a graph's).
        recording: whether calls are recorded (off for warm-up steps).
    """

    def __init__(self):
        self.samples: dict[OpId, list[float]] = {}
        self.symbols: dict[OpId, str] = {}
        self.recording = False
        self._started_s = 0.0

    def _start(self) -> None:
        self._started_s = time.perf_counter()

    def _stopper(self, op_id: OpId) -> Callable[[], None]:
        samples = self.samples.setdefault(op_id, [])

        def stop() -> None:
            elapsed_s = time.perf_counter() - self._started_s
            if self.recording:
                samples.append(elapsed_s)

        return stop

    def transform_trace_post_optimization(self, computation_trace: TraceCtx, **kwargs) -> TraceCtx:
        is_backward = TraceTag.BACKWARD in computation_trace.tags
        timed = from_trace(computation_trace)
        bsyms, index = [], 0
        for bsym in computation_trace.bound_symbols:
            if bsym.sym.name in STRUCTURAL_SYMBOLS:  # the same ops `extract` makes graph ops of
                bsyms.append(bsym)
                continue
            op_id = (is_backward, index)
            self.symbols[op_id] = bsym.sym.name
            stop_name = f"op_clock_stop_{'bwd' if is_backward else 'fwd'}{index}"
            bsyms += [_clock_bsym("op_clock_start", self._start), bsym, _clock_bsym(stop_name, self._stopper(op_id))]
            index += 1
        timed.bound_symbols = bsyms
        return timed


def check_clock_matches(graph: JointGraph, clock: OpClock) -> None:
    """Raises ValueError unless the clocked traces have exactly the graph's ops, in order (the graph
    comes from a dry run of the same compilation: a difference means the two compiled differently)."""
    expected = {(op.is_backward, op.index): op.symbol for op in graph.ops}
    if clock.symbols != expected:
        differ = sorted(k for k in expected.keys() | clock.symbols.keys() if expected.get(k) != clock.symbols.get(k))
        first = differ[0]
        raise ValueError(
            f"the clocked step's ops differ from the graph's at {len(differ)} places, first "
            f"{'bwd' if first[0] else 'fwd'}{first[1]}: graph {expected.get(first)!r}, step {clock.symbols.get(first)!r}; "
            "compile the clocked step with the executors and transforms the graph was analyzed with"
        )


def time_ops_in_step(step: Callable[[], object], graph: JointGraph, clock: OpClock, *, steps: int = 10,
                     warmup_steps: int = 2) -> dict[str, float]:
    """Median in-step seconds of each distinct op and region of `graph`, keyed like a cost table.

    Args:
        step: runs one training step of a model jitted with `clock` among its transforms (forward
            and backward).
        graph: the joint graph of that compilation (`remat_opt.analyze` with the same executors).
        clock: the `OpClock` instance in the step's transforms.
        steps: recorded steps; warmup_steps: steps run first and not recorded.

    Returns:
        op key (`costmodels.table.op_key`) -> median over every call of every op with that key, as
        a cost table aggregates its samples.
    """
    if steps < 1:
        raise ValueError(f"steps={steps} must be >= 1")
    for _ in range(warmup_steps):
        step()
    check_clock_matches(graph, clock)
    for samples in clock.samples.values():
        samples.clear()
    clock.recording = True
    try:
        with gc_paused():
            for _ in range(steps):
                step()
    finally:
        clock.recording = False
    by_key: dict[str, list[float]] = {}
    for op in graph.ops:
        by_key.setdefault(op_key(op_args(graph, op)), []).extend(clock.samples.get((op.is_backward, op.index), ()))
    return {key: statistics.median(samples) for key, samples in by_key.items() if samples}
