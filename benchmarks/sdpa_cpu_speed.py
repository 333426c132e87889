"""Times SDPA forward+backward on CPU: Thunder's decomposition vs the fused ``sdpa_cpu_ex``.

Runs one SDPA-heavy function (default B=1, H=8, T=1024, D=64, causal, float32) compiled two
ways: with Thunder's default executors, which decompose SDPA on CPU, and with
``remat_opt.executors.sdpa_cpu.sdpa_cpu_ex`` first in the list. For each it prints the median
time of N forward+backward steps and the bytes saved for backward (the sum of
``numel * element_size`` over the tensors the forward trace returns for backward), then the
ratio of the two times.

Usage:
    .venv/bin/python benchmarks/sdpa_cpu_speed.py [--batch 1 --heads 8 --seq 1024 --head-dim 64]
        [--steps 10 --warmup 2 --dtype float32 --no-causal]
"""

from __future__ import annotations

import argparse
import statistics
import time

from remat_opt import _compat  # noqa: F401  (applies the torch compatibility step before thunder)

import torch
import torch.nn.functional as F

import thunder
from thunder.core.proxies import TensorProxy
from thunder.core.pytree import tree_flatten

from remat_opt.executors.sdpa_cpu import sdpa_cpu_ex


def parse_args() -> argparse.Namespace:
    """Parses the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "float64"])
    parser.add_argument("--no-causal", dest="causal", action="store_false")
    return parser.parse_args()


def make_fn(is_causal: bool):
    """Returns the SDPA function to compile.

    Args:
        is_causal: Whether SDPA applies a causal mask.

    Returns:
        ``fn(q, k, v) -> out``.
    """

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    return fn


def saved_for_backward_bytes(jfn) -> int:
    """Bytes of the tensors the last forward execution trace of ``jfn`` saves for backward.

    Args:
        jfn: A ``thunder.jit``-compiled function that has run with inputs requiring grad.

    Returns:
        The sum of ``numel * element size`` over the saved tensor proxies.
    """
    _, saved = thunder.last_traces(jfn)[-1].output
    leaves, _ = tree_flatten(saved)
    return sum(p.numel * p.dtype.bytes for p in leaves if isinstance(p, TensorProxy))


def time_steps(jfn, inputs, cotangent, steps: int, warmup: int) -> list[float]:
    """Times forward+backward steps of ``jfn``.

    Args:
        jfn: The compiled function.
        inputs: ``(q, k, v)``, leaves with requires_grad=True.
        cotangent: Gradient of the output.
        steps: Number of timed steps.
        warmup: Number of untimed steps first (the first one compiles).

    Returns:
        Seconds per timed step.
    """
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        out = jfn(*inputs)
        torch.autograd.grad(out, inputs, cotangent)
        elapsed = time.perf_counter() - start
        if i >= warmup:
            times.append(elapsed)
    return times


def main() -> None:
    """Runs both variants and prints their figures."""
    args = parse_args()
    dtype = getattr(torch, args.dtype)
    shape = (args.batch, args.heads, args.seq, args.head_dim)
    gen = torch.Generator().manual_seed(0)
    inputs = tuple(torch.randn(shape, generator=gen).to(dtype).requires_grad_(True) for _ in range(3))
    cotangent = torch.randn(shape, generator=gen).to(dtype)
    fn = make_fn(args.causal)

    variants = {
        "decomposed (default executors)": thunder.get_default_executors(),
        "fused (sdpa_cpu_ex)": [sdpa_cpu_ex, *thunder.get_default_executors()],
    }
    print(
        f"SDPA B={args.batch} H={args.heads} T={args.seq} D={args.head_dim} {args.dtype} "
        f"causal={args.causal}; median of {args.steps} fwd+bwd steps after {args.warmup} warmup; "
        f"torch threads={torch.get_num_threads()}"
    )
    medians = {}
    for name, executors in variants.items():
        jfn = thunder.jit(fn, executors=executors)
        times = time_steps(jfn, inputs, cotangent, args.steps, args.warmup)
        medians[name] = statistics.median(times)
        saved = saved_for_backward_bytes(jfn)
        print(f"  {name:32s} median {medians[name] * 1e3:9.2f} ms   saved for backward {saved / 2**20:9.2f} MiB")
    decomposed, fused = medians.values()
    print(f"  speed-up (decomposed / fused): {decomposed / fused:.2f}x")


if __name__ == "__main__":
    main()
