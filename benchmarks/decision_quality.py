"""Decision quality: the extra step time each plan predicts vs the extra step time it costs, measured.

    .venv/bin/python benchmarks/decision_quality.py --rounds 25
    .venv/bin/python benchmarks/decision_quality.py --rounds 25 --executors nvfuser-standin

For tiny Llama-2 and Pythia (2 layers, width 256, seq 256, fp32, CPU, 1 thread) and for two sources
of op costs (the CPU formulas, and ``cost_table="auto"``: ops timed on this machine first), plans
are made at five activation budgets (save-all, 75%, 50%, 25%, the minimum). Every plan of one
model and cost source runs round-robin with the save-all plan (one step of each per round, so
machine noise hits all alike); the measured extra time of a plan is the median over rounds of
(its step time - the save-all step time of that round), with the standard error of the mean of
those differences beside it. Predicted extra time is the plan's `extra_time_s` minus the
save-all plan's. The machine's speed drifts (1.5x between two profiles of the same graph minutes
apart on the shared CPU), so a table timed before the rounds can be off by that factor; the last
two columns cancel it: each plan's extra time as a share of its save-all step, predicted (the
cost model's forward+backward total) and measured (the median save-all step of the same rounds).
With a fusion executor (``--executors``) the budgets are fractions of that
executor's own save-all and each plan is made through Thunder's fusion pass (a few dry runs per
compilation); ``auto`` then times the fusion regions whole and prices each recomputed op by its
share of its region (`remat_opt.costing.graph_costs`).

Writes the table to docs/results/cost_model.md (section ``decision_quality``, or
``decision_quality_<executors>`` for other executors; ``--page PATH`` elsewhere, ``--no-write`` to
print only).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time

from remat_opt import _compat  # noqa: F401  (applies the torch compatibility step before thunder)
import thunder  # noqa: E402
import torch  # noqa: E402

from remat_opt import InfeasibleBudgetError  # noqa: E402
from remat_opt.executors import EXECUTOR_CHOICES, executors_for  # noqa: E402
from remat_opt.validation.measure import measure_saved_bytes  # noqa: E402
from remat_opt.transform.cost_remat import CostRemat
from remat_opt.transform.explain import last_planned_step  # noqa: E402
from results_page import RESULTS_DIR, add_page_arguments, finish_page, markdown_table  # noqa: E402

FRACTIONS = (("save-all", 1.0), ("75%", 0.75), ("50%", 0.5), ("25%", 0.25), ("minimum", 0.0))


def _model(name: str, args):
    from litgpt import GPT, Config

    config = Config.from_name(
        name, n_layer=args.n_layer, n_embd=args.width, n_head=4, n_query_groups=4, head_size=args.width // 4,
        intermediate_size=4 * args.width, padded_vocab_size=256, vocab_size=256, block_size=args.seq,
    )
    torch.manual_seed(0)
    return GPT(config), (torch.randint(0, 256, (1, args.seq)),)


def _jit(model, activation_budget_bytes: int, cost_table, executors):
    transform = CostRemat(activation_budget_gb=activation_budget_bytes / 1e9, device_spec=None if cost_table else "cpu",
                          cost_table=cost_table)
    return thunder.jit(model, transforms=[transform], executors=executors)


def _plans(model, inputs, save_all: int, cost_table, executors) -> dict:
    """label -> (jitted, plan) at every budget; the minimum is found from the infeasibility error."""
    systems = {}
    for label, fraction in FRACTIONS:
        budget = int(fraction * save_all)
        jitted = _jit(model, budget, cost_table, executors)
        try:
            jitted(*inputs).float().sum().backward()
        except InfeasibleBudgetError as e:
            jitted = _jit(model, e.minimum, cost_table, executors)
            jitted(*inputs).float().sum().backward()
        systems[label] = (jitted, last_planned_step(jitted).plan)
    return systems


def _step_s(jitted, inputs) -> float:
    start = time.perf_counter()
    jitted(*inputs).float().sum().backward()
    return time.perf_counter() - start


def _measure(systems: dict, inputs, rounds: int) -> dict:
    times = {label: [] for label in systems}
    for _ in range(rounds):
        for label, (jitted, _) in systems.items():
            times[label].append(_step_s(jitted, inputs))
    return times


TABLE_HEADER = ["model", "costs", "budget", "saved B", "extra ms, predicted", "measured +- SE", "error ms",
                "extra % of save-all step, predicted", "measured +- SE"]


def section(args: argparse.Namespace, rows: list[list[str]], step_lines: list[str]) -> str:
    """Markdown: the setting, one row per plan, then each model's save-all step, predicted and measured."""
    setting = (f"n_layer {args.n_layer}, seq {args.seq}, width {args.width}, fp32, CPU, 1 thread, {args.rounds} "
               f"rounds, executors {args.executors}. Extra ms: the plan's extra step time over the save-all plan's; "
               "measured is the median per-round difference, +- the standard error of the mean difference.")
    return "\n".join([setting, "", *markdown_table(TABLE_HEADER, rows), "", *step_lines])


