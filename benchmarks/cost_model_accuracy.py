"""How well the costs predict measured time: profile a tiny Llama on the CPU and compare.

For each sequence length and executor list: analyze a tiny one-layer Llama-2, profile every
distinct op and fusion region (`remat_opt.profiling.profile_graph`; regions are timed whole through
the callables Thunder built for them), write the cost table and read it back, then print

* the Spearman rank correlation of roofline vs measured time per distinct op and region (the
  formulas' ranking), over all of them and over the forward ops alone (the recompute candidates);
* for each timing method (`costmodels.timing.ProfileOptions.method`: ops timed in the step's order,
  or each alone in a loop), the forward+backward totals: the roofline sum and the measured table's sum (every op and region
  of the graph at its measured time) against two measurements of the same model, inputs and
  executors, in interleaved rounds: the compiled forward and backward traces run directly (the
  graph's ops in order, as Thunder runs them: what the sums predict) and a whole Thunder training
  step (loss = sum of the logits; adds the prologue's input checks, the cache lookup and
  torch.autograd's glue, which no op cost covers).

    .venv/bin/python benchmarks/cost_model_accuracy.py --seq 32 512 --threads 1 [--per-op]
    .venv/bin/python benchmarks/cost_model_accuracy.py --seq 512 --executors fused-sdpa torch-compile nvfuser-standin

Use one thread on a shared machine: with two, a busy neighbour core stalls every parallel kernel
at the OpenMP barrier (16 ms matmuls of 0.01 ms were seen) and the times measure the neighbour.
"""

from __future__ import annotations

from remat_opt import _compat  # noqa: F401  (applies the torch compatibility step before thunder)

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import thunder
import torch

from remat_opt.executors import EXECUTOR_CHOICES, executors_for
from remat_opt.extract import analyze
from remat_opt.models import ModelSpec, build_model

from costmodels.timing import TIMING_METHODS, ProfileOptions
from remat_opt.profiling import profile_graph
from remat_opt.cost_report import compare, format_comparison, spearman
from remat_opt.costing import CostModel, op_args
from costmodels.formulas import is_fusion_symbol
from costmodels.table import load_table, op_key, save_table


@dataclass(frozen=True)
class MeasuredStep:
    """Medians of one Thunder training step, end to end, and of its forward and backward traces run
    directly (the ops of the graph in order, as Thunder runs them: without the prologue's input
    checks, the cache lookup and torch.autograd's glue)."""

    step_s: float
    forward_s: float
    backward_s: float


def _computation_inputs(jitted, inputs) -> tuple:
    """The inputs Thunder's prologue hands the forward trace (recorded from one real call)."""
    stats = thunder.compile_stats(jitted)
    entry = stats.interpreter_cache[-1]
    recorded = []

    def recording(*args):
        recorded.append(args)
        return entry.computation_fn(*args)

    stats.interpreter_cache[-1] = entry._replace(computation_fn=recording)
    try:
        jitted(*inputs)
    finally:
        stats.interpreter_cache[-1] = entry
    return entry, recorded[0]


def measure_step(model, inputs, executors, repeats: int) -> MeasuredStep:
    """Interleaved rounds of one whole step (loss = sum of the logits) and one direct run of the
    forward and backward traces (cotangents of ones, as the sum's backward gives)."""
    jitted = thunder.jit(model, executors=executors)
    jitted(*inputs).sum().backward()
    entry, args = _computation_inputs(jitted, inputs)

    def step() -> float:
        start = time.perf_counter()
        jitted(*inputs).sum().backward()
        return time.perf_counter() - start

    def traces() -> tuple[float, float]:
        start = time.perf_counter()
        data, (saved_tensors, saved_other) = entry.computation_fn(*args)
        forward_s = time.perf_counter() - start
        cotangents = [torch.ones_like(t) for t in data["flat_output"]]
        start = time.perf_counter()
        entry.backward_fn([list(saved_tensors), list(saved_other)], cotangents)
        return forward_s, time.perf_counter() - start

    for _ in range(3):
        step(), traces()
    steps, runs = [], []
    for _ in range(repeats):
        steps.append(step())
        runs.append(traces())
    return MeasuredStep(step_s=statistics.median(steps), forward_s=statistics.median(f for f, _ in runs),
                        backward_s=statistics.median(b for _, b in runs))


def forward_spearman(graph, comparison) -> float:
    """Spearman of roofline vs measured over the distinct forward ops and regions (the candidates)."""
    forward_keys = {op_key(op_args(graph, op)) for op in graph.forward_ops}
    rows = [r for r in comparison.rows if r[0] in forward_keys]
    return spearman([r[2] for r in rows], [r[3] for r in rows]) if len(rows) > 1 else float("nan")


