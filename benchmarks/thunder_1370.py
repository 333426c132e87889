"""Lightning-thunder PR #1370's Llama-3-70B row, predicted, and what CostRemat would do there.

The PR ran ``benchmark_litgpt.py --model_name Llama-3-70B --micro_batch_size 1 --compile
thunder-dynamo --checkpoint_activations=True --distributed_mode=fsdp --shard_mode zero3`` on 8 H100s
(seq = the config's block size, 8192) and measured 78.77 GB (``max_memory_allocated``). This script
traces one Llama-3-70B block through ThunderFX on meta (with and without ``checkpoint_wrapper``),
walks the FSDP1 iteration (`remat_opt.analysis.torch_fsdp`) and prints the predicted per-rank peak
term by term, then CostRemat's options: the block graph's Pareto plans (exact ILP), uniform over the
80 blocks or with the last blocks saving more, and the fastest under 78.77 GB, 70 GB and per-block
checkpointing's own predicted peak. Nothing is fitted to 78.77 GB.

With ``--cpu-check`` it first runs the same iteration on 2 gloo ranks on the CPU
(`tests/distributed/fsdp1_runs.py`: two tiny configs, the root's or the blocks' terms at the peak)
and prints measured against predicted. Writes the block ``thunder_1370`` of docs/results/distributed.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "distributed"))

from results_page import RESULTS_DIR, add_page_arguments, finish_page, markdown_table  # noqa: E402

from remat_opt.analysis.thunder_1370 import (THUNDER_1261_LLAMA3_70B, THUNDER_1370_MEMORY_GB,  # noqa: E402
                                             assignments, benchmark_case, block_menu, case_of_config,
                                             fastest_under)

GB = 1e9


def cpu_check() -> list[str]:
    from fsdp1_runs import CONFIGS, WORLD_SIZE, litgpt_config, spawn

    with tempfile.TemporaryDirectory() as out_dir:
        ranks = spawn(list(CONFIGS), out_dir)
    rows = []
    for result in ranks[0]:
        if "error" in result:
            raise RuntimeError(result["error"])
        name = result["config"]
        c = CONFIGS[name]
        case = case_of_config(litgpt_config(name), seq=c["seq"], world_size=WORLD_SIZE, dtype="float32", device="cpu")
        prediction = case.predict(case.checkpoint())
        predicted = prediction.allocated_during_bytes
        measured = result["peak_delta_bytes"]
        rows.append([name, f"{c['n_layer']} blocks, MLP {c['intermediate_size']}, vocab {c['vocab_size']}, "
                     f"seq {c['seq']}", prediction.peak_event, f"{measured:,}", f"{predicted:,}",
                     f"{(predicted - measured) / measured:+.2%}"])
    return ["2 gloo ranks on the CPU, fp32, the benchmark's wrapping (FSDP1 `FULL_SHARD` per block, "
            "`use_orig_params`, `checkpoint_wrapper`, ThunderFX with the CPU executors), the third iteration "
            "measured with the CPU profiler: bytes allocated during it and alive at its peak.", "",
            *markdown_table(["config", "model", "predicted peak event", "measured B", "predicted B", "error"], rows)]


def gb(n_bytes: float) -> str:
    return f"{n_bytes / GB:.2f}"


def main() -> None:
    start_s = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Llama-3-70B")
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--cpu-check", action="store_true", help="also run the 2-rank CPU check (about 2 min)")
    add_page_arguments(parser, RESULTS_DIR / "distributed.md")
    args = parser.parse_args()
    body = []
    if args.cpu_check:
        body += ["**The FSDP1 iteration model, measured on the CPU.**", "", *cpu_check(), ""]

    case_start_s = time.perf_counter()
    case = benchmark_case(args.model, world_size=args.world_size)
    trace_s = time.perf_counter() - case_start_s
    checkpoint = case.checkpoint()
    row = case.predict(checkpoint)
    measured_gb = THUNDER_1370_MEMORY_GB.get(args.model)
    n = case.units.n_blocks
    body += [f"**{args.model}, {args.world_size} ranks, seq {case.seq}, micro-batch 1, bf16, H100**: one block "
             f"traced through ThunderFX on meta in {trace_s:.0f} s. Per-rank peak of an iteration after the "
             f"first, per-block checkpointing as the PR ran it: **{gb(row.peak_bytes)} GB** at "
             f"\"{row.peak_event}\""
             + (f"; PR #1370 measured {measured_gb} GB: error {(row.peak_bytes / GB - measured_gb) / measured_gb:+.1%} "
                f"(the same flags the next day, PR #1261's thread: {THUNDER_1261_LLAMA3_70B})." if measured_gb else "."),
             "", *markdown_table(["term at the peak", "GB"], [[k, gb(v)] for k, v in row.terms.items()]), ""]

    menu_start_s = time.perf_counter()
    menu = block_menu(case)
    tagged = [p for p in menu if p.tag_targets != checkpoint.tag_targets]  # CostRemat writes tags
    uniform = assignments(case, tagged, uniform_only=True)
    mixed = assignments(case, tagged)
    solve_s = time.perf_counter() - menu_start_s
    block_s = case.block_step_time_s
    menu_rows = [[p.label, gb(p.activations.carried_bytes), gb(p.activations.backward_bytes),
                  f"{p.recompute_time_s * 1e3:.2f}", gb(case.predict(p).peak_bytes)] for p in [checkpoint, *tagged]]
    body += [f"Block plans (per block: what it carries from its forward to its backward, its backward's most "
             f"live bytes, the recompute it adds; the iteration's peak with the plan on all {n} blocks). "
             f"One block's forward + backward: {block_s * 1e3:.1f} ms on the H100 cost model.", "",
             *markdown_table(["block plan", "carried GB", "backward GB", "recompute ms", "iteration peak GB"],
                             menu_rows), ""]
    least = min(mixed, key=lambda a: (a.prediction.peak_bytes, a.recompute_time_s))
    baseline_ms = n * checkpoint.recompute_time_s * 1e3
    budgets = [("least peak", least.prediction.peak_bytes), ("per-block checkpointing's peak", row.peak_bytes)]
    if measured_gb:
        budgets.append((f"{measured_gb} GB (the PR's measurement)", measured_gb * GB))
    budgets.append(("70 GB", 70 * GB))
    choice_rows = []
    for label, budget in budgets:
        for kind, candidates in (("uniform", uniform), ("last blocks save more", mixed)):
            a = fastest_under(candidates, budget)
            if a is None:
                choice_rows.append([label, gb(budget), kind, "none fits: the least predicted peak is "
                                    f"{gb(min(c.prediction.peak_bytes for c in candidates))} GB", "", "", ""])
                continue
            choice_rows.append([label, gb(budget), kind, a.describe(n), gb(a.prediction.peak_bytes),
                                f"{a.recompute_time_s * 1e3:.0f}", f"{a.recompute_time_s * 1e3 - baseline_ms:+.0f}"])
    body += [f"CostRemat's choices: the block plans above as tags, the same plan on every block (ThunderFX "
             f"compiles one graph that every block runs: what applies as is) or the last blocks saving more "
             f"(needs a graph per plan); {len(uniform) + len(mixed):,} assignments priced in {solve_s:.1f} s. "
             f"Recompute time per iteration against per-block checkpointing's {baseline_ms:.0f} ms (the blocks' "
             f"compute without recompute: {n * block_s * 1e3:.0f} ms; communication not modelled).", "",
             *markdown_table(["budget", "GB", "assignment", "plan", "peak GB", "recompute ms", "vs per-block ms"],
                             choice_rows)]
    finish_page(args, "thunder_1370", "\n".join(body), start_s)


if __name__ == "__main__":
    main()
