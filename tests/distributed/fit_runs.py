"""2-rank gloo runs of a configuration `remat-opt fit` chose, with its plan file applied, for
`tests/distributed/test_fit_apply.py` (spawned; not a test module).

Each rank builds the tiny model at the chosen micro-batch, wraps it in Thunder's FSDP or DDP with
``CostRemat(plan=...)``, and runs the iteration `remat_opt.analysis.training_step` predicts: the
jitted forward, the eager cross-entropy loss, the backward, ``AdamW.step()`` and
``zero_grad(set_to_none=True)``, the logits kept until the next forward. The first iteration's
gradients are compared with single-process eager's (FSDP: this rank's shard); the third iteration's
peak is measured with the CPU profiler (the moments exist from the first step on) and added to
what is alive before it: parameters, buffers, optimizer states (AdamW's per-parameter `step`
scalars too, which the prediction leaves out: 4 B each), the tokens.
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

from distributed_runs import WORLD_SIZE, _grad_errors, _parallel_transform, let_gloo_release_finished_work


def _model(spec: dict):
    from remat_opt.models.by_name import ModelSpec, build_model

    return build_model(ModelSpec("Llama-2-7b-hf", device="cpu", tiny=True, dtype="float32", **spec))


def _loss(logits, tokens):
    import torch

    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens.reshape(-1))


def _eager_grads(spec: dict) -> dict:
    model, (tokens,) = _model(spec)
    _loss(model(tokens), tokens).backward()
    return {n: p.grad for n, p in model.named_parameters()}


def _alive_bytes(tensors) -> int:
    """Distinct storage bytes of `tensors`."""
    storages = {}
    for t in tensors:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _run(spec: dict, strategy: str, plan_path: str, rank: int) -> dict:
    import thunder
    import torch

    from remat_opt.executors import executors_for
    from remat_opt.transform.cost_remat import CostRemat
    from remat_opt.transform.explain import last_planned_step
    from remat_opt.validation.measure import trace_cpu_allocations

    model, (tokens,) = _model(spec)
    transforms = [_parallel_transform(strategy), CostRemat(plan=plan_path, device_spec="cpu")]
    jitted = thunder.jit(model, transforms=transforms, executors=executors_for("fused-sdpa"))
    optimizer = torch.optim.AdamW(jitted.parameters(), lr=1e-4, fused=True)  # as benchmark_litgpt.py
    held = {}

    def iteration():
        logits = jitted(tokens)
        held.clear()  # the benchmark's `logits = model(...)` drops the previous iteration's logits here
        _loss(logits, tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        held["logits"] = logits

    logits = jitted(tokens)
    _loss(logits, tokens).backward()
    grad_error, grad_relative_error = _grad_errors(strategy, jitted, _eager_grads(spec), rank)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    held["logits"] = logits
    del logits
    iteration()
    # The profiler cannot see a block allocated before the call freed during it: the previous
    # logits are dropped before the measured iteration, so the measurement is of every phase but
    # the forward (where the benchmark still holds them; the test checks the peak is not there).
    held.clear()
    states = [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
    before = _alive_bytes([*jitted.parameters(), *jitted.buffers(), *states, tokens])
    trace = trace_cpu_allocations(iteration)
    return {"grad_error": grad_error, "grad_relative_error": grad_relative_error,
            "measured_peak_bytes": before + trace.peak_delta_bytes, "alive_before_bytes": before,
            "tag_targets": sorted(last_planned_step(jitted).plan.recomputed_tag_targets)}


def run_rank(rank: int, port: int, out_dir: str, spec: dict, strategy: str, plan_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch

    torch.set_num_threads(1)
    from remat_opt import _compat  # noqa: F401  (before thunder)

    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    waits = let_gloo_release_finished_work()
    try:
        result = _run(spec, strategy, plan_path, rank)
    except Exception:
        result = {"error": traceback.format_exc()}
    finally:
        result["wait_timeouts"] = waits["timeouts"]
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        dist.destroy_process_group()


def spawn(spec: dict, strategy: str, plan_path: str, out_dir: str, timeout_s: float = 300.0) -> list[dict]:
    """Runs the configuration on 2 gloo ranks; returns each rank's results (raises on a hang)."""
    from distributed_runs import spawn_ranks

    return spawn_ranks(run_rank, (out_dir, spec, strategy, plan_path), out_dir, timeout_s)
