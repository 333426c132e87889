"""CostRemat under Thunder's FSDP and DDP on 2 gloo ranks (CPU): the full matrix of budgets.

Runs `tests/distributed/distributed_runs.py`'s cases on tiny 1-layer Llama-2 and Pythia (seq 256, where the
step peak depends on the plan): for FSDP, save-all, 50% of save-all, 1 B below what keeping every
unsharded weight can reach, the minimum, and step-peak budgets 25% and 60% of the way from the least
peak to save-all's; for DDP the same without the keep case. Prints, per rank and case, the budget,
predicted and measured saved bytes, the re-gathered weights, predicted and measured step peak and
the largest gradient difference from single-process eager (each rank's shard of it under FSDP),
absolute and relative to the parameter's largest eager gradient.

FSDP also with `collectives_in_flight=1`: 1 B below the least step peak of Thunder's order of
collectives (every all-gather at the forward's start, every reduce-scatter waited for at the
backward's end), and at the least peak of the limited order.

    .venv/bin/python benchmarks/distributed_check.py [--models Llama-2-7b-hf pythia-14m] [--seq 256]
        [--cases fsdp-in_flight fsdp-in_flight_least]   (these and the save-all runs they need)
    .venv/bin/python benchmarks/distributed_check.py --n-layer 3 --seq 256 \
        --cases fsdp-per_block fsdp-per_block_in_flight ddp-per_block   (per-block checkpointing)

Writes the tables to docs/results/distributed.md (section ``matrix_seqN``, or ``in_flight_seqN`` when
only ``fsdp-in_flight*`` cases run; ``--page PATH`` elsewhere, ``--no-write`` to print only). The
README's headline case (tiny Llama-2, seq 32, one collective in flight) is
``--models Llama-2-7b-hf --seq 32 --cases fsdp-in_flight fsdp-in_flight_least``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "distributed"))

from results_page import RESULTS_DIR, add_page_arguments, finish_page, markdown_table  # noqa: E402

from distributed_runs import spawn  # noqa: E402
from test_distributed import FULL_CASES  # noqa: E402

# Per-block activation checkpointing (solver="per_block", no budget): needs --n-layer 3 or more.
PER_BLOCK_CASES = [
    ("fsdp-per_block", "fsdp", ("per_block", None)),
    ("fsdp-per_block_in_flight", "fsdp", ("per_block", 1)),
    ("ddp-per_block", "ddp", ("per_block", None)),
]
ALL_CASES = FULL_CASES + PER_BLOCK_CASES


HEADER = ["rank", "case", "budget B", "saved predicted", "measured", "re-gathers", "peak predicted", "measured",
          "budget held", "grad error (relative)"]


def _cells(rank: int, label: str, c: dict) -> list[str]:
    kind = "peak" if c.get("peak_budget") else "activation"
    peak_error = c["measured_peak_bytes"] / c["predicted_peak_bytes"] - 1
    if c["bound_bytes"] is None:  # a named plan (per-block checkpointing): no budget to hold
        budget, held = "none", "-"
    else:
        budget = f"{kind} {c['bound_bytes']:,}"
        held = "yes" if c["measured_peak_bytes" if kind == "peak" else "measured_saved_bytes"] <= c["bound_bytes"] else "NO"
    return [str(rank), label, budget, f"{c['predicted_saved_bytes']:,}",
            f"{c['measured_saved_bytes']:,}", str(len(c["regathered"])), f"{c['predicted_peak_bytes']:,}",
            f"{c['measured_peak_bytes']:,} ({peak_error:+.2%})", held,
            f"{c['grad_error']:.1e} ({c['grad_relative_error']:.1e})"]


def _row(rank: int, label: str, c: dict) -> str:
    return "| " + " | ".join(_cells(rank, label, c)) + " |"


def _other_threads(c: dict) -> str:
    value = c.get("measured_other_threads_peak_bytes")
    return "-" if value is None else f"{value:,}"


def _floor_lines(ranks: list[dict], cases: list) -> list[str]:
    """Per rank: the least FSDP step peak of Thunder's order of collectives (from the save-all run) and
    how far each in-flight case's predicted and measured peak lies below it."""
    labels = [label for label, strategy, budget in cases if strategy == "fsdp" and isinstance(budget, tuple)
              and budget[0].startswith("in_flight")]
    lines = []
    for rank, result in enumerate(ranks):
        floor_bytes = result.get("fsdp-save_all", {}).get("least_peak_bytes")
        if "error" in result or floor_bytes is None:
            continue
        parts = [f"{label}: predicted {result[label]['predicted_peak_bytes']:,} B "
                 f"({result[label]['predicted_peak_bytes'] / floor_bytes - 1:+.1%}), measured "
                 f"{result[label]['measured_peak_bytes']:,} B ({result[label]['measured_peak_bytes'] / floor_bytes - 1:+.1%})"
                 for label in labels]
        lines.append(f"- rank {rank}: least step peak in Thunder's order of collectives (the floor) "
                     f"{floor_bytes:,} B" + (f"; against it, {'; '.join(parts)}." if parts else "."))
    return lines


