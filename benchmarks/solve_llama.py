"""Solve times of the remat solvers on Llama-2-7b joint graphs traced on the meta device.

For each depth: trace (or load a cached graph), build the problem, then solve with the ILP and the
min-cut at three saved-bytes budgets and three peak budgets, verify every plan with the
independent checker, and print one line per solve. Op times come from `remat_opt.costing.graph_costs` (formula
roofline on the named GPU).

    .venv/bin/python benchmarks/solve_llama.py --layers 2 8 32 --cache /tmp/remat_graphs

Models deeper than ``--traced-layers`` (4) are traced with 4 layers and extended (a direct 32-layer
trace takes ~5 minutes on 2 cores, ``--traced-layers 0``); ``--cache`` keeps the graphs.

Writes the solve times to docs/results/solvers_and_scale.md (section ``solve_times``; ``--page PATH``
elsewhere, ``--no-write`` to print only).
"""

from __future__ import annotations

import argparse
import pickle
import time
from pathlib import Path

from remat_opt.core.checker import check_plan
from remat_opt.core.problem import RecomputeProblem
from remat_opt.solvers import SOLVERS, ILPOptions, solve_save_all
from remat_opt.core.layers import find_repeated_blocks
from remat_opt.solvers._clock import Clock
from remat_opt.solvers.blocks import choose_ties
from remat_opt.solvers.ilp_bounds import minimum_saved_bytes, peak_model_minimum
from remat_opt.solvers.ilp_model import ILPModel
from results_page import RESULTS_DIR, add_page_arguments, finish_page, markdown_table

SOLVE_HEADER = ["budget", "solver", "solve s", "check s", "checker", "saved GiB", "peak GiB", "extra ms", "status",
                "gap", "tags"]

GiB = 2**30


def load_graph(n_layer: int, seq: int, cache: Path | None, traced_layers: int):
    """The joint graph of Llama-2-7b with `n_layer` layers on meta (traced, or from `cache`).

    Deeper than `traced_layers`, it is traced with that many layers and extended
    (`remat_opt.models.graphs.analyze_model`; identical to a direct trace, `benchmarks/deepen_check.py`).
    """
    path = cache / f"llama2-7b-L{n_layer}-T{seq}-from{traced_layers}.pkl" if cache else None
    if path is not None and path.exists():
        return pickle.loads(path.read_bytes()), 0.0
    from remat_opt.models.graphs import analyze_model

    start = time.perf_counter()
    graph = analyze_model("Llama-2-7b-hf", seq=seq, dtype="bfloat16", n_layer=n_layer, traced_layers=traced_layers)
    trace_s = time.perf_counter() - start
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle.dumps(graph))
    return graph, trace_s


def op_times(graph, device: str) -> tuple[dict[str, float], str]:
    from remat_opt.costing.graph_costs import CostModel

    costs = CostModel(graph, device)
    return {op.name: costs.op_cost(op).time_s for op in graph.forward_ops}, f"costmodels ({device})"


def budgets(problem: RecomputeProblem) -> dict[str, list[int]]:
    """Three saved-bytes and three peak budgets at 25/50/75% between a lower bound and save-all."""
    save_all = solve_save_all(problem)
    low_saved = minimum_saved_bytes(problem)
    ties = choose_ties(problem, None)
    low_peak, _ = peak_model_minimum(problem, ILPModel(problem, ties, ILPOptions()), Clock(10))
    between = lambda low, high: [int(low + f * (high - low)) for f in (0.25, 0.5, 0.75)]  # noqa: E731
    return {
        "activation_budget_bytes": between(low_saved, save_all.saved_bytes),
        "peak_budget_bytes": between(low_peak, save_all.peak_bytes),
    }


def run(n_layer: int, seq: int, cache: Path | None, device: str, solvers: list[str], traced_layers: int) -> list[str]:
    """Prints one line per solve at this depth; returns the same as markdown (a summary and a table)."""
    graph, trace_s = load_graph(n_layer, seq, cache, traced_layers)
    times, source = op_times(graph, device)
    start = time.perf_counter()
    problem = RecomputeProblem.from_graph(graph, times)
    build_s = time.perf_counter() - start
    blocks = find_repeated_blocks(graph)
    summary = (f"Llama-2-7b, {n_layer} layers, seq {seq}, bf16, meta: {len(graph.ops)} ops, {len(problem.units)} units "
               f"({len(problem.allowed_units)} allowed); blocks {blocks}; trace {trace_s:.1f} s, "
               f"problem {build_s:.2f} s; times: {source}")
    print(f"\n== {summary}")
    save_all = solve_save_all(problem)
    save_all_text = f"save-all: saved {save_all.saved_bytes / GiB:.2f} GiB, peak {save_all.peak_bytes / GiB:.2f} GiB"
    print(f"   {save_all_text}")
    rows = []
    for kind, values in budgets(problem).items():
        for budget in values:
            for name in solvers:
                start = time.perf_counter()
                try:
                    plan = SOLVERS[name](problem, **{kind: budget})
                except ValueError as e:
                    print(f"   {kind}={budget / GiB:.2f} GiB {name:7s} {type(e).__name__}: {e}")
                    rows.append([f"{kind}={budget / GiB:.2f} GiB", name, f"{type(e).__name__}: {e}", *[""] * 8])
                    continue
                solve_s = time.perf_counter() - start
                start = time.perf_counter()
                errors = check_plan(graph, plan, pinned=problem.pinned, op_time_s=times)
                check_s = time.perf_counter() - start
                gap = "-" if plan.gap is None else f"{plan.gap:.2%}"
                print(
                    f"   {kind}={budget / GiB:6.2f} GiB {name:7s} solve {solve_s:6.2f} s (check {check_s:.2f} s, "
                    f"{'ok' if not errors else errors[:2]}): saved {plan.saved_bytes / GiB:6.2f} GiB, "
                    f"peak {plan.peak_bytes / GiB:6.2f} GiB, +{plan.extra_time_s * 1e3:7.2f} ms, "
                    f"{plan.status} gap {gap}, "
                    f"{len(plan.recomputed_tag_targets)} tags"
                )
                rows.append([f"{kind}={budget / GiB:.2f} GiB", name, f"{solve_s:.2f}", f"{check_s:.2f}",
                             "ok" if not errors else f"{len(errors)} errors", f"{plan.saved_bytes / GiB:.2f}",
                             f"{plan.peak_bytes / GiB:.2f}", f"+{plan.extra_time_s * 1e3:.2f}", str(plan.status), gap,
                             str(len(plan.recomputed_tag_targets))])
    return [f"**{summary}**; {save_all_text}.", "", *markdown_table(SOLVE_HEADER, rows), ""]


def main() -> None:
    start_s = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 8, 32])
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--device", default="H100", help="GPU spec sheet for the cost model")
    parser.add_argument("--cache", type=Path, default=None, help="directory of pickled graphs")
    parser.add_argument("--solvers", nargs="+", default=["ilp", "mincut"], choices=sorted(SOLVERS))
    parser.add_argument("--traced-layers", type=int, default=4, help="trace this many layers and extend (0: all)")
    add_page_arguments(parser, RESULTS_DIR / "solvers_and_scale.md")
    args = parser.parse_args()
    section = []
    for n_layer in args.layers:
        section += run(n_layer, args.seq, args.cache, args.device, args.solvers, args.traced_layers)
    finish_page(args, "solve_times", "\n".join(section), start_s)


if __name__ == "__main__":
    main()
