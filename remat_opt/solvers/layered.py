"""`solve_layered`: plans for graphs of repeated layers by decomposition, with a certified gap.

What the planners that reach 70B graphs do (Rockmate, autoparallel; `../shared/DESIGN.md` section 10):
never solve the whole graph at once.

1. **Layers and classes.** `inside_units_by_layer` gives each layer the units it can recompute
   without touching another layer; layers whose units have equal op signatures form a class, and a
   representative layer of each class stands for all of them (units map by position).
2. **Menus.** For each class, the exact Pareto front of (saved bytes, recompute time) of its
   representative layer's plans: CP-SAT on the problem where only that layer's units may be
   recomputed, minimising time then saved bytes under a falling cap on saved bytes.
3. **Profiles.** One step simulation per (class, menu entry), every layer of the class on that
   entry: per layer, the bytes it saves (`S`) and the most live bytes in its region of the step
   beyond what earlier layers save (`H`, its forward and its backward with their recomputations).
4. **Chain.** A dynamic program over the layers in forward order on the bytes saved so far
   (discretised upwards, so conservative): each layer picks one entry of its class's menu so that
   ``saved by earlier layers + H <= model peak`` in every region, the least total time wins; a
   min-max variant of it gives the least-peak plan.
5. **Check.** The plan is simulated; an overshoot lowers the model peak by it and the chain is
   solved again. The fastest fitting plan of the chain, save-all and per-block checkpointing is
   returned: never worse than those baselines.
6. **Bound.** A lower bound on the least recompute time of any plan under the budgets: CP-SAT on
   the whole untied model with the peak model's rows (`solvers.peak_model`, a lower bound on the
   simulated peak at each event, so every fitting plan satisfies them), rows added where the
   relaxation's answer breaks the peak model, within `bound_time_limit_s`. Its plans that fit the
   simulated peak are candidates too (the polisher). The plan's `gap` is certified against it.

Units outside the layers (embedding, head) and units crossing two layers stay saved, as in
per-block checkpointing; the bound covers every plan, so the gap says what that costs.
"""

from __future__ import annotations

import math
import time
import weakref
from dataclasses import dataclass, field, replace

import numpy as np

from remat_opt.core.layers import LayerError, op_signature_codes
from remat_opt.core.plan import RematPlan, derive
from remat_opt.core.problem import RecomputeProblem
from remat_opt.core.simulation import simulate_step
from remat_opt.solvers._common import Budgets, InfeasibleBudgetError, checked
from remat_opt.solvers.baselines import forward_layers, inside_units_by_layer
from remat_opt.solvers.blocks import Ties
from remat_opt.solvers.ilp_model import ILPModel, ILPOptions
from remat_opt.solvers.ilp_bounds import minimum_saved_bytes
from remat_opt.solvers.ilp_peak import _simulated_violation, model_live_bytes
from remat_opt.solvers.schedule_rows import add_schedule_row
from remat_opt.solvers.peak_model import peak_model_of


@dataclass(frozen=True, slots=True)
class LayeredOptions:
    """Options of `solve_layered`.

    Attributes:
        max_menu_entries: most plans per layer class (the Pareto front is cut at its smallest saved
            bytes after this many).
        menu_time_limit_s: CP-SAT limit per menu entry.
        chain_buckets: resolution of the chain's saved-bytes axis (the peak budget over this many
            steps; sizes round up, so the chain is conservative by at most one step per layer).
        max_rounds: most chain solves that lower the model peak after a simulated overshoot.
        bound_time_limit_s: CP-SAT limit for the lower bound (0: no bound, `gap` None).
        time_quantum_s: resolution of op times in CP-SAT.
        num_workers: CP-SAT workers for the bound (the menus use 1).
    """

    max_menu_entries: int = 24
    menu_time_limit_s: float = 2.0
    chain_buckets: int = 20_000
    max_rounds: int = 8
    bound_time_limit_s: float = 5.0
    time_quantum_s: float = 1e-8
    num_workers: int = 8


# --------------------------------------------------------------------------------------------
# Layers, classes, menus and profiles (per problem, cached)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LayerClass:
    """Layers whose recomputable units match by position; `representative` stands for them.

    Attributes:
        layers: the layers of the class, ascending.
        representative: the layer whose menu the class uses.
        units: per layer of the class, its inside units in forward order (equal length).
        menu: plans of the representative as unit positions, from saving most to saving least.
        menu_time_s: recompute time of each menu entry in one layer.
    """

    layers: tuple[int, ...]
    representative: int
    units: dict[int, tuple[str, ...]]
    menu: tuple[tuple[int, ...], ...] = ()
    menu_time_s: tuple[float, ...] = ()

    def units_of(self, layer: int, entry: int) -> tuple[str, ...]:
        return tuple(self.units[layer][i] for i in self.menu[entry])


