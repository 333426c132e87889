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
   A layer's forward region starts at its block's first op: FSDP's all-gathers, which Thunder
   issues early, serve their layer without moving the forward into its region.
4. **Chain.** A dynamic program over the layers in forward order on the bytes saved so far
   (in buckets, each keeping one path with its exact bytes): each layer picks one entry of its
   class's menu so that ``saved by earlier layers + H <= region budget`` in every region, the
   least total time wins; a min-max variant of it gives the least-peak plan, and the chain at
   that peak its fastest plan there.
5. **Check.** The plan is simulated; a region that overshoots the budget has its budget lowered
   by the overshoot (mixed plans can miss the profiles: FSDP prefetches the next layer's
   re-gather into a region) and the chain is solved again. The fastest fitting plan of the chain,
   save-all, per-block checkpointing and a min-cut sweep is returned: never worse than those
   baselines.
6. **Bound.** A lower bound on the least recompute time of any plan under the budgets
   (`solvers.time_bound`): the largest of an LP over every event of the step (`solvers.lp_bound`),
   a fractional-knapsack bound over the peak model's events and, on graphs of fewer than
   `cp_sat_max_units` units, CP-SAT's proven bound on the whole untied model with the peak model's
   rows, within `bound_time_limit_s`. CP-SAT's plans that fit the simulated peak are candidates too
   (the polisher). The plan's `gap` is certified against the bound.
7. **Local search.** When the gap is above `gap_tolerance` and the graph is small enough
   (`polish_work_events`), `solvers.polish` searches around the plan: it can recompute what the
   chain keeps saved (units outside the layers, units crossing two of them) to pay for faster plans
   inside them.

