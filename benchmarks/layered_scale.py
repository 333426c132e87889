"""The layered solver at full size: Llama-2-7b on one H100, Llama-3-8B and the 70B models per rank
under FSDP; the whole-graph ILP beside it at the same budgets (the solver before it).

For each case: trace on meta (or load from ``REMAT_OPT_GRAPH_CACHE``), cost for an H100, and report
save-all, per-block activation checkpointing, the least step peak the layered solver finds (with
the proven lower bound on any plan's peak), then plans at two step-peak budgets: per-block
checkpointing's own peak (the memory large runs pay; how much recompute a plan needs there) and
halfway from the least peak to save-all's. Each plan: extra recompute time, the certified gap
(from the solver's lower bound on recompute time), solve time. ``--ilp`` also solves with the
whole-graph ILP (`solver="ilp"`, ``--time-limit-s``) at the same budgets.

    REMAT_OPT_GRAPH_CACHE=/tmp/remat_graphs .venv/bin/python benchmarks/layered_scale.py --ilp

FSDP graphs use ``--executors fused-sdpa`` with one collective in flight: the stand-in (the default
on meta) does not extend to full depth under FSDP yet (issue 25, item 3).

Writes docs/results/solvers_and_scale.md (section ``layered_scale``; ``--page PATH`` elsewhere,
``--no-write`` to print only).
"""

from __future__ import annotations

import argparse
import time

from results_page import RESULTS_DIR, add_page_arguments, finish_page, markdown_table

from remat_opt.core.errors import InfeasibleBudgetError
from remat_opt.costing.graph_costs import CostModel
from remat_opt.distributed.data_parallel import DataParallel
from remat_opt.models.by_name import ModelSpec
from remat_opt.models.graphs import analyze_spec
from remat_opt.planning.planner import forward_op_times_s
from remat_opt.core.problem import RecomputeProblem
from remat_opt.solvers import SOLVERS, ILPOptions, LayeredOptions
from remat_opt.solvers.layered import decomposition_of, least_peak_units
from remat_opt.solvers.peak_model import peak_model_of

GB = 1e9
# name -> (litgpt config, data parallelism, executors)
CASES = {
    "Llama-2-7b, 1 H100": ("Llama-2-7b-hf", None, None),
    "Llama-3-8B, FSDP 8": ("Llama-3-8B", DataParallel("fsdp", 8, 1), "fused-sdpa"),
    "Llama-2-70b, FSDP 8": ("Llama-2-70b-hf", DataParallel("fsdp", 8, 1), "fused-sdpa"),
    "Llama-2-70b, FSDP 64": ("Llama-2-70b-hf", DataParallel("fsdp", 64, 1), "fused-sdpa"),
    "Llama-3-70B, FSDP 8": ("Llama-3-70B", DataParallel("fsdp", 8, 1), "fused-sdpa"),
    "Llama-3-70B, FSDP 64": ("Llama-3-70B", DataParallel("fsdp", 64, 1), "fused-sdpa"),
}
SUMMARY_HEADER = ["case", "ops", "units", "save-all GB", "per-block GB (+ms)", "least peak GB (+ms)",
                  "no plan below GB", "menus built s", "graph s"]
PLAN_HEADER = ["case", "budget GB", "solver", "peak GB", "extra ms", "gap", "solve s", "plan from", "bound from"]


def load_problem(name: str, parallel, executors, seq: int) -> tuple[RecomputeProblem, float]:
    start_s = time.perf_counter()
    graph = analyze_spec(ModelSpec(name, seq=seq, dtype="bfloat16"), parallel=parallel, executors=executors)
    costs = CostModel(graph, device_spec="h100")
    return RecomputeProblem.from_graph(graph, forward_op_times_s(costs, graph)), time.perf_counter() - start_s


def _solve(problem, solver: str, budget_bytes: int, options) -> list[str]:
    start_s = time.perf_counter()
    try:
        plan = SOLVERS[solver](problem, peak_budget_bytes=budget_bytes, options=options)
    except (InfeasibleBudgetError, TimeoutError) as e:
        return [solver, type(e).__name__, str(e)[:160].replace("|", "/"), "", f"{time.perf_counter() - start_s:.1f}", "", ""]
    gap = "-" if plan.gap is None else f"{plan.gap:.2%}"
    source = next((n.split("the plan is ")[-1].rstrip("'s") for n in plan.notes if "the plan is " in n), plan.status)
    bound = next((n.rsplit("(", 1)[-1].rstrip(")") for n in plan.notes if n.startswith("certified lower bound")), "-")
    return [solver, f"{plan.peak_bytes / GB:.2f}", f"{plan.extra_time_s * 1e3:.1f}", gap,
            f"{plan.solve_time_s:.1f}", source, bound]


def run_case(label: str, seq: int, with_ilp: bool, time_limit_s: float) -> tuple[list[str], list[list[str]]]:
    name, parallel, executors = CASES[label]
    problem, graph_s = load_problem(name, parallel, executors, seq)
    options = LayeredOptions(bound_time_limit_s=time_limit_s / 2)
    save_all, per_block = SOLVERS["save_all"](problem), SOLVERS["per_block"](problem)
    start_s = time.perf_counter()
    decomposition = decomposition_of(problem, options)
    built_s = time.perf_counter() - start_s
    least = problem.plan_for(least_peak_units(problem, options), solver="layered", status="least", solve_time_s=0.0)
    floor = int(peak_model_of(problem).const.max())
    graph = problem.graph
    summary = [label, f"{len(graph.forward_ops):,} + {len(graph.backward_ops):,}", f"{len(problem.allowed_units):,}",
               f"{save_all.peak_bytes / GB:.2f}", f"{per_block.peak_bytes / GB:.2f} (+{per_block.extra_time_s * 1e3:.0f})",
               f"{least.peak_bytes / GB:.2f} (+{least.extra_time_s * 1e3:.0f})", f"{floor / GB:.2f}",
               f"{built_s:.1f}", f"{graph_s:.1f}"]
    print(" | ".join(summary), flush=True)
    rows = []
    budgets = sorted({per_block.peak_bytes, (least.peak_bytes + save_all.peak_bytes) // 2})
    for budget in budgets:
        solvers = [("layered", options)] + ([("ilp", ILPOptions(time_limit_s=time_limit_s))] if with_ilp else [])
        for solver, solver_options in solvers:
            row = [label, f"{budget / GB:.2f}", *_solve(problem, solver, budget, solver_options)]
            print(" | ".join(row), flush=True)
            rows.append(row)
    del decomposition
    return summary, rows


def main() -> None:
    start_s = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES), metavar="CASE",
                        help=f"cases to run (default all): {', '.join(CASES)}")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--ilp", action="store_true", help="also solve with the whole-graph ILP")
    parser.add_argument("--time-limit-s", type=float, default=10.0,
                        help="per solve: the ILP's limit; the layered solver's bound gets half")
    add_page_arguments(parser, RESULTS_DIR / "solvers_and_scale.md")
    args = parser.parse_args()
    summaries, plans = [], []
    for label in args.cases:
        summary, rows = run_case(label, args.seq, args.ilp, args.time_limit_s)
        summaries.append(summary)
        plans += rows
    body = [f"Seq {args.seq}, micro-batch 1, bf16, H100 cost model; per rank under FSDP. Peaks are simulated "
            "step peaks (weights, gradients, saved and transient tensors; no optimizer states).", "",
            *markdown_table(SUMMARY_HEADER, summaries), "", *markdown_table(PLAN_HEADER, plans)]
    finish_page(args, "layered_scale", "\n".join(body), start_s)


if __name__ == "__main__":
    main()