@dataclass
class Decomposition:
    """What the chain needs, built once per problem (`decomposition_of`).

    Attributes:
        n_layers: layers in the chain (0 .. n_layers - 1); region n_layers is the head.
        classes: the layer classes.
        class_of: layer -> index into `classes`.
        saved_bytes: [layer][entry] bytes the layer saves (storages it writes).
        excess_bytes: [layer][entry] most live bytes in the layer's region less what earlier
            layers save.
        head_excess_bytes: the same for the region after the last layer's forward (all layers).
        outside_saved_bytes: saved bytes of storages outside the layers (plan-independent here).
        build_time_s: seconds spent building it.
    """

    n_layers: int
    classes: list[LayerClass]
    class_of: dict[int, int]
    saved_bytes: dict[int, list[int]] = field(default_factory=dict)
    excess_bytes: dict[int, list[int]] = field(default_factory=dict)
    head_excess_bytes: int = 0
    outside_saved_bytes: int = 0
    build_time_s: float = 0.0

    def entries(self, layer: int) -> int:
        return len(self.classes[self.class_of[layer]].menu)

    def units(self, choice: list[int]) -> tuple[str, ...]:
        found = []
        for layer, entry in enumerate(choice):
            found.extend(self.classes[self.class_of[layer]].units_of(layer, entry))
        return tuple(found)

    def time_s(self, layer: int, entry: int) -> float:
        return self.classes[self.class_of[layer]].menu_time_s[entry]


_DECOMPOSITIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def decomposition_of(problem: RecomputeProblem, options: LayeredOptions = LayeredOptions()) -> Decomposition:
    """The `Decomposition` of `problem`, built on first use and kept while the problem lives.

    Raises:
        LayerError: the graph has no repeated layers.
    """
    key = (options.max_menu_entries, options.menu_time_limit_s, options.time_quantum_s)
    cached = _DECOMPOSITIONS.get(problem, {})
    if key not in cached:
        cached[key] = _decompose(problem, options)
        _DECOMPOSITIONS[problem] = cached
    return cached[key]


