"""Times every distinct op of a joint graph on this device (``remat-opt profile``) -> cost table.

How ops are timed: the joint graph is **replayed** op by op on the device with torch
(`costmodels.runners`), so every op runs on the tensors the previous ops really produced (same
strides and aliasing, realistic values), and each distinct (symbol, shapes, dtypes, attributes) is
timed once: warm-up calls, then the median of repeats (wall clock on the CPU, CUDA events on a GPU).
Inputs and incoming gradients are drawn at random (indices within range of the op that reads them).

Fusion regions (``TorchCompileN``, ``nvFusionN``) are **timed whole**: the graph holds their
member ops but not the compiled kernel (and timing the members one by one would measure an unfused
program), so the replay calls the region callable Thunder built at compile time
(`remat_opt.tracing.regions.region_calls`: the torch.compile'd region, nvFuser's fusion definition, the
stand-in's region) on the tensors the replay produced. Their table key is the region's signature
(member ops, input and output shapes; `costmodels.table.region_signature`), not its name, so a
measurement serves any run with the same region. A graph without its callables (loaded from the
graph cache, deepened, recorded on another machine) skips its regions with a reason: their cost
stays the roofline of their members' FLOPs and boundary bytes. Ops without a runner are skipped the
same way; their outputs are drawn at random so the replay goes on. The table lists every skipped op
and why.
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from costmodels.devices import calibrate_cpu, current_device_name
from costmodels.formulas import OpArgs, TensorMeta, is_fusion_symbol
from costmodels.runners import approximation, index_bound, make_call, skip_reason
from costmodels.table import CostTable, TableEntry, library_versions, op_key
from costmodels.timing import ProfileOptions, time_call
from remat_opt.costing.graph_costs import op_args
from remat_opt.tracing.regions import RegionCall, TensorArg, region_calls
from remat_opt.core.graph import JointGraph, OpNode

NO_REGION_CALLABLE = ("fusion region without the callable Thunder built for it (a graph loaded from the cache, "
                      "deepened or recorded elsewhere): costed by the roofline of its members")
REGION_NOTE = "timed whole: the region's callable as Thunder built it"


@dataclass(slots=True)
class ReplayResult:
    """What a replay did: times per op key, skipped keys with reasons, problems found, notes."""

    times: dict[str, TableEntry] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _random_tensor(meta: TensorMeta, device: str, bound: int | None) -> torch.Tensor:
    """A tensor of `meta`'s shape and dtype, with values like a training step's: floats of two or more
    dimensions (weights, activations, gradients) zero-mean with standard deviation 1/sqrt(last dim),
    so that a chain of matmuls keeps its scale; vectors (norm weights, biases, scales) in [0.5, 1.5);
    booleans; or indices below `bound`.

    Values matter to CPU time: all-positive weights made activations grow with each matmul until
    attention's softmax saturated and its backward computed in denormal floats, 2.4x slower than
    on a real step (tiny Llama-2, seq 512: 3.96 ms instead of 1.65 ms).
    """
    dtype = _torch_dtype(meta.dtype)
    if dtype.is_floating_point or dtype.is_complex:
        if len(meta.shape) < 2:
            return torch.empty(meta.shape, dtype=dtype, device=device).uniform_(0.5, 1.5)
        return torch.randn(meta.shape, dtype=dtype, device=device) / math.sqrt(max(1, meta.shape[-1]))
    if dtype == torch.bool:
        return torch.rand(meta.shape, device=device) < 0.5
    return torch.randint(0, max(1, bound or 1), meta.shape, dtype=dtype, device=device)


def _flat_tensors(result) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [t for item in result for t in _flat_tensors(item)]
    return []


def _index_bounds(graph: JointGraph) -> dict[str, int]:
    """Tensor name -> exclusive bound of valid values, for integer tensors used as indices."""
    bounds: dict[str, int] = {}
    for op in graph.ops:
        args = op_args(graph, op)
        for position, name in enumerate(op.inputs):
            bound = index_bound(args, position)
            if bound is not None:
                bounds[name] = min(bound, bounds.get(name, bound))
    return bounds


def _last_uses(graph: JointGraph) -> dict[int, list[str]]:
    """Op index -> tensors read or written for the last time there (freed after it)."""
    last: dict[str, int] = {}
    for i, op in enumerate(graph.ops):
        for name in (*op.inputs, *op.outputs):
            last[name] = i
    by_op: dict[int, list[str]] = {}
    for name, i in last.items():
        by_op.setdefault(i, []).append(name)
    return by_op


def _progress(items: list, enabled: bool, description: str) -> Iterator:
    if not enabled:
        yield from items
        return
    try:
        from tqdm import tqdm
    except ImportError:
        for i, item in enumerate(items):
            print(f"\r{description}: {i + 1}/{len(items)}", end="", file=sys.stderr)
            yield item
        print(file=sys.stderr)
        return
    yield from tqdm(items, desc=description, file=sys.stderr, leave=False)


class _Replay:
    """Runs a graph's ops in order on real tensors, keeping each tensor until its last use."""

    def __init__(self, graph: JointGraph, device: str):
        self.graph, self.device = graph, device
        self.env: dict[str, torch.Tensor] = {}
        self.bounds = _index_bounds(graph)
        self.last_uses = _last_uses(graph)

    def inputs(self, op: OpNode, args: OpArgs) -> list[torch.Tensor]:
        for name, meta in zip(op.inputs, args.inputs):
            if name not in self.env:  # inputs, parameters, incoming gradients, outputs of skipped ops
                self.env[name] = _random_tensor(meta, self.device, self.bounds.get(name))
        return [self.env[name] for name in op.inputs]

    def store(self, op: OpNode, args: OpArgs, result, result_ok: bool) -> tuple[str | None, str | None]:
        """Keeps `op`'s outputs; draws them at random when the runner's do not match the graph.

        Returns:
            ``(problem, note)``: a shape or count mismatch is a problem (the op's time is dropped);
            a dtype-only mismatch is cast to the graph's dtype and noted (Thunder's metadata can
            disagree with torch, e.g. the sum of a bool tensor).
        """
        produced = _flat_tensors(result) if result_ok else []
        problem = note = None
        mismatch = f"{op.name} {op.symbol}: runner returned {_describe(produced)}, graph has {_describe(args.outputs)}"
        if result_ok and not _matches(produced, args.outputs, check_dtype=False):
            problem, produced = mismatch, []
        elif result_ok and not _matches(produced, args.outputs, check_dtype=True):
            note = f"{mismatch}; cast to the graph's dtypes"
            produced = [t.to(_torch_dtype(m.dtype)) for t, m in zip(produced, args.outputs)]
        for i, (name, meta) in enumerate(zip(op.outputs, args.outputs)):
            self.env[name] = produced[i] if produced else _random_tensor(meta, self.device, self.bounds.get(name))
        return problem, note

    def free(self, index: int) -> None:
        for name in self.last_uses.get(index, ()):
            self.env.pop(name, None)


