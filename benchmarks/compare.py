"""Thunder, Thunder auto-recompute, CostRemat and torch.compile activation budgets, side by side.

    .venv/bin/python benchmarks/compare.py                                  # full run -> docs/compare.md
    .venv/bin/python benchmarks/compare.py --quick --out /tmp/compare.md    # smoke run, 1-2 minutes

For each litgpt config (shrunk to ``--n-layer`` layers of width ``--width``, 4 heads, MLP 4x, vocab
256, one sequence of ``--seq`` tokens, fp32, CPU) one model instance and one token batch are built,
and every system below trains on them. The loss is ``model(idx).float().sum()``.

Systems:
    thunder              ``thunder.jit(model, executors=executors_for("fused-sdpa"))``.
    thunder auto         the same with ``auto_recompute_intermediates=True``.
    CostRemat            the same executors with ``transforms=[CostRemat(activation_budget_gb=b,
                         device="cpu")]`` at ``--budgets`` budgets ``b`` evenly spaced from the least
                         saved bytes any plan reaches to save-all (``remat_opt.pareto_curve``).
    thunder tc           ``thunder.jit(model, executors=executors_for("torch-compile"))``: Thunder's own
                         torch.compile executor (TorchCompile fusion regions on CPU, as nvFuser's on
                         a GPU; Thunder's rematerialization runs on them), the fair peer of torch.compile.
    CostRemat tc         the same executors with CostRemat, which plans through that executor's fusion
                         pass (`remat_opt.planning.fusion_search`), at the least saved bytes it reaches and at
                         25, 50 and 75% of ``thunder tc``'s own save-all (``--no-torch-compile-executor``
                         leaves both out).
    torch.compile        ``torch.compile(forward, backend="inductor", fullgraph=True)`` with
                         ``torch._functorch.config.activation_memory_budget = r`` and
                         ``activation_memory_budget_solver`` ``"dp"`` and ``"ilp"``, where ``r`` is a
                         CostRemat plan's saved bytes / save-all saved bytes (every ``r < 1``), plus
                         ``r = 1.0`` (torch's own save-all reference; the solver is not used there).
                         Dynamo is reset before each config; each run compiles its own copy of a
                         two-line forward function (its own code object, so Dynamo's caches never mix
                         runs and all runs can be timed interleaved), with the AOTAutograd cache off
                         (its key ignores a built-in solver's name, so an "ilp" run could reuse a
                         "dp" partition). The budget column gives ``r`` and how many times the
                         solver's knapsack function ran during that compilation (0: torch decided
                         without it).

How each column is obtained:
    saved MB         ``remat_opt.validation.measure.measure_saved_bytes(...).activation_bytes``: the bytes of the
                     distinct storages that autograd holds for backward when the forward returns
                     (``saved_tensors_hooks``), parameters and inputs excluded. MB = 10^6 bytes.
    peak MB          ``remat_opt.validation.measure.measure_step_peak_bytes``: the CPU profiler's allocation
                     events of one training step (after one warm-up step, ``.grad`` set to None)
                     replayed in order; parameters, input and the new gradients included.
    step ms          median wall time of one step (forward, loss, backward; ``.grad`` set to None
                     before it) over ``--reps`` timed rounds after ``--warmup`` rounds. A round runs
                     one step of every system of the config, starting at a rotating position, with
                     Python's garbage collector run between rounds and off inside them.
    step-time ratio  median over the timed rounds of (this system's step time / the step time, in
                     the same round, of the same family's save-all run: ``thunder`` for Thunder
                     systems, ``torch.compile`` at 1.00 for torch systems). Pairing within a round
                     cancels machine drift slower than a round. "+-" is the standard error of that
                     median (sqrt(pi/2) * IQR/1.349 / sqrt(reps) of the per-round ratios). Two
                     ratios differ "beyond noise" when the difference exceeds twice the root sum of
                     squares of their errors.
    recompute MFLOPs measured FLOPs of the backward pass minus those of the same family's save-all
                     run: the backward (``loss.backward()``) runs under
                     ``torch.utils.flop_counter.FlopCounterMode``, which counts the aten matmul-class
                     ops (mm, addmm, bmm, ...) and SDPA; this script adds torch's own SDPA formulas for
                     the CPU flash-attention kernels (``_scaled_dot_product_flash_attention_for_cpu``
                     and its backward), which the counter lacks. Elementwise ops and reductions are
                     not counted (they cost memory traffic, not FLOPs); a FLOP is one multiply or
                     one add.
    plan MFLOPs      CostRemat only: the FLOPs of the forward ops its plan re-runs in the backward
                     (``plan.recompute_ops``), by the ``costmodels`` formulas, which count every op,
                     elementwise included.
    compile s        wall time of the first step (tracing, planning, compilation, one step). For
                     torch runs it includes hits in inductor's on-disk FX graph and kernel caches
                     (keyed by the partitioned graphs), so a run whose partition equals an earlier
                     one compiles in a second or two.
    grads            every parameter gradient after one step against eager PyTorch's
                     (``torch.testing.assert_close``, rtol 1e-4, atol 1e-5 times the largest
                     reference gradient of that parameter, at least 1e-5); a mismatch is printed,
                     marked MISMATCH and makes the script exit with status 1. So does a CostRemat
                     run whose measured saved bytes differ from its plan's or exceed its budget.

At matched saved bytes: for each CostRemat run and each torch solver, the torch run (the solver's
runs and the 1.00 reference) whose measured saved bytes are closest, and torch's step ratio and
recompute FLOPs linearly interpolated along its runs sorted by saved bytes at CostRemat's saved bytes.
The verdict compares CostRemat with the interpolated point (same saved bytes by construction): recompute
FLOPs fewer, equal (to 0.1 MFLOPs, the table's resolution) or more, and step ratio within or beyond noise
(the closest run's error standing in for the interpolated point's). A CostRemat run that saves more than
torch's save-all run is outside torch's range: torch reaches less memory with no recompute there.
"""