def _layer_classes(problem: RecomputeProblem) -> tuple[int, list[LayerClass]]:
    """``(n_layers, classes)``: layers grouped by the op signatures of their inside units."""
    graph = problem.graph
    layer_of = forward_layers(graph)
    n_layers = max(layer_of.values(), default=-1) + 1
    if n_layers < 2:
        raise LayerError("the layered solver needs at least 2 repeated layers")
    inside = inside_units_by_layer(problem)
    codes = dict(zip((op.name for op in graph.forward_ops), op_signature_codes(graph, graph.forward_ops).tolist()))
    groups: dict[tuple, list[int]] = {}
    for layer in range(n_layers):
        units = inside.get(layer, ())
        signature = tuple(tuple(codes[o] for o in problem.units[u].ops) for u in units)
        groups.setdefault(signature, []).append(layer)
    classes = [
        LayerClass(layers=tuple(layers), representative=layers[len(layers) // 2],
                   units={k: inside.get(k, ()) for k in layers})
        for layers in groups.values()
    ]
    return n_layers, classes


def _menu(problem: RecomputeProblem, layer_class: LayerClass, options: LayeredOptions) -> LayerClass:
    """The class's menu: the representative's exact (saved, time) Pareto front (CP-SAT), save-all's
    and per-block checkpointing's plans included."""
    own = layer_class.units[layer_class.representative]
    if not own:
        return replace(layer_class, menu=((),), menu_time_s=(0.0,))
    others = set(problem.allowed_units) - set(own)
    restricted = RecomputeProblem.from_graph(problem.graph, problem.op_time_s, pinned=problem.pinned | others)
    ilp_options = ILPOptions(time_quantum_s=options.time_quantum_s, num_workers=1, time_limit_s=options.menu_time_limit_s)
    form = ILPModel(restricted, Ties(), ilp_options)
    saved_weight = form.saved_bytes_expr(form.byte_gcd)
    scale = sum(w // form.byte_gcd for w in form.byte_weights.values()) + 1
    form.cp.minimize(form.time_expr() * scale + saved_weight)  # least time, then least saved bytes
    plans = {(): None, own: None}
    cap = restricted.saved_bytes(())
    while len(plans) < options.max_menu_entries + 1 and cap > 0:
        form.add_saved_budget(cap - 1)
        solution = form.solve(time.perf_counter() + options.menu_time_limit_s)
        if solution.status not in ("OPTIMAL", "FEASIBLE"):
            break
        units = restricted.effective_units(solution.units)
        plans.setdefault(units, None)
        cap = restricted.saved_bytes(units)
    position = {u: i for i, u in enumerate(own)}
    scored = sorted((-restricted.saved_bytes(p), restricted.extra_time_s(p), p) for p in plans)
    menu = tuple(tuple(position[u] for u in p) for _, _, p in scored)
    return replace(layer_class, menu=menu, menu_time_s=tuple(t for _, t, _ in scored))


def _regions(graph, labels: tuple[str, ...], layer_of: dict[str, int], n_layers: int) -> np.ndarray:
    """The region of each simulated event: layer k's forward and backward are region k, what runs
    after the last layer's forward and before the last layer's backward (head, loss) region
    n_layers; a recomputation belongs to the op it precedes. The forward regions never fall, the
    backward ones never rise (a backward op's region: the highest layer whose forward tensors it reads)."""
    producer = graph.producers
    backward_ops = {op.name: op for op in graph.backward_ops}
    forward_index = {op.name: op.index for op in graph.forward_ops}
    last_layer_op = max((op.index for op in graph.forward_ops if layer_of.get(op.name) == n_layers - 1), default=-1)
    regions = np.empty(len(labels), dtype=np.int64)
    region, backward, pending = 0, False, []
    for i, label in enumerate(labels):
        if label.startswith("recompute:"):
            pending.append(i)
            continue
        if label == "backward start":
            backward, region = True, n_layers
        elif backward:
            read = [layer_of.get(producer[n].name) for n in backward_ops[label].inputs if n in producer]
            read = [k for k in read if k is not None]
            if read:
                region = min(region, max(read))
        else:
            op_layer = layer_of.get(label)
            if op_layer is not None:
                region = max(region, op_layer)
            elif region == n_layers - 1 and forward_index[label] > last_layer_op:
                region = n_layers
        regions[[*pending, i]] = region
        pending = []
    regions[pending] = region
    return regions


def _profile(problem: RecomputeProblem, decomposition: Decomposition, layer_of: dict[str, int],
             units: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, int, int]:
    """``(saved per layer, excess per region (n_layers + 1), outside saved)`` of one plan, by simulation."""
    graph, n = problem.graph, decomposition.n_layers
    targets = {t for u in units for t in problem.units[u].tag_targets}
    timeline = simulate_step(graph, targets)
    saved = np.zeros(n, dtype=np.int64)
    outside = 0
    storages = {problem.storage_of(t) for t in derive(graph, targets).saved} - {None}
    producers = graph.producers
    for storage in storages:
        layer = layer_of.get(producers[storage].name) if storage in producers else None
        if layer is None:
            outside += problem.storage_bytes(storage)
        else:
            saved[layer] += problem.storage_bytes(storage)
    regions = _regions(graph, timeline.labels, layer_of, n)
    live = np.asarray(timeline.live_bytes, dtype=np.int64)
    prefix = np.concatenate(([0], np.cumsum(saved)))  # prefix[k]: saved by layers < k
    excess = np.full(n + 1, np.iinfo(np.int64).min // 4, dtype=np.int64)
    np.maximum.at(excess, regions, live - prefix[regions])
    return saved, excess, outside, timeline.peak_bytes


def _decompose(problem: RecomputeProblem, options: LayeredOptions) -> Decomposition:
    start = time.perf_counter()
    n_layers, classes = _layer_classes(problem)
    classes = [_menu(problem, c, options) for c in classes]
    class_of = {k: i for i, c in enumerate(classes) for k in c.layers}
    decomposition = Decomposition(n_layers, classes, class_of)
    layer_of = forward_layers(problem.graph)
    saved = {k: [0] * len(classes[class_of[k]].menu) for k in range(n_layers)}
    excess = {k: [0] * len(classes[class_of[k]].menu) for k in range(n_layers)}
    head, outside = [], []
    for c in classes:
        for entry in range(len(c.menu)):
            units = tuple(u for k in c.layers for u in c.units_of(k, entry))
            layer_saved, layer_excess, outside_saved, _ = _profile(problem, decomposition, layer_of, units)
            for k in c.layers:
                saved[k][entry], excess[k][entry] = int(layer_saved[k]), int(layer_excess[k])
            head.append(int(layer_excess[n_layers]))
            outside.append(outside_saved)
    decomposition.saved_bytes, decomposition.excess_bytes = saved, excess
    decomposition.head_excess_bytes, decomposition.outside_saved_bytes = max(head), max(outside)
    decomposition.build_time_s = time.perf_counter() - start
    return decomposition


# --------------------------------------------------------------------------------------------
# The chain
# --------------------------------------------------------------------------------------------


def _chain(decomposition: Decomposition, model_peak_bytes: int | None, activation_budget_bytes: int | None,
           buckets: int, minimise_peak: bool = False) -> list[int] | None:
    """One menu entry per layer: least total time with every region's estimated live bytes at most
    `model_peak_bytes` and the saved bytes within `activation_budget_bytes` (or, `minimise_peak`,
    the least estimated peak); None when no choice fits."""
    d = decomposition
    n = d.n_layers
    total_max = sum(max(d.saved_bytes[k]) for k in range(n))
    limit = max(total_max, 1) if model_peak_bytes is None else max(model_peak_bytes, 1)
    step = max(1, math.ceil(limit / buckets))
    size = limit // step + 2
    inf = np.inf
    value = np.full(size, inf)
    value[0] = 0.0
    choices = []
    index = np.arange(size)
    for k in range(n):
        new = np.full(size, inf)
        choice = np.full(size, -1, dtype=np.int32)
        for entry in range(d.entries(k)):
            shift = -(-d.saved_bytes[k][entry] // step)
            if shift >= size:
                continue
            source = value[: size - shift]
            peak_here = index[: size - shift] * step + d.excess_bytes[k][entry]
            if minimise_peak:
                candidate = np.maximum(source, peak_here)
            else:
                candidate = source + d.time_s(k, entry)
                if model_peak_bytes is not None:
                    candidate = np.where(peak_here <= model_peak_bytes, candidate, inf)
            target = new[shift:]
            better = candidate < target
            target[better] = candidate[better]
            choice[shift:][better] = entry
        value, choices = new, [*choices, choice]
    totals = index * step
    if minimise_peak:
        value = np.maximum(value, totals + d.head_excess_bytes)
    elif model_peak_bytes is not None:
        value = np.where(totals + d.head_excess_bytes <= model_peak_bytes, value, inf)
    if activation_budget_bytes is not None:
        value = np.where(totals + d.outside_saved_bytes <= activation_budget_bytes, value, inf)
    if not np.isfinite(value).any():
        return None
    bucket = int(np.argmin(value))
    picked = [0] * n
    for k in range(n - 1, -1, -1):
        entry = int(choices[k][bucket])
        picked[k] = entry
        bucket -= -(-d.saved_bytes[k][entry] // step)
    return picked


# --------------------------------------------------------------------------------------------
# The lower bound (and polisher)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TimeBound:
    """A proven lower bound on the least recompute time under the budgets, and fitting plans met.

    Attributes:
        time_s: the bound (0.0 when nothing was proven); None: the budgets are proven infeasible.
        optimal: the relaxation's optimum was found and fits the simulated peak (then it is optimal).
        candidates: unit sets the relaxation returned (check them against the simulation).
    """

    time_s: float | None
    optimal: bool = False
    candidates: tuple[tuple[str, ...], ...] = ()


def lower_bound(problem: RecomputeProblem, budgets: Budgets, options: LayeredOptions,
                hint_units: tuple[str, ...] | None = None) -> TimeBound:
    """Least time of the untied CP-SAT model under the peak model's rows (a relaxation of the
    simulated peak): its proven bound is a lower bound on every plan's time under `budgets`."""
    if options.bound_time_limit_s <= 0:
        return TimeBound(0.0)
    deadline = time.perf_counter() + options.bound_time_limit_s
    ilp_options = ILPOptions(time_quantum_s=options.time_quantum_s, num_workers=options.num_workers)
    form = ILPModel(problem, Ties(), ilp_options)
    if budgets.activation_bytes is not None:
        form.add_saved_budget(budgets.activation_bytes)
    rows: set[int] = set()
    if budgets.peak_bytes is not None:
        model = peak_model_of(problem)
        rows = {int(np.argmax(model_live_bytes(problem, ()))), int(np.argmax(model.const)), len(problem.graph.forward_ops)}
        if hint_units is not None:
            rows.add(int(np.argmax(model_live_bytes(problem, hint_units))))
        for event in rows:
            form.add_peak_row(event, budgets.peak_bytes)
    form.cp.minimize(form.time_expr())
    # Op times are rounded to the quantum in the model: a rounded-up time could lift the bound above
    # the true least time by at most the sum of the roundings up.
    quantum = options.time_quantum_s
    slack_s = sum(max(0.0, round(problem.op_time_s[o] / quantum) * quantum - problem.op_time_s[o])
                  for o in problem.rerunnable_ops)
    best_bound, candidates, hint = 0.0, [], None
    while time.perf_counter() < deadline:
        # Half the time left per solve: a plan that breaks a row then still leaves time to add it.
        solution = form.solve(min(deadline, time.perf_counter() + max(0.5, (deadline - time.perf_counter()) / 2)), hint)
        if solution.status == "INFEASIBLE":
            return TimeBound(None)
        if solution.status not in ("OPTIMAL", "FEASIBLE"):
            break
        best_bound = max(best_bound, solution.bound * options.time_quantum_s - slack_s)
        candidates.append(solution.units)
        hint = solution
        if budgets.peak_bytes is None:
            return TimeBound(max(0.0, best_bound), solution.status == "OPTIMAL", tuple(candidates))
        live = model_live_bytes(problem, solution.units)
        event = int(np.argmax(live))
        if live[event] > budgets.peak_bytes and event not in rows:
            rows.add(event)
            form.add_peak_row(event, budgets.peak_bytes)
            continue
        fits, over, _ = _simulated_violation(problem, solution.units, budgets.peak_bytes)
        if fits:
            return TimeBound(max(0.0, best_bound), solution.status == "OPTIMAL", tuple(candidates))
        new_rows = [j for j in over if j not in form.schedule_rows]
        if new_rows:  # the recompute schedule's liveness at that backward op: still a lower bound
            form.schedule_rows.add(new_rows[0])
            add_schedule_row(form, new_rows[0], budgets.peak_bytes)
        else:  # this plan does not fit: cutting it off keeps every fitting plan
            form.add_no_good(solution)
            hint = None
    return TimeBound(max(0.0, best_bound), False, tuple(candidates))


# --------------------------------------------------------------------------------------------
# The solver
# --------------------------------------------------------------------------------------------


def _evaluate(problem: RecomputeProblem, units) -> tuple[tuple[str, ...], int, int, float]:
    """``(units, saved bytes, simulated peak, extra time)`` of a unit set."""
    units = problem.effective_units(units)
    targets = {t for u in units for t in problem.units[u].tag_targets}
    peak = simulate_step(problem.graph, targets).peak_bytes
    return units, problem.saved_bytes(units), peak, problem.extra_time_s(units)


def _chain_plans(problem: RecomputeProblem, decomposition: Decomposition, budgets: Budgets,
                 options: LayeredOptions) -> list[tuple[tuple[str, ...], int, int, float]]:
    """The chain's plans under the budgets: the model peak lowered by each simulated overshoot,
    then raised halfway back towards the last overshooting value while plans fit."""
    evaluated = []
    model_peak, high = budgets.peak_bytes, None
    for _ in range(options.max_rounds):
        choice = _chain(decomposition, model_peak, budgets.activation_bytes, options.chain_buckets)
        if choice is None:
            break
        found = _evaluate(problem, decomposition.units(choice))
        evaluated.append(found)
        if budgets.peak_bytes is None:
            break
        over = found[2] - budgets.peak_bytes
        if over > 0:
            high = model_peak
            model_peak -= over
        elif high is None or high - model_peak <= max(1, budgets.peak_bytes // 2000):
            break
        else:
            model_peak = (model_peak + high) // 2
    return evaluated


def least_peak_units(problem: RecomputeProblem, options: LayeredOptions = LayeredOptions()) -> tuple[str, ...]:
    """The chain's plan of least estimated peak (checked by simulation against per-block
    checkpointing, the least-peak plan of the two is returned)."""
    decomposition = decomposition_of(problem, options)
    choice = _chain(decomposition, None, None, options.chain_buckets, minimise_peak=True)
    candidates = [decomposition.units(choice)] if choice is not None else []
    candidates.append(tuple(u for c in decomposition.classes for k in c.layers for u in c.units[k]))
    return min((_evaluate(problem, units) for units in candidates), key=lambda e: (e[2], e[3]))[0]


def solve_layered(
    problem: RecomputeProblem,
    *,
    activation_budget_bytes: int | None = None,
    peak_budget_bytes: int | None = None,
    options: LayeredOptions = LayeredOptions(),
) -> RematPlan:
    """Least recompute time under a saved-bytes and/or simulated-peak budget, by decomposition over
    the repeated layers (see the module docstring), with a certified gap.

    Returns:
        A checked `RematPlan`; `gap` is certified by `lower_bound` (None when no bound was computed).

    Raises:
        LayerError: the graph has no repeated layers (use ``solver="ilp"``).
        InfeasibleBudgetError: no plan found meets the budgets; the message names the least found and
            a proven lower bound.
    """
    start = time.perf_counter()
    budgets = Budgets(activation_budget_bytes, peak_budget_bytes)
    decomposition = decomposition_of(problem, options)
    inside = tuple(u for c in decomposition.classes for k in c.layers for u in c.units[k])
    candidates = [("save-all", _evaluate(problem, ())), ("per-block checkpointing", _evaluate(problem, inside))]
    candidates += [("the layer chain", found) for found in _chain_plans(problem, decomposition, budgets, options)]
    best = _fastest_fitting(candidates, budgets)
    if best is not None and best[1][3] == 0:
        bound = TimeBound(0.0, True)  # nothing recomputed: optimal
    else:
        bound = lower_bound(problem, budgets, options, best[1][0] if best else None)
        polished = _fastest_fitting([("the relaxation (CP-SAT)", _evaluate(problem, u)) for u in bound.candidates], budgets)
        if polished is not None and (best is None or polished[1][3] < best[1][3]):
            best = polished
    if best is None:
        raise _infeasible(problem, budgets, options, bound)
    source, (units, _, _, extra_s) = best
    bound_s = extra_s if bound.time_s is None else min(bound.time_s, extra_s)
    gap = 0.0 if extra_s <= 0 or bound.optimal and source.startswith("the relaxation") else (extra_s - bound_s) / extra_s
    if options.bound_time_limit_s <= 0 and extra_s > 0:
        gap = None
    menus = ", ".join(str(len(c.menu)) for c in decomposition.classes)
    notes = [
        f"layered: {decomposition.n_layers} layers in {len(decomposition.classes)} classes (menus of {menus} plans, "
        f"built in {decomposition.build_time_s:.2f} s); the plan is {source}'s",
        f"certified lower bound on recompute time: {bound_s * 1e3:.4f} ms (CP-SAT relaxation with the peak model's rows)",
    ]
    plan = problem.plan_for(units, solver="layered", status="optimal" if gap == 0.0 else "feasible", solve_time_s=0.0,
                            gap=gap, activation_budget_bytes=activation_budget_bytes,
                            peak_budget_bytes=peak_budget_bytes, notes=notes)
    plan = replace(plan, solve_time_s=time.perf_counter() - start)
    return checked(problem, plan)


def _fastest_fitting(candidates, budgets: Budgets):
    """The ``(source, evaluation)`` of least time (then saved bytes) that meets `budgets`, or None."""
    fits = [c for c in candidates if budgets.admits(c[1][1], c[1][2])]
    return min(fits, key=lambda c: (c[1][3], c[1][1])) if fits else None


def _infeasible(problem: RecomputeProblem, budgets: Budgets, options: LayeredOptions,
                bound: TimeBound) -> InfeasibleBudgetError:
    """The error naming the least budget a plan was found for, and a proven lower bound."""
    if budgets.activation_bytes is not None:
        ilp_options = ILPOptions(time_limit_s=max(options.bound_time_limit_s, 1.0), tie_blocks=False,
                                 time_quantum_s=options.time_quantum_s)
        least = minimum_saved_bytes(problem, ilp_options)
        if budgets.activation_bytes < least:
            return InfeasibleBudgetError("activation_budget_bytes", budgets.activation_bytes, least, None, "layered")
    units = least_peak_units(problem, options)
    least_peak = simulate_step(problem.graph, {t for u in units for t in problem.units[u].tag_targets}).peak_bytes
    proven = int(peak_model_of(problem).const.max())
    if bound.time_s is None:  # the relaxation proved the budget infeasible
        proven = max(proven, (budgets.peak_bytes or 0) + 1)
    return InfeasibleBudgetError("peak_budget_bytes", budgets.peak_bytes, least_peak, min(proven, least_peak), "layered")
