"""2-rank gloo runs on localhost for `tests/distributed/test_distributed.py` (spawned; not a test module).

Each rank builds the same tiny model and inputs, so the gradient Thunder reduces over the ranks (an
average) equals single-process eager's; FSDP leaves rank r its shard of it. One spawn runs every
case (strategy x budget) so that the processes import Thunder once; each rank writes its results
as JSON for the test process to check.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import traceback
from pathlib import Path

WORLD_SIZE = 2
MODEL = "Llama-2-7b-hf"


def _another_thread_runs(own_tid: int) -> bool:
    """Whether a thread of this process other than `own_tid` is running or runnable (``R`` in /proc)."""
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == own_tid:
            continue
        try:
            state = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):  # the thread exited
            continue
        if state == "R":
            return True
    return False


def let_gloo_release_finished_work(timeout_s: float = 5.0) -> dict:
    """Makes every wait on a collective also wait until gloo's worker threads are idle again.

    A gloo worker thread keeps its reference to a finished collective (and to the tensors it
    holds) until it goes back to its queue. When the step drops its own reference first (Thunder
    deletes the future right after waiting on it), the worker frees those tensors, outside the
    collective, on a thread the profiler does not record: the measured peak then counts a 64 KiB
    weight as alive to the end of the step, by chance of thread scheduling. Waiting here, until
    no other thread runs, makes the step the last holder every time. Returns a dict counting the
    waits that timed out (``{"timeouts": n}``), for the tests to check.
    """
    import time

    import torch.distributed as dist

    work, counts = dist.distributed_c10d.Work, {"timeouts": 0}
    wait, own_tid = work.wait, threading.get_native_id()

    def wait_until_released(self, *args, **kwargs):
        result = wait(self, *args, **kwargs)
        deadline = time.monotonic() + timeout_s
        while _another_thread_runs(own_tid):
            if time.monotonic() > deadline:
                counts["timeouts"] += 1
                break
            os.sched_yield()
        return result

    work.wait = wait_until_released
    return counts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model(model: str = MODEL, seq: int | None = None, n_layer: int = 1):
    from remat_opt.models.by_name import ModelSpec, build_model

    return build_model(ModelSpec(model, n_layer=n_layer, device="cpu", tiny=True, seq=seq))


def _eager_grads(model_spec) -> dict:
    model, inputs = _model(*model_spec)
    model(*inputs).float().sum().backward()
    return {n: p.grad for n, p in model.named_parameters()}


def _parallel_transform(strategy: str):
    import torch
    import torch.distributed as dist

    if strategy == "fsdp":
        from thunder.distributed.transforms.fsdp_v2 import FSDPTransform

        return FSDPTransform(device=torch.device("cpu"))
    from thunder.distributed.transforms.ddp_v2 import DDPTransform

    return DDPTransform(process_group=dist.distributed_c10d._get_default_group(), bucket_size_in_mb=25.0,
                        broadcast_from=0)


def _grad_errors(strategy: str, jitted, eager: dict, rank: int) -> tuple[float, float]:
    """Largest |grad - eager| over parameters (FSDP: this rank's shard of eager's gradient), and the
    largest such difference relative to the parameter's largest |eager gradient|."""
    import torch
    from thunder.distributed import _shard_tensor

    worst = worst_relative = 0.0
    for name, param in jitted.named_parameters():
        expected = eager[name]
        if strategy == "fsdp":
            expected, _ = _shard_tensor(expected, rank, WORLD_SIZE, name, allow_padding_for_fsdp=True)
        if param.grad is None or param.grad.shape != expected.shape or not torch.isfinite(param.grad).all():
            return float("inf"), float("inf")
        difference = (param.grad - expected).abs().max().item()
        worst = max(worst, difference)
        worst_relative = max(worst_relative, difference / max(expected.abs().max().item(), 1e-30))
    return worst, worst_relative


def regather_units_of(problem) -> list[str]:
    """Every unit that re-gathers an FSDP weight (allowed or not)."""
    from remat_opt.core.problem import is_regather_unit

    return [n for n, u in problem.units.items() if is_regather_unit([problem.ops_by_name[o] for o in u.ops])]


def _order_error(strategy: str, model_spec) -> str:
    """The error of CostRemat placed before the data-parallel transform ('' if none)."""
    import thunder

    from remat_opt.transform.cost_remat import CostRemat

    model, inputs = _model(*model_spec)
    jitted = thunder.jit(model, transforms=[CostRemat(device_spec="cpu"), _parallel_transform(strategy)])
    try:
        jitted(*inputs)
    except ValueError as e:
        return str(e)
    return ""


