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
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "distributed"))

from distributed_runs import spawn  # noqa: E402
from test_distributed import FULL_CASES  # noqa: E402


def _row(rank: int, label: str, c: dict) -> str:
    kind = "peak" if c.get("peak_budget") else "activation"
    peak_error = c["measured_peak_bytes"] / c["predicted_peak_bytes"] - 1
    held = c["measured_peak_bytes" if kind == "peak" else "measured_saved_bytes"] <= c["bound_bytes"]
    return (f"| {rank} | {label} | {kind} {c['bound_bytes']:,} | {c['predicted_saved_bytes']:,} | "
            f"{c['measured_saved_bytes']:,} | {len(c['regathered'])} | {c['predicted_peak_bytes']:,} | "
            f"{c['measured_peak_bytes']:,} ({peak_error:+.2%}) | {'yes' if held else 'NO'} | {c['grad_error']:.1e} ({c['grad_relative_error']:.1e}) |")


def main() -> None:
    os.environ["REMAT_OPT_MEASURE_FSDP_PEAK"] = "1"  # the spawned ranks measure FSDP's step peak too
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["Llama-2-7b-hf", "pythia-14m"])
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--cases", nargs="+", default=None, help="labels to run (default: all)")
    args = parser.parse_args()
    cases = FULL_CASES
    if args.cases:
        unknown = set(args.cases) - {label for label, _, _ in FULL_CASES}
        if unknown:
            parser.error(f"unknown case(s) {', '.join(sorted(unknown))}; use: {', '.join(c[0] for c in FULL_CASES)}")
        strategies = {s for label, s, _ in FULL_CASES if label in args.cases}
        cases = [c for c in FULL_CASES if c[0] in args.cases or (c[2] == "save_all" and c[1] in strategies)]
    for model in args.models:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as out:
            ranks = spawn(cases, out, timeout_s=1800.0, model_spec=(model, args.seq))
        print(f"\n{model} (tiny, 1 layer, seq {args.seq}, fp32, fused SDPA; {time.perf_counter() - start:.0f} s)\n")
        print("| rank | case | budget B | saved predicted | measured | re-gathers | peak predicted | measured | "
              "budget held | grad error (relative) |\n|---|---|---|---|---|---|---|---|---|---|")
        for rank, result in enumerate(ranks):
            if "error" in result:
                print(f"rank {rank} failed:\n{result['error']}")
                continue
            for label, _, _ in cases:
                print(_row(rank, label, result[label]), flush=True)


if __name__ == "__main__":
    main()
