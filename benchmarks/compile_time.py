"""First-compile time of `thunder.jit` with and without `CostRemat`, per executor list, measured side by side.

For each model and executor list: one untimed compile first (imports, torch's and Thunder's
process-wide caches), then `--repeats` rounds, each compiling afresh (a new `thunder.jit`) Thunder
alone and CostRemat with no budget and at activation budgets of 50% and 25% of what Thunder alone
saves with these executors, in turn. A compile is timed from `thunder.jit` to the end of the first
forward and backward (tracing, Thunder's passes, CostRemat's planning and dry runs, running the step
once). Per configuration: the median seconds, the median of the per-round ratios to Thunder alone,
and the dry runs with tags CostRemat paid for. Issue 25's goal: CostRemat at most 1.5x Thunder alone
with a fusion executor.

    .venv/bin/python benchmarks/compile_time.py                  # tiny Llama-2 (CPU) and a 7B-shaped layer (meta)
    .venv/bin/python benchmarks/compile_time.py --models tiny-llama-2 --executors nvfuser-standin --repeats 5

The 7B-shaped model is one Llama-2-7b layer at seq 4096 in bf16 on the meta device (nothing is
allocated; the H100 spec prices it; its budgets are step-peak budgets, as a user of a 7B model sets
them, a half and a quarter of the way from the least peak CostRemat finds to Thunder alone's).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

from remat_opt import _compat  # noqa: F401

import thunder  # noqa: E402
import torch  # noqa: E402

from remat_opt import CostRemat, analyze  # noqa: E402
from remat_opt.core.simulation import simulate_peak_bytes  # noqa: E402
from remat_opt.executors import executors_for  # noqa: E402
from remat_opt.models.by_name import ModelSpec, build_model  # noqa: E402
from remat_opt.transform.explain import last_planned_step  # noqa: E402

from fusion_check import least_peak_bytes  # noqa: E402
from results_page import RESULTS_DIR, add_page_arguments, finish_page  # noqa: E402

MODELS = {
    "tiny-llama-2": (ModelSpec("Llama-2-7b-hf", n_layer=1, device="cpu", tiny=True), "cpu"),
    "llama-2-7b-layer-meta": (ModelSpec("Llama-2-7b-hf", n_layer=1, seq=4096, dtype="bfloat16", device="meta"), "h100"),
}
EXECUTORS = ("nvfuser-standin", "torch-compile", "fused-sdpa")


def _budgets(model, inputs, executors, device: str) -> dict[str, dict]:
    """CostRemat's arguments per configuration: no budget; on CPU, activation budgets of a half and a
    quarter of what Thunder alone saves with these executors; on meta, step-peak budgets a half and a
    quarter of the way from the least peak CostRemat finds to Thunder alone's peak (an untimed compile
    finds the least)."""
    graph = analyze(model, *inputs, executors=executors)
    configs = {"CostRemat, no budget": {}}
    if device == "cpu":
        for label, fraction in (("50%", 0.5), ("25%", 0.25)):
            configs[f"CostRemat, activations {label}"] = {"activation_budget_gb": fraction * graph.saved_activation_bytes / 1e9}
        return configs
    peak, least = simulate_peak_bytes(graph), least_peak_bytes(model, inputs, executors, device)
    for label, fraction in (("half", 0.5), ("a quarter", 0.25)):
        configs[f"CostRemat, step peak {label} of the way from the least"] = {"budget_gb": (least + fraction * (peak - least)) / 1e9}
    return configs


def _compile_s(model, inputs, executors, transforms) -> tuple[float, object]:
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    jitted = thunder.jit(model, transforms=transforms, executors=executors)
    out = jitted(*inputs)
    out.float().sum().backward()
    return time.perf_counter() - start, jitted


def measure(name: str, executors_name: str, repeats: int) -> list[str]:
    spec, device = MODELS[name]
    model, inputs = build_model(spec)
    executors = executors_for(executors_name)
    configs = _budgets(model, inputs, executors, device)
    _compile_s(model, inputs, executors, [])  # untimed: process-wide caches
    seconds = {label: [] for label in ("Thunder alone", *configs)}
    ratios = {label: [] for label in configs}
    dry_runs = {label: set() for label in configs}
    outcome = {}
    for _ in range(repeats):
        alone_s, _ = _compile_s(model, inputs, executors, [])
        seconds["Thunder alone"].append(alone_s)
        for label, kwargs in configs.items():
            s, jitted = _compile_s(model, inputs, executors, [CostRemat(device_spec=device, **kwargs)])
            seconds[label].append(s)
            ratios[label].append(s / alone_s)
            step = last_planned_step(jitted)
            dry_runs[label].add(step.fusion.tagged_dry_runs if step.fusion is not None else 0)
            outcome[label] = f"{step.plan.saved_bytes:,} | +{step.plan.extra_time_s * 1e3:.3g}"
    rows = [f"| {name} | {executors_name} | Thunder alone | {statistics.median(seconds['Thunder alone']):.1f} | 1 | | | |"]
    for label in configs:
        runs = "/".join(str(d) for d in sorted(dry_runs[label]))
        rows.append(f"| {name} | {executors_name} | {label} | {statistics.median(seconds[label]):.1f} | "
                    f"{statistics.median(ratios[label]):.2f} | {runs} | {outcome[label]} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--executors", nargs="+", default=list(EXECUTORS), choices=EXECUTORS)
    parser.add_argument("--repeats", type=int, default=3)
    add_page_arguments(parser, RESULTS_DIR / "fusion.md")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    start_s = time.perf_counter()
    rows = []
    for name in args.models:
        for executors_name in args.executors:
            if name.endswith("meta") and executors_name == "torch-compile":
                continue  # torch.compile does not run on meta tensors
            rows += measure(name, executors_name, args.repeats)
            print("\n".join(rows[-4:]), flush=True)
    body = "\n".join([
        f"First compile (`thunder.jit` to the end of the first forward and backward), median of {args.repeats} "
        "rounds, each compiling every configuration afresh in turn; ratio: the median of the per-round ratios "
        "to Thunder alone in the same round. Dry runs: the dry runs with tags CostRemat paid for (each "
        "compilation with a fusion executor also pays for two untagged ones, which share one autodiff: Thunder "
        "alone with these executors, and without the fusion executors, the graph the solver plans on). The "
        "plan's saved bytes "
        "and predicted recompute time per step are the last round's (the same in every round).",
        "",
        "| model | executors | configuration | first compile (s) | ratio to Thunder alone | dry runs with tags "
        "| plan saves (B) | recompute (ms) |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
    ])
    finish_page(args, "compile_time", body, start_s)


if __name__ == "__main__":
    main()