def _run_case(strategy: str, bound_bytes: int | None, rank: int, eager: dict, executors, model_spec, *,
              reference: bool = False, peak: bool = False, in_flight: int | None = None,
              solver: str = "auto") -> dict:
    """One compilation and step; `bound_bytes` bounds the saved bytes, or with `peak` the step peak;
    `in_flight`: CostRemat's ``collectives_in_flight``; `solver`: CostRemat's."""
    import thunder

    from remat_opt.validation.measure import measure_saved_bytes, measure_step_peak_bytes
    from remat_opt.transform.cost_remat import CostRemat
    from remat_opt.transform.explain import last_planned_step

    model, inputs = _model(*model_spec)
    budget_gb = None if bound_bytes is None else bound_bytes / 1e9
    transform = CostRemat(**{"budget_gb" if peak else "activation_budget_gb": budget_gb}, device_spec="cpu",
                          collectives_in_flight=in_flight, solver=solver)
    jitted = thunder.jit(model, transforms=[_parallel_transform(strategy), transform], executors=executors)
    measured = measure_saved_bytes(jitted, *inputs)
    measured.output.float().sum().backward()
    step = last_planned_step(jitted)
    grad_error, grad_relative_error = _grad_errors(strategy, jitted, eager, rank)
    measure_peak = strategy == "ddp" or in_flight is not None or solver != "auto" or \
        os.environ.get("REMAT_OPT_MEASURE_FSDP_PEAK") == "1"
    peak_measurement = measure_step_peak_bytes(jitted, *inputs) if measure_peak else None
    from remat_opt.solvers import minimum_saved_bytes
    from remat_opt.solvers.ilp_bounds import minimum_peak_bytes

    from remat_opt.transform.ranks import regather_units
    from remat_opt.core.problem import RecomputeProblem

    problem = step.problem
    keep_minimum = least_peak = None
    if reference:  # the save-all run: the least any plan keeping every unsharded weight saves, the least peak
        keep = RecomputeProblem.from_graph(problem.graph, problem.op_time_s, pinned=regather_units_of(problem))
        keep_minimum = minimum_saved_bytes(keep)
        least_peak = minimum_peak_bytes(problem)[0] if reference == "with_peak" else None
    return {
        "regathered": regather_units(step),
        "keep_minimum_bytes": keep_minimum,
        "measured_saved_bytes": measured.activation_bytes,
        "predicted_saved_bytes": step.plan.saved_bytes,
        "measured_peak_bytes": None if peak_measurement is None else peak_measurement.peak_bytes,
        "measured_other_threads_peak_bytes": None if peak_measurement is None else peak_measurement.other_threads_peak_bytes,
        "predicted_peak_bytes": step.plan.peak_bytes,
        "least_peak_bytes": least_peak,
        "grad_error": grad_error,
        "grad_relative_error": grad_relative_error,
        "tag_targets": list(step.plan.recomputed_tag_targets),
        "save_all_bytes": step.problem.saved_bytes(()),
        "minimum_bytes": minimum_saved_bytes(step.problem) if reference else None,
        "explain": str(__import__("remat_opt").explain(jitted)),
    }


def _least_peak_bytes(strategy: str, executors, model_spec, in_flight: int | None) -> int:
    """The least step peak CostRemat finds with `in_flight`, as the error of a 1 B budget names it."""
    import thunder

    from remat_opt.core.errors import InfeasibleBudgetError
    from remat_opt.transform.cost_remat import CostRemat

    model, inputs = _model(*model_spec)
    transform = CostRemat(budget_gb=1e-9, device_spec="cpu", collectives_in_flight=in_flight)
    try:
        thunder.jit(model, transforms=[_parallel_transform(strategy), transform], executors=executors)(*inputs)
    except InfeasibleBudgetError as e:
        return e.minimum
    raise AssertionError("a 1 B step-peak budget was met")


def _budget(budget, ref: dict) -> tuple[int, bool]:
    """``(bound_bytes, is_a_peak_budget)`` of a case's budget, from its strategy's save-all run."""
    if isinstance(budget, tuple):  # ("peak", f): f of the way from the least step peak to save-all's
        _, fraction = budget
        least, save_all = ref["least_peak_bytes"], ref["predicted_peak_bytes"]
        return least + int(fraction * (save_all - least)), True
    named = {"minimum": ref["minimum_bytes"], "below_keep": ref["keep_minimum_bytes"] - 1}
    return (named[budget] if budget in named else int(budget * ref["save_all_bytes"])), False


