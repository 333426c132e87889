"""Plans that hold after a fusion executor's own pass (no Thunder imports).

With a fusion executor (nvFuser, its stand-in, Thunder's torch.compile executor), Thunder partitions
the *joint* trace into regions after our tags and then runs its per-region-pair rematerialization:
a region may pull forward ops into the backward, and what crosses from forward to backward is
re-derived. What Thunder then saves is a function of the tags that only Thunder's pass computes;
planning on the fused graph of an untagged dry run is wrong (its regions are not the regions the
tags produce), and so is planning on the unfused graph alone (it ignores what fusion removes).

So the planner runs in a loop with Thunder's pass:

1. **plan** on the unfused joint graph (the same trace without the fusion executors): its units are
   exactly what a tag re-runs, so the solver's decisions are meaningful;
2. **realize**: run Thunder's autodiff, fusion and split on the plan's tags (a dry run) and read
   what it saves and the step peak: exact, it is the real pass;
3. **adjust** the budget handed to the solver by how far the realized bytes fell from the target,
   and plan again, for a few rounds (`search_budgets`).

Of the plans tried, the one with the least predicted recompute time whose realized bytes hold every
budget wins, and its realized bytes are the prediction: exact by construction, whatever the pass
does. The price is one dry run per round (`Round` records each).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from remat_opt.core.errors import InfeasibleBudgetError

ACTIVATION = "activation_budget_bytes"  # bounds the realized saved bytes
PEAK = "peak_budget_bytes"  # bounds the realized step peak


@dataclass(frozen=True)
class Realized:
    """What Thunder's own pass makes of a set of tags (a dry run)."""

    saved_bytes: int
    peak_bytes: int

    def value(self, budget_name: str) -> int:
        return self.saved_bytes if budget_name == ACTIVATION else self.peak_bytes


@dataclass(frozen=True)
class Round:
    """One round of the search: the budgets the solver got, its plan's time, what Thunder made of it."""

    solver_budgets: tuple[tuple[str, int], ...]
    extra_time_s: float
    realized: Realized

    def holds(self, targets: Mapping[str, int]) -> bool:
        return all(self.realized.value(name) <= target for name, target in targets.items())

    def describe(self) -> str:
        budgets = ", ".join(f"{name.replace('_bytes', '')}={value:,} B" for name, value in self.solver_budgets)
        return (f"solver given {budgets}: Thunder saves {self.realized.saved_bytes:,} B, peak "
                f"{self.realized.peak_bytes:,} B, +{self.extra_time_s * 1e3:.3f} ms")


@dataclass(frozen=True)
class SearchResult:
    plan: object  # what `plan_at` returned for the winning round
    realized: Realized
    rounds: tuple[Round, ...]


