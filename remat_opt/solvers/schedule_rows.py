"""Peak rows at a backward op that follow the recompute schedule (for `solvers.ilp`).

`PeakModel` rows know only what is saved. In the backward, recomputation also changes liveness:
a recomputed tensor lives from the moment its op runs (which a consumer far up the recompute
chain can pull early) to its last use, and a saved tensor read by a rerun op lives until that op
runs. For one backward op j these rows add, with the ILP's ``d`` (rerun) and ``s`` (save)
variables:

* ``q[o]`` (``ran_{op}@bwd{j}``): rerun op o has run by backward op j. Exact: ``q[o] <= d[o]``;
  ``q[o] >= d[o]`` if the backward reads an output of o by j; ``q[o] >= q[o'] + d[o] - 1`` and
  ``q[o] <= [read by j] + sum q[o']`` over rerun ops o' reading o's outputs.
* ``p[x]`` (``pending_{x}@bwd{j}``): x is still needed after j: 1 if the backward reads it later,
  else ``p[x] >= d[o'] - q[o']`` for rerun ops o' reading it.
* ``a[x]`` (``alive_{x}@bwd{j}``): ``a[x] >= s[x] + p[x] - 1`` and ``a[x] >= q[o(x)] + p[x] - 1``.
* the row: ``const[j] + sum over storages bytes * max(a[aliases]) <= peak_budget``.

The row is exact at backward op events except that a saved and a recomputed copy of one storage
count once, so it stays a lower bound on the simulated peak.
"""

from __future__ import annotations

from dataclasses import dataclass

from remat_opt.core.problem import RecomputeProblem
from remat_opt.solvers.peak_model import extend_held_reads


@dataclass(frozen=True)
class BackwardReads:
    """Direct backward reads of forward tensors, and rerun-capable consumers."""

    first: dict[str, int]
    last: dict[str, int]
    op_first: dict[str, int]
    rerun_consumers: dict[str, tuple[str, ...]]

    @classmethod
    def of(cls, problem: RecomputeProblem) -> BackwardReads:
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        for j, op in enumerate(problem.graph.backward_ops):
            for name in op.inputs:
                first.setdefault(name, j)
                last[name] = j
        extend_held_reads(problem.graph.backward_ops, last)
        op_first = {}
        for op in problem.graph.forward_ops:
            reads = [first[o] for o in op.outputs if o in first]
            if reads:
                op_first[op.name] = min(reads)
        consumers: dict[str, list[str]] = {}
        for o in problem.rerunnable_ops:
            for x in dict.fromkeys(problem.ops_by_name[o].inputs):
                consumers.setdefault(x, []).append(o)
        return cls(first, last, op_first, {x: tuple(v) for x, v in consumers.items()})


def _reads(form) -> BackwardReads:
    if getattr(form, "backward_reads", None) is None:
        form.backward_reads = BackwardReads.of(form.problem)
    return form.backward_reads


def _ran_vars(form, reads: BackwardReads, j: int) -> dict:
    """``q[o]`` for every rerun-capable op, consumers first (reverse forward order)."""
    problem, cp = form.problem, form.cp
    ran = {}
    for o in reversed(problem.rerunnable_ops):
        q, d = form.var(("q", f"{o}@bwd{j}")), form.var(("d", form.ties.of("op", o)))
        read_by_j = reads.op_first.get(o, j + 1) <= j
        readers = (c for out in problem.ops_by_name[o].outputs for c in reads.rerun_consumers.get(out, ()))
        later = [ran[c] for c in readers if c in ran]
        cp.add(q <= d)
        if read_by_j:
            cp.add(q >= d)
        else:
            cp.add(q <= sum(later))
        for c in later:
            cp.add(q >= c + d - 1)
        ran[o] = q
    return ran


def _alive_var(form, reads: BackwardReads, x: str, j: int, ran: dict):
    """``a[x]``, or None when x cannot be alive at backward op j."""
    producer = form.problem.graph.producers[x].name
    save = form.var(("s", form.ties.of("tensor", x))) if x in form.saved_tensors else None
    consumers = [c for c in reads.rerun_consumers.get(x, ()) if c in ran]
    read_later = reads.last.get(x, -1) > j
    if (save is None and producer not in ran) or (not read_later and not consumers):
        return None
    pending = 1
    if not read_later:
        pending = form.var(("p", f"{x}@bwd{j}"))
        for c in consumers:
            form.cp.add(pending >= form.var(("d", form.ties.of("op", c))) - ran[c])
    alive = form.var(("a", f"{x}@bwd{j}"))
    if save is not None:
        form.cp.add(alive >= save + pending - 1)
    if producer in ran:
        form.cp.add(alive >= ran[producer] + pending - 1)
    return alive


def add_schedule_row(form, j: int, peak_budget) -> None:
    """Adds the schedule-aware peak row at backward op `j` to an ILP formulation."""
    problem = form.problem
    reads = _reads(form)
    model = form.peak_model
    event = len(problem.graph.forward_ops) + 1 + j
    ran = _ran_vars(form, reads, j)
    by_storage: dict[str, list] = {}
    for x in problem.forward_tensors:
        storage = problem.storage_of(x)
        if storage is None or any(a <= event <= b for a, b in model.covered.get(storage, ())):
            continue
        alive = _alive_var(form, reads, x, j, ran)
        if alive is not None:
            by_storage.setdefault(storage, []).append(alive)
    terms = []
    for storage, alive in by_storage.items():
        if len(alive) > 1:
            any_alive = form.var(("z", f"{storage}@bwd{j}"))
            for a in alive:
                form.cp.add(any_alive >= a)
            alive = [any_alive]
        terms.append(model.nbytes[storage] * alive[0])
    form.cp.add(sum(terms) + int(model.const[event]) <= peak_budget)
