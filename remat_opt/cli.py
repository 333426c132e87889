"""The `remat-opt` command line.

    remat-opt inspect Llama-2-7b-hf --n-layer 2 --seq 4096 --dtype bfloat16 --device meta
    remat-opt inspect remat_opt.examples:block --device cpu --json

Bad input (unknown config, a model whose forward fails, inputs on mixed devices) ends with one
line `remat-opt: error: ...` and exit status 2, not a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from remat_opt.errors import InfeasibleBudgetError
from remat_opt.executors import EXECUTOR_CHOICES, executors_for
from remat_opt.models import DTYPES, ModelSpec, ModelSpecError



def add_model_arguments(
    parser: argparse.ArgumentParser,
    device_default: str = "meta",
    device_help: str = "meta (no memory, the default), cpu or cuda",
) -> None:
    """The model options shared by every subcommand that builds a model."""
    parser.add_argument("model", help="litgpt config name (e.g. Llama-2-7b-hf) or package.module:factory")
    parser.add_argument("--n-layer", type=int, default=None, help="override the number of layers")
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default 128; 32 with --tiny)")
    parser.add_argument("--batch", type=int, default=1, help="micro-batch size")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--device", default=device_default, help=device_help)
    parser.add_argument("--tiny", action="store_true", help="shrink the config to a tiny model of its family")
    parser.add_argument(
        "--executors",
        choices=EXECUTOR_CHOICES,
        default="fused-sdpa",
        help="fused-sdpa (default: CPU/meta traces look like GPU traces), default (Thunder's), "
        "torch-compile (TorchCompile fusion regions on CPU)",
    )
    parser.add_argument(
        "--traced-layers",
        type=int,
        default=None,
        help="trace this many layers of a litgpt config and extend the graph to its full depth "
        "(default on meta: 4; 0: trace every layer)",
    )


def model_spec(args: argparse.Namespace) -> ModelSpec:
    return ModelSpec(
        name=args.model,
        n_layer=args.n_layer,
        seq=args.seq,
        batch=args.batch,
        dtype=args.dtype,
        device=args.device,
        tiny=args.tiny,
    )


def analyze_from_args(args: argparse.Namespace):
    """Builds the model named by `args` and returns ``(spec, graph, seconds)``.

    A litgpt config is traced by `remat_opt.model_graphs.analyze_spec`: deep configs on meta with a
    few layers, extended; with ``REMAT_OPT_GRAPH_CACHE`` set, traced graphs are kept there. A
    ``module:factory`` model is traced as the factory builds it.
    """
    from remat_opt.extract import analyze
    from remat_opt.model_graphs import analyze_spec
    from remat_opt.models import build_model, check_same_device, check_spec, litgpt_config

    spec = model_spec(args)
    check_spec(spec)
    traced_layers = _traced_layers(args, spec)
    start_s = time.perf_counter()
    if ":" in spec.name:
        model, inputs = build_model(spec)
        check_same_device(model, inputs)
        graph = analyze(model, *inputs, executors=executors_for(args.executors))
        return spec, graph, time.perf_counter() - start_s
    config, seq = litgpt_config(spec)
    spec = replace(spec, seq=spec.seq or seq, n_layer=config.n_layer)
    graph = analyze_spec(spec, traced_layers=traced_layers, executors=args.executors)
    return spec, graph, time.perf_counter() - start_s


def _traced_layers(args: argparse.Namespace, spec: ModelSpec) -> int:
    """How many layers to trace before extending (0: trace the model as built)."""
    if ":" in spec.name:
        if args.traced_layers:
            raise ValueError("--traced-layers needs a litgpt config name, not a module:factory")
        return 0
    if args.traced_layers is not None:
        return args.traced_layers
    from remat_opt.model_graphs import DEFAULT_TRACED_LAYERS

    return DEFAULT_TRACED_LAYERS if spec.device == "meta" else 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from remat_opt.report import inspect_report, render_inspect

    spec, graph, analysis_s = analyze_from_args(args)
    report = inspect_report(graph, spec=spec, analysis_s=analysis_s, top=args.top)
    print(json.dumps(report, indent=2) if args.json else render_inspect(report))
    return 0


# Short `--device-spec` names -> `costmodels.devices` spec names ("cpu": the nominal CPU).
DEVICE_SPEC_NAMES = {"h100": "H100-SXM", "h200": "H200", "a100": "A100-80GB", "l40s": "L40S", "cpu": "cpu"}


def resolve_device_spec(name: str | None) -> str | None:
    """The spec name for a `--device-spec` value (a short name or a full spec name); None stays None.

    Raises:
        ValueError: no spec matches `name`.
    """
    if name is None:
        return None
    key = name.strip().lower()
    if key in DEVICE_SPEC_NAMES:
        return DEVICE_SPEC_NAMES[key]
    from costmodels.devices import GPU_SPECS

    if name in GPU_SPECS:
        return name
    raise ValueError(
        f"unknown --device-spec {name!r}; use one of {', '.join(DEVICE_SPEC_NAMES)} "
        f"(or a spec name: {', '.join(GPU_SPECS)})"
    )


def parse_budgets_gb(text: str) -> list[float]:
    """``"40,50,60"`` -> ``[40.0, 50.0, 60.0]``; empty, non-numeric or negative entries raise ValueError."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise ValueError(f"--budgets-gb needs a comma-separated list of budgets in GB, e.g. 40,50,60; got {text!r}")
    budgets = []
    for p in parts:
        try:
            value = float(p)
        except ValueError:
            raise ValueError(f"--budgets-gb: {p!r} is not a number") from None
        if not value >= 0 or value == float("inf"):
            raise ValueError(f"--budgets-gb: budgets must be finite and not negative, got {p}")
        budgets.append(value)
    return sorted(set(budgets))


