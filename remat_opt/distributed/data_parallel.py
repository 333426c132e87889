"""Per-rank graphs of Thunder's FSDP and DDP for any world size, in one process (offline planning).

Thunder's `FSDPTransform` and `DDPTransform` read the default process group: its size decides the
shards and the collectives of the per-rank trace. Offline, `fake_process_group(N)` initializes
torch's fake process group (`torch.testing._internal.distributed.fake_pg`: collectives that move
nothing) as rank 0 of N, so that Thunder traces the trace rank 0 of N real ranks would compile, on
any device (meta included), without starting N processes. Its backend allocates no staging buffer
(as NCCL), so the graph is the one a GPU cluster runs, not the one gloo runs on CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from math import gcd

from remat_opt import _compat  # noqa: F401  (before thunder)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from remat_opt.distributed.collective_order import check_in_flight  # noqa: E402

STRATEGIES = ("fsdp", "ddp")


@dataclass(frozen=True, slots=True)
class DataParallel:
    """How a model is split over ranks: `strategy` (``"fsdp"`` or ``"ddp"``) over `world_size` ranks;
    with FSDP, at most `collectives_in_flight` all-gathers and reduce-scatters in flight beside the one
    in use, as ``CostRemat(collectives_in_flight=...)`` runs them (None: Thunder's order)."""

    strategy: str
    world_size: int
    collectives_in_flight: int | None = None

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown data-parallel strategy {self.strategy!r}; use one of: {', '.join(STRATEGIES)}")
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world size must be a positive integer, got {self.world_size!r}")
        check_in_flight(self.collectives_in_flight)
        if self.collectives_in_flight is not None and self.strategy != "fsdp":
            raise ValueError(f"collectives_in_flight applies to FSDP's all-gathers and reduce-scatters; {self.strategy.upper()} "
                             "has neither")

    def describe(self) -> str:
        in_flight = "" if self.collectives_in_flight is None else f", {self.collectives_in_flight} collectives in flight"
        return f"{self.strategy.upper()} over {self.world_size} ranks (per rank{in_flight})"


def data_parallel_of(strategy: str | None, world_size: int | None, collectives_in_flight: int | None = None, *,
                     spell=lambda name: name) -> DataParallel | None:
    """The `DataParallel` the three options name, None with neither strategy nor world size: what
    `remat_opt.analyze_model` and the CLI's ``--strategy/--world-size/--collectives-in-flight`` take.
    `spell` writes an option's name as the caller's user types it (a keyword, a flag).

    Raises:
        ValueError: one of strategy and world size without the other, or collectives in flight
            without FSDP (one line, with an example).
    """
    if collectives_in_flight is not None and strategy != "fsdp":
        raise ValueError(f"{spell('collectives_in_flight')} goes with {spell('strategy')} fsdp (it places FSDP's "
                         "all-gathers and reduce-scatters)")
    if world_size is None and strategy is None:
        return None
    if world_size is None or strategy is None:
        raise ValueError(f"{spell('world_size')} and {spell('strategy')} go together: e.g. {spell('world_size')} 8 "
                         f"{spell('strategy')} fsdp")
    return DataParallel(strategy, world_size, collectives_in_flight)


def check_shardable(model: torch.nn.Module, world_size: int) -> None:
    """Raises `ValueError` (one line) unless `world_size` divides the first dimension of every
    parameter FSDP shards: Thunder would pad the shards, which the plan does not model."""
    sizes = {name: p.shape[0] for name, p in model.named_parameters() if p.ndim > 0}
    bad = [(name, size) for name, size in sizes.items() if size % world_size]
    if bad:
        common = 0
        for size in sizes.values():
            common = gcd(common, size)
        fits = [d for d in range(2, min(common, 4096) + 1) if common % d == 0][:8]
        name, size = bad[0]
        raise ValueError(
            f"world size {world_size} does not divide what FSDP shards: {name} has {size} rows "
            f"({len(bad)} parameter(s) in all); use a world size dividing every parameter's first dimension"
            + (f" ({', '.join(map(str, fits))}, ...)" if fits else " (only 1 does)"))


@contextmanager
def fake_process_group(world_size: int) -> Iterator[None]:
    """Rank 0 of a fake `world_size`-rank default process group for the duration (see the module
    docstring); an initialized group of that size is used as it is."""
    if dist.is_initialized():
        if dist.get_world_size() != world_size:
            raise ValueError(f"a process group of {dist.get_world_size()} ranks is already initialized; "
                             f"plan for world size {dist.get_world_size()} or outside it")
        yield
        return
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def parallel_transform(strategy: str, device: torch.device):
    """Thunder's transform for `strategy` over the default process group, on `device`."""
    if strategy == "fsdp":
        from thunder.distributed.transforms.fsdp_v2 import FSDPTransform

        return FSDPTransform(device=device)
    from thunder.distributed.transforms.ddp_v2 import DDPTransform

    return DDPTransform(process_group=dist.distributed_c10d._get_default_group(), bucket_size_in_mb=25.0,
                        broadcast_from=None)