def search_budgets(
    targets: Mapping[str, int],
    plan_at: Callable[[dict[str, int]], object],
    realize: Callable[[object], Realized],
    extra_time_s: Callable[[object], float],
    solver_value: Callable[[object, str], int],
    first_guess: Mapping[str, int],
    *,
    first_slope: Mapping[str, float] | None = None,
    refine: Callable[[object, dict[str, int]], object | None] | None = None,
    max_rounds: int = 6,
    close_fraction: float = 0.01,
) -> SearchResult:
    """Finds solver budgets whose plan, realized by Thunder's pass, holds `targets` at least time.

    Args:
        targets: the user's budgets by name (`ACTIVATION`, `PEAK`), in bytes.
        plan_at: solver budgets -> a plan; raises `InfeasibleBudgetError` (with ``minimum``) when the
            solver's own model cannot go that low.
        realize: plan -> what Thunder's pass saves and peaks at with its tags.
        extra_time_s: plan -> its predicted recompute seconds (what the search minimizes).
        solver_value: (plan, budget name) -> the bytes the solver's own model predicts for it; the
            next round moves from there, so that a round always asks for a different plan.
        first_guess: the solver budgets of the first round.
        first_slope: per budget, how many realized bytes one solver byte is expected to be worth
            (default 1), until two rounds measure it.
        refine: (plan, overshoot bytes by budget name) -> a plan that recomputes more of what
            Thunder's pass actually saved (`units_to_add`), or None; tried before the solver is
            asked again with a lower budget.
        max_rounds: dry runs at most (the minimum plan, when needed, is one more).
        close_fraction: stop once a holding plan leaves less than this fraction of each budget unused.

    Raises:
        InfeasibleBudgetError: not even the solver's least-memory plan holds after Thunder's pass;
            ``minimum`` is what that plan realizes (the least the search found).
    """
    solver, first_slope = dict(first_guess), dict(first_slope or {})
    feasible_below: dict[str, int] = {}  # per budget: the largest solver budget seen to hold
    failing_above: dict[str, int] = {}  # per budget: the smallest solver budget seen to break
    observed: dict[str, list[tuple[int, int]]] = {n: [] for n in targets}  # (solver's bytes, realized bytes)
    rounds: list[Round] = []
    best: tuple[object, Round] | None = None
    plan, refining = None, False
    for _ in range(max_rounds):
        if plan is None:
            try:
                plan = plan_at(dict(solver))
            except (InfeasibleBudgetError, TimeoutError):  # the solver has no plan this low
                break
        this = Round(tuple(sorted(solver.items())), extra_time_s(plan), realize(plan))
        improved = not refining or _overshoot(this.realized, targets) < _overshoot(rounds[-1].realized, targets)
        rounds.append(this)
        if not refining:
            for name in targets:
                observed[name].append((solver_value(plan, name), this.realized.value(name)))
        if this.holds(targets):
            if best is None or this.extra_time_s < best[1].extra_time_s:
                best = (plan, this)
            if all(target - this.realized.value(name) <= close_fraction * target for name, target in targets.items()):
                break
        elif refine is not None and improved:  # recompute more of what Thunder's pass actually saved
            overshoot = {n: this.realized.value(n) - t for n, t in targets.items() if this.realized.value(n) > t}
            refined = refine(plan, overshoot)
            if refined is not None:
                plan, refining = refined, True
                continue
        bracket, keep = (feasible_below, max) if this.holds(targets) else (failing_above, min)
        for name, value in solver.items():
            bracket[name] = keep(bracket.get(name, value), value)
        following = _next_budgets(observed, targets, feasible_below, failing_above, first_slope)
        if any(tuple(sorted(following.items())) == r.solver_budgets for r in rounds):
            break
        solver, plan, refining = following, None, False
    if best is None:
        best = _least_plan(targets, plan_at, realize, extra_time_s, rounds)
    return SearchResult(best[0], best[1].realized, tuple(rounds))


def search_with_model(
    targets: Mapping[str, int],
    plan_at: Callable[[dict[str, int]], object],
    realize: Callable[[object], Realized],
    extra_time_s: Callable[[object], float],
    predict: Callable[[object], Realized],
    observe: Callable[[object, Realized], None],
    top_scale: float,
    *,
    first_scale: float | None = None,
    floor_scale: float = 0.0,
    plan_key: Callable[[object], object] = id,
    max_checks: int = 3,
    solves_per_check: int = 8,
    close_fraction: float = 0.01,
) -> SearchResult | None:
    """Finds the least-time plan that holds `targets` with a model of Thunder's pass, and a dry run
    per model answer as the check: the answer of `search_budgets` in one or two dry runs where the
    model is right (`remat_opt.planning.fusion_model`).

    Each check: solve at solver budgets ``scale * target`` (a search over `scale` in [0, `top_scale`],
    at most `solves_per_check` solves), keep the least-time plan the model predicts to hold, realize it. A
    realized plan that holds and that the model predicted within `close_fraction` of each budget ends
    the search; otherwise the model learns from it (`observe`) and the next check starts.

    Args (beyond `search_budgets`'):
        predict: plan -> what the model predicts Thunder's pass makes of it.
        observe: (plan, realized) -> None: the model learns from a dry run.
        top_scale: a scale of the targets at which the solver saves everything it would.
        first_scale: the scale the model expects to fill the targets (the search starts there).
        floor_scale: a scale below which the solver has no plan (a lower bound on its least memory):
            the search does not look below it (a solve below the least plan is slow: its error names
            the least plan).
        plan_key: plan -> a key equal for equal plans (a plan checked once is not checked again).

    Returns:
        The least-time realized plan that holds, or None when no check found one (the caller falls
        back to `search_budgets`; the rounds done here are in its dry-run cache).
    """
    rounds: list[Round] = []
    best: tuple[object, Round] | None = None
    checked: set = set()
    for _ in range(max_checks):
        found = _least_time_predicted_to_hold(targets, plan_at, extra_time_s, predict, top_scale, solves_per_check,
                                              first_scale, close_fraction, floor_scale)
        if found is None or plan_key(found[0]) in checked:
            break
        plan, budgets = found
        checked.add(plan_key(plan))
        predicted = predict(plan)
        this = Round(tuple(sorted(budgets.items())), extra_time_s(plan), realize(plan))
        rounds.append(this)
        if this.holds(targets) and (best is None or this.extra_time_s < best[1].extra_time_s):
            best = (plan, this)
        exact = all(abs(this.realized.value(n) - predicted.value(n)) <= close_fraction * t for n, t in targets.items())
        if this.holds(targets) and exact:
            break
        observe(plan, this.realized)
    return None if best is None else SearchResult(best[0], best[1].realized, tuple(rounds))