def _check_budget_gb(flag: str, value: float | None) -> None:
    if value is not None and not value >= 0:
        raise ValueError(f"{flag} must not be negative, got {value:g}")


def add_cost_arguments(parser: argparse.ArgumentParser) -> None:
    """`--device-spec` and `--cost-table`: what `pareto` and `plan` cost ops with."""
    parser.add_argument(
        "--device-spec",
        default=None,
        help=f"device to cost for: {', '.join(DEVICE_SPEC_NAMES)} (or a full spec name such as H100-SXM); "
        "default: the cost table's device, else the graph's (meta graphs need one)",
    )
    parser.add_argument("--cost-table", default=None, help="measured cost table (JSON from `remat-opt profile`)")
    parser.add_argument("--time-limit-s", type=float, default=10.0, help="solver time limit per budget")


def _cost_request_kwargs(args: argparse.Namespace) -> dict:
    if args.device_spec is None and args.cost_table is None and args.device in ("meta", "cuda"):
        raise ValueError(f"--device {args.device} graphs need --device-spec ({', '.join(DEVICE_SPEC_NAMES)}) "
                         "or --cost-table")
    return {"device_spec": resolve_device_spec(args.device_spec), "cost_table": args.cost_table,
            "time_limit_s": args.time_limit_s}


_BUDGET_FLAGS = {"peak_budget_bytes": "--budget-gb", "budget_bytes": "--activation-budget-gb"}


def _title(spec, request) -> str:
    device = request.device_spec or (request.table.device if request.table is not None else "?")
    return f"{spec.name} n_layer={spec.n_layer} seq={spec.seq} batch={spec.batch} {spec.dtype}, costed for {device}"


