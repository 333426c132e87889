"""Predicted vs measured memory over one training step on CPU, drawn to a PNG.

Runs a model under Thunder on CPU twice, with `CostRemat` at save-all and at a fraction of the
save-all activation budget, measures each step's allocator timeline
(`remat_opt.measure_step_peak_bytes`) and draws it under the predicted timelines
(`remat_opt.analysis.curves.plot_timeline`). Prints predicted and measured peaks side by side.

    .venv/bin/python benchmarks/timeline_check.py --fraction 0.25 --out docs/timeline_llama2_tiny_cpu.png

Writes the peaks to docs/results/accuracy.md (section ``timeline``; ``--page PATH`` elsewhere,
``--no-write`` to print only).
"""

from __future__ import annotations

import argparse
import time

from results_page import RESULTS_DIR, add_page_arguments, finish_page, markdown_table

from remat_opt import _compat  # noqa: F401

import thunder  # noqa: E402

from remat_opt import CostRemat, analyze  # noqa: E402
from remat_opt.analysis.curves import plot_timeline  # noqa: E402
from remat_opt.executors import executors_for  # noqa: E402
from remat_opt.validation.measure import measure_step_peak_bytes  # noqa: E402
from remat_opt.models.by_name import ModelSpec, build_model  # noqa: E402
from remat_opt.core.simulation import simulate_step  # noqa: E402
from remat_opt.transform.explain import last_planned_step  # noqa: E402


def peaks_section(args: argparse.Namespace, rows: list[tuple[str, int, int, int]], png: str) -> str:
    """Markdown: the setting, then per run its saved bytes and predicted and measured step peak."""
    table = markdown_table(
        ["run", "saved B (plan)", "step peak predicted B", "measured B", "measured / predicted - 1"],
        [[name, f"{saved_bytes:,}", f"{predicted_bytes:,}", f"{measured_bytes:,}", f"{measured_bytes / predicted_bytes - 1:+.3%}"]
         for name, saved_bytes, predicted_bytes, measured_bytes in rows])
    setting = (f"{args.model} tiny, {args.n_layer} layers, seq {args.seq}, fp32, CPU, fused SDPA; CostRemat at "
               f"save-all and at {args.fraction:.0%} of save-all; timelines drawn to `{png}`.")
    return "\n".join([setting, "", *table])


def main() -> None:
    start_s = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Llama-2-7b-hf")
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--fraction", type=float, default=0.25, help="activation budget, fraction of save-all")
    parser.add_argument("--out", default="docs/timeline_llama2_tiny_cpu.png")
    add_page_arguments(parser, RESULTS_DIR / "accuracy.md")
    args = parser.parse_args()

    model, inputs = build_model(ModelSpec(args.model, n_layer=args.n_layer, seq=args.seq, device="cpu", tiny=True))
    executors = executors_for("fused-sdpa")
    save_all = analyze(model, *inputs, executors=executors).saved_activation_bytes
    predicted, measured, rows = {}, {}, []
    for name, budget in (("save-all", save_all), (f"{args.fraction:.0%} of save-all", int(args.fraction * save_all))):
        transform = CostRemat(activation_budget_gb=budget / 1e9, device_spec="cpu")
        jitted = thunder.jit(model, transforms=[transform], executors=executors)
        peak = measure_step_peak_bytes(jitted, *inputs)
        step = last_planned_step(jitted)
        predicted[name], measured[name] = simulate_step(step.graph, step.plan), peak.timeline_bytes
        print(f"{name:>22}: saved {step.plan.saved_bytes:>10,} B; peak predicted {step.plan.peak_bytes:>10,} B, "
              f"measured {peak.peak_bytes:>10,} B ({peak.peak_bytes / step.plan.peak_bytes - 1:+.1%})")
        rows.append((name, step.plan.saved_bytes, step.plan.peak_bytes, peak.peak_bytes))
    title = f"{args.model} tiny, {args.n_layer} layers, seq {args.seq}, fp32, CPU: predicted (stacked) and measured"
    png = plot_timeline(predicted, args.out, title, measured=measured)
    print("wrote", png)
    finish_page(args, "timeline", peaks_section(args, rows, args.out), start_s, extra_packages=["matplotlib"])


if __name__ == "__main__":
    main()