def run_rank(rank: int, port: int, out_dir: str, cases: list, model_spec: tuple = (MODEL, None)) -> None:
    """One rank: every case in order on the tiny `model_spec` = ``(litgpt name, seq[, n_layer])`` (1 layer
    unless given).

    ``cases`` are ``(label, strategy, budget)`` where budget is ``"save_all"`` (run first for each
    strategy: it finds save-all and the minimum; the least step peak too when a peak case follows),
    a fraction of save-all (``0.5``), ``"minimum"``, ``"below_keep"`` (1 B below the least any plan
    keeping every unsharded weight saves), ``("peak", f)`` (a step-peak budget f of the way from the
    least peak to save-all's), ``("in_flight", k)`` (``collectives_in_flight=k`` with a step-peak budget
    1 B below the least peak of Thunder's order of collectives), ``("in_flight_least", k)`` (the same
    at the least peak of its own order, which the error of a 1 B budget names), ``("per_block", k)``
    (per-block activation checkpointing, ``solver="per_block"``, with ``collectives_in_flight=k``; no
    budget; needs a model of several layers) or ``"order"``
    (CostRemat before the data-parallel transform: the error).
    """
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch

    torch.set_num_threads(1)
    from remat_opt import _compat  # noqa: F401  (before thunder)

    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    waits = let_gloo_release_finished_work()
    results = {}
    try:
        from remat_opt.executors import executors_for

        executors = executors_for("fused-sdpa")
        eager = _eager_grads(model_spec)
        reference = {}
        for label, strategy, budget in cases:
            if budget == "order":
                results[label] = {"error_message": _order_error(strategy, model_spec)}
                continue
            if budget == "save_all":
                with_peak = any(isinstance(b, tuple) and b[0] != "per_block" and s == strategy for _, s, b in cases)
                result = _run_case(strategy, 10**9, rank, eager, executors, model_spec,  # 1 GB: nothing to recompute
                                   reference="with_peak" if with_peak else True)
                reference[strategy] = result
                results[label] = {**result, "bound_bytes": result["save_all_bytes"]}
                continue
            if isinstance(budget, tuple) and budget[0] == "per_block":  # no budget: the named plan
                result = _run_case(strategy, None, rank, eager, executors, model_spec, in_flight=budget[1],
                                   solver="per_block")
                results[label] = {**result, "bound_bytes": None, "peak_budget": False}
                continue
            if isinstance(budget, tuple) and budget[0] in ("in_flight", "in_flight_least"):
                in_flight = budget[1]
                below_floor = reference[strategy]["least_peak_bytes"] - 1
                bound_bytes = below_floor if budget[0] == "in_flight" else _least_peak_bytes(
                    strategy, executors, model_spec, in_flight)
                peak = True
            else:
                in_flight = None
                bound_bytes, peak = _budget(budget, reference[strategy])
            result = _run_case(strategy, bound_bytes, rank, eager, executors, model_spec, peak=peak, in_flight=in_flight)
            results[label] = {**result, "bound_bytes": bound_bytes, "peak_budget": peak}
    except Exception:
        results["error"] = traceback.format_exc()
    finally:
        results["wait_timeouts"] = waits["timeouts"]
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
        dist.destroy_process_group()


def spawn_ranks(run, args: tuple, out_dir: str, timeout_s: float) -> list:
    """Runs ``run(rank, port, *args)`` on `WORLD_SIZE` spawned gloo ranks; returns each rank's JSON
    results from ``out_dir/rank{r}.json`` (kills the ranks and raises on a hang, raises on a crash)."""
    import time

    import torch.multiprocessing as mp

    context = mp.start_processes(run, args=(free_port(), *args), nprocs=WORLD_SIZE, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
        if time.monotonic() > deadline:
            for p in context.processes:
                p.kill()
            raise TimeoutError(f"2-rank run did not finish in {timeout_s:.0f} s")
    return [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)]


def spawn(cases: list, out_dir: str, timeout_s: float = 420.0, model_spec: tuple = (MODEL, None)) -> list[dict]:
    """Runs `cases` on 2 gloo ranks; returns each rank's results (raises on a hang or a crash)."""
    return spawn_ranks(run_rank, (out_dir, cases, model_spec), out_dir, timeout_s)