The chain keeps units outside the layers (embedding, head) and units crossing two layers saved, as
per-block checkpointing does; only the local search recomputes them. The bound covers every plan,
so the gap says what that costs.
"""

from __future__ import annotations

import math
import os
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np

from remat_opt.core.layers import LayerError, op_signature_codes
from remat_opt.core.plan import RematPlan, derive
from remat_opt.core.problem import RecomputeProblem
from remat_opt.core.simulation import PeakTimeline, simulate_step
from remat_opt.solvers._clock import Clock
from remat_opt.solvers._common import Budgets, Evaluated, InfeasibleBudgetError, checked, evaluate_units
from remat_opt.solvers.baselines import forward_layers_and_satellites, inside_units_by_layer
from remat_opt.solvers.blocks import Ties, choose_ties
from remat_opt.solvers.ilp_model import ILPModel, ILPOptions
from remat_opt.solvers.ilp_bounds import minimum_saved_bytes
from remat_opt.solvers.time_bound import TimeBound, lower_bound
from remat_opt.solvers.mincut import mincut_sweep
from remat_opt.solvers.peak_model import peak_model_of
from remat_opt.solvers.polish import PolishOptions, affordable, polish


@dataclass(frozen=True, slots=True)
class LayeredOptions:
    """Options of `solve_layered`.

    Attributes:
        max_menu_entries: plans per layer class: half of them the first Pareto points down from
            saving everything, the rest at saved-bytes caps spread evenly below them (besides
            save-all's, per-block's and the min-cut plans' own).
        menu_time_limit_s: CP-SAT limit per menu entry.
        chain_buckets: resolution of the chain's saved-bytes axis (the peak budget over this many
            steps; each keeps the path of least time with its exact bytes, so estimates are exact
            and only paths merged in a bucket are lost).
        max_rounds: most chain solves that lower a region's budget after a simulated overshoot.
        bound_time_limit_s: CP-SAT limit for the lower bound (0: no bound, `gap` None).
        time_quantum_s: resolution of op times in CP-SAT.
        num_workers: CP-SAT workers for the bound (the menus use 1).
        deterministic: the menus' CP-SAT limits in deterministic time (`solvers._clock`; they use
            one worker anyway): the same menus, so the same chain, on a loaded machine. The bound's
            CP-SAT keeps its wall-clock limit and 8 workers.
        gap_tolerance: CP-SAT (bound and polisher) is skipped when the LP and knapsack bounds already
            certify the plan within this relative gap (as a MIP solver's relative gap tolerance).
        cp_sat_max_units: CP-SAT (bound and polisher) runs on graphs with fewer recomputable units
            than this. In `benchmarks/layered_scale.py`'s cases of 3,959 to 9,863 units (Llama-3-8B
            and 70B under FSDP, 2026-12-07) it never improved the plan or the bound within its
            limit, and building its model alone took 2-4 s per budget; it did prove one point near
            save-all of the stand-in 70B sweep. On Llama-2-7b (580 units) it proves sweep points
            optimal in seconds.
        polish_work_events: the local search's work (`solvers.polish`) from the fastest plan found,
            when the bound leaves a gap above `gap_tolerance`, in simulated events; graphs where
            that does not pay for one round (a flip of every unit) are not searched (Llama-2-7b's
            580 units: searched; Llama-3-8B's and 70B graphs under FSDP: not). 0: no search. Plans
            requests (`CostRemat`, the CLI) give 200,000 per second of their time limit (2 million
            at the default 10 s).
    """

    max_menu_entries: int = 40
    menu_time_limit_s: float = 2.0
    chain_buckets: int = 20_000
    max_rounds: int = 8
    bound_time_limit_s: float = 5.0
    time_quantum_s: float = 1e-8
    num_workers: int = 8
    gap_tolerance: float = 0.01
    cp_sat_max_units: int = 2000
    deterministic: bool = True
    polish_work_events: int = 2_000_000


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
        menu_time_s: recompute time of each menu entry in the representative layer.
        menu_reruns: per entry, the ops it reruns, as (unit position, op position in the unit):
            the same ops in every layer of the class (whose op times may differ).
    """

    layers: tuple[int, ...]
    representative: int
    units: dict[int, tuple[str, ...]]
    menu: tuple[tuple[int, ...], ...] = ()
    menu_time_s: tuple[float, ...] = ()
    menu_reruns: tuple[tuple[tuple[int, int], ...], ...] = ()

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
        layer_time_s: [layer][entry] recompute time of the entry in that layer (its own op times).
        excess_bytes: [layer][entry] most live bytes in the layer's region less what earlier
            layers save.
        head_excess_bytes: the same for the region after the last layer's forward (all layers).
        outside_saved_bytes: saved bytes of storages outside the layers (plan-independent here).
        baselines: ``(name, Evaluated)`` of save-all, per-block checkpointing and a min-cut sweep:
            plans the solver is never worse than.
        least_peak: the least-peak plan found (`least_peak_units`), once asked for.
        build_time_s: seconds spent building it.
        keys: what places a simulated event in a region (`_RegionKeys`).
    """

    n_layers: int
    classes: list[LayerClass]
    class_of: dict[int, int]
    saved_bytes: dict[int, list[int]] = field(default_factory=dict)
    layer_time_s: dict[int, list[float]] = field(default_factory=dict)
    excess_bytes: dict[int, list[int]] = field(default_factory=dict)
    head_excess_bytes: int = 0
    outside_saved_bytes: int = 0
    baselines: list = field(default_factory=list)
    least_peak: Evaluated | None = None
    build_time_s: float = 0.0
    keys: _RegionKeys | None = None

    def entries(self, layer: int) -> int:
        return len(self.classes[self.class_of[layer]].menu)

    def units(self, choice: list[int]) -> tuple[str, ...]:
        found = []
        for layer, entry in enumerate(choice):
            found.extend(self.classes[self.class_of[layer]].units_of(layer, entry))
        return tuple(found)

    def time_s(self, layer: int, entry: int) -> float:
        return self.layer_time_s[layer][entry]


_DECOMPOSITIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def decomposition_of(problem: RecomputeProblem, options: LayeredOptions = LayeredOptions()) -> Decomposition:
    """The `Decomposition` of `problem`, built on first use and kept while the problem lives.

    Raises:
        LayerError: the graph has no repeated layers.
    """
    key = (options.max_menu_entries, options.menu_time_limit_s, options.time_quantum_s, options.deterministic)
    cached = _DECOMPOSITIONS.get(problem, {})
    if key not in cached:
        cached[key] = _decompose(problem, options)
        _DECOMPOSITIONS[problem] = cached
    return cached[key]


def _layer_classes(problem: RecomputeProblem, layer_of: dict[str, int]) -> tuple[int, list[LayerClass]]:
    """``(n_layers, classes)``: layers grouped by the op signatures of their inside units."""
    graph = problem.graph
    n_layers = max(layer_of.values(), default=-1) + 1
    if n_layers < 2:
        raise LayerError("the layered solver needs at least 2 repeated layers")
    inside = inside_units_by_layer(problem, layer_of)
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


def _menu(problem: RecomputeProblem, layer_class: LayerClass, options: LayeredOptions,
          whole_plans: tuple[tuple[str, ...], ...] = ()) -> LayerClass:
    """The class's menu: the representative's exact (saved, time) Pareto front (CP-SAT), save-all's
    and per-block checkpointing's plans, and what each of `whole_plans` (plans of the whole graph,
    the min-cut sweep's) does in the representative layer: plans off that front that keep the
    layer's backward transient low."""
    own = layer_class.units[layer_class.representative]
    if not own:
        return replace(layer_class, menu=((),), menu_time_s=(0.0,), menu_reruns=((),))
    others = set(problem.allowed_units) - set(own)
    restricted = RecomputeProblem.from_graph(problem.graph, problem.op_time_s, pinned=problem.pinned | others)
    ilp_options = ILPOptions(time_quantum_s=options.time_quantum_s, num_workers=1, time_limit_s=options.menu_time_limit_s,
                             deterministic=options.deterministic)
    form = ILPModel(restricted, Ties(), ilp_options)
    saved_weight = form.saved_bytes_expr(form.byte_gcd)
    scale = sum(w // form.byte_gcd for w in form.byte_weights.values()) + 1
    form.cp.minimize(form.time_expr() * scale + saved_weight)  # least time, then least saved bytes
    plans = {(): None, own: None}
    for whole in whole_plans:
        plans.setdefault(restricted.effective_units(set(own).intersection(whole)), None)
    # Pareto points: the first steps of the front down from saving everything (the cheapest ones),
    # then points at saved-bytes caps spread evenly down to the least the layer can save.
    most, least = restricted.saved_bytes(()), restricted.saved_bytes(own)
    cap, steps = most - 1, options.max_menu_entries // 2
    for _ in range(steps):
        units = _menu_point(form, restricted, cap, options)
        if units is None:
            break
        plans.setdefault(units, None)
        cap = restricted.saved_bytes(units) - 1
    n_caps = max(1, options.max_menu_entries - len(plans))
    for spread in sorted({least + (cap - least) * i // n_caps for i in range(n_caps)}, reverse=True):
        units = _menu_point(form, restricted, spread, options)
        if units is None:
            break
        plans.setdefault(units, None)
    position = {u: i for i, u in enumerate(own)}
    op_position = {op: (i, j) for i, u in enumerate(own) for j, op in enumerate(problem.units[u].ops)}
    scored = sorted((-restricted.saved_bytes(p), restricted.extra_time_s(p), p) for p in plans)
    menu = tuple(tuple(position[u] for u in p) for _, _, p in scored)
    reruns = tuple(tuple(op_position[op] for op in restricted.demand(p)[2]) for _, _, p in scored)
    return replace(layer_class, menu=menu, menu_time_s=tuple(t for _, t, _ in scored), menu_reruns=reruns)


def _menus(problem: RecomputeProblem, classes: list[LayerClass], options: LayeredOptions,
           whole_plans: tuple[tuple[str, ...], ...]) -> list[LayerClass]:
    """Every class's `_menu`, the classes in threads: CP-SAT solves outside the GIL, and each solve's
    limit is deterministic, so the menus are the same as one by one (Llama-2-70b over 8, 2 classes:
    1.97 s against 3.24 s on 2 cores)."""
    workers = min(len(classes), os.cpu_count() or 1)
    if workers <= 1:
        return [_menu(problem, c, options, whole_plans) for c in classes]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda c: _menu(problem, c, options, whole_plans), classes))


def _layer_times_s(problem: RecomputeProblem, layer_class: LayerClass, layer: int) -> list[float]:
    """Each menu entry's recompute time in `layer`: the representative's rerun ops, by position."""
    units = layer_class.units[layer]
    return [sum(float(problem.op_time_s[problem.units[units[i]].ops[j]]) for i, j in reruns)
            for reruns in layer_class.menu_reruns]


def _menu_point(form: ILPModel, restricted: RecomputeProblem, cap_bytes: int, options: LayeredOptions):
    """The least-time (then least-saved) plan saving at most `cap_bytes`, or None. Caps must fall
    from call to call: each adds a row implying the ones before."""
    form.add_saved_budget(cap_bytes)
    solution = form.solve(Clock(options.menu_time_limit_s, options.deterministic))
    if solution.status not in ("OPTIMAL", "FEASIBLE"):
        return None
    return restricted.effective_units(solution.units)


@dataclass(frozen=True, slots=True)
class _RegionKeys:
    """What places a simulated event in a region, whatever the plan (built once per problem).

    Attributes:
        layer_of: forward op -> its layer.
        head_ops: forward ops after the last layer's forward (final norm, head, loss).
        backward_layer: backward op -> the highest layer whose forward tensors it reads (None: none).
        satellites: forward ops outside the blocks that serve one layer (`core.layers`: an FSDP
            weight's all-gather, wait and reshapes): they do not move the forward into their
            layer's region. Thunder issues them early, some at the forward's start, which would put
            every later forward event in the last layer's region.
    """

    layer_of: dict[str, int]
    head_ops: frozenset[str]
    backward_layer: dict[str, int | None]
    satellites: frozenset[str] = frozenset()

    @classmethod
    def of(cls, graph, layer_of: dict[str, int], n_layers: int,
           satellites: frozenset[str] = frozenset()) -> _RegionKeys:
        producers = graph.producers
        last = max((op.index for op in graph.forward_ops if layer_of.get(op.name) == n_layers - 1), default=-1)
        head = frozenset(op.name for op in graph.forward_ops if op.index > last and op.name not in layer_of)
        backward = {}
        for op in graph.backward_ops:
            read = [layer_of.get(producers[n].name) for n in op.inputs if n in producers]
            backward[op.name] = max((k for k in read if k is not None), default=None)
        return cls(layer_of, head, backward, satellites)


def _regions(timeline: PeakTimeline, keys: _RegionKeys, n_layers: int) -> np.ndarray:
    """The region of each simulated event: layer k's forward and backward are region k, what runs
    after the last layer's forward and before the last layer's backward (head, loss) region
    n_layers; a recomputation belongs to the op it precedes (`PeakTimeline.op_events`). The forward
    regions never fall, the backward ones never rise (a backward op's region: the highest layer
    whose forward tensors it reads)."""
    op_event, is_rerun = timeline.op_events()
    labels = [label for label, rerun in zip(timeline.labels, is_rerun) if not rerun]
    start = labels.index("backward start")
    # forward: the highest block layer so far; a head op moves on to n_layers once the last layer is reached
    forward = np.maximum.accumulate(np.array(
        [0, *(-1 if label in keys.satellites else keys.layer_of.get(label, -1) for label in labels[:start])]))[1:]
    head = np.fromiter((label in keys.head_ops for label in labels[:start]), dtype=bool, count=start)
    forward = np.maximum.accumulate(np.where(head & (forward == n_layers - 1), n_layers, forward))
    # backward: from n_layers, the least layer read so far
    read = (keys.backward_layer[label] for label in labels[start + 1:])
    backward = np.minimum.accumulate(np.array([n_layers, *(n_layers if k is None else k for k in read)]))
    return np.concatenate((forward, backward)).astype(np.int64)[op_event]


def _profile(problem: RecomputeProblem, n_layers: int, keys: _RegionKeys,
             units: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, int]:
    """``(saved per layer, excess per region (n_layers + 1), outside saved)`` of one plan, by simulation."""
    graph = problem.graph
    targets = {t for u in units for t in problem.units[u].tag_targets}
    timeline = simulate_step(graph, targets, by_kind=False)
    saved = np.zeros(n_layers, dtype=np.int64)
    outside = 0
    storages = {problem.storage_of(t) for t in derive(graph, targets).saved} - {None}
    producers = graph.producers
    for storage in storages:
        layer = keys.layer_of.get(producers[storage].name) if storage in producers else None
        if layer is None:
            outside += problem.storage_bytes(storage)
        else:
            saved[layer] += problem.storage_bytes(storage)
    regions = _regions(timeline, keys, n_layers)
    live = np.asarray(timeline.live_bytes, dtype=np.int64)
    prefix = np.concatenate(([0], np.cumsum(saved)))  # prefix[k]: saved by layers < k
    excess = np.full(n_layers + 1, np.iinfo(np.int64).min // 4, dtype=np.int64)
    np.maximum.at(excess, regions, live - prefix[regions])
    return saved, excess, outside


MINCUT = "a min-cut plan"


def _baselines(problem: RecomputeProblem, inside: tuple[str, ...]) -> list[tuple[str, Evaluated]]:
    """Save-all, per-block checkpointing (`inside`) and the min-cut sweep's plans (blocks tied), evaluated."""
    found = [("save-all", evaluate_units(problem, ())), ("per-block checkpointing", evaluate_units(problem, inside))]
    ties = choose_ties(problem, None)
    sweep = dict.fromkeys(problem.effective_units(units) for _, units in mincut_sweep(problem, 8, ties))
    found += [(MINCUT, evaluate_units(problem, units)) for units in sweep]
    return found


def _decompose(problem: RecomputeProblem, options: LayeredOptions) -> Decomposition:
    start = time.perf_counter()
    layer_of, satellites = forward_layers_and_satellites(problem.graph)
    n_layers, classes = _layer_classes(problem, layer_of)
    baselines = _baselines(problem, tuple(u for c in classes for k in c.layers for u in c.units[k]))
    whole_plans = tuple(dict.fromkeys(found.units for name, found in baselines if name == MINCUT))
    classes = _menus(problem, classes, options, whole_plans)
    class_of = {k: i for i, c in enumerate(classes) for k in c.layers}
    keys = _RegionKeys.of(problem.graph, layer_of, n_layers, satellites)
    decomposition = Decomposition(n_layers, classes, class_of, baselines=baselines, keys=keys)
    saved = {k: [0] * len(classes[class_of[k]].menu) for k in range(n_layers)}
    excess = {k: [0] * len(classes[class_of[k]].menu) for k in range(n_layers)}
    head, outside = [], []
    for entry in range(max(len(c.menu) for c in classes)):
        # one simulation for the entry-th plan of every class (the last one where a menu is shorter)
        picks = {i: min(entry, len(c.menu) - 1) for i, c in enumerate(classes)}
        units = tuple(u for i, c in enumerate(classes) for k in c.layers for u in c.units_of(k, picks[i]))
        layer_saved, layer_excess, outside_saved = _profile(problem, n_layers, keys, units)
        for i, c in enumerate(classes):
            for k in c.layers:
                saved[k][picks[i]], excess[k][picks[i]] = int(layer_saved[k]), int(layer_excess[k])
        head.append(int(layer_excess[n_layers]))
        outside.append(outside_saved)
    decomposition.saved_bytes, decomposition.excess_bytes = saved, excess
    decomposition.layer_time_s = {k: _layer_times_s(problem, classes[class_of[k]], k) for k in range(n_layers)}
    decomposition.head_excess_bytes, decomposition.outside_saved_bytes = max(head), max(outside)
    decomposition.build_time_s = time.perf_counter() - start
    return decomposition


# --------------------------------------------------------------------------------------------
# The chain
# --------------------------------------------------------------------------------------------


def _chain(decomposition: Decomposition, region_peak_bytes: np.ndarray | None, activation_budget_bytes: int | None,
           buckets: int, minimise_peak: bool = False) -> list[int] | None:
    """One menu entry per layer: least total time with each region's estimated live bytes at most
    its entry of `region_peak_bytes` (layers, then the head) and the saved bytes within
    `activation_budget_bytes` (or, `minimise_peak`, the least estimated peak); None when no choice
    fits.

    A dynamic program over the layers in forward order whose state is the bytes saved so far,
    in `buckets` steps up to the budget. Each bucket keeps one path (the least time, then the
    fewest bytes) with its exact saved bytes, and every check uses them: a path's estimated peak
    is exact (no rounding up per layer, which at 80 layers cost a step per layer, enough to rule
    out every plan but the baselines at the least peaks); merging paths in a bucket is the only
    approximation."""
    d = decomposition
    n = d.n_layers
    total_max = sum(max(d.saved_bytes[k]) for k in range(n))
    limit = max(total_max, 1) if region_peak_bytes is None else max(int(region_peak_bytes.max()), 1)
    step = max(1, math.ceil(limit / buckets))
    size = limit // step + 2
    value = np.full(size, np.inf)
    value[0] = 0.0
    exact = np.zeros(size, dtype=np.int64)  # saved bytes of each bucket's path
    index = np.arange(size)
    choices, sources = [], []
    for k in range(n):
        new = np.full(size, np.inf)
        new_exact = np.zeros(size, dtype=np.int64)
        choice = np.full(size, -1, dtype=np.int32)
        source = np.full(size, -1, dtype=np.int64)
        for entry in range(d.entries(k)):
            saved = d.saved_bytes[k][entry]
            reached = exact + saved
            if minimise_peak:
                candidate = np.maximum(value, exact + d.excess_bytes[k][entry])
            else:
                candidate = value + d.time_s(k, entry)
                if region_peak_bytes is not None:
                    candidate = np.where(exact + d.excess_bytes[k][entry] <= region_peak_bytes[k], candidate, np.inf)
            target = reached // step
            for shift in _shifts(saved, step):
                rows = np.flatnonzero((target - index == shift) & np.isfinite(candidate))
                rows = rows[rows + shift < size]
                if not len(rows):
                    continue
                to = rows + shift
                better = (candidate[rows] < new[to]) | ((candidate[rows] == new[to]) & (reached[rows] < new_exact[to]))
                to, rows = to[better], rows[better]
                new[to], new_exact[to], choice[to], source[to] = candidate[rows], reached[rows], entry, rows
        value, exact = new, new_exact
        choices.append(choice)
        sources.append(source)
    if minimise_peak:
        value = np.maximum(value, exact + d.head_excess_bytes)
    elif region_peak_bytes is not None:
        value = np.where(exact + d.head_excess_bytes <= region_peak_bytes[n], value, np.inf)
    if activation_budget_bytes is not None:
        value = np.where(exact + d.outside_saved_bytes <= activation_budget_bytes, value, np.inf)
    if not np.isfinite(value).any():
        return None
    bucket = int(np.argmin(value))
    picked = [0] * n
    for k in range(n - 1, -1, -1):
        picked[k] = int(choices[k][bucket])
        bucket = int(sources[k][bucket])
    return picked


def _shifts(saved_bytes: int, step: int) -> tuple[int, int]:
    """The bucket shifts adding `saved_bytes` can make: a path's exact bytes lie anywhere in its
    bucket, so the sum lands ``saved // step`` or one more buckets up."""
    return saved_bytes // step, saved_bytes // step + 1


# --------------------------------------------------------------------------------------------
# The solver
# --------------------------------------------------------------------------------------------


def _chain_plans(problem: RecomputeProblem, decomposition: Decomposition, budgets: Budgets,
                 options: LayeredOptions) -> list[Evaluated]:
    """The chain's plans under the budgets. Each plan is simulated; a region whose live bytes
    overshoot the peak budget has its budget in the chain lowered by the overshoot, and the chain
    is solved again; once a plan fits, the lowered budgets are raised halfway back towards where
    their region last overshot, while plans fit (at most `max_rounds` solves in all). A region's
    estimate can miss in a mixed plan (the profiles put every layer of a class on one entry): under
    FSDP, the re-gather of the next layer in the backward is prefetched into this layer's region."""
    d, evaluated = decomposition, []
    if budgets.peak_bytes is None:
        choice = _chain(d, None, budgets.activation_bytes, options.chain_buckets)
        return [] if choice is None else [evaluate_units(problem, d.units(choice))]
    region_peak = np.full(d.n_layers + 1, budgets.peak_bytes, dtype=np.int64)
    overshot_at = np.full(d.n_layers + 1, -1, dtype=np.int64)  # per region: the budget it last overshot
    resolution = max(1, budgets.peak_bytes // 2000)
    for _ in range(options.max_rounds):
        choice = _chain(d, region_peak, budgets.activation_bytes, options.chain_buckets)
        if choice is None:
            break
        units, saved_bytes, time_s = problem.assess(d.units(choice))
        layer_saved, layer_excess, _ = _profile(problem, d.n_layers, d.keys, units)
        live = np.concatenate(([0], np.cumsum(layer_saved)))[: d.n_layers + 1] + layer_excess  # per region
        evaluated.append(Evaluated(units, saved_bytes, int(live.max()), time_s))
        over = live - budgets.peak_bytes
        if over.max() > 0:
            overshot_at = np.where(over > 0, region_peak, overshot_at)
            region_peak = region_peak - np.maximum(0, over)
            continue
        raise_ = (overshot_at >= 0) & (overshot_at - region_peak > resolution)
        if not raise_.any():
            break
        region_peak = np.where(raise_, (region_peak + overshot_at) // 2, region_peak)
    return evaluated


def least_peak_units(problem: RecomputeProblem, options: LayeredOptions = LayeredOptions()) -> tuple[str, ...]:
    """The least-peak plan among the chain's plan of least estimated peak and the baselines (by
    simulation; the faster on equal peaks)."""
    return _least_peak(problem, decomposition_of(problem, options), options).units


def _least_peak(problem: RecomputeProblem, decomposition: Decomposition, options: LayeredOptions) -> Evaluated:
    if decomposition.least_peak is None:  # kept with the decomposition: a sweep asks at every budget
        choice = _chain(decomposition, None, None, options.chain_buckets, minimise_peak=True)
        candidates = [found for _, found in decomposition.baselines]
        if choice is not None:
            candidates.append(evaluate_units(problem, decomposition.units(choice)))
        least = min(candidates, key=lambda e: (e.peak_bytes, e.extra_time_s))
        # the fastest plan the chain finds at that peak (the min-max chain only minimises the peak)
        candidates += _chain_plans(problem, decomposition, Budgets(None, least.peak_bytes), options)
        decomposition.least_peak = min(candidates, key=lambda e: (e.peak_bytes, e.extra_time_s))
    return decomposition.least_peak


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
    candidates = list(decomposition.baselines)
    if peak_budget_bytes is not None:  # the chain's least-peak plan meets budgets its time-least plans miss
        candidates.append(("the least-peak plan found", _least_peak(problem, decomposition, options)))
    candidates += [("the layer chain", found) for found in _chain_plans(problem, decomposition, budgets, options)]
    best = _fastest_fitting(candidates, budgets)
    if best is not None and best[1].extra_time_s == 0:
        bound = TimeBound(0.0, True, source="nothing recomputed")
    else:
        bound = lower_bound(problem, budgets, time_limit_s=options.bound_time_limit_s,
                            cp_sat=len(problem.allowed_units) < options.cp_sat_max_units,
                            time_quantum_s=options.time_quantum_s, num_workers=options.num_workers,
                            hint_units=best[1].units if best else None,
                            incumbent_s=best[1].extra_time_s if best else None, gap_tolerance=options.gap_tolerance)
        polished = _fastest_fitting([("the relaxation (CP-SAT)", evaluate_units(problem, u)) for u in bound.candidates], budgets)
        if polished is not None and (best is None or polished[1].extra_time_s < best[1].extra_time_s):
            best = polished
        best = _searched(problem, budgets, options, bound, best)
    if best is None:
        raise _infeasible(problem, budgets, options, bound, _least_peak(problem, decomposition, options))
    source, found = best
    units, extra_s = found.units, found.extra_time_s
    bound_s = extra_s if bound.time_s is None else min(bound.time_s, extra_s)
    gap = 0.0 if extra_s <= 0 or bound.optimal and source.startswith("the relaxation") else (extra_s - bound_s) / extra_s
    if options.bound_time_limit_s <= 0 and extra_s > 0:
        gap = None
    menus = ", ".join(str(len(c.menu)) for c in decomposition.classes)
    notes = [
        f"layered: {decomposition.n_layers} layers in {len(decomposition.classes)} classes (menus of {menus} plans, "
        f"built in {decomposition.build_time_s:.2f} s); the plan is {source}'s",
        f"certified lower bound on recompute time: {bound_s * 1e3:.4f} ms ({bound.source})",
    ]
    plan = problem.plan_for(units, solver="layered", status="optimal" if gap == 0.0 else "feasible", solve_time_s=0.0,
                            gap=gap, activation_budget_bytes=activation_budget_bytes,
                            peak_budget_bytes=peak_budget_bytes, notes=notes)
    plan = replace(plan, solve_time_s=time.perf_counter() - start)
    return checked(problem, plan)


def _searched(problem: RecomputeProblem, budgets: Budgets, options: LayeredOptions, bound: TimeBound, best):
    """`best` (``(source, Evaluated)`` or None), or the faster plan the local search (`solvers.polish`)
    reaches from it: when the bound leaves a gap above `gap_tolerance` and the graph is small enough
    for one round of `polish_work_events`."""
    if best is None or bound.optimal or options.polish_work_events <= 0:
        return best
    extra_s = best[1].extra_time_s
    bound_s = 0.0 if bound.time_s is None else bound.time_s
    polish_options = PolishOptions(work_events=options.polish_work_events)
    if extra_s - bound_s <= options.gap_tolerance * extra_s or not affordable(problem, polish_options):
        return best
    found = polish(problem, best[1].units, budgets, polish_options)
    return ("the local search", found) if found.extra_time_s < extra_s else best


def _fastest_fitting(candidates, budgets: Budgets):
    """The ``(source, evaluation)`` of least time (then saved bytes) that meets `budgets`, or None."""
    fits = [c for c in candidates if budgets.admits(c[1].saved_bytes, c[1].peak_bytes)]
    return min(fits, key=lambda c: (c[1].extra_time_s, c[1].saved_bytes)) if fits else None


def _infeasible(problem: RecomputeProblem, budgets: Budgets, options: LayeredOptions, bound: TimeBound,
                least: Evaluated) -> InfeasibleBudgetError:
    """The error naming the least budget a plan was found for, and a proven lower bound."""
    if budgets.activation_bytes is not None:
        ilp_options = ILPOptions(time_limit_s=max(options.bound_time_limit_s, 1.0), tie_blocks=False,
                                 time_quantum_s=options.time_quantum_s, deterministic=options.deterministic)
        least_saved = minimum_saved_bytes(problem, ilp_options)
        if budgets.activation_bytes < least_saved:
            return InfeasibleBudgetError("activation_budget_bytes", budgets.activation_bytes, least_saved, None, "layered")
    least_peak = least.peak_bytes
    proven = int(peak_model_of(problem).const.max())
    if bound.time_s is None:  # the relaxation proved the budget infeasible
        proven = max(proven, (budgets.peak_bytes or 0) + 1)
    return InfeasibleBudgetError("peak_budget_bytes", budgets.peak_bytes, least_peak, min(proven, least_peak), "layered")
