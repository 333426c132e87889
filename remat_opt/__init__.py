"""remat-opt: cost-model-driven rematerialization planning for Lightning Thunder.

The user API, imported on first use so that ``import remat_opt`` stays cheap and imports neither
torch nor Thunder:

* `CostRemat` (a Thunder transform) and `explain` (the plan of a jitted function's last call);
* `analyze` (the joint graph of a model, without running a step), `analyze_model` (a litgpt config
  at full depth, traced on meta from a few layers), `plan_graph` and `pareto_curve` (offline plans);
* `fit` (the fastest configuration of micro-batch and data parallelism whose iteration fits N GPUs);
* `measure_saved_bytes` and `measure_step_peak_bytes` (what a real step saves and peaks at);
* `sdpa_cpu_ex` (fused SDPA on CPU and meta, so that traces there look like GPU traces);
* the errors to catch: `InfeasibleBudgetError`, `ModelTraceError`, `DeepenError`, `FitError`.

Internals live in their modules (`remat_opt.core.graph`, `remat_opt.solvers`, ...). The modules that
touch Thunder apply the torch compatibility steps (`remat_opt._compat`) before importing it, and
``import remat_opt`` installs a hook that runs the step Thunder needs to import at all before the
first ``import thunder`` (`remat_opt._thunder_import`; torch is not imported until then), so
``import remat_opt, thunder`` works on torch 2.13.
"""

from remat_opt import _thunder_import

__version__ = "0.1.0"

_thunder_import.install()

_LAZY = {
    "CostRemat": ("remat_opt.transform.cost_remat", "CostRemat"),
    "explain": ("remat_opt.transform.explain", "explain"),
    "analyze": ("remat_opt.tracing.capture", "analyze"),
    "analyze_model": ("remat_opt.models.graphs", "analyze_model"),
    "plan_graph": ("remat_opt.analysis.offline", "plan_graph"),
    "pareto_curve": ("remat_opt.analysis.offline", "pareto_curve"),
    "fit": ("remat_opt.analysis.fit", "fit"),
    "FitError": ("remat_opt.analysis.fit", "FitError"),
    "measure_saved_bytes": ("remat_opt.validation.measure", "measure_saved_bytes"),
    "measure_step_peak_bytes": ("remat_opt.validation.measure", "measure_step_peak_bytes"),
    "sdpa_cpu_ex": ("remat_opt.executors.sdpa_cpu", "sdpa_cpu_ex"),
    "InfeasibleBudgetError": ("remat_opt.core.errors", "InfeasibleBudgetError"),
    "ModelTraceError": ("remat_opt.tracing.capture", "ModelTraceError"),
    "DeepenError": ("remat_opt.core.deepen", "DeepenError"),
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'remat_opt' has no attribute {name!r}")
    import importlib

    module_name, attr = _LAZY[name]
    return getattr(importlib.import_module(module_name), attr)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = sorted(_LAZY)
