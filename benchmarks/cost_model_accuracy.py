"""How well the costs predict measured time: profile a tiny Llama on the CPU and compare.

For each sequence length and executor list: analyze a tiny one-layer Llama-2, profile every
distinct op and fusion region (`remat_opt.costing.profiling.profile_graph`; regions are timed whole through
the callables Thunder built for them), write the cost table and read it back, then print

* the Spearman rank correlation of roofline vs measured time per distinct op and region (the
  formulas' ranking), over all of them and over the forward ops alone (the recompute candidates);
* per distinct op and region, each table's times and the roofline's against the same ops timed
  inside the real training step (`remat_opt.validation.step_timing.OpClock`: a clock read around every op of
  the compiled traces): the Spearman rank correlation, and the summed in-step op times against
  the traces run directly (what the clock itself adds);
* for each timing method (`costmodels.timing.ProfileOptions.method`: ops timed in the step's order,
  or each alone in a loop), the forward+backward totals: the roofline sum and the measured table's sum (every op and region
  of the graph at its measured time) against two measurements of the same model, inputs and
  executors, in interleaved rounds: the compiled forward and backward traces run directly (the
  graph's ops in order, as Thunder runs them: what the sums predict) and a whole Thunder training
  step (loss = sum of the logits; adds the prologue's input checks, the cache lookup and
  torch.autograd's glue, which no op cost covers).

The machine's speed drifts (on a shared CPU, 1.5x within minutes), so a table profiled once and a
step measured later compare two speeds: the benchmark runs `--rounds` rounds of (profile, then
measure the step at once), takes every ratio within its round, and prints the median and range.

    .venv/bin/python benchmarks/cost_model_accuracy.py --seq 32 512 --threads 1 [--per-op]
    .venv/bin/python benchmarks/cost_model_accuracy.py --seq 512 --executors fused-sdpa torch-compile nvfuser-standin

Use one thread on a shared machine: with two, a busy neighbour core stalls every parallel kernel
at the OpenMP barrier (16 ms matmuls of 0.01 ms were seen) and the times measure the neighbour.

Writes the medians to docs/results/cost_model.md (section ``accuracy``; ``--page PATH`` elsewhere,
``--no-write`` to print only).
"""

from __future__ import annotations

from remat_opt import _compat  # noqa: F401  (applies the torch compatibility step before thunder)

import argparse
import math
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import thunder
import torch

from remat_opt.executors import EXECUTOR_CHOICES, executors_for
from remat_opt.tracing.capture import analyze
from remat_opt.models.by_name import ModelSpec, build_model

from costmodels.timing import TIMING_METHODS, ProfileOptions
from remat_opt.costing.profiling import profile_graph
from remat_opt.validation.cost_report import compare, format_comparison, rank_agreement, spearman
from remat_opt.validation.step_timing import OpClock, time_ops_in_step
from remat_opt.costing.graph_costs import CostModel, op_args
from costmodels.formulas import is_fusion_symbol
from costmodels.table import load_table, op_key, save_table
from results_page import RESULTS_DIR, add_page_arguments, finish_page, markdown_table


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


class StepRunner:
    """One compiled Thunder step of `model`, measured on demand: interleaved rounds of one whole step
    (loss = sum of the logits) and one direct run of the forward and backward traces (cotangents of
    ones, as the sum's backward gives)."""

    def __init__(self, model, inputs, executors):
        self.inputs = inputs
        self.jitted = thunder.jit(model, executors=executors)
        self.jitted(*inputs).sum().backward()
        self.entry, self.args = _computation_inputs(self.jitted, inputs)

    def step(self) -> float:
        start = time.perf_counter()
        self.jitted(*self.inputs).sum().backward()
        return time.perf_counter() - start

    def traces(self) -> tuple[float, float]:
        start = time.perf_counter()
        data, (saved_tensors, saved_other) = self.entry.computation_fn(*self.args)
        forward_s = time.perf_counter() - start
        cotangents = [torch.ones_like(t) for t in data["flat_output"]]
        start = time.perf_counter()
        self.entry.backward_fn([list(saved_tensors), list(saved_other)], cotangents)
        return forward_s, time.perf_counter() - start

    def measure(self, repeats: int) -> MeasuredStep:
        for _ in range(3):
            self.step(), self.traces()
        steps, runs = [], []
        for _ in range(repeats):
            steps.append(self.step())
            runs.append(self.traces())
        return MeasuredStep(step_s=statistics.median(steps), forward_s=statistics.median(f for f, _ in runs),
                            backward_s=statistics.median(b for _, b in runs))