def _least_time_predicted_to_hold(targets, plan_at, extra_time_s, predict, top_scale: float, solves: int,
                                  first_scale: float | None = None, resolution: float = 0.01,
                                  floor_scale: float = 0.0):
    """A search over one scale of the solver's budgets (``scale * target`` each) for the largest
    scale whose plan the model predicts to hold: regula falsi on the predicted overshoot (the largest
    predicted bytes over target, less one), bisection while the low end's overshoot is unknown (a
    positive floor, a budget without a plan) and where it stalls, from `first_scale` (default:
    the top) until the bracket is narrower than `resolution` of its top, at most `solves` solves. Of
    the plans the solver returned, the least-time one predicted to hold and its budgets; when none
    is, the one predicted to overshoot least (the model may be wrong: a dry run checks it); None
    when the solver returned none."""
    def overshoot(plan) -> float:
        predicted = predict(plan)
        return max(predicted.value(n) / max(t, 1) for n, t in targets.items()) - 1.0

    top = max(top_scale, 1.0)
    low, high = min(max(floor_scale, 0.0), top), top  # low: holds (or below what the solver can plan); high: breaks
    f_low, f_high, found, closest = -1.0, None, [], None
    # whether the low end's overshoot is known: a plan there was predicted to hold, or the floor is
    # zero bytes (where a plan saves nothing: -1); a positive floor's is not
    low_known = low == 0.0
    scale = max(first_scale, low) if first_scale is not None and 0 < first_scale < top else top
    for _ in range(solves):
        budgets = {n: int(scale * t) for n, t in targets.items()}
        try:
            plan = plan_at(budgets)
        except (InfeasibleBudgetError, TimeoutError) as error:  # the solver has no plan this low
            low, f_low, low_known = scale, -1.0, False
            minimum = getattr(error, "minimum", None)
            if minimum is not None and error.kind in targets:  # nor below its least plan
                low = max(low, min(minimum / max(targets[error.kind], 1), top))
        else:
            f = overshoot(plan)
            if f <= 0:
                found.append((plan, budgets))
                if scale == top:
                    break  # the largest budget holds: nothing to search
                low, f_low, low_known = scale, f, True
            else:
                high, f_high = scale, f
                if closest is None or f < closest[0]:
                    closest = (f, plan, budgets)
        if high - low <= resolution * high:
            break
        if f_high is None:  # the first guess held: is the top's plan held too?
            scale = top
            continue
        if not low_known:
            # the low end is a positive floor or a budget without a plan: its overshoot is unknown
            # (a secant to a made-up -1 there crawled down from the top by 2% of the range per solve)
            scale = (low + high) / 2
            continue
        secant = low + (high - low) * (-f_low) / (f_high - f_low)
        # regula falsi, kept inside the bracket's middle 90% (bisection where it would stall at an end)
        scale = secant if low + 0.05 * (high - low) < secant < high - 0.05 * (high - low) \
            else (low + high) / 2
    if not found:
        return None if closest is None else closest[1:]
    return min(found, key=lambda pair: extra_time_s(pair[0]))


