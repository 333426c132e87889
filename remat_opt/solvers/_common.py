"""What every solver shares: the final check and budget bookkeeping (errors: `remat_opt.core.errors`)."""

from __future__ import annotations

from dataclasses import dataclass

from remat_opt.core.errors import InfeasibleBudgetError, PlanCheckError
from remat_opt.core.plan import RematPlan
from remat_opt.core.checker import check_plan
from remat_opt.core.problem import RecomputeProblem
from remat_opt.core.simulation import simulate_step


@dataclass(frozen=True, slots=True)
class Budgets:
    """The two budgets a solver may receive (None: unbounded)."""

    activation_bytes: int | None = None
    peak_bytes: int | None = None

    def admits(self, saved_bytes: int, peak_bytes: int) -> bool:
        return (self.activation_bytes is None or saved_bytes <= self.activation_bytes) and (
            self.peak_bytes is None or peak_bytes <= self.peak_bytes
        )


def checked(problem: RecomputeProblem, plan: RematPlan) -> RematPlan:
    """Returns `plan` after the independent checker accepted it; raises `PlanCheckError` otherwise."""
    errors = check_plan(problem.graph, plan, pinned=problem.pinned, op_time_s=problem.op_time_s)
    if errors:
        raise PlanCheckError(f"{plan.solver} produced an invalid plan: " + "; ".join(errors[:8]))
    return plan


def raise_if_over(plan: RematPlan, budgets: Budgets, *, minimum_saved: int, minimum_peak: int) -> None:
    """Raises `InfeasibleBudgetError` for a fixed-plan solver whose plan is over budget."""
    if budgets.activation_bytes is not None and plan.saved_bytes > budgets.activation_bytes:
        raise InfeasibleBudgetError("activation_budget_bytes", budgets.activation_bytes, minimum_saved, solver=plan.solver)
    if budgets.peak_bytes is not None and plan.peak_bytes > budgets.peak_bytes:
        raise InfeasibleBudgetError("peak_budget_bytes", budgets.peak_bytes, minimum_peak, solver=plan.solver)


@dataclass(frozen=True, slots=True)
class Evaluated:
    """A unit set with what it costs: saved bytes, simulated step peak (0 when not simulated) and
    recompute time."""

    units: tuple[str, ...]
    saved_bytes: int
    peak_bytes: int
    extra_time_s: float


def evaluate_units(problem: RecomputeProblem, units, *, with_peak: bool = True) -> Evaluated:
    """`units` reduced to those that rerun something (`effective_units`), with their costs."""
    units, saved_bytes, time_s = problem.assess(units)
    targets = {t for u in units for t in problem.units[u].tag_targets}
    peak = simulate_step(problem.graph, targets, by_kind=False).peak_bytes if with_peak else 0
    return Evaluated(units, saved_bytes, peak, time_s)