from __future__ import annotations  # noqa: I001  (remat_opt is imported before thunder)

import argparse
import contextlib
import gc
import itertools
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import remat_opt
from remat_opt import _compat  # noqa: F401  (applies the torch compatibility step before thunder)
import thunder
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from remat_opt.executors import executors_for
from remat_opt.validation.measure import measure_saved_bytes, measure_step_peak_bytes
from remat_opt.transform.cost_remat import CostRemat
from remat_opt.transform.explain import last_planned_step
from results_page import command_line, machine_text, markdown_table, now_utc_text, versions_text

GRAD_RTOL = 1e-4
GRAD_ATOL = 1e-5
MB = 10**6
TORCH_SOLVERS = ("dp", "ilp")
# Notes that make the run fail (exit status 1): a wrong gradient, or CostRemat's measured saved bytes
# differing from its plan or exceeding its budget.
GRADIENT_MISMATCH = "GRADIENT MISMATCH"
SAVED_MISMATCH = "SAVED-BYTES MISMATCH"
THUNDER, TORCH, THUNDER_TC = "thunder", "torch", "thunder torch-compile"
COMPARE_PACKAGES = ("torch", "lightning-thunder", "litgpt", "scipy")  # the page header's versions
TC_FRACTIONS = (0.25, 0.5, 0.75)  # CostRemat (torch-compile executor) budgets, of that configuration's own save-all


# --------------------------------------------------------------------------------------------
# Model and reference
# --------------------------------------------------------------------------------------------


def model_config(name: str, args: argparse.Namespace):
    """The litgpt config `name`, shrunk to the benchmark size; keeps its norm, MLP and rope layout."""
    from litgpt import Config

    n_head = 4
    family = Config.from_name(name)
    groups = 1 if family.n_query_groups == 1 else (2 if family.n_query_groups < family.n_head else n_head)
    return Config.from_name(
        name, n_layer=args.n_layer, n_embd=args.width, n_head=n_head, n_query_groups=groups,
        head_size=args.width // n_head, intermediate_size=4 * args.width, padded_vocab_size=256,
        vocab_size=256, block_size=args.seq,
    )


def build(name: str, args: argparse.Namespace) -> tuple[torch.nn.Module, torch.Tensor]:
    """A seeded litgpt model and one batch of tokens."""
    from litgpt import GPT

    torch.manual_seed(0)
    config = model_config(name, args)
    model = GPT(config)
    idx = torch.randint(0, config.padded_vocab_size, (args.batch, args.seq))
    return model, idx


def loss_of(output: torch.Tensor) -> torch.Tensor:
    return output.float().sum()


def train_step(fn: Callable, args: tuple, params: list[torch.nn.Parameter]) -> None:
    """One step with fresh gradients, as after ``optimizer.zero_grad(set_to_none=True)``."""
    for p in params:
        p.grad = None
    loss_of(fn(*args)).backward()


def eager_grads(model: torch.nn.Module, idx: torch.Tensor) -> dict[str, torch.Tensor]:
    params = dict(model.named_parameters())
    train_step(model, (idx,), list(params.values()))
    return {name: p.grad.detach().clone() for name, p in params.items()}


# --------------------------------------------------------------------------------------------
# Systems
# --------------------------------------------------------------------------------------------


