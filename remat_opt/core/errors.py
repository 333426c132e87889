"""The errors users catch, in one place (no imports: every layer may raise them)."""

from __future__ import annotations

import math

GB = 10**9  # budgets are in decimal gigabytes, as torch.cuda memory reports and litgpt print them

# The solvers' budget names and the options users give them under, in GB.
_GB_OPTION = {"activation_budget_bytes": "activation_budget_gb", "peak_budget_bytes": "budget_gb"}


def _gb_up(nbytes: int) -> str:
    """Bytes as GB rounded up to 3 decimals, or to 4 significant digits below 1 GB (a budget of that
    many GB admits `nbytes` and is at most 0.1% above it, so advice built from it works when
    followed: 4,096 B is 0.000004096 GB, not 0.001)."""
    value_gb = nbytes / GB
    decimals = 3 if value_gb >= 1 or nbytes <= 0 else 3 - math.floor(math.log10(value_gb))
    scale = 10**decimals
    return f"{math.ceil(round(value_gb * scale, 6)) / scale:.{decimals}f}"


class InfeasibleBudgetError(ValueError):
    """No plan meets the budget; the message names the smallest feasible budget.

    Attributes:
        kind: ``"activation_budget_bytes"`` (saved bytes) or ``"peak_budget_bytes"``.
        budget: the budget asked for, in bytes.
        minimum: the smallest budget a plan was found for, in bytes (proven minimal when
            `lower_bound` equals it; else the message says it is the least found).
        lower_bound: a proven lower bound on the smallest feasible budget (equal to `minimum`
            when it is exact), in bytes.
        solver: the solver that gave up.
        in_gb: whether the message speaks in GB (the unit of `CostRemat` and `plan_graph`).
        hint: what else would lower the minimum (an option of the caller's), ending the message.
    """

    def __init__(self, kind: str, budget: int, minimum: int, lower_bound: int | None = None, solver: str = "",
                 *, in_gb: bool = False, option: str | None = None, hint: str = ""):
        self.kind, self.budget, self.minimum, self.solver, self.in_gb = kind, budget, minimum, solver, in_gb
        self.option, self.hint = option or _GB_OPTION.get(kind, kind), hint
        self.lower_bound = minimum if lower_bound is None else lower_bound
        super().__init__(self._message() + (f"; {hint}" if hint else ""))

    def _message(self) -> str:
        """Names the minimum; when it is not proven (the least a search found), says so and gives the bound."""
        where = f"{self.solver}: " if self.solver else ""
        proven = self.lower_bound >= self.minimum
        if not self.in_gb:
            if proven:
                return f"{where}{self.kind}={self.budget} < minimum feasible {self.minimum}"
            return f"{where}{self.kind}={self.budget} < least found {self.minimum} (a proven lower bound is {self.lower_bound})"
        option = self.option
        exact = f" ({self.minimum:,} B)" if self.minimum < GB else ""  # 3 decimals of a GB hide small models
        advice = f"use {option}={_gb_up(self.minimum)} or more"
        if proven:
            return f"{where}{option}={self.budget / GB:g} is below the minimum feasible {_gb_up(self.minimum)} GB{exact}: {advice}"
        return (f"{where}{option}={self.budget / GB:g} is below the least found, {_gb_up(self.minimum)} GB{exact}; "
                f"no plan can go below {_gb_up(self.lower_bound)} GB (proven): {advice}")

    def to_gb(self, option: str | None = None, hint: str = "") -> InfeasibleBudgetError:
        """The same error with its message in GB, naming the budget as `option` (default: the
        keyword users give, ``budget_gb`` or ``activation_budget_gb``; the CLI passes its flag),
        ending with `hint` (default: this error's)."""
        return InfeasibleBudgetError(self.kind, self.budget, self.minimum, self.lower_bound, self.solver, in_gb=True,
                                     option=option, hint=hint or self.hint)


class PlanCheckError(AssertionError):
    """A solver produced a plan that the independent checker rejects (a solver bug)."""
