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

from remat_opt import _compat  # noqa: F401  (before thunder)
from remat_opt.models import DTYPES, ModelSpec, ModelSpecError

EXECUTOR_CHOICES = ("fused-sdpa", "default", "torch-compile")


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


def executors_for(choice: str) -> list | None:
    """Thunder executor list for a `--executors` choice (None: Thunder's defaults)."""
    import thunder

    from remat_opt.executors.sdpa_cpu import sdpa_cpu_ex

    if choice == "default":
        return None
    if choice == "torch-compile":
        from thunder.executors.torch_compile import torch_compile_ex

        return [torch_compile_ex, sdpa_cpu_ex, *thunder.get_default_executors()]
    return [sdpa_cpu_ex, *thunder.get_default_executors()]


def analyze_from_args(args: argparse.Namespace):
    """Builds the model named by `args` and returns ``(spec, graph, seconds)``."""
    from remat_opt.extract import analyze
    from remat_opt.models import build_model, check_same_device

    spec = model_spec(args)
    model, inputs = build_model(spec)
    check_same_device(model, inputs)
    if ":" not in spec.name and spec.seq is None:
        spec = replace(spec, seq=int(inputs[0].shape[-1]))
    start_s = time.perf_counter()
    graph = analyze(model, *inputs, executors=executors_for(args.executors))
    return spec, graph, time.perf_counter() - start_s


def cmd_inspect(args: argparse.Namespace) -> int:
    from remat_opt.report import inspect_report, render_inspect

    spec, graph, analysis_s = analyze_from_args(args)
    report = inspect_report(graph, spec=spec, analysis_s=analysis_s, top=args.top)
    print(json.dumps(report, indent=2) if args.json else render_inspect(report))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="remat-opt", description="Cost-model-driven rematerialization for Thunder")
    sub = parser.add_subparsers(dest="command", required=True)
    inspect = sub.add_parser("inspect", help="saved-for-backward table of a model")
    add_model_arguments(inspect)
    inspect.add_argument("--top", type=int, default=10, help="how many of the largest saved tensors to list")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.set_defaults(run=cmd_inspect)

    from costmodels.profiler import add_profile_arguments, run_profile

    profile = sub.add_parser("profile", help="time every op of a model on this device -> JSON cost table")
    add_profile_arguments(profile)
    profile.set_defaults(run=run_profile)
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
