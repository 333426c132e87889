"""The CP-SAT model of the recompute problem: variables, constraint families, budgets, objective.

`solvers.ilp_peak` refines it against the simulated peak, `solvers.ilp_bounds` minimises memory
with it, and `solvers.ilp.solve_ilp` is the solver built on both.

Symbols (CP-SAT variable names in brackets), all 0/1:

* ``r[u]`` (``recompute_{unit}``): unit (tag target) u is tagged ``RECOMPUTE_IN_BACKWARD``.
* ``T[o]``: op o is tagged: ``r`` of its unit, or ``t[o]`` (``tagged_{op}``) when several
  (nested) units re-run it, with ``t[o] >= r[u]`` and ``t[o] <= sum r[u]`` over them.
* ``d[o]`` (``rerun_{op}``): forward op o runs again in the backward.
* ``s[t]`` (``save_{tensor}``): tensor t is saved for backward.
* ``k[s]`` (``keep_{storage}``): storage s stays alive from the forward into the backward.

With N0 the tensors the backward reads and o(t) the op writing t:

* needed by the backward: ``s[t] + T[o(t)] >= 1`` and ``d[o(t)] >= T[o(t)]`` for t in N0;
* a rerun op is tagged: ``d[o] <= T[o]``;
* inputs of a rerun op: ``s[x] + T[o(x)] >= d[o]`` and ``d[o(x)] >= d[o] + T[o(x)] - 1``;
* a saved tensor keeps its storage: ``k[storage(t)] >= s[t]`` (input storages are free);
* only demanded ops rerun (untied models, so that each plan has one assignment and a no-good cut
  removes exactly one plan): ``d[o] <= sum d[readers of o's outputs]`` unless the backward reads
  an output of o, and ``r[u] <= sum d[o in u]``;
* saved budget: ``sum bytes[s] k[s] <= activation_budget_bytes``;
* peak budget: ``const[e] + sum bytes[s] y[e, s] <= peak_budget_bytes`` for events e of
  `PeakModel` (a lower bound on the simulated peak), where ``y[e, s] >= s[a]`` for each alias a
  of storage s whose saving keeps s alive at e (``any_saved_...``), added lazily: after each
  solve the plan is simulated; a violated event adds its row; where the simulation exceeds the
  budget at a backward op the saved-only row misses, a schedule-aware row (`schedule_rows`) is
  added there; a plan that still passes every row (a recompute-event transient) is cut off by a
  no-good cut on ``d``. Tied (large) models instead lower the model's peak budget by the
  simulated overshoot and bisect it, reporting the gap to the first relaxation's bound.
* objective: ``min sum time[o] d[o]`` (time in integer `time_quantum_s` units).

Units not allowed (random ops, pinned, non-taggable, forward outputs) have no ``r``/``d``
variables. With repeated blocks, tied names share one variable (see `solvers.blocks`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from ortools.sat.python import cp_model

from remat_opt.core.problem import RecomputeProblem
from remat_opt.solvers._clock import Clock
from remat_opt.solvers.blocks import Ties
from remat_opt.solvers.peak_model import peak_model_of

Key = tuple[str, str]  # (kind, name): kind is a key of _VAR_PREFIX
_TIE_KIND = {"r": "unit", "d": "op", "t": "op", "s": "tensor", "k": "storage"}
_VAR_PREFIX = {
    "r": "recompute",
    "t": "tagged",
    "d": "rerun",
    "s": "save",
    "k": "keep",
    "y": "any_saved",
    "q": "ran",
    "p": "pending",
    "a": "alive",
    "z": "any_alive",
}


# What a deterministic clock charges per variable for each solve besides CP-SAT's own deterministic
# time: building the solver, reading the solution back and simulating the plan, work CP-SAT does
# not count. 200 refinements of the 1,487-variable model of the tiny FSDP graph (2 ranks, one
# collective in flight) took 15.6 s of wall time and 2.7 s of CP-SAT's deterministic time on this
# project's 2-core machine (2026-12-07): 43 us per variable per solve.
SOLVE_CHARGE_S_PER_VAR = 4e-5


@dataclass(frozen=True, slots=True)
class ILPOptions:
    """Options of `solve_ilp`.

    Attributes:
        time_limit_s: limit for everything (all refinement rounds): wall seconds, or CP-SAT's
            deterministic seconds with `deterministic`.
        deterministic: limits in deterministic time, one CP-SAT worker (`solvers._clock`): one
            graph, one plan on a loaded machine too, where a wall-clock limit cuts a search short
            and answers otherwise. Off by default for plans: the 8-worker portfolio proves optima
            several times faster. `minimum_peak`, whose answer an infeasible budget's error names
            and every rank must agree on, always runs deterministic.
        num_workers: CP-SAT search workers; None: 1 for small models, 8 otherwise (CP-SAT's
            portfolio of 8 subsolvers proves optimality far faster than 2, even on 2 cores).
        time_quantum_s: resolution of op times in the objective.
        tie_blocks: tie repeated blocks: True, False, or None (when at least `min_tied_blocks`).
        min_tied_blocks: fewest repetitions for automatic tying.
        max_refinements: most lazy peak rows and no-good cuts added.
        exact_peak: refine against the simulated peak exactly (schedule rows, no-good cuts), or
            (False) lower the model's peak budget by the simulated overshoot; None: exact when
            blocks are not tied.
        max_shrinks: most model-budget trials when not exact.
        peak_tolerance: stop that search once the bracket is this fraction of the budget.
        tiebreak_saved_bytes: among plans of least time, take one with least saved bytes (a second
            solve, given at most a fifth of the time limit).
        random_seed: CP-SAT seed.
        minimum_peak_tolerance: `solvers.ilp_bounds.minimum_peak` stops bisecting once the least
            peak found is within this fraction of the floor proven so far (0: to the byte). Its
            error then names the least found with the proven bound beside it.
    """

    time_limit_s: float = 10.0
    num_workers: int | None = None
    time_quantum_s: float = 1e-8
    tie_blocks: bool | None = None
    min_tied_blocks: int = 4
    max_refinements: int = 200
    exact_peak: bool | None = None
    max_shrinks: int = 8
    peak_tolerance: float = 2e-3
    tiebreak_saved_bytes: bool = True
    random_seed: int = 0
    deterministic: bool = False
    minimum_peak_tolerance: float = 0.0

    def clock(self) -> Clock:
        """A fresh `Clock` of `time_limit_s`."""
        return Clock(self.time_limit_s, self.deterministic)


def _tagged_key(problem: RecomputeProblem, op: str) -> Key | None:
    """The variable 'op is tagged': its unit's ``r``, ``t[op]`` when several units re-run it."""
    units = problem.units_of_op.get(op, ())
    if not units:
        return None
    return ("r", units[0]) if len(units) == 1 else ("t", op)


