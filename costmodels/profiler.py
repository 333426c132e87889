"""``remat-opt profile``: time every distinct op of a model's forward and backward on this device.

How ops are timed: the joint graph is **replayed** op by op on the device with torch
(`costmodels.runners`), so every op runs on the tensors the previous ops really produced (same
strides and aliasing, realistic values), and each distinct (symbol, shapes, dtypes, attributes) is
timed once: warm-up calls, then the median of repeats (wall clock on the CPU, CUDA events on a GPU).
Inputs and incoming gradients are drawn at random (indices within range of the op that reads them).

Fusion regions (``TorchCompileN``, ``nvFusionN``) are **skipped with a reason**: the graph holds
their member ops but not the compiled kernel, and timing the members one by one would measure an
unfused program. Their cost stays the roofline of their members' FLOPs and boundary bytes; the table
lists every skipped op and why. Ops without a runner are skipped the same way; their outputs are
drawn at random so the replay goes on.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from remat_opt.graph import JointGraph, OpNode

from costmodels.api import op_args
from costmodels.devices import calibrate_cpu, current_device_name, median_time_s
from costmodels.formulas import OpArgs, TensorMeta
from costmodels.report import compare, format_comparison
from costmodels.runners import approximation, index_bound, make_call, skip_reason
from costmodels.table import CostTable, TableEntry, library_versions, load_table, op_key, save_table


@dataclass(frozen=True, slots=True)
class ProfileOptions:
    """How long to time each op.

    Attributes:
        warmup: untimed calls before timing.
        repeats: timed calls at least.
        min_time_s: keep repeating (up to `max_repeats`) until this much time was timed.
        max_repeats: timed calls at most.
    """

    warmup: int = 3
    repeats: int = 10
    min_time_s: float = 0.01
    max_repeats: int = 1000


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
    """A tensor of `meta`'s shape and dtype: floats in [0.5, 1.5), booleans, or indices below `bound`."""
    dtype = _torch_dtype(meta.dtype)
    if dtype.is_floating_point or dtype.is_complex:
        return torch.empty(meta.shape, dtype=dtype, device=device).uniform_(0.5, 1.5)
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


def _cuda_median_time_s(fn: Callable, options: ProfileOptions) -> tuple[float, int]:
    for _ in range(options.warmup):
        fn()
    times = []
    while len(times) < options.repeats or (sum(times) < options.min_time_s and len(times) < options.max_repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times), len(times)


def time_call(fn: Callable, device: str, options: ProfileOptions) -> tuple[float, int]:
    """``(median seconds, repeats)`` of `fn()` on `device` (CUDA events on a GPU, wall clock on the CPU)."""
    if device.startswith("cuda"):
        return _cuda_median_time_s(fn, options)
    counter = [0]

    def counted():
        counter[0] += 1
        return fn()

    seconds = median_time_s(
        counted,
        warmup=options.warmup,
        repeats=options.repeats,
        min_total_s=options.min_time_s,
        max_repeats=options.max_repeats,
    )
    return seconds, counter[0] - options.warmup


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


def replay(
    graph: JointGraph,
    device: str,
    *,
    options: ProfileOptions | None = None,
    time_ops: bool = True,
    progress: bool = False,
) -> ReplayResult:
    """Runs every op of `graph` on `device`, timing each distinct op key once when `time_ops`.

    On ``device="meta"`` nothing runs for real: use ``time_ops=False`` to check that every runner
    produces the shapes and dtypes the graph records (`ReplayResult.problems`).
    """
    options = options or ProfileOptions()
    state, result = _Replay(graph, device), ReplayResult()
    with torch.no_grad():
        for index, op in enumerate(_progress(list(graph.ops), progress, "profiling ops")):
            args = op_args(graph, op)
            key = op_key(args)
            reason = skip_reason(op.symbol)
            output, ok = None, False
            if reason is None:
                try:
                    call = make_call(args, state.inputs(op, args), device)
                    if time_ops and key not in result.times:
                        seconds, repeats = time_call(call, device, options)
                        result.times[key] = TableEntry(
                            key=key, symbol=op.symbol, time_s=seconds, repeats=repeats, note=approximation(op.symbol)
                        )
                    output, ok = call(), True
                except Exception as e:  # a runner that fails is reported, and the replay goes on
                    reason = f"runner failed: {type(e).__name__}: {str(e)[:200]}"
                    result.problems.append(f"{op.name} {op.symbol}: {reason}")
            if reason is not None:
                result.skipped.setdefault(key, reason)
            problem, note = state.store(op, args, output, ok)
            if note:
                result.notes.append(note)
            if problem:
                result.problems.append(problem)
                result.times.pop(key, None)
                result.skipped.setdefault(key, "runner output does not match the graph")
            state.free(index)
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


# ---------------------------------------------------------------------------------------------
# Command line: `remat-opt profile`
# ---------------------------------------------------------------------------------------------


def add_profile_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the options of ``remat-opt profile``: the model options of ``remat-opt`` (`ModelSpec`,
    ``--executors``), with ``--device cpu`` by default, and the profiling options."""
    from remat_opt.cli import add_model_arguments

    add_model_arguments(parser, device_default="cpu", device_help="cpu (the default) or cuda: where ops are timed")
    parser.add_argument("--output", "-o", default=None, help="cost table path (default: cost_tables/<device>.json)")
    parser.add_argument("--report", action="store_true", help="print predicted vs measured per op and Spearman")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per op")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per op, at least")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def default_table_path(device_name: str) -> Path:
    """``cost_tables/<device name as a file name>.json`` under the current directory."""
    slug = "".join(c if c.isalnum() else "-" for c in device_name).strip("-").lower()
    while "--" in slug:
        slug = slug.replace("--", "-")
    return Path("cost_tables") / f"{slug[:80]}.json"


def run_profile(args: argparse.Namespace) -> int:
    """Runs ``remat-opt profile``: builds and analyzes the model, times its ops, writes the table.

    Model errors (`ModelSpecError`, `ModelTraceError`) propagate to ``remat-opt``'s error handling.

    Returns:
        The exit status: 0, or 2 for a device that cannot time ops.
    """
    from remat_opt.cli import analyze_from_args

    if not (args.device == "cpu" or args.device.startswith("cuda")):
        print(f"remat-opt: error: --device {args.device} cannot time ops; use cpu or cuda", file=sys.stderr)
        return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    spec, graph, _ = analyze_from_args(args)
    options = ProfileOptions(warmup=args.warmup, repeats=args.repeats)
    table = profile_graph(graph, device=args.device, options=options, progress=not args.no_progress, model=repr(spec))
    path = save_table(table, args.output or default_table_path(table.device))
    table = load_table(path, device=args.device)  # what planners will read: check it round-trips
    print(f"wrote {path}: {len(table.entries)} ops timed, {len(table.skipped)} skipped, on {table.device}")
    for key, reason in table.skipped:
        print(f"  skipped {key[:100]}: {reason}")
    if args.report:
        print(format_comparison(compare(graph, table)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m costmodels.profiler MODEL ...``: the same as ``remat-opt profile MODEL ...``."""
    parser = argparse.ArgumentParser(prog="remat-opt profile", description=__doc__.split("\n")[0])
    add_profile_arguments(parser)
    return run_profile(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