def _profile(graph, spec, method: str, args: argparse.Namespace, out_dir: Path, name: str):
    start = time.perf_counter()
    options = ProfileOptions(method=method, repeats=args.repeats)
    table = profile_graph(graph, options=options, progress=False, model=repr(spec))
    profile_s = time.perf_counter() - start
    path = save_table(table, out_dir / f"{name}-{method}.json")
    return load_table(path, device="cpu"), profile_s, path


def _report(graph, table, measured: MeasuredStep, method: str, profile_s: float, path: Path, per_op: bool) -> None:
    comparison = compare(graph, table)
    regions = [op for op in graph.ops if is_fusion_symbol(op.symbol)]
    region_keys = {op_key(op_args(graph, op)) for op in regions}
    print(f"\n--- ops timed {method}: {len(table.entries)} distinct ops and regions of {len(graph.ops)} ops in "
          f"{profile_s:.1f} s ({len(region_keys & set(table.entries))} of {len(region_keys)} distinct fusion regions "
          f"timed whole, {len(regions)} regions in the graph); table {path} reloaded")
    for key, reason in table.skipped:
        print(f"  skipped {key[:100]}: {reason}")
    print(format_comparison(comparison, per_op=per_op))
    print(f"Spearman over the forward ops and regions only: {forward_spearman(graph, comparison):.3f}")
    traces_s = measured.forward_s + measured.backward_s
    predicted = CostModel(graph, table=table)
    print(f"measured table summed: {comparison.measured_total_s * 1e3:.3f} ms = "
          f"{comparison.measured_total_s / traces_s:.3f} of the traces run directly "
          f"(forward {predicted.total_time_s(backward=False) / measured.forward_s:.3f}, "
          f"backward {predicted.total_time_s(backward=True) / measured.backward_s:.3f}), "
          f"{comparison.measured_total_s / measured.step_s:.3f} of the whole step")
    print(f"roofline summed: {comparison.predicted_total_s * 1e3:.3f} ms = {comparison.predicted_total_s / traces_s:.3f} "
          f"of the traces run directly, {comparison.predicted_total_s / measured.step_s:.3f} of the whole step")


def run(seq: int, executors_name: str, args: argparse.Namespace, out_dir: Path) -> None:
    spec = ModelSpec("Llama-2-7b-hf", n_layer=args.n_layer, seq=seq, device="cpu", tiny=True)
    model, inputs = build_model(spec)
    executors = executors_for(executors_name)
    graph = analyze(model, *inputs, executors=executors)
    tables = {m: _profile(graph, spec, m, args, out_dir, f"tiny-llama-seq{seq}-{executors_name}") for m in args.methods}
    measured = measure_step(model, inputs, executors, args.step_repeats)
    print(f"\n=== tiny Llama-2 ({args.n_layer} layer, seq {seq}, float32), executors {executors_name}, "
          f"{torch.get_num_threads()} thread(s) ===")
    print(f"measured, median of {args.step_repeats} interleaved rounds: forward+backward traces run directly "
          f"{(measured.forward_s + measured.backward_s) * 1e3:.3f} ms (forward {measured.forward_s * 1e3:.3f}, "
          f"backward {measured.backward_s * 1e3:.3f}); whole Thunder step {measured.step_s * 1e3:.3f} ms")
    for method, (table, profile_s, path) in tables.items():
        _report(graph, table, measured, method, profile_s, path, args.per_op)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", type=int, nargs="+", default=[32, 512], help="sequence lengths to profile")
    parser.add_argument("--executors", nargs="+", default=["fused-sdpa"], choices=EXECUTOR_CHOICES,
                        help="executor lists to compare (torch-compile and nvfuser-standin form fusion regions)")
    parser.add_argument("--n-layer", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 on a shared machine)")
    parser.add_argument("--methods", nargs="+", default=list(TIMING_METHODS), choices=TIMING_METHODS,
                        help="how ops are timed (costmodels.timing.ProfileOptions.method), each reported")
    parser.add_argument("--repeats", type=int, default=20, help="timed passes (in-order) or calls per op (loop)")
    parser.add_argument("--step-repeats", type=int, default=20, help="timed training steps")
    parser.add_argument("--per-op", action="store_true", help="print one line per distinct op")
    parser.add_argument("--out", type=Path, default=None, help="folder for the tables (default: a temp folder)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="cost_tables_"))
    for seq in args.seq:
        for executors_name in args.executors:
            run(seq, executors_name, args, out_dir)


if __name__ == "__main__":
    main()