def _families(problem: RecomputeProblem, exact_demand: bool) -> Iterator[tuple[list[tuple[Key, int]], int]]:
    """Yields ``(terms, lower)`` meaning ``sum(coef * var) >= lower``, family by family."""
    producers, inputs = problem.graph.producers, set(problem.graph.input_names)
    saved_vars: dict[str, None] = {}
    # An op re-run by several units is tagged iff one of them is.
    for o in problem.rerunnable_ops:
        units = problem.units_of_op[o]
        if len(units) > 1:
            yield from (([(("t", o), 1), (("r", u), -1)], 0) for u in units)
            yield [*((("r", u), 1) for u in units), (("t", o), -1)], 0
    # Needed by the backward: saved, or recomputed by rerunning its (tagged) op.
    for t in problem.needed_by_backward:
        o, tagged = producers[t].name, _tagged_key(problem, producers[t].name)
        saved_vars[t] = None
        if tagged is not None:
            yield [(("s", t), 1), (tagged, 1)], 1
            yield [(("d", o), 1), (tagged, -1)], 0
        else:
            yield [(("s", t), 1)], 1
    readers: dict[str, list[str]] = {}
    for o in problem.rerunnable_ops:
        # A rerun op is tagged.
        yield [(_tagged_key(problem, o), 1), (("d", o), -1)], 0
        for x in dict.fromkeys(problem.ops_by_name[o].inputs):
            if x in inputs:
                continue
            ox = producers[x].name
            tagged, saved_vars[x] = _tagged_key(problem, ox), None
            readers.setdefault(ox, []).append(o)
            # Inputs of a rerun op: saved, or rebuilt by rerunning their own (tagged) op.
            if tagged is not None:
                yield [(("s", x), 1), (tagged, 1), (("d", o), -1)], 0
                yield [(("d", ox), 1), (("d", o), -1), (tagged, -1)], -1
            else:
                yield [(("s", x), 1), (("d", o), -1)], 0
    # A saved tensor keeps its storage alive (storages of inputs and parameters are free).
    for t in saved_vars:
        storage = problem.storage_of(t)
        if storage is not None:
            yield [(("k", storage), 1), (("s", t), -1)], 0
    if exact_demand:
        yield from _demand_upper_bounds(problem, set(problem.needed_by_backward), readers)