@dataclass
class System:
    """One way of compiling the training step (mutable while it is compiled and measured)."""

    name: str
    budget: str
    family: str
    is_reference: bool = False
    fn: Callable | None = None
    args: tuple = ()
    transform: CostRemat | None = None
    compile_s: float = math.nan
    error: str | None = None

    @property
    def key(self) -> str:
        return f"{self.name} [{self.budget}]"


def short_error(e: BaseException) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0][:160] if lines else ''}"


def compile_system(system: System, make: Callable[[], Callable], params: list) -> System:
    """Builds `system.fn` and runs its first step (the compilation); records a failure instead of raising."""
    start_s = time.perf_counter()
    try:
        system.fn = make()
        train_step(system.fn, system.args, params)
    except Exception as e:  # noqa: BLE001  (any compile failure is recorded; the others still run)
        system.fn, system.error = None, f"failed: {short_error(e)}"
        print(f"  {system.key}: {system.error}", file=sys.stderr)
        return system
    system.compile_s = time.perf_counter() - start_s
    print(f"  compiled {system.key} in {system.compile_s:.1f} s", flush=True)
    return system


def cost_remat_budgets(model, idx, n_budgets: int) -> tuple[list, int]:
    """Pareto points of the analyzed graph (least saved bytes .. save-all) and save-all's saved bytes."""
    graph = remat_opt.analyze(model, idx, executors=executors_for("fused-sdpa"))
    points = remat_opt.pareto_curve(graph, n_budgets, device_spec="cpu")
    return points, graph.saved_activation_bytes


def thunder_systems(model, idx, points, save_all_bytes: int, params: list) -> list[System]:
    """Thunder default, Thunder auto-recompute and CostRemat at each Pareto point's budget."""
    executors = executors_for("fused-sdpa")
    systems = [
        compile_system(System("thunder", "save-all (no budget)", THUNDER, is_reference=True, args=(idx,)),
                       lambda: thunder.jit(model, executors=executors), params),
        compile_system(System("thunder auto", "auto_recompute_intermediates", THUNDER, args=(idx,)),
                       lambda: thunder.jit(model, executors=executors, auto_recompute_intermediates=True),
                       params),
    ]
    for point in points:
        transform = CostRemat(activation_budget_gb=point.swept_budget_bytes / 1e9, device_spec="cpu")
        budget = f"{point.swept_budget_bytes / MB:.3f} MB ({point.swept_budget_bytes / save_all_bytes:.2f})"
        system = System("CostRemat", budget, THUNDER, args=(idx,), transform=transform)
        systems.append(compile_system(
            system, lambda t=transform: thunder.jit(model, transforms=[t], executors=executors), params))
    return systems


def thunder_tc_systems(model, idx, params: list) -> tuple[list[System], int]:
    """Thunder with its torch.compile executor (TorchCompile fusion regions on CPU, as nvFuser's on a GPU)
    and CostRemat through that executor's fusion pass at its least feasible budget and at fractions
    of *this configuration's own* save-all (what Thunder saves with these executors and no plan)."""
    executors = executors_for("torch-compile")
    save_all_bytes = remat_opt.analyze(model, idx, executors=executors).saved_activation_bytes
    systems = [compile_system(System("thunder tc", "save-all (no budget)", THUNDER_TC, is_reference=True, args=(idx,)),
                              lambda: thunder.jit(model, executors=executors), params)]
    budgets = [_least_tc_budget(model, idx, executors), *(int(f * save_all_bytes) for f in TC_FRACTIONS)]
    for activation_budget_bytes in budgets:
        transform = CostRemat(activation_budget_gb=activation_budget_bytes / 1e9, device_spec="cpu")
        budget = f"{activation_budget_bytes / MB:.3f} MB ({activation_budget_bytes / save_all_bytes:.2f})"
        system = System("CostRemat tc", budget, THUNDER_TC, args=(idx,), transform=transform)
        systems.append(compile_system(
            system, lambda t=transform: thunder.jit(model, transforms=[t], executors=executors), params))
    return systems, save_all_bytes


def _least_tc_budget(model, idx, executors) -> int:
    """The least saved bytes CostRemat reaches through the torch.compile executor's pass (what a
    0-byte budget's error names)."""
    try:
        thunder.jit(model, transforms=[CostRemat(activation_budget_gb=0.0, device_spec="cpu")], executors=executors)(idx)
    except remat_opt.InfeasibleBudgetError as e:
        return e.minimum
    return 0


def fresh_forward(tag: str) -> Callable:
    """``forward(model, idx) = model(idx)`` with its own code object, so Dynamo caches it on its own."""
    namespace: dict = {}
    exec(compile("def forward(model, idx):\n    return model(idx)\n", f"<compare {tag}>", "exec"), namespace)  # noqa: S102
    return namespace["forward"]


