"""remat-opt: cost-model-driven rematerialization planning for Lightning Thunder.

Importing this package first runs the torch/Thunder compatibility step (see ``remat_opt._compat``),
so ``import remat_opt`` followed by ``import thunder`` works on torch versions that removed the
named-tensor methods.
"""

from remat_opt import _compat  # noqa: F401  (must run before anything imports thunder)

__version__ = "0.1.0"

_LAZY = {
    "analyze": ("remat_opt.extract", "analyze"),
    "analyze_model": ("remat_opt.deepen", "analyze_model"),
    "extend_layers": ("remat_opt.deepen", "extend_layers"),
    "CostRemat": ("remat_opt.transform", "CostRemat"),
    "explain": ("remat_opt.transform", "explain"),
    "GraphCapture": ("remat_opt.extract", "GraphCapture"),
    "JointGraph": ("remat_opt.graph", "JointGraph"),
    "measure": ("remat_opt.measure", None),
    "RematPlan": ("remat_opt.plan", "RematPlan"),
    "check_plan": ("remat_opt.plan", "check_plan"),
    "simulate_step": ("remat_opt.plan", "simulate_step"),
    "RecomputeProblem": ("remat_opt.problem", "RecomputeProblem"),
    "SOLVERS": ("remat_opt.solvers", "SOLVERS"),
    "pareto": ("remat_opt.solvers", "pareto"),
    "sdpa_cpu_ex": ("remat_opt.executors.sdpa_cpu", "sdpa_cpu_ex"),
}


def __getattr__(name: str):
    # Thunder-dependent parts are imported on first use: `import remat_opt` stays cheap.
    if name not in _LAZY:
        raise AttributeError(f"module 'remat_opt' has no attribute {name!r}")
    import importlib

    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    return module if attr is None else getattr(module, attr)


__all__ = sorted(_LAZY)
