"""Solver time limits that give one graph one answer on any machine, loaded or not.

A wall-clock limit makes a solver's answer depend on the machine's load: a search cut short on a
busy CI runner, or on one rank of a distributed run, returns another plan or another least peak
than the same search unhindered. A deterministic `Clock` counts CP-SAT's deterministic time (a
measure of the work done) instead, with one CP-SAT worker, so the same model with the same limit
gets the same answer. (CP-SAT's deterministic parallel search, `interleave_search`, was tried: on
the 65-unit layered graph of `tests/solvers/test_lp_bound.py`, seed 5, it found no plan in 15 s
where one worker proved the optimum in 1.0 s and the free 8-worker portfolio in 0.3 s.) Work
outside CP-SAT (simulations, building models) is charged by counts (`ILPModel.solve`), not time.
A deterministic clock still stops at `WALL_SAFETY` times its limit in wall seconds, a guard
against a hang, which no run on this project's machines reaches.
"""

from __future__ import annotations

import time

WALL_SAFETY = 20.0


class Clock:
    """A time limit, in CP-SAT's deterministic seconds (`deterministic`) or in wall seconds.

    A child clock (`child`) has its own limit within its parent's, and the deterministic time
    charged to it is charged to its parent too.
    """

    def __init__(self, limit_s: float, deterministic: bool = True, parent: Clock | None = None):
        self.limit_s = max(0.0, float(limit_s))
        self.deterministic = deterministic
        self.parent = parent
        self.used_s = 0.0
        self._wall_deadline = time.perf_counter() + self.limit_s * (WALL_SAFETY if deterministic else 1.0)

    def wall_remaining_s(self) -> float:
        left = self._wall_deadline - time.perf_counter()
        return min(left, self.parent.wall_remaining_s()) if self.parent is not None else left

    def remaining_s(self) -> float:
        """What is left of the limit (never below 0)."""
        left = self.wall_remaining_s()
        if self.deterministic:
            left = min(left, self.limit_s - self.used_s)
        if self.parent is not None:
            left = min(left, self.parent.remaining_s())
        return max(0.0, left)

    def expired(self) -> bool:
        return self.remaining_s() <= 0.0

    def charge(self, deterministic_s: float) -> None:
        """Counts work CP-SAT reports (`CpSolver.deterministic_time`) against this clock and its parents."""
        self.used_s += deterministic_s
        if self.parent is not None:
            self.parent.charge(deterministic_s)

    def child(self, limit_s: float) -> Clock:
        """A clock of at most `limit_s` within this one."""
        return Clock(min(limit_s, self.remaining_s()), self.deterministic, parent=self)

    def limit_cp_sat(self, parameters, floor_s: float = 0.01) -> None:
        """Sets a CP-SAT solve's limits (at least `floor_s`) to what is left of this clock."""
        if self.deterministic:
            parameters.max_deterministic_time = max(floor_s, self.remaining_s())
            parameters.max_time_in_seconds = max(floor_s, self.wall_remaining_s())
            parameters.num_workers = 1
        else:
            parameters.max_time_in_seconds = max(floor_s, self.remaining_s())
