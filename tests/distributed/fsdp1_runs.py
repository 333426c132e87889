"""2-rank gloo runs of ``benchmark_litgpt.py``'s FSDP1 iteration on the CPU, for
`tests/distributed/test_torch_fsdp.py` (spawned; not a test module).

Each rank builds a tiny litgpt model, wraps it as the benchmark does with ``--compile thunder-dynamo
--checkpoint_activations=True --distributed_mode=fsdp --shard_mode zero3`` (FSDP1 ``FULL_SHARD``, one
unit per ``Block``, ``use_orig_params=True``, ``checkpoint_wrapper`` on every block, Dynamo with
Thunder as its backend), runs two iterations (the optimizer's moments then exist), and measures the
third's allocations with the CPU profiler: the bytes allocated during the iteration and alive at its
peak. Each rank writes them, with its FSDP units' padded flat-parameter sizes, as JSON.
"""

from __future__ import annotations

import functools
import json
import os
import traceback
from pathlib import Path

WORLD_SIZE = 2
# name: litgpt overrides of Llama-2-7b-hf (width 128, 4 heads): the root's terms make the peak
# ("root", a wide vocabulary), or the blocks' backward does ("blocks", a wide MLP, 3 blocks).
CONFIGS = {
    "root": dict(n_layer=2, intermediate_size=344, vocab_size=2048, seq=64),
    "blocks": dict(n_layer=3, intermediate_size=1376, vocab_size=256, seq=128),
}


def litgpt_config(name: str):
    from litgpt import Config

    c = CONFIGS[name]
    return Config.from_name("Llama-2-7b-hf", n_layer=c["n_layer"], n_embd=128, n_head=4,
                            intermediate_size=c["intermediate_size"], vocab_size=c["vocab_size"],
                            padded_vocab_size=c["vocab_size"], block_size=c["seq"])


def _wrapped_model(config):
    import torch
    from litgpt import GPT
    from litgpt.model import Block
    from thunder.dynamo import ThunderCompiler
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (apply_activation_checkpointing,
                                                                             checkpoint_wrapper)
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    from remat_opt.executors import resolve_executors

    torch.manual_seed(0)
    model = FullyShardedDataParallel(
        GPT(config), sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True,
        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block}),
        device_id=torch.device("cpu"))
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper,
                                   check_fn=lambda m: isinstance(m, Block))
    _, executors = resolve_executors(None, "cpu")
    return torch._dynamo.optimize(backend=ThunderCompiler(executors=executors))(model), model


def _unit_numels(fsdp_model) -> list[int]:
    """The padded unsharded flat parameters' sizes (set at FSDP1's lazy init, the first forward)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return sorted({m._handle.flat_param._padded_unsharded_size.numel()
                   for m in FullyShardedDataParallel.fsdp_modules(fsdp_model) if m._handle is not None})


def _measure(name: str) -> dict:
    import torch

    from remat_opt.validation.measure import trace_cpu_allocations

    config = litgpt_config(name)
    model, fsdp_model = _wrapped_model(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, config.vocab_size, (1, config.block_size), generator=torch.Generator().manual_seed(0))
    held = {}

    def iteration():  # the benchmark's loop body: the logits stay referenced until the next forward returns
        logits = model(tokens).reshape(-1, config.padded_vocab_size)
        loss = torch.nn.functional.cross_entropy(logits, tokens.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        held["logits"] = logits

    iteration()
    iteration()
    trace = trace_cpu_allocations(iteration)
    torch._dynamo.reset()
    return {"config": name, "peak_delta_bytes": trace.peak_delta_bytes, "unit_numels": _unit_numels(fsdp_model)}


def run_rank(rank: int, port: int, out_dir: str, names: list[str]) -> None:
    import torch.distributed as dist

    from distributed_runs import let_gloo_release_finished_work

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    let_gloo_release_finished_work()
    try:
        import remat_opt._compat  # noqa: F401  (before thunder)

        results = [_measure(name) for name in names]
    except Exception:
        results = [{"error": traceback.format_exc()}]
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def spawn(names: list[str], out_dir: str, timeout_s: float = 300.0) -> list[list[dict]]:
    """Runs `names` of `CONFIGS` on 2 gloo ranks; returns each rank's results (raises on a hang)."""
    from distributed_runs import spawn_ranks

    return spawn_ranks(run_rank, (out_dir, names), out_dir, timeout_s)