def model_section(model: str, seq: int, wall_time_s: float, ranks: list[dict], cases: list,
                  n_layer: int = 1) -> list[str]:
    """Markdown for one model: its setting, the per-rank table (and other threads' peak), the floor."""
    lines = [f"**{model}** (tiny, {n_layer} layer(s), seq {seq}, fp32, fused SDPA, 2 gloo ranks; {wall_time_s:.0f} s)", ""]
    rows, failures = [], []
    for rank, result in enumerate(ranks):
        if "error" in result:
            failures.append(f"- rank {rank} FAILED: {result['error'].strip().splitlines()[-1]}")
            continue
        rows += [[*_cells(rank, label, result[label]), _other_threads(result[label])] for label, _, _ in cases]
    lines += markdown_table([*HEADER, "other threads' peak B"], rows)
    extra = failures + _floor_lines(ranks, cases)
    return lines + ([""] + extra if extra else []) + [""]


def main() -> None:
    start_s = time.perf_counter()
    os.environ["REMAT_OPT_MEASURE_FSDP_PEAK"] = "1"  # the spawned ranks measure FSDP's step peak too
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["Llama-2-7b-hf", "pythia-14m"])
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--n-layer", type=int, default=1, help="layers of the tiny models (per-block cases: 3 or more)")
    parser.add_argument("--cases", nargs="+", default=None,
                        help="labels to run (default: all budgets; the per-block cases only when named)")
    add_page_arguments(parser, RESULTS_DIR / "distributed.md")
    args = parser.parse_args()
    cases = FULL_CASES
    if args.cases:
        unknown = set(args.cases) - {label for label, _, _ in ALL_CASES}
        if unknown:
            parser.error(f"unknown case(s) {', '.join(sorted(unknown))}; use: {', '.join(c[0] for c in ALL_CASES)}")
        strategies = {s for label, s, _ in ALL_CASES if label in args.cases}
        cases = [c for c in ALL_CASES if c[0] in args.cases or (c[2] == "save_all" and c[1] in strategies)]
    section = []
    for model in args.models:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as out:
            ranks = spawn(cases, out, timeout_s=1800.0, model_spec=(model, args.seq, args.n_layer))
        print(f"\n{model} (tiny, {args.n_layer} layer(s), seq {args.seq}, fp32, fused SDPA; "
              f"{time.perf_counter() - start:.0f} s)\n")
        print("| rank | case | budget B | saved predicted | measured | re-gathers | peak predicted | measured | "
              "budget held | grad error (relative) |\n|---|---|---|---|---|---|---|---|---|---|")
        for rank, result in enumerate(ranks):
            if "error" in result:
                print(f"rank {rank} failed:\n{result['error']}")
                continue
            for label, _, _ in cases:
                print(_row(rank, label, result[label]), flush=True)
        section += model_section(model, args.seq, time.perf_counter() - start, ranks, cases, args.n_layer)
    only_in_flight = args.cases and all(label.startswith("fsdp-in_flight") for label in args.cases)
    only_per_block = args.cases and all("per_block" in label for label in args.cases)
    kind = "per_block" if only_per_block else "in_flight" if only_in_flight else "matrix"
    key = f"{kind}_seq{args.seq}" + (f"_layers{args.n_layer}" if args.n_layer != 1 else "")
    finish_page(args, key, "\n".join(section), start_s)


if __name__ == "__main__":
    main()
