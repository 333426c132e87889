"""The `remat-opt` command line.

    remat-opt inspect Llama-2-7b-hf --n-layer 2 --seq 4096 --dtype bfloat16 --device meta
    remat-opt inspect remat_opt.models.examples:block --device cpu --json

Bad input (unknown config, a model whose forward fails, inputs on mixed devices) ends with one
line `remat-opt: error: ...` and exit status 2, not a traceback.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from costmodels.devices import DEVICE_SPEC_CHOICES, device_spec_name
from costmodels.timing import TIMING_METHODS, ProfileOptions
from remat_opt.core.errors import InfeasibleBudgetError
from remat_opt.executors import EXECUTOR_CHOICES, default_executors, executors_for
from remat_opt.models.by_name import DTYPES, FACTORY_OPTIONS, ModelSpec, ModelSpecError


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, ``remat-opt: error: ...``, exit status 2."""

    def error(self, message: str):
        command = self.prog.removeprefix("remat-opt").strip()  # the subcommand, if any
        self.exit(2, f"remat-opt: error: {command + ': ' if command else ''}{message}\n")


class _HelpFormatter(argparse.HelpFormatter):
    """Help that states each option's default where it has a value (None and False: not shown, the
    help says what happens without the option)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        default = action.default
        if "%(default)" in help_text or default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return help_text
        return f"{help_text} (default: %(default)s)"


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def _finite_float(*, positive: bool):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (value > 0 if positive else value >= 0) or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be finite and {'positive' if positive else 'not negative'}, "
                                             f"got {text}")
        return value

    parse.__name__ = "number"
    return parse


def _device(text: str) -> str:
    """``meta``, ``cpu``, ``cuda`` or ``cuda:N``."""
    name = text.strip().lower()
    if name in ("meta", "cpu", "cuda") or (name.startswith("cuda:") and name[5:].isdigit()):
        return name
    raise argparse.ArgumentTypeError(f"unknown device {text!r}; use meta, cpu, cuda or cuda:N")


_positive_int, _count = _int_at_least(1), _int_at_least(0)


def check_writable_dir(path: Path, flag: str, shown: Path | None = None) -> None:
    """Creates `path` if needed and checks a file can be written there, before any work starts
    (`shown`: the path the error names, when it is a file in `path`)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".remat-opt-write-check"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"{flag} {str(shown or path)!r} is not writable: {e.strerror or e}") from None


def check_writable_file(path: Path, flag: str) -> None:
    """Checks `path` can be written (its folder created if needed), before any work starts."""
    if path.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a folder; give a file path such as {path / 'table.json'}")
    check_writable_dir(path.parent, flag, shown=path)
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{flag} {str(path)!r} is not writable")