class ClockedStep:
    """The same model compiled with an `OpClock`: every op's time inside a real training step."""

    def __init__(self, model, inputs, executors, graph):
        self.inputs, self.graph = inputs, graph
        self.clock = OpClock()
        self.jitted = thunder.jit(model, executors=executors, transforms=[self.clock])

    def step(self) -> None:
        self.jitted(*self.inputs).sum().backward()

    def op_times(self, steps: int) -> dict[str, float]:
        """op key -> median seconds in the step (`time_ops_in_step`)."""
        return time_ops_in_step(self.step, self.graph, self.clock, steps=steps)


def _forward_keys(graph) -> set[str]:
    return {op_key(op_args(graph, op)) for op in graph.forward_ops}


def _summed(graph, times: dict[str, float]) -> float:
    """Every op of the graph at its key's time (repeats counted)."""
    return sum(times[op_key(op_args(graph, op))] for op in graph.ops)


def forward_spearman(graph, comparison) -> float:
    """Spearman of roofline vs measured over the distinct forward ops and regions (the candidates)."""
    forward_keys = _forward_keys(graph)
    rows = [r for r in comparison.rows if r[0] in forward_keys]
    return spearman([r[2] for r in rows], [r[3] for r in rows]) if len(rows) > 1 else float("nan")


def _profile(graph, spec, method: str, args: argparse.Namespace, out_dir: Path, name: str):
    start = time.perf_counter()
    options = ProfileOptions(method=method, repeats=args.repeats)
    table = profile_graph(graph, options=options, progress=False, model=repr(spec))
    profile_s = time.perf_counter() - start
    path = save_table(table, out_dir / f"{name}-{method}.json")
    return load_table(path, device="cpu"), profile_s, path


@dataclass(frozen=True)
class RoundFigures:
    """One round: a table profiled, then the step measured right after it."""

    spearman: float
    forward_spearman: float
    table_vs_traces: float
    forward: float
    backward: float
    table_vs_step: float
    roofline_vs_traces: float
    table_vs_in_step: float  # Spearman, table vs the ops timed inside the step
    forward_table_vs_in_step: float
    roofline_vs_in_step: float
    in_step_vs_traces: float  # summed in-step op times / traces run directly


def _round_figures(graph, table, measured: MeasuredStep, in_step: dict[str, float]) -> RoundFigures:
    comparison = compare(graph, table)
    traces_s = measured.forward_s + measured.backward_s
    predicted = CostModel(graph, table=table)
    table_s = {r[0]: r[3] for r in comparison.rows}
    roofline_s = {r[0]: r[2] for r in comparison.rows}
    return RoundFigures(
        table_vs_in_step=rank_agreement(table_s, in_step),
        forward_table_vs_in_step=rank_agreement(table_s, in_step, _forward_keys(graph)),
        roofline_vs_in_step=rank_agreement(roofline_s, in_step),
        in_step_vs_traces=_summed(graph, in_step) / traces_s,
        spearman=comparison.spearman,
        forward_spearman=forward_spearman(graph, comparison),
        table_vs_traces=comparison.measured_total_s / traces_s,
        forward=predicted.total_time_s(backward=False) / measured.forward_s,
        backward=predicted.total_time_s(backward=True) / measured.backward_s,
        table_vs_step=comparison.measured_total_s / measured.step_s,
        roofline_vs_traces=comparison.predicted_total_s / traces_s,
    )


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def _worst_in_step(table_s: dict[str, float], in_step: dict[str, float], count: int = 15) -> str:
    """The ops whose table time is furthest from their in-step time (by ratio), worst first."""
    keys = sorted((k for k in table_s if k in in_step), key=lambda k: -abs(math.log(table_s[k] / in_step[k])))
    lines = [f"{'table_us':>9} {'in_step_us':>10} {'ratio':>6}  op (furthest from its in-step time first)"]
    lines += [f"{1e6 * table_s[k]:9.1f} {1e6 * in_step[k]:10.1f} {table_s[k] / in_step[k]:6.2f}  {k[:120]}" for k in keys[:count]]
    return "\n".join(lines)