def cmd_pareto(args: argparse.Namespace) -> int:
    from remat_opt.curves import plot_curve, render_points, write_csv
    from remat_opt.planning import PlanRequest, pareto_points, plan_step
    from remat_opt.solvers.pareto import ParetoPoint

    budgets_gb = None if args.budgets_gb is None else parse_budgets_gb(args.budgets_gb)
    if budgets_gb is None and args.points < 2:
        raise ValueError(f"--points must be at least 2 (least memory and save-all), got {args.points}")
    request = PlanRequest.create(**_cost_request_kwargs(args))
    spec, graph, _ = analyze_from_args(args)
    if budgets_gb is None:
        points = pareto_points(graph, request, args.points, budget=args.budget)
    else:
        key = "activation_budget_bytes" if args.budget == "saved" else "peak_budget_bytes"
        points = []
        for gb in budgets_gb:
            try:
                plan = plan_step(graph, replace(request, **{key: round(gb * 1e9)})).plan
            except InfeasibleBudgetError as e:
                raise e.to_gb("--budgets-gb") from e
            points.append(ParetoPoint(round(gb * 1e9), plan.peak_bytes, plan.saved_bytes, plan.extra_time_s, plan))
    out = Path(args.out)
    csv_path = write_csv(points, out / "pareto.csv")
    png_path, svg_path = plot_curve(points, out / "pareto.png", out / "pareto.svg", _title(spec, request))
    print(_title(spec, request) + f"; {args.budget} budget sweep")
    print(render_points(points))
    print(f"\nwrote {csv_path}, {png_path}, {svg_path}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from remat_opt.explanation import explain_step
    from remat_opt.planning import PlanRequest, plan_step

    _check_budget_gb("--budget-gb", args.budget_gb)
    _check_budget_gb("--activation-budget-gb", args.activation_budget_gb)
    request = PlanRequest.from_gb(budget_gb=args.budget_gb, activation_budget_gb=args.activation_budget_gb,
                                  solver=args.solver, **_cost_request_kwargs(args))
    spec, graph, _ = analyze_from_args(args)
    try:
        step = plan_step(graph, request)
    except InfeasibleBudgetError as e:
        raise e.to_gb(_BUDGET_FLAGS[e.kind]) from e
    explanation = explain_step(step)
    if args.json:
        print(json.dumps(explanation.to_dict(), indent=2, default=str))
    else:
        print(_title(spec, request) + f"; {request.describe()}")
        print(explanation.summary_table() if args.summary else explanation)
    return 0


# ---- `remat-opt profile` ------------------------------------------------------------------


def add_profile_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``remat-opt profile``: the model options (with ``--device cpu`` by default) and
    the profiling options."""
    add_model_arguments(parser, device_default="cpu", device_help="cpu (the default) or cuda: where ops are timed")
    parser.add_argument("--output", "-o", default=None, help="cost table path (default: cost_tables/<device>.json)")
    parser.add_argument("--report", action="store_true", help="print predicted vs measured per op and Spearman")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per op")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per op, at least")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def default_table_path(device_name: str) -> Path:
    """``cost_tables/<device name as a file name>.json`` under the current directory."""
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
    from costmodels.timing import ProfileOptions
    from remat_opt.cost_report import compare, format_comparison
    from remat_opt.profiling import profile_graph

    if not (args.device == "cpu" or args.device.startswith("cuda")):
        print(f"remat-opt: error: --device {args.device} cannot time ops; use cpu or cuda", file=sys.stderr)
        return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    spec, graph, _ = analyze_from_args(args)
    options = ProfileOptions(warmup=args.warmup, repeats=args.repeats)
    table = profile_graph(graph, device=args.device, options=options, progress=not args.no_progress, model=repr(spec))
    path = save_table(table, args.output or default_table_path(table.device))
    table = load_table(path, device=args.device)  # what planners will read: check it round-trips
    print(f"wrote {path}: {len(table.entries)} ops timed, {len(table.skipped)} skipped, on {table.device}")
    for key, reason in table.skipped:
        print(f"  skipped {key[:100]}: {reason}")
    if args.report:
        print(format_comparison(compare(graph, table)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="remat-opt", description="Cost-model-driven rematerialization for Thunder")
    sub = parser.add_subparsers(dest="command", required=True)
    inspect = sub.add_parser("inspect", help="saved-for-backward table of a model")
    add_model_arguments(inspect)
    inspect.add_argument("--top", type=int, default=10, help="how many of the largest saved tensors to list")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.set_defaults(run=cmd_inspect)

    profile = sub.add_parser("profile", help="time every op of a model on this device -> JSON cost table")
    add_profile_arguments(profile)
    profile.set_defaults(run=cmd_profile)

    pareto = sub.add_parser("pareto", help="sweep budgets: peak/saved GB vs predicted extra time -> CSV, PNG, SVG")
    add_model_arguments(pareto)
    add_cost_arguments(pareto)
    pareto.add_argument("--points", type=int, default=8, help="how many budgets, from least memory to save-all")
    pareto.add_argument("--budget", choices=("saved", "peak"), default="saved",
                        help="sweep the saved-for-backward budget or the step peak budget")
    pareto.add_argument("--budgets-gb", default=None,
                        help="explicit comma-separated budgets in GB (e.g. 40,50,60) instead of --points")
    pareto.add_argument("--out", default="pareto_out", help="folder for pareto.csv, pareto.png, pareto.svg")
    pareto.set_defaults(run=cmd_pareto)

    from remat_opt.planning import SOLVER_CHOICES

    plan = sub.add_parser("plan", help="plan under a budget and print the explain table")
    add_model_arguments(plan)
    add_cost_arguments(plan)
    budgets = plan.add_mutually_exclusive_group()
    budgets.add_argument("--budget-gb", type=float, default=None, help="bound on the predicted step peak, GB")
    budgets.add_argument("--activation-budget-gb", type=float, default=None,
                         help="bound on saved-for-backward bytes (inputs excluded), GB")
    plan.add_argument("--solver", choices=SOLVER_CHOICES, default="auto")
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    plan.add_argument("--summary", action="store_true",
                      help="tensors grouped by producing op and action instead of one line per tensor")
    plan.set_defaults(run=cmd_plan)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from remat_opt.extract import ModelTraceError

    try:
        return args.run(args)
    except (ModelSpecError, ModelTraceError, ValueError) as e:
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"remat-opt: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
