"""Plans through a fusion executor's pass, checked on CPU: budgets hold, predictions are exact.

For each model, with the nvFuser stand-in (or ``--executors torch-compile``), runs `CostRemat` at
activation budgets of save-all, 75, 50 and 25% of *this configuration's own* save-all (what Thunder
saves with these executors and no plan) and the minimum, and at three step-peak budgets, a quarter,
half and three quarters of the way from the least peak the search finds to the save-all peak. Per run it prints the
predicted and measured saved bytes (`measure_saved_bytes`), predicted and measured step peak
(`measure_step_peak_bytes`), the largest gradient difference from eager, the dry runs the search
took and the compile time. Figures of docs/results/fusion.md come from here. ``--executors
fused-sdpa`` runs the budgets of tests/transform/test_transform.py on every family (the suite runs a
rotation of them).

    .venv/bin/python benchmarks/fusion_check.py                       # block + six tiny families, stand-in
    .venv/bin/python benchmarks/fusion_check.py --models block --executors torch-compile
    .venv/bin/python benchmarks/fusion_check.py --models Llama-2-7b-hf --n-layer 2 --executors sdpa-then-torch-compile --no-peak-budgets

``torch-compile`` puts Thunder's torch.compile executor first (the CLI's choice: SDPA inside its
regions); ``sdpa-then-torch-compile`` puts the fused SDPA executor first (SDPA stays out of them).
"""

from __future__ import annotations

import argparse
import time
import warnings

from remat_opt import _compat  # noqa: F401

import thunder  # noqa: E402
import torch  # noqa: E402

from remat_opt import CostRemat, InfeasibleBudgetError, analyze  # noqa: E402
from remat_opt.models.examples import block  # noqa: E402
from remat_opt.executors import executors_for  # noqa: E402
from remat_opt.validation.measure import measure_saved_bytes, measure_step_peak_bytes  # noqa: E402
from remat_opt.models.by_name import ModelSpec, build_model  # noqa: E402
from remat_opt.core.simulation import simulate_peak_bytes  # noqa: E402
from remat_opt.transform.explain import last_planned_step  # noqa: E402

FAMILIES = ("block", "Llama-2-7b-hf", "Llama-3-8B", "Mistral-7B-v0.1", "gemma-2b", "phi-2", "pythia-14m")


def _model(name: str, n_layer: int):
    if name == "block":
        return block(batch=2, seq=32)
    return build_model(ModelSpec(name, n_layer=n_layer, device="cpu", tiny=True))


def _eager_grads(model, inputs) -> list[torch.Tensor]:
    model(*inputs).float().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def _run(model, inputs, executors, eager, **budget) -> str:
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    jitted = thunder.jit(model, transforms=[CostRemat(device_spec="cpu", **budget)], executors=executors)
    try:
        measured = measure_saved_bytes(jitted, *inputs)
    except InfeasibleBudgetError as e:
        return f"infeasible: {str(e).splitlines()[0]}"
    compile_s = time.perf_counter() - start
    measured.output.float().sum().backward()
    error = max((p.grad - g).abs().max().item() for p, g in zip(model.parameters(), eager))
    model.zero_grad(set_to_none=True)
    step = last_planned_step(jitted)
    peak = measure_step_peak_bytes(jitted, *inputs)
    rounds = step.fusion.tagged_dry_runs if step.fusion else 0
    saved_ok = "=" if measured.activation_bytes == step.plan.saved_bytes else "!="
    return (f"saved {step.plan.saved_bytes:>9,} {saved_ok} {measured.activation_bytes:>9,} B | peak "
            f"{step.plan.peak_bytes:>9,} vs {peak.peak_bytes:>9,} B ({peak.peak_bytes / step.plan.peak_bytes - 1:+.2%}) | "
            f"+{step.plan.extra_time_s * 1e3:.3f} ms | grad err {error:.1e} | {rounds} dry runs, {compile_s:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(FAMILIES))
    parser.add_argument("--executors", default="nvfuser-standin",
                        choices=("nvfuser-standin", "torch-compile", "sdpa-then-torch-compile", "fused-sdpa"),
                        help="fused-sdpa: no fusion executor, as tests/transform/test_transform.py's budget runs")
    parser.add_argument("--n-layer", type=int, default=1)
    parser.add_argument("--no-peak-budgets", action="store_true", help="activation budgets only")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    executors = _executors(args.executors)
    for name in args.models:
        model, inputs = _model(name, args.n_layer)
        eager = _eager_grads(model, inputs)
        graph = analyze(model, *inputs, executors=executors)
        save_all, save_all_peak = graph.saved_activation_bytes, simulate_peak_bytes(graph)
        print(f"\n{name} ({args.executors}): Thunder alone saves {save_all:,} B, step peak {save_all_peak:,} B", flush=True)
        for label, fraction in (("save-all", 1.0), ("75%", 0.75), ("50%", 0.5), ("25%", 0.25), ("minimum", 0.0)):
            line = _run(model, inputs, executors, eager, activation_budget_gb=int(fraction * save_all) / 1e9)
            print(f"  activations {label:>8}: {line}", flush=True)
        if args.no_peak_budgets:
            continue
        least_peak = least_peak_bytes(model, inputs, executors)
        print(f"  least step peak found: {least_peak:,} B", flush=True)
        for quarter in (1, 2, 3):
            budget = least_peak + quarter * (save_all_peak - least_peak) // 4
            if budget >= save_all_peak:
                print(f"  peak {budget:>11,} B: not below the save-all peak, skipped")
                continue
            line = _run(model, inputs, executors, eager, budget_gb=budget / 1e9)
            print(f"  peak {budget:>11,} B: {line}", flush=True)


def _executors(choice: str) -> list:
    if choice != "sdpa-then-torch-compile":
        return executors_for(choice)
    from thunder.executors.torch_compile import torch_compile_ex

    from remat_opt import sdpa_cpu_ex

    return [sdpa_cpu_ex, torch_compile_ex, *thunder.get_default_executors()]


def least_peak_bytes(model, inputs, executors, device_spec: str = "cpu") -> int:
    """The least step peak the search finds (what an infeasible peak budget names)."""
    jitted = thunder.jit(model, transforms=[CostRemat(device_spec=device_spec, budget_gb=1e-12)], executors=executors)
    try:
        jitted(*inputs)
    except InfeasibleBudgetError as e:
        return e.minimum
    raise AssertionError("a 1 B step peak held")


if __name__ == "__main__":
    main()