def _report(graph, table, rounds: list[RoundFigures], method: str, profile_s: float, path: Path, per_op: bool,
            in_step: dict[str, float]) -> None:
    regions = [op for op in graph.ops if is_fusion_symbol(op.symbol)]
    region_keys = {op_key(op_args(graph, op)) for op in regions}
    print(f"\n--- ops timed {method}: {len(table.entries)} distinct ops and regions of {len(graph.ops)} ops in "
          f"{profile_s:.1f} s ({len(region_keys & set(table.entries))} of {len(region_keys)} distinct fusion regions "
          f"timed whole, {len(regions)} regions in the graph); last table {path} reloaded")
    for key, reason in table.skipped:
        print(f"  skipped {key[:100]}: {reason}")
    if per_op:
        comparison = compare(graph, table)
        print(format_comparison(comparison))
        print(_worst_in_step({r[0]: r[3] for r in comparison.rows}, in_step))
    print(f"median (min-max) over {len(rounds)} rounds of a profile and the step measured right after it:")
    print(f"  Spearman rank correlation, roofline vs measured per distinct op and region: "
          f"{_spread([r.spearman for r in rounds])}; forward ops and regions only: "
          f"{_spread([r.forward_spearman for r in rounds])}")
    print(f"  measured table summed / traces run directly: {_spread([r.table_vs_traces for r in rounds])} "
          f"(forward {_spread([r.forward for r in rounds])}, backward {_spread([r.backward for r in rounds])}); "
          f"/ whole step: {_spread([r.table_vs_step for r in rounds])}")
    print(f"  roofline summed / traces run directly: {_spread([r.roofline_vs_traces for r in rounds])}")
    print(f"  per distinct op and region against the same ops timed inside the training step: Spearman of the "
          f"table {_spread([r.table_vs_in_step for r in rounds])} (forward ops and regions "
          f"{_spread([r.forward_table_vs_in_step for r in rounds])}), of the roofline "
          f"{_spread([r.roofline_vs_in_step for r in rounds])}; in-step op times summed / traces run directly "
          f"{_spread([r.in_step_vs_traces for r in rounds])}")


PAGE_HEADER = ["seq", "executors", "timing method", "rounds", "Spearman, roofline vs measured (forward)",
               "table / traces (fwd, bwd)", "table / step", "roofline / traces",
               "Spearman, table vs in-step (forward)", "roofline vs in-step", "in-step / traces",
               "traces ms", "step ms"]


@dataclass(frozen=True)
class ConfigResult:
    """One configuration's page rows (one per timing method) and what fell below ``--min-spearman``."""

    rows: list[list[str]]
    below: list[str]


def _page_row(seq: int, executors_name: str, method: str, rounds: list[RoundFigures], traces_ms: list[float],
              steps_ms: list[float]) -> list[str]:
    """Medians (min-max) over the rounds, as `_report` prints them."""
    def spread(attr: str) -> str:
        return _spread([getattr(r, attr) for r in rounds])

    return [str(seq), executors_name, method, str(len(rounds)), f"{spread('spearman')} ({spread('forward_spearman')})",
            f"{spread('table_vs_traces')} ({spread('forward')}, {spread('backward')})", spread("table_vs_step"),
            spread("roofline_vs_traces"), f"{spread('table_vs_in_step')} ({spread('forward_table_vs_in_step')})",
            spread("roofline_vs_in_step"), spread("in_step_vs_traces"),
            f"{statistics.median(traces_ms):.3f}", f"{statistics.median(steps_ms):.3f}"]


def page_section(args: argparse.Namespace, results: list[ConfigResult]) -> str:
    setting = (f"Tiny Llama-2 ({args.n_layer} layer, float32, CPU), {args.threads} thread(s); {args.rounds} rounds of "
               f"(profile with {args.repeats} repeats, then {args.step_repeats} timed steps); median (min-max) over "
               "the rounds. Ratios are summed times / measured times; traces ms and step ms are medians of the "
               "forward+backward traces run directly and of the whole Thunder step.")
    rows = [row for result in results for row in result.rows]
    below = [line for result in results for line in result.below]
    verdict = ([f"BELOW --min-spearman {args.min_spearman}: {line}." for line in below] if below else
               [f"Every median Spearman (roofline vs measured) is at or above --min-spearman {args.min_spearman}."])
    return "\n".join([setting, "", *markdown_table(PAGE_HEADER, rows), "", *verdict])


