"""The search that plans through a fusion executor's pass (`remat_opt.planning.fusion_search`), on synthetic
solvers and passes: what it keeps, when it refines, when it gives up."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from remat_opt.core.errors import InfeasibleBudgetError
from remat_opt.planning.fusion_search import ACTIVATION, PEAK, Realized, search_budgets


@dataclass(frozen=True)
class _Plan:
    saved: int  # what the (unfused) solver predicts
    time_s: float
    extra: int = 0  # what refinement took off


def _solver(least: int = 0):
    """Saves exactly the budget it is given (down to `least`); time grows as it saves less."""
    def plan_at(budgets):
        budget = budgets[ACTIVATION]
        if budget < least:
            raise InfeasibleBudgetError("activation_budget_bytes", budget, least)
        saved = min(budget, 1000)
        return _Plan(saved, (1000 - saved) / 1000)
    return plan_at


def _search(targets, plan_at, realize, **kwargs):
    return search_budgets(targets, plan_at, realize, extra_time_s=lambda p: p.time_s,
                          solver_value=lambda p, name: p.saved, first_guess=dict(targets), **kwargs)


def test_a_pass_that_saves_less_than_the_solver_thinks_gets_budget_back():
    # the pass realizes 60% of what the solver saves: the search raises the solver's budget until the
    # realized bytes fill the target, and keeps the least-time plan that holds
    result = _search({ACTIVATION: 300}, _solver(), lambda p: Realized(int(p.saved * 0.6), 0))
    assert result.realized.saved_bytes <= 300
    assert result.realized.saved_bytes > 300 * 0.6 * 1.2  # better than the first round (180 B)
    assert result.plan.time_s == min(r.extra_time_s for r in result.rounds if r.holds({ACTIVATION: 300}))


def test_a_pass_that_saves_more_is_asked_for_less_until_it_holds():
    result = _search({ACTIVATION: 500}, _solver(), lambda p: Realized(p.saved + 120, 0))
    assert result.realized.saved_bytes <= 500
    assert len(result.rounds) >= 2 and not result.rounds[0].holds({ACTIVATION: 500})


def test_refinement_is_tried_before_the_solver_is_asked_again():
    calls = []

    def refine(plan, overshoot):
        calls.append(overshoot)
        return _Plan(plan.saved, plan.time_s + 0.01, plan.extra + overshoot[ACTIVATION])

    result = _search({ACTIVATION: 400}, _solver(), lambda p: Realized(p.saved + 50 - p.extra, 0), refine=refine)
    assert calls == [{ACTIVATION: 50}]
    assert result.realized.saved_bytes == 400 and result.plan.extra == 50


def test_a_peak_target_is_searched_on_the_peak():
    def plan_at(budgets):
        return _Plan(budgets[PEAK], 1.0 / max(budgets[PEAK], 1))
    result = search_budgets({PEAK: 1000}, plan_at, lambda p: Realized(0, p.saved + 100),
                            extra_time_s=lambda p: p.time_s, solver_value=lambda p, n: p.saved,
                            first_guess={PEAK: 1000})
    assert result.realized.peak_bytes <= 1000


def test_when_nothing_holds_the_least_plan_realized_is_the_minimum_named():
    realize = lambda p: Realized(p.saved + 200, 0)  # noqa: E731  (the pass adds 200 B to any plan)
    with pytest.raises(InfeasibleBudgetError) as caught:
        _search({ACTIVATION: 100}, _solver(least=50), realize, max_rounds=3)
    assert caught.value.minimum == 250 and caught.value.budget == 100
    assert "activation_budget_gb" in str(caught.value) and "after Thunder's fusion pass" in "".join(caught.value.__notes__)


def test_the_least_plan_is_kept_when_only_it_holds():
    # only plans saving under 50 B survive the pass unchanged; the rest realize 900 B
    realize = lambda p: Realized(p.saved if p.saved < 50 else 900, 0)  # noqa: E731
    result = _search({ACTIVATION: 100}, _solver(), realize, max_rounds=2)
    assert result.realized.saved_bytes == 0 and result.rounds[-1].solver_budgets == ((ACTIVATION, 0),)
