"""How well the roofline predicts measured op times: profile a tiny Llama on the CPU and compare.

For each sequence length: analyze a tiny one-layer Llama-2 (fused CPU SDPA), profile every distinct
op (`remat_opt.profiling.profile_graph`), write the cost table and read it back, then print the
Spearman rank correlation of roofline vs measured time per distinct op, the forward+backward totals
(roofline, sum of measured ops) and the measured time of a real Thunder training step.

    .venv/bin/python benchmarks/cost_model_accuracy.py --seq 32 512 --threads 1 [--per-op]

Use one thread on a shared machine: with two, a busy neighbour core stalls every parallel kernel
at the OpenMP barrier (16 ms matmuls of 0.01 ms were seen) and the times measure the neighbour.
"""

from __future__ import annotations

from remat_opt import _compat  # noqa: F401  (applies the torch compatibility step before thunder)

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import thunder
import torch

from remat_opt.executors import executors_for
from remat_opt.extract import analyze
from remat_opt.models import ModelSpec, build_model

from costmodels.timing import ProfileOptions
from remat_opt.profiling import profile_graph
from remat_opt.cost_report import compare, format_comparison
from costmodels.table import load_table, save_table


def step_time_s(model, inputs, executors, repeats: int) -> float:
    """Median wall time of one Thunder forward+backward step (loss = sum of the logits)."""
    jitted = thunder.jit(model, executors=executors)

    def step():
        jitted(*inputs).sum().backward()

    for _ in range(3):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(seq: int, args: argparse.Namespace, out_dir: Path) -> None:
    spec = ModelSpec("Llama-2-7b-hf", n_layer=args.n_layer, seq=seq, device="cpu", tiny=True)
    model, inputs = build_model(spec)
    executors = executors_for("fused-sdpa")
    graph = analyze(model, *inputs, executors=executors)
    start = time.perf_counter()
    table = profile_graph(graph, options=ProfileOptions(repeats=args.repeats), progress=False, model=repr(spec))
    profile_s = time.perf_counter() - start
    path = save_table(table, out_dir / f"tiny-llama-seq{seq}.json")
    table = load_table(path, device="cpu")
    comparison = compare(graph, table)
    step_s = step_time_s(model, inputs, executors, args.step_repeats)
    print(f"\n=== tiny Llama-2 ({args.n_layer} layer, seq {seq}, float32), {torch.get_num_threads()} thread(s) ===")
    print(f"profiled {len(table.entries)} distinct ops of {len(graph.ops)} in {profile_s:.1f} s; table {path} reloaded")
    print(format_comparison(comparison, per_op=args.per_op))
    print(f"Thunder training step, measured end to end: {step_s * 1e3:.3f} ms (median of {args.step_repeats})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", type=int, nargs="+", default=[32, 512], help="sequence lengths to profile")
    parser.add_argument("--n-layer", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 on a shared machine)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per op, at least")
    parser.add_argument("--step-repeats", type=int, default=20, help="timed training steps")
    parser.add_argument("--per-op", action="store_true", help="print one line per distinct op")
    parser.add_argument("--out", type=Path, default=None, help="folder for the tables (default: a temp folder)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="cost_tables_"))
    for seq in args.seq:
        run(seq, args, out_dir)


if __name__ == "__main__":
    main()
