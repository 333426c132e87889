"""Step time and saved bytes: Thunder alone vs CostRemat at several activation budgets, side by side.

    .venv/bin/python benchmarks/cost_remat_step.py --n-layer 2 --seq 256 --steps 15

The systems run round-robin (one step of each, repeated), so machine noise hits all of them alike;
the table gives median step times and their ratio to Thunder without CostRemat. At a budget at or
above save-all (the #1646 case) CostRemat must recompute nothing expensive: its ratio should be
within noise of 1.
"""

from __future__ import annotations

import argparse
import statistics
import time

from remat_opt import _compat  # noqa: F401  (applies the torch compatibility step before thunder)
import thunder
import torch

from remat_opt.executors.sdpa_cpu import sdpa_cpu_ex
from remat_opt.validation.measure import measure_saved_bytes
from remat_opt.core.report import format_bytes
from remat_opt.transform.cost_remat import CostRemat


def _system(args, transform):
    """A litgpt model of `args.model`'s family, `args.width` wide, jitted with the fused SDPA."""
    from litgpt import GPT, Config

    config = Config.from_name(
        args.model, n_layer=args.n_layer, n_embd=args.width, n_head=4, n_query_groups=4,
        head_size=args.width // 4, intermediate_size=4 * args.width, padded_vocab_size=256,
        vocab_size=256, block_size=args.seq,
    )
    torch.manual_seed(0)
    model = GPT(config)
    inputs = (torch.randint(0, 256, (1, args.seq)),)
    transforms = [] if transform is None else [transform]
    jitted = thunder.jit(model, transforms=transforms, executors=[sdpa_cpu_ex, *thunder.get_default_executors()])
    return jitted, inputs


def _step_s(jitted, inputs) -> float:
    start = time.perf_counter()
    jitted(*inputs).float().sum().backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Llama-2-7b-hf")
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--width", type=int, default=256, help="n_embd (4 heads, MLP 4x)")
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)

    baseline, inputs = _system(args, None)
    save_all = measure_saved_bytes(baseline, *inputs).activation_bytes
    systems = {"thunder": (baseline, inputs)}
    for label, fraction in (("CostRemat save-all", 1.0), ("CostRemat 50%", 0.5), ("CostRemat 25%", 0.25)):
        systems[label] = _system(args, CostRemat(activation_budget_gb=fraction * save_all / 1e9, device_spec="cpu"))
    saved = {label: measure_saved_bytes(j, *i).activation_bytes for label, (j, i) in systems.items()}
    for jitted, inputs in systems.values():  # warm-up
        _step_s(jitted, inputs)
    times: dict[str, list[float]] = {label: [] for label in systems}
    for _ in range(args.steps):
        for label, (jitted, inputs) in systems.items():
            times[label].append(_step_s(jitted, inputs))
    base_ms = 1e3 * statistics.median(times["thunder"])
    print(f"{args.model} n_layer={args.n_layer} seq={args.seq} width={args.width}, {args.steps} steps, 1 thread")
    print(f"{'system':<22}{'saved':>14}{'median ms':>12}{'ratio':>8}")
    for label in systems:
        median_ms = 1e3 * statistics.median(times[label])
        print(f"{label:<22}{format_bytes(saved[label]):>14}{median_ms:>12.2f}{median_ms / base_ms:>8.3f}")


if __name__ == "__main__":
    main()
