"""Deterministic solver limits (`remat_opt.solvers._clock`): one graph, one answer on a loaded machine."""

import threading
import time

from ortools.sat.python import cp_model

from remat_opt.core.problem import RecomputeProblem
from remat_opt.solvers import _clock
from remat_opt.solvers._clock import WALL_SAFETY, Clock
from remat_opt.solvers.ilp_bounds import _MINIMA, minimum_peak
from remat_opt.solvers.ilp_model import ILPModel, ILPOptions
from remat_opt.solvers.ilp_peak import _LEARNED
from synthetic import proxy_op_time_s, stacked_blocks_graph

_SOLVE = ILPModel.solve  # unwrapped, whatever a test patches


def test_a_deterministic_clock_counts_work_not_wall_time():
    clock = Clock(1.0)
    time.sleep(0.05)
    assert clock.remaining_s() == 1.0
    child = clock.child(0.5)
    child.charge(0.3)
    assert (child.remaining_s(), clock.remaining_s()) == (0.2, 0.7)
    child.charge(0.3)
    assert child.expired() and not clock.expired()
    assert clock.child(5.0).remaining_s() == 0.4  # a child stays within its parent


def test_a_wall_clock_expires_with_time_and_ignores_charges():
    clock = Clock(0.05, deterministic=False)
    clock.charge(10.0)
    assert not clock.expired()
    time.sleep(0.06)
    assert clock.expired()


def test_cp_sat_gets_deterministic_limits_and_one_worker():
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 8
    Clock(2.0).limit_cp_sat(solver.parameters)
    assert solver.parameters.max_deterministic_time == 2.0
    assert 2.0 * WALL_SAFETY - 1 < solver.parameters.max_time_in_seconds <= 2.0 * WALL_SAFETY
    assert solver.parameters.num_workers == 1  # parallel workers race: their answer depends on the load
    wall = cp_model.CpSolver()
    wall.parameters.num_workers = 8
    Clock(2.0, deterministic=False).limit_cp_sat(wall.parameters)
    assert 1.9 < wall.parameters.max_time_in_seconds <= 2.0 and wall.parameters.num_workers == 8


def _spin(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))


def _least_peak_and_solves(problem: RecomputeProblem, options: ILPOptions, monkeypatch, spinning_threads: int):
    """`minimum_peak` and every CP-SAT solution it went through, with Python threads spinning beside
    it (they take the GIL from the solver's loop, as a loaded machine takes cores)."""
    solves = []

    def recorded(form, clock, hint=None):
        solution = _SOLVE(form, clock, hint)
        solves.append((solution.status, solution.units))
        return solution

    monkeypatch.setattr(ILPModel, "solve", recorded)
    stop = threading.Event()
    spinners = [threading.Thread(target=_spin, args=(stop,)) for _ in range(spinning_threads)]
    for thread in spinners:
        thread.start()
    _MINIMA.pop(problem, None)  # search again: `minimum_peak` keeps its answer per problem
    _LEARNED.pop(problem, None)  # from the initial rows: solves keep the rows they found per problem
    try:
        return minimum_peak(problem, options), solves
    finally:
        stop.set()
        for thread in spinners:
            thread.join()


def test_the_least_peak_search_is_the_same_when_the_machine_is_loaded(monkeypatch):
    # A search its limit cuts short. With a wall-clock limit (the deterministic=False that
    # minimum_peak overrides) the loaded run made 1 solve where the quiet one made 4 (2026-12-07);
    # with the deterministic limit both go through the same solutions. The wall-clock guard
    # (WALL_SAFETY x 0.3 s) is lifted so that a slow CI machine cannot reach it.
    monkeypatch.setattr(_clock, "WALL_SAFETY", 1e4)
    graph = stacked_blocks_graph(12)
    problem = RecomputeProblem.from_graph(graph, proxy_op_time_s(graph))
    options = ILPOptions(time_limit_s=0.3, tie_blocks=False)
    quiet, quiet_solves = _least_peak_and_solves(problem, options, monkeypatch, 0)
    assert quiet.lower_bytes < quiet.best_bytes  # cut short: the answer is the search's, not the optimum
    loaded, loaded_solves = _least_peak_and_solves(problem, options, monkeypatch, 3)
    assert (loaded, loaded_solves) == (quiet, quiet_solves)


def test_the_least_peak_is_searched_once_per_problem_and_options(monkeypatch):
    """`minimum_peak` is deterministic, so its answer is kept: a second call with the same problem and
    options makes no solve (a search through a fusion pass may ask many infeasible budgets, each
    naming the least peak); other options search again."""
    graph = stacked_blocks_graph(4)
    problem = RecomputeProblem.from_graph(graph, proxy_op_time_s(graph))
    options = ILPOptions(time_limit_s=2.0, tie_blocks=False)
    first, first_solves = _least_peak_and_solves(problem, options, monkeypatch, 0)
    assert first_solves
    solves = []
    monkeypatch.setattr(ILPModel, "solve", lambda form, clock, hint=None: solves.append(1) or _SOLVE(form, clock, hint))
    assert minimum_peak(problem, options) is first and not solves
    minimum_peak(problem, ILPOptions(time_limit_s=1.0, tie_blocks=False))
    assert solves


def test_a_tolerance_stops_the_least_peak_search_within_it(monkeypatch):
    """`minimum_peak_tolerance`: the bisection stops once the least peak found is within that
    fraction of its floor (a search through a fusion pass needs a floor, not the byte), so the
    least found is within it of the exact search's, with fewer solves."""
    graph = stacked_blocks_graph(6)
    problem = RecomputeProblem.from_graph(graph, proxy_op_time_s(graph))
    exact, exact_solves = _least_peak_and_solves(problem, ILPOptions(time_limit_s=5.0, tie_blocks=False), monkeypatch, 0)
    assert exact.lower_bytes == exact.best_bytes  # proven: the least peak
    tolerance = 0.05
    loose, loose_solves = _least_peak_and_solves(
        problem, ILPOptions(time_limit_s=5.0, tie_blocks=False, minimum_peak_tolerance=tolerance), monkeypatch, 0)
    assert loose.lower_bytes <= exact.best_bytes <= loose.best_bytes <= exact.best_bytes / (1 - tolerance)
    assert len(loose_solves) < len(exact_solves)