def _dtype_name(t) -> str:
    return t.dtype if isinstance(t, TensorMeta) else str(t.dtype).removeprefix("torch.")


def _describe(tensors) -> list[str]:
    return [f"{_dtype_name(t)}{list(t.shape)}" for t in tensors]


def _matches(tensors: list[torch.Tensor], metas: tuple[TensorMeta, ...], *, check_dtype: bool) -> bool:
    return len(tensors) == len(metas) and all(
        tuple(t.shape) == m.shape and (not check_dtype or _dtype_name(t) == m.dtype) for t, m in zip(tensors, metas)
    )


def _region_call(region: RegionCall, state: _Replay, op: OpNode, args: OpArgs):
    state.inputs(op, args)  # draws the inputs no earlier op produced
    arguments = [state.env[a.name] if isinstance(a, TensorArg) else a for a in region.arguments]
    return lambda: region.fn(*arguments)


def _op_call(op: OpNode, args: OpArgs, state: _Replay, regions: dict[str, RegionCall]) -> tuple:
    """``(call, None)``, or ``(None, why it cannot run)``."""
    if is_fusion_symbol(op.symbol):
        region = regions.get(op.name) if state.device != "meta" else None  # meta: shapes only, no compiling
        return (_region_call(region, state, op, args), None) if region else (None, NO_REGION_CALLABLE)
    reason = skip_reason(op.symbol)
    return (make_call(args, state.inputs(op, args), state.device), None) if reason is None else (None, reason)


