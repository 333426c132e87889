"""Coverage report of the cost formulas and the profiler's runners over every model family.

For each family (tiny one-layer litgpt configs and the hand-written block), executor list (Thunder's
defaults: SDPA decomposed; fused: remat-opt's CPU SDPA executor first) and device (cpu, meta), prints
the number of ops, the ops without a formula (they would get the fallback) and the ops the profiler
could not replay on meta with the shapes the graph records. Then the torch.compile regions on CPU.

    .venv/bin/python benchmarks/cost_coverage.py          # about 3 minutes on 2 cores
"""

from __future__ import annotations

from remat_opt import _compat  # noqa: F401  (applies the torch compatibility step before thunder)

import time

from remat_opt.executors import executors_for
from remat_opt.models.examples import block
from remat_opt.tracing.capture import analyze
from remat_opt.models.by_name import ModelSpec, build_model

from remat_opt.costing.graph_costs import coverage_report
from remat_opt.costing.profiling import replay

FAMILIES = ("Llama-2-7b-hf", "Llama-3-8B", "gemma-2b", "phi-2", "pythia-14m", "Mistral-7B-v0.1", "block")


def graph_of(family: str, kind: str, device: str):
    if family == "block":
        model, inputs = block(device=device)
    else:
        model, inputs = build_model(ModelSpec(family, n_layer=1, device=device, tiny=True))
    return analyze(model, *inputs, executors=executors_for(kind))


def report(family: str, kind: str, device: str) -> tuple[int, int]:
    start = time.perf_counter()
    graph = graph_of(family, kind, device)
    coverage = coverage_report(graph)
    problems = replay(graph, "meta", time_ops=False).problems
    missing = sum(coverage.without_formula.values()) + sum(coverage.members_without_formula.values())
    print(
        f"{family:16s} {kind:12s} {device:5s} {coverage.ops:4d} ops {coverage.members:4d} members  "
        f"without formula: {missing}  runner problems: {len(problems)}  ({time.perf_counter() - start:.1f} s)"
    )
    for line in coverage.format().splitlines()[1:] + problems:
        print(f"    {line}")
    return missing, len(problems)


def main() -> None:
    totals = [0, 0]
    cases = [(f, k, d) for d in ("meta", "cpu") for k in ("fused-sdpa", "default") for f in FAMILIES]
    cases += [("block", "torch-compile", "cpu"), ("Llama-2-7b-hf", "torch-compile", "cpu")]
    for case in cases:
        missing, problems = report(*case)
        totals[0] += missing
        totals[1] += problems
    print(f"\n{len(cases)} graphs: {totals[0]} ops without a formula, {totals[1]} runner problems")


if __name__ == "__main__":
    main()
