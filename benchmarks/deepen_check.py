"""Checks a deepened graph against a full trace at real scale, and times both.

Traces Llama-2-7b (seq 4096, bf16, meta) with 4 layers, extends it to `--layers`, traces the full
depth directly, and prints the structural differences (expected: none), saved bytes, simulated
peak, and the time each way. Executors: the default on meta (the nvFuser stand-in), or `--executors`.
`--strategy fsdp|ddp` checks one rank of `--world-size` (default 2) under Thunder's FSDP or DDP.

    .venv/bin/python benchmarks/deepen_check.py --layers 32     # ~6-8 minutes on 2 cores
    .venv/bin/python benchmarks/deepen_check.py --layers 8 --executors fused-sdpa
    .venv/bin/python benchmarks/deepen_check.py --model Llama-2-7b-hf --tiny --seq 32 --traced-layers 3 --layers 5 \
        --executors fused-sdpa --strategy fsdp
    .venv/bin/python benchmarks/deepen_check.py --tiny --seq 32 --layers 5 --strategy ddp --dtype float32 --no-write
        # DDP with the stand-in in fp32 cannot be extended: the one-line DeepenError (bf16: extends)

Writes the comparison to docs/results/solvers_and_scale.md, in a section named after the model,
depth, executors and strategy (``deepen_Llama-2-7b-hf_8_layers_nvfuser-standin``; ``--page PATH``
elsewhere, e.g. docs/results/distributed.md for ``--strategy``; ``--no-write`` to print only).
"""

from __future__ import annotations

import argparse
import time

from results_page import RESULTS_DIR, add_page_arguments, finish_page, markdown_table

from remat_opt import _compat  # noqa: F401  (applies the torch compatibility step before thunder)
from remat_opt.core.deepen import DeepenError
from remat_opt.distributed.data_parallel import STRATEGIES, DataParallel
from remat_opt.executors import EXECUTOR_CHOICES, default_executors
from remat_opt.validation.graph_diff import structural_differences
from remat_opt.models.graphs import analyze_spec
from remat_opt.models.by_name import DTYPES, ModelSpec
from remat_opt.core.simulation import simulate_peak_bytes


def section_key(args: argparse.Namespace) -> str:
    """The page section of one configuration: model, depth, executors, and tiny/strategy when given."""
    parts = ["deepen", args.model + ("-tiny" if args.tiny else ""), f"{args.layers}_layers", args.executors]
    return "_".join(parts + ([f"{args.strategy}{args.world_size}"] if args.strategy else []))


def section(setting: str, traced_layers: int, graphs: dict, seconds: dict, peaks_bytes: dict, diffs: list) -> str:
    """Markdown: the setting, one row per way of getting the graph, the speed-up and the differences."""
    rows = [[how, f"{time_s:.1f}", f"{len(graphs[how].ops):,}", f"{graphs[how].saved_activation_bytes / 1e9:.3f}",
             f"{peaks_bytes[how] / 1e9:.3f}"] for how, time_s in seconds.items()]
    table = markdown_table(["graph", "time s", "ops", "saved GB", "save-all peak GB"], rows)
    verdict = (f"Speed-up {seconds['direct'] / seconds['extended']:.1f}x; structural differences "
               f"(`remat_opt.validation.graph_diff.structural_differences`): {len(diffs)}.")
    ways = f"`extended`: {traced_layers} layers traced, then extended; `direct`: every layer traced"
    return "\n".join([f"{setting}. {ways}.", "", *table, "", verdict,
                      *[f"- `{diff}`" for diff in diffs]])


def main() -> None:
    run_start_s = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Llama-2-7b-hf")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--traced-layers", type=int, default=4)
    parser.add_argument("--executors", choices=EXECUTOR_CHOICES, default=default_executors("meta"))
    parser.add_argument("--tiny", action="store_true", help="shrink the config's width (remat_opt.models.by_name)")
    parser.add_argument("--strategy", choices=STRATEGIES, default=None, help="one rank under FSDP or DDP")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    add_page_arguments(parser, RESULTS_DIR / "solvers_and_scale.md")
    args = parser.parse_args()
    spec = ModelSpec(args.model, n_layer=args.layers, seq=args.seq, dtype=args.dtype, device="meta", tiny=args.tiny)
    parallel = DataParallel(args.strategy, args.world_size) if args.strategy else None
    graphs, seconds = {}, {}
    for how, traced in (("extended", args.traced_layers), ("direct", 0)):
        start_s = time.perf_counter()
        try:
            graphs[how] = analyze_spec(spec, traced_layers=traced, executors=args.executors, parallel=parallel)
        except DeepenError as e:  # the one-line error the CLI prints
            raise SystemExit(f"deepen_check: {e}") from e
        seconds[how] = time.perf_counter() - start_s
    diffs = structural_differences(graphs["extended"], graphs["direct"], limit=20)
    where = f", {parallel.describe()}" if parallel else ""
    dtype = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}[args.dtype]
    setting = (f"{args.model}{' (tiny)' if args.tiny else ''}, {args.layers} layers, seq {args.seq}, {dtype}, meta, "
               f"executors {args.executors}{where}")
    print(setting)
    peaks_bytes = {}
    for how, graph in graphs.items():
        peaks_bytes[how] = simulate_peak_bytes(graph)
        peak_gb = peaks_bytes[how] / 1e9
        print(
            f"  {how:9s} {seconds[how]:7.1f} s  {len(graph.ops)} ops  saved {graph.saved_activation_bytes / 1e9:.3f} GB  "
            f"save-all peak {peak_gb:.3f} GB"
        )
    print(f"  speed-up {seconds['direct'] / seconds['extended']:.1f}x; structural differences: {len(diffs)}")
    for diff in diffs:
        print("   ", diff)
    finish_page(args, section_key(args), section(setting, args.traced_layers, graphs, seconds, peaks_bytes, diffs),
                run_start_s)


if __name__ == "__main__":
    main()