def add_model_arguments(
    parser: argparse.ArgumentParser,
    device_default: str = "meta",
    device_help: str = "meta (no memory, the default), cpu or cuda",
) -> None:
    """The model options shared by every subcommand that builds a model."""
    parser.add_argument("model", help="litgpt config name (e.g. Llama-2-7b-hf) or package.module:factory")
    parser.add_argument("--n-layer", type=_positive_int, default=None, help="override the number of layers")
    parser.add_argument("--seq", type=_positive_int, default=None, help="sequence length (default 128; 32 with --tiny)")
    parser.add_argument("--batch", type=_positive_int, default=None, help="micro-batch size (default 1)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="default: bfloat16 on meta and cuda (what GPU training runs), float32 on cpu")
    parser.add_argument("--device", type=_device, default=None, help=device_help)
    parser.set_defaults(default_device=device_default)
    parser.add_argument("--tiny", action="store_true", help="shrink the config to a tiny model of its family")
    parser.add_argument(
        "--executors",
        choices=EXECUTOR_CHOICES,
        default=None,
        help="nvfuser-standin (default on meta: nvFuser's fusion regions and Thunder's rematerialization, as a GPU "
        "step runs, without nvFuser), fused-sdpa (default on cpu/cuda: Thunder's executors with a fused SDPA), "
        "default (Thunder's, SDPA decomposed on CPU), torch-compile (TorchCompile fusion regions on CPU)",
    )
    parser.add_argument(
        "--traced-layers",
        type=int,
        default=None,
        help="trace this many layers of a litgpt config and extend the graph to its full depth "
        "(default on meta: 4; 0: trace every layer)",
    )


def add_parallel_arguments(parser: argparse.ArgumentParser) -> None:
    """``--world-size``/``--strategy``: plan one rank of Thunder's FSDP or DDP, without processes."""
    parser.add_argument("--world-size", type=_positive_int, default=None,
                        help="plan one rank of this many under --strategy (traced with a fake process group)")
    parser.add_argument("--strategy", default=None, type=_strategy,
                        help="fsdp (Thunder's FSDPTransform: sharded weights, re-gathers priced by the spec's "
                             "interconnect) or ddp (DDPTransform)")
    parser.add_argument("--collectives-in-flight", type=_count, default=None, metavar="K",
                        help="with --strategy fsdp: at most K all-gathers (forward) and reduce-scatters (backward) "
                             "in flight beside the one in use, as CostRemat(collectives_in_flight=K) runs them "
                             "(default: Thunder's order, every all-gather at the forward's start and every "
                             "reduce-scatter waited for at the backward's end: every unsharded weight or gradient "
                             "alive at once)")


def _strategy(text: str) -> str:
    from remat_opt.distributed.data_parallel import STRATEGIES

    if text not in STRATEGIES:
        raise argparse.ArgumentTypeError(f"unknown strategy {text!r}; use one of: {', '.join(STRATEGIES)}")
    return text


def _fit_strategies(text: str) -> list[str]:
    from remat_opt.analysis.fit import STRATEGIES

    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown strategy {(unknown or [text])[0]!r}; use any of: {', '.join(STRATEGIES)}")
    return names


def model_spec(args: argparse.Namespace) -> ModelSpec:
    return ModelSpec(
        name=args.model,
        n_layer=args.n_layer,
        seq=args.seq,
        batch=args.batch or 1,
        dtype=args.dtype,
        device=args.device or args.default_device,
        tiny=args.tiny,
    )


def given_options(args: argparse.Namespace) -> frozenset[str]:
    """The model options the user set explicitly (a factory must take each of them)."""
    given = {k for k in FACTORY_OPTIONS if getattr(args, k, None) is not None}
    return frozenset(given | ({"tiny"} if args.tiny else set()))


def check_model_args(args: argparse.Namespace) -> None:
    """Checks the model options (the name exists, sizes and dtype are valid) before anything else,
    so that a wrong model name is the first error a user sees."""
    from remat_opt.models.by_name import check_spec, litgpt_config, load_factory

    spec = model_spec(args)
    check_spec(spec)
    if ":" in spec.name:
        load_factory(spec.name)
    else:
        litgpt_config(spec)


def analyze_from_args(args: argparse.Namespace):
    """Builds the model named by `args` and returns ``(spec, graph, seconds)``.

    A litgpt config is traced by `remat_opt.models.graphs.analyze_spec`: deep configs on meta with a
    few layers, extended; with ``REMAT_OPT_GRAPH_CACHE`` set, traced graphs are kept there. A
    ``module:factory`` model is traced as the factory builds it.
    """
    from remat_opt.tracing.capture import analyze
    from remat_opt.models.graphs import analyze_spec
    from remat_opt.models.by_name import build_model, check_same_device, check_spec, litgpt_config

    spec = model_spec(args)
    check_spec(spec)
    traced_layers = _traced_layers(args, spec)
    executors = args.executors or default_executors(spec.device)
    start_s = time.perf_counter()
    if ":" in spec.name:
        if _parallel(args) is not None:
            raise ValueError("--world-size/--strategy need a litgpt config name, not a module:factory")
        model, inputs = build_model(spec, given_options(args))
        check_same_device(model, inputs)
        graph = analyze(model, *inputs, executors=executors_for(executors))
        return spec, graph, time.perf_counter() - start_s
    config, seq = litgpt_config(spec)
    spec = replace(spec, seq=spec.seq or seq, n_layer=config.n_layer)
    graph = analyze_spec(spec, traced_layers=traced_layers, executors=executors, parallel=_parallel(args))
    return spec, graph, time.perf_counter() - start_s


def _parallel(args: argparse.Namespace):
    """The `DataParallel` of ``--world-size``/``--strategy`` (None without them)."""
    from remat_opt.distributed.data_parallel import data_parallel_of

    return data_parallel_of(getattr(args, "strategy", None), getattr(args, "world_size", None),
                            getattr(args, "collectives_in_flight", None),
                            spell=lambda name: "--" + name.replace("_", "-"))


def _traced_layers(args: argparse.Namespace, spec: ModelSpec) -> int:
    """How many layers to trace before extending (0: trace the model as built)."""
    if ":" in spec.name:
        if args.traced_layers:
            raise ValueError("--traced-layers needs a litgpt config name, not a module:factory")
        return 0
    if args.traced_layers is not None:
        return args.traced_layers
    from remat_opt.models.graphs import DEFAULT_TRACED_LAYERS

    return DEFAULT_TRACED_LAYERS if spec.device == "meta" else 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from remat_opt.core.report import inspect_report, render_inspect

    from remat_opt.models.by_name import describe_model

    spec, graph, analysis_s = analyze_from_args(args)
    model = describe_model(spec, given_options(args))
    report = inspect_report(graph, model=model, analysis_s=analysis_s, top=args.top)
    print(json.dumps(report, indent=2) if args.json else render_inspect(report))
    return 0


def resolve_device_spec(name: str | None) -> str | None:
    """The spec name for a `--device-spec` value (`costmodels.devices.device_spec_name`); None stays None.

    Raises:
        ValueError: no spec matches `name`.
    """
    return None if name is None else device_spec_name(name)


def parse_budgets_gb(text: str, flag: str = "--budget-gb") -> list[float]:
    """``"40,50,60"`` -> ``[40.0, 50.0, 60.0]``; empty, non-numeric or negative entries raise ValueError."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise ValueError(f"{flag} needs a comma-separated list of budgets in GB, e.g. 40,50,60; got {text!r}")
    budgets = []
    for p in parts:
        try:
            value = float(p)
        except ValueError:
            raise ValueError(f"{flag}: {p!r} is not a number") from None
        if not value >= 0 or value == float("inf"):
            raise ValueError(f"{flag}: budgets must be finite and not negative, got {p}")
        budgets.append(value)
    return sorted(set(budgets))


def add_cost_arguments(parser: argparse.ArgumentParser) -> None:
    """`--device-spec` and `--cost-table`: what `pareto` and `plan` cost ops with."""
    parser.add_argument(
        "--device-spec",
        default=None,
        help=f"device to cost for: {', '.join(DEVICE_SPEC_CHOICES)} (or a full spec name such as H100-SXM); "
        "default: the cost table's device, else the graph's (meta graphs need one)",
    )
    parser.add_argument("--cost-table", default=None,
                        help="measured cost table (JSON from `remat-opt profile`), or auto: time this model's forward "
                             "ops on its --device now, cached on disk (REMAT_OPT_COST_CACHE)")
    parser.add_argument("--allow-other-device", action="store_true",
                        help="use a --cost-table measured on another device or library versions (with a warning)")
    parser.add_argument("--time-limit-s", type=_finite_float(positive=True), default=10.0,
                        help="solver time limit per budget (wall seconds; the least peak an infeasible budget's error "
                             "names is searched for this long in CP-SAT's deterministic time, the same on every machine)")


def _cost_request_kwargs(args: argparse.Namespace) -> dict:
    device = args.device or args.default_device
    if args.device_spec is None and args.cost_table is None and device.partition(":")[0] in ("meta", "cuda"):
        raise ValueError(f"--device {device} graphs need --device-spec ({', '.join(DEVICE_SPEC_CHOICES)}) "
                         "or --cost-table")
    table = args.cost_table
    if table is not None and args.allow_other_device:
        from costmodels.table import load_table

        table = load_table(table, allow_mismatch=True)
    elif args.allow_other_device:
        raise ValueError("--allow-other-device applies to a --cost-table; none was given")
    return {"device_spec": resolve_device_spec(args.device_spec), "cost_table": table,
            "time_limit_s": args.time_limit_s}


_BUDGET_FLAGS = {"peak_budget_bytes": "--budget-gb", "activation_budget_bytes": "--activation-budget-gb"}


def _title(spec, request, graph, given: frozenset[str]) -> str:
    """The model as built (a factory: only what it was called with) and the device costed for."""
    from remat_opt.costing.graph_costs import resolve_device_spec as resolve_costed_spec
    from remat_opt.models.by_name import describe_model
    from remat_opt.core.report import format_model

    device = resolve_costed_spec(request.device_spec, request.table, graph)
    parallel = _parallel_of_graph(graph)
    return f"{format_model(describe_model(spec, given))}{parallel}, costed for {device.name}"


def _parallel_of_graph(graph) -> str:
    """``", per rank of N"`` for a graph with collectives (their process group's size), else ``""``."""
    from costmodels.formulas import WORLD_SIZE_ATTR

    sizes = {dict(op.attrs).get(WORLD_SIZE_ATTR) for op in graph.ops if "collective" in op.op_tags}
    sizes.discard(None)
    return f", per rank of {max(sizes)}" if sizes else ""


def _sweep_budgets(args: argparse.Namespace) -> tuple[str, list[float] | None]:
    """``(budget kind, explicit budgets in GB or None)`` of ``remat-opt pareto``'s flags."""
    kind, flag, text = (("peak", "--budget-gb", args.budget_gb) if args.budget_gb is not None else
                        ("activation", "--activation-budget-gb", args.activation_budget_gb))
    if text is None:
        return args.sweep or "activation", None
    if args.sweep not in (None, kind):
        raise ValueError(f"{flag} gives {kind} budgets; --sweep {args.sweep} contradicts it (drop one)")
    return kind, parse_budgets_gb(text, flag)


def cmd_pareto(args: argparse.Namespace) -> int:
    from remat_opt.costing.cost_cache import with_auto_costs
    from remat_opt.analysis.curves import plot_curve, render_points, write_csv
    from remat_opt.planning.planner import PlanRequest, sweep

    check_model_args(args)
    budget_kind, budgets_gb = _sweep_budgets(args)
    request = PlanRequest.create(solver=args.solver, **_cost_request_kwargs(args))
    out = Path(args.out)
    check_writable_dir(out, "--out")
    spec, graph, _ = analyze_from_args(args)
    request, costs_note = with_auto_costs(request, graph)
    if costs_note:
        print(costs_note, file=sys.stderr)
    if budgets_gb is None:
        points = sweep(graph, request, budget_kind=budget_kind, n_points=args.points)
    else:
        try:
            points = sweep(graph, request, budget_kind=budget_kind, budgets_bytes=[round(gb * 1e9) for gb in budgets_gb])
        except InfeasibleBudgetError as e:
            raise e.to_gb(_BUDGET_FLAGS[e.kind], _lower_floor_hint(args, e)) from e
    title = _title(spec, request, graph, given_options(args))
    csv_path = write_csv(points, out / "pareto.csv")
    png_path, svg_path = plot_curve(points, out / "pareto.png", out / "pareto.svg", title)
    print(title + f"; {budget_kind} budget sweep ({_BUDGET_FLAGS[budget_kind + '_budget_bytes']})")
    print(render_points(points))
    print(f"\nwrote {csv_path}, {png_path}, {svg_path}")
    return 0


def _lower_floor_hint(args: argparse.Namespace, error: InfeasibleBudgetError) -> str:
    """Under FSDP in Thunder's order, a step-peak minimum is set by every unsharded weight alive at
    once: say which option lowers it."""
    if (getattr(args, "strategy", None) == "fsdp" and getattr(args, "collectives_in_flight", None) is None
            and error.kind == "peak_budget_bytes"):
        return ("Thunder's order of FSDP collectives (every all-gather issued at the forward's start) sets that "
                "floor: --collectives-in-flight 1 lowers it")
    return ""


def cmd_plan(args: argparse.Namespace) -> int:
    from remat_opt.costing.cost_cache import with_auto_costs
    from remat_opt.planning.explanation import explain_step
    from remat_opt.planning.planner import PlanRequest, plan_step

    check_model_args(args)
    request = PlanRequest.from_gb(budget_gb=args.budget_gb, activation_budget_gb=args.activation_budget_gb,
                                  solver=args.solver, **_cost_request_kwargs(args))
    if args.timeline is not None:
        check_writable_file(Path(args.timeline), "--timeline")
    spec, graph, _ = analyze_from_args(args)
    request, costs_note = with_auto_costs(request, graph)
    if costs_note:
        print(costs_note, file=sys.stderr)
    try:
        step = plan_step(graph, request)
    except InfeasibleBudgetError as e:
        raise e.to_gb(_BUDGET_FLAGS[e.kind], _lower_floor_hint(args, e)) from e
    explanation = explain_step(step)
    if args.json:
        print(json.dumps(explanation.to_dict(), indent=2, default=str))
    else:
        print(_title(spec, request, graph, given_options(args)) + f"; {request.describe()}")
        print(explanation.summary_table() if args.summary else explanation)
    if args.timeline is not None:
        from remat_opt.analysis.curves import plot_timeline
        from remat_opt.core.simulation import simulate_step

        timelines = {"save-all": simulate_step(graph), f"plan ({request.describe()})": simulate_step(graph, step.plan)}
        path = plot_timeline(timelines, args.timeline, _title(spec, request, graph, given_options(args)))
        print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)
    return 0


# ---- `remat-opt profile` ------------------------------------------------------------------


def add_profile_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``remat-opt profile``: the model options (with ``--device cpu`` by default) and
    the profiling options."""
    add_model_arguments(parser, device_default="cpu", device_help="cpu (the default) or cuda: where ops are timed")
    parser.add_argument("--output", "-o", default=None, help="cost table path (default: cost_tables/<device>.json)")
    parser.add_argument("--report", action="store_true", help="print predicted vs measured per op and Spearman")
    parser.add_argument("--method", choices=TIMING_METHODS, default=ProfileOptions().method,
                        help="in-order: replay the step's ops in order and time every call as it runs (what a "
                             "step costs); loop: time each distinct op alone, repeated (warm caches, reused memory)")
    parser.add_argument("--warmup", type=_count, default=3, help="untimed passes (in-order) or calls per op (loop)")
    parser.add_argument("--repeats", type=_positive_int, default=10,
                        help="timed passes (in-order) or calls per op, at least (loop)")
    parser.add_argument("--threads", type=_positive_int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def default_table_path(device_name: str) -> Path:
    """``cost_tables/cpu.json`` for this machine's CPU (one table per machine: its identity is in
    the table), ``cost_tables/<GPU name as a file name>.json`` for a GPU, under the current folder."""
    if device_name.startswith("cpu"):
        return Path("cost_tables") / "cpu.json"
    slug = "".join(c if c.isalnum() else "-" for c in device_name).strip("-").lower()
    while "--" in slug:
        slug = slug.replace("--", "-")
    return Path("cost_tables") / f"{slug[:80]}.json"


def cmd_profile(args: argparse.Namespace) -> int:
    """Runs ``remat-opt profile``: builds and analyzes the model, times its ops, writes the table.

    Returns:
        The exit status: 0, or 2 for a device that cannot time ops.
    """
    import torch

    from costmodels.table import load_table, save_table
    from remat_opt.validation.cost_report import compare, format_comparison
    from remat_opt.costing.profiling import REGION_NOTE, profile_graph

    device = args.device or args.default_device
    if not (device == "cpu" or device.startswith("cuda")):
        print(f"remat-opt: error: --device {device} cannot time ops; use cpu or cuda", file=sys.stderr)
        return 2
    if args.output is not None:
        check_writable_file(Path(args.output), "--output")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    spec, graph, _ = analyze_from_args(args)
    options = ProfileOptions(method=args.method, warmup=args.warmup, repeats=args.repeats)
    table = profile_graph(graph, device=device, options=options, progress=not args.no_progress, model=repr(spec))
    path = save_table(table, args.output or default_table_path(table.device))
    table = load_table(path, device=device)  # what planners will read: check it round-trips
    regions = sum(e.note == REGION_NOTE for e in table.entries.values())
    print(f"wrote {path}: {len(table.entries)} ops timed ({regions} fusion regions timed whole), "
          f"{len(table.skipped)} skipped, on {table.device}")
    for key, reason in table.skipped:
        print(f"  skipped {key[:100]}: {reason}")
    if args.report:
        print(format_comparison(compare(graph, table)))
    return 0


def add_solver_argument(parser: argparse.ArgumentParser) -> None:
    from remat_opt.planning.planner import SOLVER_CHOICES

    parser.add_argument("--solver", choices=SOLVER_CHOICES, default="auto",
                        help="ilp: the CP-SAT ILP over the whole graph (least recompute time under the budget, "
                             "within --time-limit-s); layered: per-layer menus chained by a dynamic program, with a "
                             "certified gap (graphs of repeated layers); auto: layered from 8 repeated layers up, "
                             "else ilp; mincut: networkx min-cut; save_all, recompute_all: the "
                             "baselines; per_block: activation checkpointing of every repeated layer")


# ---- `remat-opt fit` ----------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers (e.g. 1,2,4)") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers, comma-separated (e.g. 1,2,4)")
    return values


def _in_flight_list(text: str) -> list[int | None]:
    values: list[int | None] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part.lower() == "thunder":
            values.append(None)
        elif part.isdigit():
            values.append(int(part))
        else:
            raise argparse.ArgumentTypeError(f"{part!r} is neither a count of collectives nor 'thunder' "
                                             "(Thunder's order); e.g. 1,2,thunder")
    if not values:
        raise argparse.ArgumentTypeError("give at least one value, e.g. 1,2,thunder")
    return values


def _fit_progress(i: int, n: int, config, row) -> None:
    from remat_opt.analysis.fit import gb

    if row is None:
        print(f"[{i + 1}/{n}] {config.describe()} ...", file=sys.stderr, flush=True)
        return
    if row.fits:
        what = f"fits: {gb(row.peak_bytes)} GB, {row.step_time_s * 1e3:.1f} ms per step"
    else:
        what = f"does not fit ({row.note})" if not row.over_bytes else f"over by {gb(row.over_bytes)} GB"
    print(f"[{i + 1}/{n}] {config.describe()}: {what} ({row.seconds:.1f} s)", file=sys.stderr, flush=True)


def cmd_fit(args: argparse.Namespace) -> int:
    from remat_opt.analysis.fit import STRATEGIES, apply_lines, fit, gb, plan_file_of, result_json, result_rows

    if args.out is not None:
        check_writable_file(Path(args.out), "--out")
    from remat_opt.analysis.whatif import markdown_table

    result = fit(args.model, gpus=args.gpus, seq=args.seq, global_batch=args.global_batch,
                 memory_margin=args.memory_margin, memory_gb=args.memory_gb, micro_batches=args.micro_batches,
                 strategies=args.strategy or STRATEGIES,
                 collectives_in_flight=args.collectives_in_flight, dtype=args.dtype or "bfloat16",
                 n_layer=args.n_layer, tiny=args.tiny, executors=args.executors, traced_layers=args.traced_layers,
                 time_limit_s=args.time_limit_s, progress=None if args.no_progress else _fit_progress)
    plan_path, planned = None, result.best_thunder_jit
    if args.out is not None and planned is not None:
        plan_path = str(plan_file_of(result, planned).write(args.out))
    if args.json:
        data = result_json(result)
        if plan_path is not None:
            data.update(plan_file=plan_path, plan_file_configuration=planned.config.describe(),
                        apply=apply_lines(result, planned, plan_path=plan_path))
        print(json.dumps(data, indent=2, default=str))
        return 0
    tried = len(result.rows)
    print(f"{result.model}, seq {result.seq} on {result.gpus.describe()}: at most {gb(result.limit_bytes)} GB "
          f"per rank ({result.memory_margin:.0%} held back); {tried} configurations in {result.seconds:.1f} s")
    print(markdown_table(result_rows(result)))
    for note in result.notes:
        print(f"- {note}")
    lines = apply_lines(result)
    if not lines:
        print("\nNo configuration fits; the closest is listed first among those that do not"
              + (f" (no plan written to {args.out})" if args.out else "") + ".")
        return 0
    print(f"\nFastest that fits: {result.best.config.describe()}")
    print("\n".join(lines))
    if plan_path is not None:
        print(f"\nIts plan is in {plan_path}:" if planned is result.best else
              f"\nThe fastest under thunder.jit, {planned.config.describe()}, has its plan in {plan_path}:")
        print("\n".join(apply_lines(result, planned, plan_path=plan_path)))
    elif args.out is not None:
        print(f"\nNo configuration under thunder.jit fits: no plan written to {args.out}.")
    return 0


def add_fit_arguments(parser: argparse.ArgumentParser) -> None:
    """`remat-opt fit`'s options."""
    from remat_opt.analysis.fit import DEFAULT_MEMORY_MARGIN

    parser.add_argument("model", help="litgpt config name (e.g. Llama-3-70B)")
    parser.add_argument("--gpus", required=True, help="COUNTxKIND, e.g. 8xH100, 64xH100, 8xA100 "
                        f"(kinds: {', '.join(DEVICE_SPEC_CHOICES)}; cpu needs --memory-gb)")
    parser.add_argument("--seq", type=_positive_int, required=True, help="sequence length")
    parser.add_argument("--global-batch", type=_positive_int, default=None,
                        help="sequences per optimizer step over all GPUs, made up by gradient accumulation "
                             "(default: each micro-batch once per rank, no accumulation)")
    parser.add_argument("--memory-margin", type=_finite_float(positive=False), default=DEFAULT_MEMORY_MARGIN,
                        help="fraction of each GPU's memory held back (CUDA context, fragmentation)")
    parser.add_argument("--memory-gb", type=_finite_float(positive=True), default=None,
                        help="memory of one device in GB, instead of the spec sheet's (needed for cpu)")
    parser.add_argument("--micro-batches", type=_int_list, default=None, metavar="M,M,...",
                        help="micro-batch sizes to try (default 1,2,4,8, or the powers of two dividing the "
                             "per-rank batch)")
    parser.add_argument("--strategy", default=None, type=_fit_strategies, metavar="S,S,...",
                        help="which of fsdp, ddp (thunder.jit with Thunder's transforms) and fsdp1 (torch's FSDP1 "
                             "under ThunderFX, one unit per block, as Thunder's benchmark runs large models) to try "
                             "(default: all)")
    parser.add_argument("--collectives-in-flight", type=_in_flight_list, default=[1, 2, None], metavar="K,K,...",
                        help="FSDP variants to try: collectives in flight beside the one in use, or 'thunder' "
                             "(Thunder's order)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default bfloat16")
    parser.add_argument("--n-layer", type=_positive_int, default=None, help="override the number of layers")
    parser.add_argument("--tiny", action="store_true", help="shrink the config to a tiny model of its family")
    parser.add_argument("--executors", choices=EXECUTOR_CHOICES, default=None,
                        help="default nvfuser-standin (nvFuser's fusion regions, as a GPU step runs)")
    parser.add_argument("--traced-layers", type=int, default=None,
                        help="layers traced before extending to full depth (default 4; 0: all)")
    parser.add_argument("--time-limit-s", type=_finite_float(positive=True), default=10.0,
                        help="the solver's time limit per plan (wall seconds)")
    parser.add_argument("--out", default=None, metavar="JSON",
                        help="write the fastest fitting configuration's plan here, for CostRemat(plan=...)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="remat-opt", description="Cost-model-driven rematerialization for Thunder",
                     formatter_class=_HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True,
                                parser_class=functools.partial(_Parser, formatter_class=_HelpFormatter))
    inspect = sub.add_parser("inspect", help="saved-for-backward table of a model")
    add_model_arguments(inspect)
    inspect.add_argument("--top", type=_count, default=10, help="how many of the largest saved tensors to list")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.set_defaults(run=cmd_inspect)

    profile = sub.add_parser("profile", help="time every op of a model on this device -> JSON cost table")
    add_profile_arguments(profile)
    profile.set_defaults(run=cmd_profile)

    pareto = sub.add_parser("pareto", help="sweep budgets: peak/saved GB vs predicted extra time -> CSV, PNG, SVG")
    add_model_arguments(pareto)
    add_parallel_arguments(pareto)
    add_cost_arguments(pareto)
    pareto.add_argument("--points", type=_int_at_least(2), default=8, help="how many budgets, from least memory to save-all")
    pareto.add_argument("--sweep", choices=("activation", "peak"), default=None,
                        help="the budget the points bound: activation (bytes saved for backward, as "
                             "--activation-budget-gb; the default) or peak (the step peak, as --budget-gb)")
    budgets = pareto.add_mutually_exclusive_group()
    budgets.add_argument("--budget-gb", default=None, metavar="GB,GB,...",
                         help="explicit step-peak budgets, comma-separated (e.g. 40,50,60), instead of --points")
    budgets.add_argument("--activation-budget-gb", default=None, metavar="GB,GB,...",
                         help="explicit saved-for-backward budgets, comma-separated, instead of --points")
    add_solver_argument(pareto)
    pareto.add_argument("--out", default="pareto_out", help="folder for pareto.csv, pareto.png, pareto.svg")
    pareto.set_defaults(run=cmd_pareto)

    plan = sub.add_parser("plan", help="plan under a budget and print the explain table")
    add_model_arguments(plan)
    add_parallel_arguments(plan)
    add_cost_arguments(plan)
    budgets = plan.add_mutually_exclusive_group()
    budgets.add_argument("--budget-gb", type=_finite_float(positive=False), default=None,
                         help="bound on the predicted step peak, GB")
    budgets.add_argument("--activation-budget-gb", type=_finite_float(positive=False), default=None,
                         help="bound on saved-for-backward bytes (inputs excluded), GB")
    add_solver_argument(plan)
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    plan.add_argument("--timeline", default=None, metavar="PNG",
                      help="draw the predicted memory over one step, save-all and the plan, to this PNG")
    plan.add_argument("--summary", action="store_true",
                      help="tensors grouped by producing op and action instead of one line per tensor")
    plan.set_defaults(run=cmd_plan)

    fit = sub.add_parser("fit", help="the fastest training configuration that fits N GPUs: micro-batch, FSDP/DDP, plan")
    add_fit_arguments(fit)
    fit.set_defaults(run=cmd_fit)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, or a one-line usage error (`_Parser.error`)
        return e.code if isinstance(e.code, int) else 2
    from remat_opt.tracing.capture import ModelTraceError

    try:
        return args.run(args)
    except (ModelSpecError, ModelTraceError, ValueError) as e:
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"remat-opt: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