def _overshoot(realized: Realized, targets: Mapping[str, int]) -> int:
    return max(realized.value(name) - target for name, target in targets.items())


def _next_budgets(observed: dict[str, list[tuple[int, int]]], targets: Mapping[str, int],
                  feasible_below: dict[str, int], failing_above: dict[str, int],
                  first_slope: Mapping[str, float]) -> dict[str, int]:
    """The next solver budgets: from the solver's bytes of the last solver round, moved by how far
    Thunder's realized bytes fell from the target divided by how realized bytes have followed the
    solver's (a secant over the rounds so far; `first_slope` before there are two), at least one byte,
    kept inside the bracket of solver budgets already seen to hold and to break (bisecting when not)."""
    following = {}
    for name, target in targets.items():
        points = observed[name]
        predicted, realized = points[-1]
        slope = first_slope.get(name, 1.0)
        distinct = [(p, r) for p, r in points[:-1] if p != predicted]
        if distinct:
            p0, r0 = distinct[-1]
            slope = (realized - r0) / (predicted - p0) if (realized - r0) * (predicted - p0) > 0 else slope
        slope = min(max(slope, 0.05), 2.0)
        gap = target - realized
        # headroom: give the solver half of it back; overshoot: ask for all of it (and a byte) less
        step = int(gap / 2 / slope) + 1 if gap > 0 else int(gap / slope) - 1
        proposal = predicted + step
        low, high = feasible_below.get(name), failing_above.get(name)
        if low is not None and high is not None and not low < proposal < high:
            proposal = (low + high) // 2
        following[name] = max(proposal, 0)
    return following


def units_to_add(units, tagged: Iterable[str], realized_graph, overshoot_bytes: int) -> list[str]:
    """The next units to tag when Thunder's pass realized `overshoot_bytes` too many: the tensors it
    actually saves (`realized_graph`) whose tag target is an allowed unit not yet tagged, cheapest
    recompute time per saved byte first, until their bytes cover the overshoot.

    Args:
        units: the unfused problem's units by tag target (`RecomputeProblem.units`).
        tagged: units the plan tags already.
        realized_graph: the fused joint graph Thunder's pass made of the plan.
    """
    tagged = set(tagged)
    bytes_by_unit: dict[str, int] = {}
    for name in realized_graph.saved_names:
        origin = realized_graph.origins.get(name)
        unit = units.get(origin.tag_target) if origin is not None and origin.taggable else None
        if unit is None or not unit.allowed or unit.name in tagged:
            continue
        bytes_by_unit[unit.name] = bytes_by_unit.get(unit.name, 0) + realized_graph.storage_bytes([name])
    chosen, covered = [], 0
    for name in sorted(bytes_by_unit, key=lambda u: units[u].time_s / max(bytes_by_unit[u], 1)):
        chosen.append(name)
        covered += bytes_by_unit[name]
        if covered >= overshoot_bytes:
            break
    return chosen


def _least_plan(targets, plan_at, realize, extra_time_s, rounds: list[Round]):
    """No round held: the solver's least-memory plan, realized; if it does not hold either, the
    budget is infeasible and its realized bytes are the least found."""
    zero = {name: 0 for name in targets}
    try:
        plan = plan_at(zero)
    except InfeasibleBudgetError as e:
        if e.minimum is None:
            raise
        plan = plan_at({name: e.minimum for name in targets})
    least = Round(tuple(sorted(zero.items())), extra_time_s(plan), realize(plan))
    rounds.append(least)
    if least.holds(targets):
        return plan, least
    name = next(n for n, t in targets.items() if least.realized.value(n) > t)
    error = InfeasibleBudgetError(name, targets[name], least.realized.value(name), in_gb=True)
    error.add_note("after Thunder's fusion pass: the least-memory plan found "
                   f"({len(rounds)} dry run(s)) realizes {least.realized.value(name):,} B")
    raise error