@contextlib.contextmanager
def counting_knapsack_calls(solver: str, calls: list):
    """Appends to `calls` each time the partitioner runs `solver`'s knapsack function."""
    from torch._functorch import partitioners

    name = f"{solver}_knapsack"
    original = getattr(partitioners, name)

    def counted(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)

    setattr(partitioners, name, counted)
    try:
        yield
    finally:
        setattr(partitioners, name, original)


def compile_torch(system: System, ratio: float, solver: str, params: list) -> System:
    def make() -> Callable:
        return torch.compile(fresh_forward(system.key), backend="inductor", fullgraph=True)

    # the partition is chosen when the forward compiles; the backward compiles at the first backward
    calls: list[str] = []
    with torch._functorch.config.patch(
        activation_memory_budget=ratio, activation_memory_budget_solver=solver, enable_autograd_cache=False
    ), counting_knapsack_calls(solver, calls):
        compile_system(system, make, params)
    if system.is_reference:
        return system
    return replace(system, budget=f"{system.budget} ({solver} x{len(calls)})")


def torch_systems(model, idx, ratios: list[float], params: list) -> list[System]:
    """torch.compile at budget 1.0 (reference) and at each ratio < 1 with each knapsack solver."""
    torch._dynamo.reset()
    reference = System("torch.compile", "1.00 (save-all)", TORCH, is_reference=True, args=(model, idx))
    systems = [compile_torch(reference, 1.0, TORCH_SOLVERS[0], params)]
    for ratio in ratios:
        for solver in TORCH_SOLVERS:
            system = System(f"torch.compile {solver}", f"{ratio:.2f}", TORCH, args=(model, idx))
            systems.append(compile_torch(system, ratio, solver, params))
    return systems


# --------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------


