"""Solvers: pure functions over a `RecomputeProblem`, one signature, one result type.

    solve_x(problem, *, activation_budget_bytes=None, peak_budget_bytes=None, options=XOptions()) -> RematPlan

Every plan returned has passed the independent `remat_opt.core.checker.check_plan`. Pick a solver by
name through `SOLVERS` (baselines included, so each solver has a reference).

Modules: `baselines` (save-all, recompute-all, per-block checkpointing), `mincut` (min-cut: a networkx graph,
OR-Tools' max flow), `ilp_model` (the
CP-SAT model), `ilp_peak` (refining it against the simulated peak), `ilp_bounds` (least memory of
any plan), `ilp` (`solve_ilp`), `peak_model` (linear lower bound on the peak), `schedule_rows`,
`blocks` (ties between repeated layers), `layered` (decomposition over repeated layers), `polish` (a local
search checked by simulation, after `layered`), `time_bound`
(proven lower bounds on recompute time: the certified gap), `pareto` (budget sweeps).
"""

from __future__ import annotations

from remat_opt.solvers._common import InfeasibleBudgetError, PlanCheckError
from remat_opt.solvers.baselines import BaselineOptions, solve_per_block, solve_recompute_all, solve_save_all
from remat_opt.solvers.ilp import solve_ilp
from remat_opt.solvers.ilp_bounds import PeakMinimum, minimum_peak, minimum_peak_bytes, minimum_saved_bytes
from remat_opt.solvers.ilp_model import ILPOptions
from remat_opt.solvers.layered import LayeredOptions, solve_layered
from remat_opt.solvers.mincut import MinCutOptions, mincut_sweep, solve_mincut
from remat_opt.solvers.pareto import ParetoPoint, pareto_front

SOLVERS = {
    "mincut": solve_mincut,
    "ilp": solve_ilp,
    "layered": solve_layered,
    "save_all": solve_save_all,
    "recompute_all": solve_recompute_all,
    "per_block": solve_per_block,
}

__all__ = [
    "SOLVERS",
    "BaselineOptions",
    "ILPOptions",
    "InfeasibleBudgetError",
    "LayeredOptions",
    "MinCutOptions",
    "ParetoPoint",
    "PlanCheckError",
    "PeakMinimum",
    "mincut_sweep",
    "minimum_peak",
    "minimum_peak_bytes",
    "minimum_saved_bytes",
    "pareto_front",
    "solve_ilp",
    "solve_layered",
    "solve_mincut",
    "solve_per_block",
    "solve_recompute_all",
    "solve_save_all",
]