class _LoopTiming:
    """``method="loop"``: each distinct key is timed once, alone (warm-up, then the median of repeated
    calls on the same tensors)."""

    def __init__(self, device: str, options: ProfileOptions):
        self.device, self.options = device, options
        self.samples: dict[str, tuple[float, int]] = {}

    def wants(self, key: str) -> bool:
        return key not in self.samples

    def run(self, key: str, call):
        self.samples[key] = time_call(call, self.device, self.options)
        return call()

    def entries(self) -> dict[str, tuple[float, int]]:
        return dict(self.samples)


class _InOrderTiming:
    """``method="in-order"``: every call of a timed pass is timed once as it runs, in the step's order
    on the tensors the step's earlier ops just produced and with its allocation pattern (wall clock
    on the CPU; CUDA events on a GPU, read when the pass ends); a key's time is the median over its
    calls and passes."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.samples: dict[str, list[float]] = {}
        self.pending: list[tuple[str, object, object]] = []

    def wants(self, key: str) -> bool:
        return True

    def run(self, key: str, call):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            output = call()
            end.record()
            self.pending.append((key, start, end))
            return output
        start_s = time.perf_counter()
        output = call()
        self.samples.setdefault(key, []).append(time.perf_counter() - start_s)
        return output

    def end_pass(self) -> None:
        if self.pending:
            torch.cuda.synchronize()
            for key, start, end in self.pending:
                self.samples.setdefault(key, []).append(start.elapsed_time(end) / 1e3)
            self.pending.clear()

    def entries(self) -> dict[str, tuple[float, int]]:
        return {key: (statistics.median(times), len(times)) for key, times in self.samples.items()}


def _replay_pass(state: _Replay, ops: list, regions: dict[str, RegionCall], result: ReplayResult, timing,
                 wanted, *, progress: bool, first: bool) -> None:
    """Runs every op once; ops whose key `wanted(key)` accepts run through `timing`. Problems,
    skips and notes are recorded on the `first` pass only."""
    state.env.clear()
    for index, (op, args, key) in enumerate(_progress(ops, progress, "profiling ops")):
        output, ok, reason = None, False, None
        timed = timing is not None and wanted(key) and timing.wants(key)
        # a region not timed now is not run (a torch.compile region would compile): random outputs
        run = timed or not is_fusion_symbol(op.symbol)
        try:
            call, reason = _op_call(op, args, state, regions) if run else (None, None)
            if call is not None:
                output, ok = (timing.run(key, call) if timed else call()), True
        except Exception as e:  # a runner that fails is reported, and the replay goes on
            reason = f"runner failed: {type(e).__name__}: {str(e)[:200]}"
            if first:
                result.problems.append(f"{op.name} {op.symbol}: {reason}")
        if reason is not None:
            result.skipped.setdefault(key, reason)
        problem, note = state.store(op, args, output, ok)
        if first and note:
            result.notes.append(note)
        if problem:
            if first:
                result.problems.append(problem)
            result.skipped.setdefault(key, "runner output does not match the graph")
        state.free(index)


@contextlib.contextmanager
def gc_paused():
    """Python's cyclic garbage collector paused while ops are timed: it runs after a count of
    allocations, so a collection would fall inside some op's timed call and add its time to that op.
    Restored as it was, also when the replay fails."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def replay(
    graph: JointGraph,
    device: str,
    *,
    options: ProfileOptions | None = None,
    time_ops: bool = True,
    progress: bool = False,
    time_keys: set[str] | None = None,
    deadline_s: float | None = None,
    regions: dict[str, RegionCall] | None = None,
) -> ReplayResult:
    """Runs every op of `graph` on `device` and, when `time_ops`, times its distinct op keys (only
    those in `time_keys` when given, and none after `time.perf_counter()` passes `deadline_s`).

    How (`ProfileOptions.method`): ``"in-order"`` (the default) replays the whole graph
    ``warmup + repeats`` times and times every call as it runs in order; ``"loop"`` replays it once
    and times each distinct op alone in a loop. Ops run alone reuse one output buffer and hot
    caches: on a CPU they measured up to 2x faster than in the step (small elementwise ops on tiny
    Llama-2, seq 512), so their sum fell 23% short of the step's forward and backward.

    Fusion regions run through `regions` (op name -> `RegionCall`; default: the callables Thunder
    built for `graph`, `remat_opt.tracing.regions.region_calls`). On ``device="meta"`` nothing runs for
    real: use ``time_ops=False`` to check that every runner produces the shapes and dtypes the graph
    records (`ReplayResult.problems`).
    """
    options = options or ProfileOptions()
    regions = region_calls(graph) if regions is None else regions
    state, result = _Replay(graph, device), ReplayResult()
    ops = [(op, args, op_key(args)) for op in graph.ops for args in (op_args(graph, op),)]

    def wanted(key: str) -> bool:
        return (time_keys is None or key in time_keys) and (deadline_s is None or time.perf_counter() < deadline_s)

    if not time_ops:
        timing, passes = None, 1
    elif options.method == "loop":
        timing, passes = _LoopTiming(device, options), 1
    else:
        timing, passes = _InOrderTiming(device), options.warmup + options.repeats
    with torch.no_grad(), gc_paused():
        for index in range(passes):
            if index > 0 and deadline_s is not None and time.perf_counter() >= deadline_s:
                break
            _replay_pass(state, ops, regions, result, timing, wanted, progress=progress and index == 0,
                         first=index == 0)
            if isinstance(timing, _InOrderTiming):
                timing.end_pass()
                if index < options.warmup:
                    timing.samples.clear()  # warm-up: compiles regions, fills caches and the allocator
    symbols = {key: op.symbol for op, _, key in ops}
    for key, (seconds, repeats) in (timing.entries() if timing is not None else {}).items():
        if key not in result.skipped:
            symbol = symbols[key]
            note = REGION_NOTE if is_fusion_symbol(symbol) else approximation(symbol)
            result.times[key] = TableEntry(key=key, symbol=symbol, time_s=seconds, repeats=repeats, note=note)
    return result