def main() -> None:
    start_s = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="Llama-2-7b-hf,pythia-160m")
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--executors", default="fused-sdpa", choices=EXECUTOR_CHOICES,
                        help="torch-compile or nvfuser-standin: plans through Thunder's fusion pass, and 'auto' "
                             "prices the recomputed ops by their share of the regions timed whole")
    parser.add_argument("--costs", default="formula,auto", help="cost sources to compare: formula, auto or both")
    add_page_arguments(parser, RESULTS_DIR / "cost_model.md")
    args = parser.parse_args()
    executors = executors_for(args.executors)
    torch.set_num_threads(1)
    os.environ.setdefault("REMAT_OPT_COST_CACHE", tempfile.mkdtemp(prefix="remat-opt-costs-"))
    print(f"n_layer={args.n_layer} seq={args.seq} width={args.width}, fp32, CPU, 1 thread, {args.rounds} rounds, "
          f"executors {args.executors}")
    print(f"{'model':<16}{'costs':<10}{'budget':<10}{'saved B':>11}{'predicted ms':>14}{'measured ms':>13}"
          f"{'+- SE':>8}{'error ms':>10}{'pred %':>8}{'meas %':>8}{'+- SE':>7}")
    rows, step_lines = [], []
    for name in args.models.split(","):
        model, inputs = _model(name, args)
        baseline = thunder.jit(model, executors=executors)
        save_all = measure_saved_bytes(baseline, *inputs).activation_bytes
        for costs in args.costs.split(","):
            table = {"formula": None, "auto": "auto"}[costs]
            systems = _plans(model, inputs, save_all, table, executors)
            times = _measure(systems, inputs, args.rounds)
            reference_s = systems["save-all"][1].extra_time_s
            predicted_step_s = last_planned_step(systems["save-all"][0]).costs.total_time_s()
            measured_step_s = statistics.median(times["save-all"])
            for label, (_, plan) in systems.items():
                diffs = [a - b for a, b in zip(times[label], times["save-all"])]
                measured_ms = 1e3 * statistics.median(diffs)
                se_ms = 1e3 * statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
                predicted_ms = 1e3 * (plan.extra_time_s - reference_s)
                print(f"{name:<16}{costs:<10}{label:<10}{plan.saved_bytes:>11,}{predicted_ms:>14.2f}"
                      f"{measured_ms:>13.2f}{se_ms:>8.2f}{predicted_ms - measured_ms:>10.2f}"
                      f"{predicted_ms / predicted_step_s / 10:>8.1f}{measured_ms / measured_step_s / 10:>8.1f}"
                      f"{se_ms / measured_step_s / 10:>7.1f}")
                rows.append([name, costs, label, f"{plan.saved_bytes:,}", f"{predicted_ms:.2f}",
                             f"{measured_ms:.2f} +- {se_ms:.2f}", f"{predicted_ms - measured_ms:.2f}",
                             f"{predicted_ms / predicted_step_s / 10:.1f}",
                             f"{measured_ms / measured_step_s / 10:.1f} +- {se_ms / measured_step_s / 10:.1f}"])
            print(f"{'':<36}save-all step: predicted {1e3 * predicted_step_s:.2f} ms (forward+backward of the "
                  f"graph), measured {1e3 * measured_step_s:.2f} ms (median)")
            step_lines.append(f"- {name}, {costs}: save-all step predicted {1e3 * predicted_step_s:.2f} ms "
                              f"(forward+backward of the graph), measured {1e3 * measured_step_s:.2f} ms (median).")
    key = "decision_quality" if args.executors == "fused-sdpa" else f"decision_quality_{args.executors}"
    finish_page(args, key, section(args, rows, step_lines), start_s)


if __name__ == "__main__":
    main()