def _sdpa_cpu_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _sdpa_cpu_backward_flops(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


def sdpa_cpu_flop_mapping() -> dict:
    """torch's SDPA FLOP formulas for the CPU flash kernels, which `FlopCounterMode` has no entry for."""
    aten = torch.ops.aten
    return {
        aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flops,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward_flops,
    }


def backward_flops(system: System, params: list) -> int:
    """FLOPs counted by `FlopCounterMode` while the backward of one step runs."""
    for p in params:
        p.grad = None
    loss = loss_of(system.fn(*system.args))
    with FlopCounterMode(display=False, custom_mapping=sdpa_cpu_flop_mapping()) as counter:
        loss.backward()
    return counter.get_total_flops()


def grad_mismatches(system: System, params: dict, reference: dict) -> tuple[list[str], float]:
    """Parameters whose gradient differs from eager's beyond tolerance; and the largest abs error."""
    train_step(system.fn, system.args, list(params.values()))
    problems, worst_abs = [], 0.0
    for name, p in params.items():
        if p.grad is None:
            problems.append(f"{name}: no gradient")
            continue
        expected = reference[name]
        worst_abs = max(worst_abs, (p.grad - expected).abs().max().item())
        atol = GRAD_ATOL * max(expected.abs().max().item(), 1.0)
        try:
            torch.testing.assert_close(p.grad, expected, rtol=GRAD_RTOL, atol=atol)
        except AssertionError as e:
            problems.append(f"{name}: {' '.join(str(e).split())[:200]}")
    return problems, worst_abs


@dataclass(frozen=True, slots=True)
class Measured:
    """One system's memory, FLOPs and gradient check."""

    saved_bytes: int
    peak_bytes: int
    backward_flops: int | None
    grad_problems: tuple[str, ...]
    grad_max_abs: float
    plan_flops: int | None
    plan_saved_bytes: int | None
    activation_budget_bytes: int | None


def plan_figures(system: System) -> tuple[int | None, int | None, int | None]:
    """CostRemat's predicted recompute FLOPs (costmodels formulas), saved bytes and activation budget."""
    if system.transform is None or system.fn is None:
        return None, None, None
    try:
        step = last_planned_step(system.fn)
    except ValueError:  # not compiled (an error was recorded)
        return None, None, None
    flops = step.costs.chain_cost(step.plan.recompute_ops).flops
    return flops, step.plan.saved_bytes, step.request.activation_budget_bytes


def measure(system: System, named_params: dict, reference: dict) -> Measured:
    """Saved bytes, step peak, backward FLOPs and the gradient check of one compiled system."""
    params = list(named_params.values())
    saved = measure_saved_bytes(system.fn, *system.args)
    saved_bytes = saved.activation_bytes
    del saved
    peak = measure_step_peak_bytes(system.fn, *system.args, loss_fn=loss_of)
    # FlopCounterMode is a dispatch mode, under which Thunder's TorchCompile regions cannot compile
    flops = None if system.family == THUNDER_TC else backward_flops(system, params)
    problems, worst_abs = grad_mismatches(system, named_params, reference)
    plan_flops, plan_saved_bytes, activation_budget_bytes = plan_figures(system)
    return Measured(
        saved_bytes=saved_bytes,
        peak_bytes=peak.peak_bytes,
        backward_flops=flops,
        grad_problems=tuple(problems),
        grad_max_abs=worst_abs,
        plan_flops=plan_flops,
        plan_saved_bytes=plan_saved_bytes,
        activation_budget_bytes=activation_budget_bytes,
    )


def time_interleaved(systems: list[System], params: list, warmup: int, reps: int) -> dict[str, list[float]]:
    """Step seconds per system: rounds of one step each, starting at a rotating position."""
    times: dict[str, list[float]] = {s.key: [] for s in systems}
    for round_index in range(warmup + reps):
        gc.collect()
        gc.disable()
        shift = round_index % len(systems)
        try:
            for system in systems[shift:] + systems[:shift]:
                for p in params:
                    p.grad = None
                start_s = time.perf_counter()
                loss_of(system.fn(*system.args)).backward()
                if round_index >= warmup:
                    times[system.key].append(time.perf_counter() - start_s)
        finally:
            gc.enable()
    return times


# --------------------------------------------------------------------------------------------
# Rows
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    """One line of a config's table."""

    system: str
    budget: str
    family: str
    saved_bytes: int | None = None
    peak_bytes: int | None = None
    step_s: float | None = None
    step_ratio: float | None = None
    ratio_error: float | None = None
    recompute_flops: int | None = None
    plan_flops: int | None = None
    compile_s: float | None = None
    grads: str = ""
    error: str | None = None


def median_standard_error(values: list[float]) -> float:
    """Standard error of the median: sqrt(pi/2) * sigma / sqrt(n), sigma estimated as IQR / 1.349.

    The normal-distribution constants; the IQR keeps a few slow outlier steps from inflating sigma.
    """
    if len(values) < 2:
        return 0.0
    quartiles = statistics.quantiles(values, n=4)
    sigma = (quartiles[2] - quartiles[0]) / 1.349
    return math.sqrt(math.pi / 2) * sigma / math.sqrt(len(values))


def paired_ratios(times_s: list[float], reference_times_s: list[float]) -> list[float]:
    """Per timed round, the step time over the reference's step time in the same round."""
    return [t / ref for t, ref in zip(times_s, reference_times_s, strict=True)]


def grads_text(m: Measured) -> str:
    if m.grad_problems:
        return f"MISMATCH ({len(m.grad_problems)} params, max abs err {m.grad_max_abs:.2e})"
    return f"ok (max abs err {m.grad_max_abs:.1e})"


def build_rows(systems: list[System], measured: dict[str, Measured], times: dict[str, list[float]]) -> list[Row]:
    """Rows with step-time ratios to each family's save-all run, paired round by round."""
    references = {s.family: s for s in systems if s.is_reference and s.fn is not None}
    rows = []
    for s in systems:
        if s.fn is None:
            rows.append(Row(system=s.name, budget=s.budget, family=s.family, error=s.error))
            continue
        m, ref = measured[s.key], references.get(s.family)
        ratios = paired_ratios(times[s.key], times[ref.key]) if ref else [math.nan]
        rows.append(Row(
            system=s.name, budget=s.budget, family=s.family, saved_bytes=m.saved_bytes,
            peak_bytes=m.peak_bytes, step_s=statistics.median(times[s.key]), step_ratio=statistics.median(ratios),
            ratio_error=median_standard_error(ratios),
            recompute_flops=(m.backward_flops - measured[ref.key].backward_flops
                             if ref and m.backward_flops is not None else None),
            plan_flops=m.plan_flops, compile_s=s.compile_s, grads=grads_text(m),
        ))
    return rows


# --------------------------------------------------------------------------------------------
# At matched saved bytes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Match:
    """A CostRemat run beside the torch run of one solver with the closest saved bytes."""

    cost_remat: Row
    solver: str
    closest: Row | None
    interp_ratio: float | None
    interp_flops: float | None


def torch_curve(rows: list[Row], solver: str) -> list[Row]:
    """The measured runs of one torch solver plus the 1.0 reference, by saved bytes."""
    curve = [r for r in rows if r.family == TORCH and r.error is None
             and (r.system == f"torch.compile {solver}" or r.system == "torch.compile")]
    return sorted(curve, key=lambda r: (r.saved_bytes, r.step_ratio))


def interpolate(curve: list[Row], saved_bytes: int, attr: str) -> float | None:
    """`attr` linearly interpolated at `saved_bytes` between neighbouring runs; None outside the curve."""
    for low, high in itertools.pairwise(curve):
        if low.saved_bytes <= saved_bytes <= high.saved_bytes:
            if high.saved_bytes == low.saved_bytes:
                return (getattr(low, attr) + getattr(high, attr)) / 2
            weight = (saved_bytes - low.saved_bytes) / (high.saved_bytes - low.saved_bytes)
            return getattr(low, attr) + weight * (getattr(high, attr) - getattr(low, attr))
    if len(curve) == 1 and curve[0].saved_bytes == saved_bytes:
        return getattr(curve[0], attr)
    return None


def matches(rows: list[Row]) -> list[Match]:
    found = []
    for cr in (r for r in rows if r.system in ("CostRemat", "CostRemat tc") and r.error is None):
        for solver in TORCH_SOLVERS:
            curve = torch_curve(rows, solver)
            closest = min(curve, key=lambda r: abs(r.saved_bytes - cr.saved_bytes), default=None)
            found.append(Match(
                cost_remat=cr, solver=solver, closest=closest,
                interp_ratio=interpolate(curve, cr.saved_bytes, "step_ratio"),
                interp_flops=interpolate(curve, cr.saved_bytes, "recompute_flops"),
            ))
    return found


def noise_ratio(a: Row, b: Row) -> float:
    return 2 * math.hypot(a.ratio_error, b.ratio_error)


def verdict(m: Match) -> str:
    """CostRemat against torch at the same saved bytes, in plain figures."""
    cr, other = m.cost_remat, m.closest
    if other is None:
        return "no torch run"
    if m.interp_flops is None:
        if cr.saved_bytes > other.saved_bytes:
            return (f"outside torch's range: torch's {other.budget} saves {_mb(other.saved_bytes)} MB with "
                    f"{_mflops(other.recompute_flops)} recompute MFLOPs; CostRemat not better here")
        return "outside torch's range (below its least saved bytes)"
    if cr.recompute_flops is None:  # not countable (TorchCompile regions)
        flops = "recompute FLOPs not counted"
    else:
        flops_delta_m = round(cr.recompute_flops / 1e6 - m.interp_flops / 1e6, 1)
        flops = "equal recompute FLOPs" if flops_delta_m == 0 else (
            f"{'fewer' if flops_delta_m < 0 else 'MORE'} recompute FLOPs ({flops_delta_m:+.1f} MFLOPs)")
    ratio_delta = cr.step_ratio - m.interp_ratio
    noise = noise_ratio(cr, other)
    timing = "within noise" if abs(ratio_delta) <= noise else ("CostRemat SLOWER" if ratio_delta > 0 else
                                                              "CostRemat faster")
    return f"{flops}; ratio {ratio_delta:+.3f} ({timing}, noise +-{noise:.3f})"


def peak_notes(rows: list[Row]) -> list[str]:
    """Where the measured peak rises while saved bytes fall, per budgeted system."""
    notes = []
    curves = {name: [r for r in rows if r.system == name and r.error is None] for name in ("CostRemat", "CostRemat tc")}
    curves.update({f"torch.compile {solver}": torch_curve(rows, solver) for solver in TORCH_SOLVERS})
    for name, curve in curves.items():
        ordered = sorted(curve, key=lambda r: r.saved_bytes)
        rises = [(low, high) for low, high in itertools.pairwise(ordered)
                 if low.peak_bytes > high.peak_bytes and low.saved_bytes < high.saved_bytes]
        if not ordered:
            continue
        if not rises:
            notes.append(f"{name}: peak never rises as saved bytes fall.")
            continue
        pairs = "; ".join(f"{_mb(lo.saved_bytes)} MB saved peaks at {_mb(lo.peak_bytes)} MB but "
                          f"{_mb(hi.saved_bytes)} MB saved at {_mb(hi.peak_bytes)} MB" for lo, hi in rises)
        notes.append(f"{name}: peak NOT monotone in saved bytes: {pairs}.")
    return notes


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def _mb(n_bytes: int | None) -> str:
    return "-" if n_bytes is None else f"{n_bytes / MB:.3f}"


def _mflops(flops: float | None) -> str:
    return "-" if flops is None else f"{flops / 1e6:.1f}"


def _ratio(ratio: float | None, spread: float | None = None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.3f}" if spread is None else f"{ratio:.3f} +-{spread:.3f}"


def row_cells(r: Row) -> list[str]:
    if r.error is not None:
        return [r.system, r.budget, r.error, "", "", "", "", "", "", ""]
    return [
        r.system, r.budget, _mb(r.saved_bytes), _mb(r.peak_bytes), f"{r.step_s * 1e3:.2f}",
        _ratio(r.step_ratio, r.ratio_error), _mflops(r.recompute_flops), _mflops(r.plan_flops),
        f"{r.compile_s:.1f}", r.grads,
    ]


RUN_HEADER = ["system", "budget", "saved MB", "peak MB", "step ms", "step-time ratio", "recompute MFLOPs",
              "plan MFLOPs", "compile s", "grads vs eager"]
MATCH_HEADER = ["CostRemat run", "saved MB", "ratio", "recompute MFLOPs", "torch solver",
                "closest torch run: budget, saved MB, ratio, MFLOPs", "torch at CostRemat's saved MB: ratio, MFLOPs",
                "CostRemat vs torch at the same saved bytes"]


def match_cells(m: Match) -> list[str]:
    cr, t = m.cost_remat, m.closest
    closest = "-" if t is None else (
        f"{t.budget}: {_mb(t.saved_bytes)}, {_ratio(t.step_ratio, t.ratio_error)}, {_mflops(t.recompute_flops)}")
    interpolated = "outside torch's range" if m.interp_ratio is None else (
        f"{_ratio(m.interp_ratio)}, {_mflops(m.interp_flops)}")
    return [f"{cr.system} {cr.budget}", _mb(cr.saved_bytes), _ratio(cr.step_ratio, cr.ratio_error), _mflops(cr.recompute_flops),
            m.solver, closest, interpolated, verdict(m)]


@dataclass(frozen=True, slots=True)
class ConfigResult:
    """Everything measured for one litgpt config."""

    name: str
    description: str
    rows: list[Row]
    notes: list[str]


def config_section(result: ConfigResult) -> list[str]:
    lines = [f"## {result.name}", "", result.description, ""]
    lines += markdown_table(RUN_HEADER, [row_cells(r) for r in result.rows])
    lines += ["", f"At matched saved bytes ({result.name}):", ""]
    lines += markdown_table(MATCH_HEADER, [match_cells(m) for m in matches(result.rows)])
    notes = [*result.notes, *peak_notes(result.rows)]
    lines += ["", "Notes:", "", *[f"- {note}" for note in notes]]
    return lines + [""]


def header_lines(args: argparse.Namespace, total_s: float) -> list[str]:
    now, command = now_utc_text(), command_line()
    machine = f"- Machine: {machine_text()}."
    versions = f"- Versions: {versions_text(packages=COMPARE_PACKAGES)}."
    configs = (f"- Configs: {', '.join(args.configs)}, each shrunk to {args.n_layer} layers, width "
               f"{args.width}, 4 heads, MLP {4 * args.width}, vocab 256; batch {args.batch} x seq {args.seq} "
               "tokens; fp32; loss `model(idx).float().sum()`.")
    repetitions = (f"- Repetitions: {args.warmup} warm-up and {args.reps} timed rounds, every system of a "
                   f"config interleaved; torch.set_num_threads({args.threads}); {args.budgets} CostRemat budgets.")
    ratios = ("- Step-time ratios are medians of per-round ratios to the same family's save-all run "
              "(`thunder` for Thunder systems, `torch.compile` at 1.00 for torch systems); `+-` is the "
              "standard error of that median. MB = 10^6 bytes.")
    load = "- Load average (1, 5, 15 min) at the end of the run: {:.2f}, {:.2f}, {:.2f} on {} cores.".format(
        *os.getloadavg(), os.cpu_count())
    title = "# CostRemat vs Thunder vs torch.compile activation budgets (CPU)"
    generated = f"Generated by `benchmarks/compare.py` on {now}: `{command}` ({total_s / 60:.1f} min in all)."
    return [title, "", generated, "", machine, versions, configs, repetitions, ratios, load, ""]


def method_lines() -> list[str]:
    """The module docstring from "Systems:" on: how each system was built and each column obtained."""
    text = __doc__[__doc__.index("Systems:"):]
    return ["## Method (from the script's docstring)", "", "```", *text.rstrip().splitlines(), "```", ""]


def render(args: argparse.Namespace, results: list[ConfigResult], total_s: float) -> str:
    lines = header_lines(args, total_s)
    for result in results:
        lines += config_section(result)
    return "\n".join(lines + method_lines())


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


def config_notes(systems: list[System], measured: dict[str, Measured]) -> list[str]:
    """Failures, gradient mismatches, and whether CostRemat's measured saved bytes equal its plans'."""
    notes, plan_checks = [], []
    by_name = {s.name: s for s in systems if s.error is None}
    if "thunder tc" in by_name and "torch.compile" in by_name:
        ours, theirs = measured[by_name["thunder tc"].key], measured[by_name["torch.compile"].key]
        notes.append(f"Save-all beside save-all: Thunder's torch.compile executor saves {_mb(ours.saved_bytes)} MB, "
                     f"torch.compile {_mb(theirs.saved_bytes)} MB.")
    for s in systems:
        if s.error is not None:
            notes.append(f"{s.key}: {s.error}")
            continue
        m = measured[s.key]
        notes += [f"{GRADIENT_MISMATCH} {s.key}: {problem}" for problem in m.grad_problems]
        if m.plan_saved_bytes is not None:
            plan_checks.append(m.plan_saved_bytes == m.saved_bytes <= m.activation_budget_bytes)
            if m.plan_saved_bytes != m.saved_bytes or m.saved_bytes > m.activation_budget_bytes:
                notes.append(f"{SAVED_MISMATCH} {s.key}: plan predicted {m.plan_saved_bytes} saved bytes, "
                             f"measured {m.saved_bytes}, budget {m.activation_budget_bytes}")
    if plan_checks and all(plan_checks):
        notes.append(f"All {len(plan_checks)} CostRemat runs: measured saved bytes equal the plan's, to the byte, "
                     "and are within the budget.")
    if not any(note.startswith(GRADIENT_MISMATCH) for note in notes):
        n_checked = sum(s.error is None for s in systems)
        notes.append(f"All {n_checked} runs: every parameter gradient matches eager PyTorch within tolerance.")
    return notes


def describe_config(name: str, model: torch.nn.Module, idx: torch.Tensor, points, save_all_bytes: int) -> str:
    n_params = sum(p.numel() for p in model.parameters())
    budgets = ", ".join(f"{p.swept_budget_bytes / MB:.3f}" for p in points)
    return (f"litgpt `{name}` family: {model.config.n_layer} layers, width {model.config.n_embd}, "
            f"{n_params / 1e6:.2f} M parameters, input {tuple(idx.shape)}. Analyzed save-all: "
            f"{save_all_bytes / MB:.3f} MB saved; CostRemat activation budgets (MB): {budgets}.")


def run_config(name: str, args: argparse.Namespace) -> ConfigResult:
    """Builds, compiles, measures and times every system for one litgpt config."""
    print(f"== {name}", flush=True)
    model, idx = build(name, args)
    named_params = dict(model.named_parameters())
    params = list(named_params.values())
    reference = eager_grads(model, idx)
    points, save_all_bytes = cost_remat_budgets(model, idx, args.budgets)
    systems = thunder_systems(model, idx, points, save_all_bytes, params)
    ratios = sorted({p.saved_bytes / save_all_bytes for p in points if p.saved_bytes < save_all_bytes})
    if args.torch_compile_executor:
        tc_systems, tc_save_all_bytes = thunder_tc_systems(model, idx, params)
        systems += tc_systems
    systems += torch_systems(model, idx, ratios, params)
    live = [s for s in systems if s.fn is not None]
    measured = {}
    for s in live:
        measured[s.key] = measure(s, named_params, reference)
        print(f"  measured {s.key}: saved {measured[s.key].saved_bytes / MB:.3f} MB, "
              f"{grads_text(measured[s.key])}", flush=True)
    load_before = os.getloadavg()[0]
    times = time_interleaved(live, params, args.warmup, args.reps)
    load_note = (f"1-minute load average {load_before:.2f} before the timed rounds and "
                 f"{os.getloadavg()[0]:.2f} after them, on {os.cpu_count()} cores.")
    rows = build_rows(systems, measured, times)
    description = describe_config(name, model, idx, points, save_all_bytes)
    return ConfigResult(name=name, description=description, rows=rows,
                        notes=[*config_notes(systems, measured), load_note])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["Llama-2-7b-hf", "pythia-160m"],
                        help="litgpt config names (their family's layout, shrunk)")
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--width", type=int, default=256, help="n_embd (4 heads, MLP 4x)")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--budgets", type=int, default=5, help="CostRemat budgets, least memory to save-all")
    parser.add_argument("--reps", type=int, default=30, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--out", default="docs/compare.md", help="Markdown output")
    parser.add_argument("--no-torch-compile-executor", dest="torch_compile_executor", action="store_false",
                        help="leave out Thunder's torch.compile executor and CostRemat through it")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 1 layer, width 64, seq 64, 2 budgets, 3 reps, 1 warm-up")
    args = parser.parse_args(argv)
    if args.quick:
        args.n_layer, args.width, args.seq, args.budgets, args.reps, args.warmup = 1, 64, 64, 2, 3, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    start_s = time.perf_counter()
    results = [run_config(name, args) for name in args.configs]
    markdown = render(args, results, time.perf_counter() - start_s)
    print(markdown)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown)
    print(f"wrote {out}")
    failures = [n for r in results for n in r.notes if n.startswith((GRADIENT_MISMATCH, SAVED_MISMATCH))]
    if failures:
        print(f"\n{len(failures)} FAILED CHECKS:\n" + "\n".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