def profile_graph(
    graph: JointGraph,
    *,
    device: str = "cpu",
    options: ProfileOptions | None = None,
    progress: bool = True,
    model: str = "",
) -> CostTable:
    """Times every distinct op of `graph` on `device` and returns the cost table.

    Args:
        graph: the joint graph (its tensors are re-created on `device`).
        device: ``"cpu"`` or ``"cuda[:N]"``.
        options: warm-up and repeat counts.
        progress: show a progress bar on stderr.
        model: free text recorded in the table (what was profiled).

    Returns:
        A `CostTable` with the device name, library versions, the CPU calibration (on a CPU),
        one entry per timed op and the skipped ops with reasons.
    """
    if not (device == "cpu" or device.startswith("cuda")):
        raise ValueError(f"cannot time ops on device {device!r}: profile on 'cpu' or 'cuda' (meta runs nothing)")
    calibration = calibrate_cpu() if device == "cpu" else None
    result = replay(graph, device, options=options, time_ops=True, progress=progress)
    torch_version, thunder_version = library_versions()
    return CostTable(
        device=current_device_name(device),
        device_kind="cpu" if device == "cpu" else "cuda",
        torch_version=torch_version,
        thunder_version=thunder_version,
        entries=result.times,
        calibration=calibration,
        skipped=tuple(sorted(result.skipped.items())),
        model=model,
    )