def _demand_upper_bounds(problem: RecomputeProblem, needed: set[str], readers: dict[str, list[str]]):
    """Only demanded ops rerun, only units that rerun an op are tagged: one ``d`` per plan."""
    for name in problem.allowed_units:
        # A tagged unit reruns at least one of its ops.
        yield [*((("d", o), 1) for o in problem.units[name].ops), (("r", name), -1)], 0
    for o in problem.rerunnable_ops:
        if not any(t in needed for t in problem.ops_by_name[o].outputs):
            # An op reruns only if a rerun op reads its output.
            yield [*((("d", c), 1) for c in dict.fromkeys(readers.get(o, ()))), (("d", o), -1)], 0


# --------------------------------------------------------------------------------------------
# The CP-SAT model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Solution:
    status: str  # "OPTIMAL", "FEASIBLE", "INFEASIBLE", "UNKNOWN", ...
    units: tuple[str, ...] = ()
    objective: float = 0.0
    bound: float = 0.0
    values: dict | None = None


class ILPModel:
    """The CP-SAT model of one problem under one set of ties (mutable while refining)."""

    def __init__(self, problem: RecomputeProblem, ties: Ties, options: ILPOptions):
        self.problem, self.ties, self.options = problem, ties, options
        self.cp = cp_model.CpModel()
        self.vars: dict[Key, cp_model.IntVar] = {}
        self.storages: set[str] = set()  # untied storages with a keep variable
        self.saved_tensors: set[str] = set()  # untied tensors with a save variable
        self.any_saved: dict[frozenset, Key] = {}
        self.schedule_rows: set[int] = set()
        self.backward_reads = None
        self.peak_model = peak_model_of(problem)
        seen = set()
        for terms, lower in _families(problem, exact_demand=not ties.tied):
            mapped = self._map(terms)
            signature = (tuple(sorted(mapped.items())), lower)
            if signature not in seen:
                seen.add(signature)
                self.cp.add(sum(c * self.var(k) for k, c in mapped.items()) >= lower)
            self.storages.update(name for (kind, name), _ in terms if kind == "k")
            self.saved_tensors.update(name for (kind, name), _ in terms if kind == "s")
        self.byte_weights = self._weights(((s, problem.storage_bytes(s)) for s in sorted(self.storages)), "k")
        op_times = ((o, round(problem.op_time_s[o] / options.time_quantum_s)) for o in problem.rerunnable_ops)
        self.time_weights = self._weights(op_times, "d")
        self.byte_gcd = math.gcd(*self.byte_weights.values()) or 1

    def _map(self, terms) -> dict[Key, int]:
        mapped: dict[Key, int] = {}
        for (kind, name), coef in terms:
            key = (kind, self.ties.of(_TIE_KIND[kind], name))
            mapped[key] = mapped.get(key, 0) + coef
        return {k: c for k, c in mapped.items() if c}

    def _weights(self, pairs, kind: str) -> dict[Key, int]:
        weights: dict[Key, int] = {}
        for name, w in pairs:
            key = (kind, self.ties.of(_TIE_KIND[kind], name))
            weights[key] = weights.get(key, 0) + int(w)
        return weights

    def var(self, key: Key) -> cp_model.IntVar:
        if key not in self.vars:
            self.vars[key] = self.cp.new_bool_var(f"{_VAR_PREFIX[key[0]]}_{key[1]}")
        return self.vars[key]

    def saved_bytes_expr(self, divisor: int = 1):
        return sum((w // divisor) * self.var(k) for k, w in self.byte_weights.items())

    def time_expr(self):
        return sum(w * self.var(k) for k, w in self.time_weights.items())

    def add_saved_budget(self, activation_budget_bytes: int) -> None:
        # Saved budget: the kept storages fit in activation_budget_bytes (exact after dividing by the gcd).
        self.cp.add(self.saved_bytes_expr(self.byte_gcd) <= activation_budget_bytes // self.byte_gcd)

    def _any_saved(self, aliases) -> Key | None:
        """The variable 'one of these aliases is saved' (a save variable itself for one alias)."""
        keys = frozenset(("s", self.ties.of("tensor", a)) for a in aliases if a in self.saved_tensors)
        if len(keys) <= 1:
            return next(iter(keys), None)
        if keys not in self.any_saved:
            key = ("y", str(len(self.any_saved)))
            for k in sorted(keys):  # sorted: the same model in every process (string hashes vary)
                self.cp.add(self.var(key) >= self.var(k))
            self.any_saved[keys] = key
        return self.any_saved[keys]

    def add_peak_row(self, event: int, peak_budget) -> None:
        # Peak budget at one event: what is alive anyway plus storages alive because saved.
        const, row = self.peak_model.row(event)
        weights: dict[Key, int] = {}
        for nbytes, aliases in row.values():
            key = self._any_saved(aliases)
            if key is not None:
                weights[key] = weights.get(key, 0) + nbytes
        self.cp.add(sum(w * self.var(k) for k, w in weights.items()) + const <= peak_budget)

    def add_no_good(self, solution: Solution) -> None:
        # No-good: the rerun set of a plan the simulation rejected may not come back.
        flips = [1 - v if solution.values[k] else v for k, v in self.vars.items() if k[0] == "d"]
        self.cp.add(sum(flips) >= 1)

    def solve(self, clock: Clock, hint: Solution | None = None) -> Solution:
        solver = cp_model.CpSolver()
        workers = self.options.num_workers
        solver.parameters.num_workers = workers or (1 if len(self.vars) < 200 else 8)
        solver.parameters.random_seed = self.options.random_seed
        clock.limit_cp_sat(solver.parameters)
        self.cp.clear_hints()
        if hint is not None and hint.values:
            for key, var in self.vars.items():
                self.cp.add_hint(var, hint.values.get(key, 0))
        status = solver.status_name(solver.solve(self.cp))
        clock.charge(solver.deterministic_time + SOLVE_CHARGE_S_PER_VAR * len(self.vars))
        if status not in ("OPTIMAL", "FEASIBLE"):
            return Solution(status)
        values = {k: solver.value(v) for k, v in self.vars.items()}
        units = tuple(
            u for u in self.problem.allowed_units if values.get(("r", self.ties.of("unit", u)), 0)
        )
        return Solution(status, units, solver.objective_value, solver.best_objective_bound, values)
