"""`polish`: a faster plan near one that meets the budgets, by a local search the simulation checks.

Around a plan P, each candidate flip (recompute one more unit, or stop recomputing one) is simulated
once: what it changes in recompute time, in saved bytes and in live bytes at every op event of the
step (a backward op's event taking the reruns just before it, so that every plan has the same
events). A CP-SAT model then picks the flips of least total time whose summed changes keep every
event within the peak budget and the saved bytes within the activation budget. That sum is a
linearization of the step around P: exact for one flip, approximate for several (flips in one layer
interact through rerun chains). Its answer is simulated. When it overshoots, its flips are tried
one at a time (those that cost time first, each kept only while the plan fits), then flips that
cost time and are no longer needed are undone; when that is not faster either, the rows the answer
broke are lowered by its overshoot and the model is solved again. A faster plan that fits becomes
P, and the search repeats from it.

Found on Llama-2-7b at seq 4096 on an H100 (2026-12-08): at per-block checkpointing's step peak,
the layer chain's plan recomputes 6.82 ms; three rounds of this search bring it to 5.25 ms, 3% above
the LP bound: it recomputes 14 of the fusions between two layers (a residual add and the next
norm) and 3 units outside the layers, which the chain keeps saved, and saves 8 linear outputs and
5 fusion outputs inside the layers instead.

The work is counted in simulated events (`PolishOptions.work_events`) and CP-SAT's deterministic
time, not in wall seconds: one graph and one plan give one answer on any machine. (Whether the
layered solver runs it depends on its bound, whose LP, MILP and CP-SAT have wall-clock limits.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from remat_opt.core.problem import RecomputeProblem
from remat_opt.core.simulation import simulate_step
from remat_opt.solvers._clock import Clock
from remat_opt.solvers._common import Budgets, Evaluated


@dataclass(frozen=True, slots=True)
class PolishOptions:
    """Options of `polish`.

    Attributes:
        work_events: simulated events the search may spend (one step simulation costs the events of
            its step; a round simulates the flips of allowed units that save time or free bytes):
            about 1,600 simulations of Llama-2-7b's 1,261-event step, 5 rounds of its about 300
            such flips. `affordable` says whether a graph gets one round.
        corrections: times a round lowers the rows its answer broke and solves again.
        cp_sat_time_limit_s: CP-SAT's deterministic time per pick.
        time_quantum_s: resolution of times in CP-SAT.
    """

    work_events: int = 2_000_000
    corrections: int = 6
    cp_sat_time_limit_s: float = 2.0
    time_quantum_s: float = 1e-9


@dataclass
class _Step:
    """A plan with what the search compares: recompute time, saved bytes, live bytes per op event."""

    units: frozenset[str]
    time_s: float
    saved_bytes: int
    live_bytes: np.ndarray | None  # None without a peak budget

    def fits(self, budgets: Budgets) -> bool:
        peak = 0 if self.live_bytes is None else int(self.live_bytes.max())
        return budgets.admits(self.saved_bytes, peak)

    def evaluated(self, problem: RecomputeProblem) -> Evaluated:
        units = tuple(u for u in problem.units if u in self.units)
        peak = 0 if self.live_bytes is None else int(self.live_bytes.max())
        return Evaluated(units, self.saved_bytes, peak, self.time_s)


class _Search:
    """One search: the problem, the budgets and the work spent."""

    def __init__(self, problem: RecomputeProblem, budgets: Budgets, options: PolishOptions):
        self.problem, self.budgets, self.options = problem, budgets, options
        self.events_used = 0
        self.events_per_step = len(problem.graph.ops) + 1

    def has_work(self) -> bool:
        return self.events_used + self.events_per_step <= self.options.work_events

    def step(self, units, simulate: bool = True) -> _Step:
        effective, saved_bytes, time_s = self.problem.assess(units)
        step = _Step(frozenset(effective), time_s, saved_bytes, None)
        return self.simulated(step) if simulate else step

    def simulated(self, step: _Step) -> _Step:
        """`step` with its live bytes (under a peak budget; simulated once)."""
        if step.live_bytes is None and self.budgets.peak_bytes is not None:
            step.live_bytes = _op_event_live_bytes(self.problem, step.units)
            self.events_used += self.events_per_step
        return step


def _op_event_live_bytes(problem: RecomputeProblem, units) -> np.ndarray:
    """Simulated live bytes per op event (forward ops, backward start, backward ops), each backward
    op's the most of its own event and the reruns just before it: the same events in every plan."""
    targets = {t for u in units for t in problem.units[u].tag_targets}
    timeline = simulate_step(problem.graph, targets, by_kind=False)
    op_event, is_rerun = timeline.op_events()
    live = np.full(int((~is_rerun).sum()), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(live, op_event, np.asarray(timeline.live_bytes, dtype=np.int64))
    return live


def affordable(problem: RecomputeProblem, options: PolishOptions = PolishOptions()) -> bool:
    """Whether `options.work_events` pays for one round on `problem` (a flip of every allowed unit)."""
    return (len(problem.allowed_units) + 2) * (len(problem.graph.ops) + 1) <= options.work_events


def polish(problem: RecomputeProblem, units, budgets: Budgets, options: PolishOptions = PolishOptions()) -> Evaluated:
    """The fastest plan the local search (module docstring) reaches from `units`, which must meet
    `budgets`: `units` itself when it finds nothing faster.

    Returns:
        The plan, evaluated (peak 0 without a peak budget).
    """
    search = _Search(problem, budgets, options)
    current = search.step(units)
    if not current.fits(budgets):
        raise ValueError("polish starts from a plan that meets the budgets")
    while current.time_s > 0 and search.has_work():
        better = _round(search, current)
        if better is None:
            break
        current = better
    return current.evaluated(problem)


def _round(search: _Search, current: _Step) -> _Step | None:
    """One linearization around `current`: a faster plan that fits, or None."""
    flips, steps = [], []
    for unit in search.problem.allowed_units:
        if not search.has_work():
            return None
        step = search.step(current.units ^ {unit}, simulate=False)
        # a flip helps when it saves time or frees saved bytes (what a faster flip elsewhere needs)
        if step.time_s < current.time_s or step.saved_bytes < current.saved_bytes:
            flips.append(unit)
            steps.append(search.simulated(step))
    if not flips:
        return None
    lowered: dict[int, int] = {}  # event -> bytes its row is lowered by
    for _ in range(search.options.corrections + 1):
        chosen = _pick(search, current, flips, steps, lowered)
        if chosen is None or not search.has_work():
            return None
        trial = search.step(current.units ^ set(chosen))
        if trial.fits(search.budgets) and trial.time_s < current.time_s:
            return trial
        dived = _dive(search, current, chosen, dict(zip(flips, steps)))
        if dived is not None:
            return dived
        if trial.live_bytes is None:
            break
        for event in np.flatnonzero(trial.live_bytes > search.budgets.peak_bytes):
            lowered[int(event)] = lowered.get(int(event), 0) + int(trial.live_bytes[event]) - search.budgets.peak_bytes
    return None


def _pick(search: _Search, current: _Step, flips: list[str], steps: list[_Step],
          lowered: dict[int, int]) -> list[str] | None:
    """The flips of least summed time change (at least one quantum less than `current`) whose summed
    byte changes keep every event within the budgets (rows lowered by `lowered`), or None."""
    budgets, options = search.budgets, search.options
    model = cp_model.CpModel()
    x = [model.new_bool_var(f"flip_{unit}") for unit in flips]
    quantum = options.time_quantum_s
    time_change = [round((s.time_s - current.time_s) / quantum) for s in steps]
    # saved bytes within the activation budget
    if budgets.activation_bytes is not None:
        change = [s.saved_bytes - current.saved_bytes for s in steps]
        model.add(sum(c * v for c, v in zip(change, x) if c) <= budgets.activation_bytes - current.saved_bytes)
    # live bytes within the peak budget at every event the flips could push over it (in units of
    # `scale` bytes: changes rounded up, room rounded down)
    if budgets.peak_bytes is not None:
        scale = max(1, budgets.peak_bytes >> 15)
        change = np.stack([s.live_bytes - current.live_bytes for s in steps])
        room = budgets.peak_bytes - current.live_bytes
        for event in sorted(lowered):
            room[event] -= lowered[event]
        coefficients = -(-change // scale)
        for event in np.flatnonzero(np.maximum(coefficients, 0).sum(axis=0) * scale > room):
            terms = np.flatnonzero(coefficients[:, event])
            model.add(sum(int(coefficients[i, event]) * x[i] for i in terms) <= int(room[event] // scale))
    objective = sum(t * v for t, v in zip(time_change, x) if t)
    model.add(objective <= -1)
    model.minimize(objective)
    solver = cp_model.CpSolver()
    solver.parameters.random_seed = 0
    clock = Clock(options.cp_sat_time_limit_s, deterministic=True)
    clock.limit_cp_sat(solver.parameters)
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return [unit for unit, v in zip(flips, x) if solver.value(v)]


def _dive(search: _Search, current: _Step, chosen: list[str], single: dict[str, _Step]) -> _Step | None:
    """`chosen` flips applied one at a time, those that cost time first, each kept only while the
    plan fits; then the kept flips that cost time undone where the plan still fits. A faster plan,
    or None."""
    budgets, work = search.budgets, current
    for unit in sorted(chosen, key=lambda u: current.time_s - single[u].time_s):
        if not search.has_work():
            break
        trial = search.step(work.units ^ {unit})
        if trial.fits(budgets):
            work = trial
    costly = [u for u in chosen if single[u].time_s > current.time_s and u in work.units ^ current.units]
    for unit in sorted(costly, key=lambda u: current.time_s - single[u].time_s):
        if not search.has_work():
            break
        trial = search.step(work.units ^ {unit})
        if trial.fits(budgets) and trial.time_s < work.time_s:
            work = trial
    return work if work.time_s < current.time_s and work.fits(budgets) else None
