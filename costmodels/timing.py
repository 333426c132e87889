"""Timing one call on a device: warm-up, then the median of repeats (CUDA events on a GPU, wall
clock on the CPU). Used by the profiler of `remat_opt.costing.profiling` and by the benchmarks."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from costmodels.devices import median_time_s


TIMING_METHODS = ("in-order", "loop")


@dataclass(frozen=True, slots=True)
class ProfileOptions:
    """How to time each op.

    Attributes:
        method: ``"in-order"``: replay the whole graph `warmup` + `repeats` times and time every call
            as it runs in the step's order (`remat_opt.costing.profiling.replay`); ``"loop"``: time each
            distinct op alone, repeating the call on the same tensors.
        warmup: untimed passes (in order) or calls (loop) before timing.
        repeats: timed passes (in order) or calls at least (loop).
        min_time_s: (loop) keep repeating (up to `max_repeats`) until this much time was timed.
        max_repeats: (loop) timed calls at most.
    """

    method: str = "in-order"
    warmup: int = 3
    repeats: int = 10
    min_time_s: float = 0.01
    max_repeats: int = 1000

    def __post_init__(self):
        if self.method not in TIMING_METHODS:
            raise ValueError(f"unknown timing method {self.method!r}: use one of {', '.join(TIMING_METHODS)}")


def _cuda_median_time_s(fn: Callable, options: ProfileOptions) -> tuple[float, int]:
    for _ in range(options.warmup):
        fn()
    times = []
    while len(times) < options.repeats or (sum(times) < options.min_time_s and len(times) < options.max_repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times), len(times)


def time_call(fn: Callable, device: str, options: ProfileOptions) -> tuple[float, int]:
    """``(median seconds, repeats)`` of `fn()` on `device` (CUDA events on a GPU, wall clock on the CPU)."""
    if device.startswith("cuda"):
        return _cuda_median_time_s(fn, options)
    counter = [0]

    def counted():
        counter[0] += 1
        return fn()

    seconds = median_time_s(
        counted,
        warmup=options.warmup,
        repeats=options.repeats,
        min_total_s=options.min_time_s,
        max_repeats=options.max_repeats,
    )
    return seconds, counter[0] - options.warmup
