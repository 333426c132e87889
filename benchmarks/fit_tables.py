"""`remat-opt fit` on the cases of issue 26, with the times to answer, beside published runs.

    .venv/bin/python benchmarks/fit_tables.py                     # every case; writes docs/results/fit.md
    .venv/bin/python benchmarks/fit_tables.py --cases llama2-7b-1xh100 --no-write

Cases: Llama-2-7b on one H100 at seq 4096 (beside lightning-thunder #1646's measured micro-batch 1:
64.18 GB, 341.78 ms), Llama-3-70B on 8 H100s at seq 8192 (beside PR #1370's 78.77 GB, torch FSDP1
with per-block checkpointing, micro-batch 1), Llama-3-8B and Llama-2-70b on 8 and 64 H100s and on
8 A100-80GB. Each case is one `remat_opt.fit` call with its defaults (micro-batches 1, 2, 4, 8 without
accumulation; FSDP with 1, 2 or Thunder's collectives in flight, DDP, torch FSDP1 under ThunderFX;
5% of memory held back), timed whole: set ``REMAT_OPT_GRAPH_CACHE`` to a folder to reuse traced
graphs between runs (the page says whether the cache held them). Published figures are printed
beside the predictions, never used in them.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path

from results_page import RESULTS_DIR, add_page_arguments, finish_page  # noqa: E402

import remat_opt  # noqa: F401  (before thunder)
from remat_opt.analysis.fit import GB, fit, result_rows
from remat_opt.analysis.thunder_1370 import THUNDER_1370_MEMORY_GB
from remat_opt.analysis.thunder_1646 import THUNDER_1646_MEMORY_GB, THUNDER_1646_STEP_MS
from remat_opt.analysis.whatif import markdown_table


@dataclass(frozen=True)
class Case:
    key: str
    model: str
    gpus: str
    seq: int
    published: str = ""


CASES = (
    Case("llama2-7b-1xh100", "Llama-2-7b-hf", "1xH100", 4096,
         f"lightning-thunder #1646 measured micro-batch 1 on one H100 (benchmark_litgpt.py, thunder.jit): "
         f"{THUNDER_1646_MEMORY_GB['sdpa saved']} GB, {THUNDER_1646_STEP_MS['sdpa saved']} ms per iteration"),
    Case("llama3-70b-8xh100", "Llama-3-70B", "8xH100", 8192,
         f"lightning-thunder PR #1370 measured torch FSDP1 ZeRO-3 under ThunderFX with per-block checkpointing, "
         f"micro-batch 1, on 8 H100s: {THUNDER_1370_MEMORY_GB['Llama-3-70B']} GB per rank"),
    Case("llama3-70b-64xh100", "Llama-3-70B", "64xH100", 8192),
    Case("llama3-8b-8xh100", "Llama-3-8B", "8xH100", 8192),
    Case("llama3-8b-64xh100", "Llama-3-8B", "64xH100", 8192),
    Case("llama3-8b-8xa100", "Llama-3-8B", "8xA100", 8192),
    Case("llama2-70b-8xh100", "Llama-2-70b-hf", "8xH100", 4096),
    Case("llama2-70b-64xh100", "Llama-2-70b-hf", "64xH100", 4096),
    Case("llama2-70b-8xa100", "Llama-2-70b-hf", "8xA100", 4096),
)
DEFAULT_PAGE = RESULTS_DIR / "fit.md"


def cached_graphs() -> int | None:
    """Files in ``REMAT_OPT_GRAPH_CACHE`` (None: no cache set)."""
    folder = os.environ.get("REMAT_OPT_GRAPH_CACHE")
    if not folder:
        return None
    return sum(1 for _ in Path(folder).glob("**/*")) if Path(folder).exists() else 0


def cache_state(before: int | None, after: int | None) -> str:
    if before is None:
        return "no graph cache: every graph traced"
    if after == before:
        return "warm: every graph from the graph cache"
    return f"cold: graphs traced, {after - before} files written to the graph cache"


def run_case(case: Case, micro_batches=None) -> str:
    cached_before = cached_graphs()
    start_s = time.perf_counter()
    result = fit(case.model, gpus=case.gpus, seq=case.seq, micro_batches=micro_batches,
                 progress=lambda i, n, config, row: print(f"  [{time.perf_counter() - start_s:5.0f} s] {i + 1}/{n} "
                                                          f"{config.describe()}" + ("" if row is None else
                                                          f": {'fits' if row.fits else 'does not fit'}"), flush=True))
    state = cache_state(cached_before, cached_graphs())
    lines = [f"### {case.model} on {result.gpus.describe()}, seq {case.seq}", "",
             f"Answered in **{result.seconds:.1f} s** ({state}; torch FSDP1's one block always traced); limit {result.limit_bytes / GB:.2f} GB per rank "
             f"({result.memory_margin:.0%} of memory held back).", ""]
    if case.published:
        lines += [f"Published: {case.published}.", ""]
    lines += [markdown_table(result_rows(result)), ""]
    best = result.best
    lines.append(f"Fastest that fits: **{best.config.describe()}**, {best.peak_bytes / GB:.2f} GB, "
                 f"{best.tokens_per_s_per_gpu:,.0f} tokens/s per GPU." if best else "**No configuration fits.**")
    skipped = [n for n in result.notes if "not tried" in n]
    if skipped:
        lines += ["", f"Not tried ({len(skipped)}): a smaller micro-batch of the same parallelism did not fit."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(c.key for c in CASES),
                        help=f"comma-separated case keys (default all: {', '.join(c.key for c in CASES)})")
    parser.add_argument("--micro-batches", default=None, help="e.g. 1,2 (default: fit's)")
    add_page_arguments(parser, DEFAULT_PAGE)
    args = parser.parse_args()
    known = {c.key: c for c in CASES}
    keys = [k.strip() for k in args.cases.split(",") if k.strip()]
    unknown = [k for k in keys if k not in known]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r}; use any of {', '.join(known)}")
    micro_batches = [int(m) for m in args.micro_batches.split(",")] if args.micro_batches else None
    for key in keys:
        print(f"{key}:", flush=True)
        start_s = time.perf_counter()
        body = run_case(known[key], micro_batches)
        finish_page(args, key, body, start_s)


if __name__ == "__main__":
    main()