def run(seq: int, executors_name: str, args: argparse.Namespace, out_dir: Path) -> ConfigResult:
    """Profiles and measures one configuration, prints its report, and returns its page rows and what
    fell below ``--min-spearman`` (empty: every median at or above it)."""
    spec = ModelSpec("Llama-2-7b-hf", n_layer=args.n_layer, seq=seq, device="cpu", tiny=True)
    model, inputs = build_model(spec)
    executors = executors_for(executors_name)
    graph = analyze(model, *inputs, executors=executors)
    runner = StepRunner(model, inputs, executors)
    clocked = ClockedStep(model, inputs, executors, graph)
    figures = {m: [] for m in args.methods}
    measured_steps, last_tables = [], {}
    # the machine's speed drifts (1.5x within minutes on a shared CPU): each round profiles, then
    # measures the step at once, and every ratio is taken within its round
    for _ in range(args.rounds):
        for method in args.methods:
            table, profile_s, path = _profile(graph, spec, method, args, out_dir, f"tiny-llama-seq{seq}-{executors_name}")
            measured = runner.measure(args.step_repeats)
            in_step = clocked.op_times(args.step_repeats)
            measured_steps.append(measured)
            figures[method].append(_round_figures(graph, table, measured, in_step))
            last_tables[method] = (table, profile_s, path, in_step)
    print(f"\n=== tiny Llama-2 ({args.n_layer} layer, seq {seq}, float32), executors {executors_name}, "
          f"{torch.get_num_threads()} thread(s) ===")
    traces_ms = [1e3 * (m.forward_s + m.backward_s) for m in measured_steps]
    print(f"measured, medians of {args.step_repeats} interleaved runs after each profile: forward+backward traces "
          f"run directly {statistics.median(traces_ms):.3f} ms ({min(traces_ms):.3f}-{max(traces_ms):.3f} over "
          f"{len(traces_ms)} measurements); whole Thunder step "
          f"{1e3 * statistics.median(m.step_s for m in measured_steps):.3f} ms")
    for method in args.methods:
        table, profile_s, path, in_step = last_tables[method]
        _report(graph, table, figures[method], method, profile_s, path, args.per_op, in_step)
    below = [f"seq {seq}, {executors_name}, {method}: median Spearman (roofline vs measured) {median:.3f}"
             for method in args.methods
             if (median := statistics.median(r.spearman for r in figures[method])) < args.min_spearman]
    steps_ms = [1e3 * m.step_s for m in measured_steps]
    rows = [_page_row(seq, executors_name, method, figures[method], traces_ms, steps_ms) for method in args.methods]
    return ConfigResult(rows=rows, below=below)


def main() -> int:
    start_s = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", type=int, nargs="+", default=[32, 512], help="sequence lengths to profile")
    parser.add_argument("--executors", nargs="+", default=["fused-sdpa"], choices=EXECUTOR_CHOICES,
                        help="executor lists to compare (torch-compile and nvfuser-standin form fusion regions)")
    parser.add_argument("--n-layer", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 on a shared machine)")
    parser.add_argument("--methods", nargs="+", default=list(TIMING_METHODS), choices=TIMING_METHODS,
                        help="how ops are timed (costmodels.timing.ProfileOptions.method), each reported")
    parser.add_argument("--repeats", type=int, default=10, help="timed passes (in-order) or calls per op (loop)")
    parser.add_argument("--step-repeats", type=int, default=10, help="timed training steps after each profile")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of (profile, then measure the step); ratios are taken within a round")
    parser.add_argument("--per-op", action="store_true", help="print one line per distinct op")
    parser.add_argument("--out", type=Path, default=None, help="folder for the tables (default: a temp folder)")
    parser.add_argument("--min-spearman", type=float, default=0.5,
                        help="exit 1 when a configuration's median Spearman of roofline vs measured falls below this "
                             "(a roofline that has lost the ranking; 0.85-0.94 typical, a random ranking 0 +- 0.11)")
    add_page_arguments(parser, RESULTS_DIR / "cost_model.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="cost_tables_"))
    results = [run(seq, executors_name, args, out_dir) for seq in args.seq for executors_name in args.executors]
    finish_page(args, "accuracy", page_section(args, results), start_s)
    below = [line for result in results for line in result.below]
    for line in below:
        print(f"BELOW --min-spearman {args.min_spearman}: {line}")
    return 1 if below else 0


if __name__ == "__main__":
    raise SystemExit(main())
