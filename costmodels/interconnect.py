"""Interconnects between ranks, and the time of a collective over one (a leaf: no remat_opt).

Bandwidths are **per direction, per GPU**: what one rank can send (and at the same time receive).
NVIDIA's sheets print NVLink and PCIe figures as the bidirectional total; the per-direction value is
half of it. Sources (checked 2025):
    * H100 SXM5 / H200 SXM: NVLink 4 "900GB/s", PCIe Gen5 "128GB/s" (bidirectional):
      https://www.nvidia.com/en-us/data-center/h100/, https://www.nvidia.com/en-us/data-center/h200/
      -> 450 GB/s and 64 GB/s per direction.
    * A100 80GB SXM: NVLink 3 "600GB/s", PCIe Gen4 "64GB/s": https://www.nvidia.com/en-us/data-center/a100/
      -> 300 GB/s and 32 GB/s per direction.
    * L40S: PCIe Gen4 x16 "64GB/s bidirectional", no NVLink: https://www.nvidia.com/en-us/data-center/l40s/
    * InfiniBand NDR (NVIDIA ConnectX-7, one 400 Gb/s port per GPU as in DGX H100):
      https://www.nvidia.com/en-us/networking/infiniband-adapters/ -> 50 GB/s per direction.

Latencies are **nominal assumptions, not measured**: the time one collective call costs beyond its
bytes (launch, synchronization, protocol), which dominates small collectives (Hu et al., "Demystifying
NCCL", arXiv:2507.04786, on NCCL's latency-oriented LL protocols). Link latencies are a few
microseconds (NVSwitch ~1 us, one InfiniBand hop ~2 us); we take per-call figures a few times larger.

A CPU run with the gloo backend (the tests: ranks on one host, TCP over loopback) gets a deliberately
conservative nominal figure (1 GB/s, 100 us per call): gloo's real speed on a given host varies, and
re-gathering should look expensive there rather than free.

Collective times are the ring algorithm's (NCCL's default for large messages): an all-gather or a
reduce-scatter of a tensor of B bytes (the full, unsharded size) moves B * (w - 1) / w bytes through
each rank's link; an all-reduce twice that.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True, slots=True)
class Interconnect:
    """One kind of link between ranks.

    Attributes:
        name: short name (``"NVLink4"``, ``"InfiniBand-NDR"``).
        bandwidth_bytes_per_s: bytes per second per direction per rank.
        latency_s: fixed time of one collective call.
        source: where the figures come from.
    """

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float
    source: str


NVLINK4 = Interconnect("NVLink4", 450 * GB, 10e-6, "H100/H200 SXM datasheet: 900 GB/s bidirectional; latency nominal")
NVLINK3 = Interconnect("NVLink3", 300 * GB, 10e-6, "A100 SXM datasheet: 600 GB/s bidirectional; latency nominal")
PCIE5 = Interconnect("PCIe5-x16", 64 * GB, 15e-6, "H100 datasheet: PCIe Gen5 128 GB/s bidirectional; latency nominal")
PCIE4 = Interconnect("PCIe4-x16", 32 * GB, 15e-6, "A100/L40S datasheets: PCIe Gen4 64 GB/s bidirectional; latency nominal")
INFINIBAND_NDR = Interconnect("InfiniBand-NDR", 50 * GB, 20e-6, "ConnectX-7: 400 Gb/s per port; latency nominal")
GLOO_LOOPBACK = Interconnect("gloo-loopback", 1 * GB, 100e-6,
                             "nominal and conservative for gloo over loopback TCP on one host, not measured")

INTERCONNECTS: dict[str, Interconnect] = {
    link.name: link for link in (NVLINK4, NVLINK3, PCIE5, PCIE4, INFINIBAND_NDR, GLOO_LOOPBACK)
}


def ring_bytes_per_rank(kind: str, full_bytes: int, world_size: int) -> int:
    """Bytes one rank sends for a ring collective over a tensor of `full_bytes` (unsharded size).

    Args:
        kind: ``"all_gather"``, ``"reduce_scatter"`` or ``"all_reduce"``.
        full_bytes: bytes of the full tensor (all-gather: the output; reduce-scatter: the input).
        world_size: ranks in the group (1: nothing moves).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    steps = {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 2}
    if kind not in steps:
        raise ValueError(f"unknown collective {kind!r}; known: {', '.join(steps)}")
    return steps[kind] * full_bytes * (world_size - 1) // world_size


# Backends that run a collective through a flat staging buffer of the full tensor, allocated and freed
# by the backend while the collective runs: torch's ProcessGroupGloo gathers into `newLikeFlat(outputs)`
# and reduce-scatters through `flattenDenseTensors(inputs)`, then copies out (measured on 2 gloo ranks:
# one extra allocation of the full size per call). NCCL reads and writes the tensors in place.
STAGING_KINDS = {"gloo": ("all_gather", "reduce_scatter")}


def staging_bytes(backend: str | None, kind: str, full_bytes: int) -> int:
    """Bytes the process group's `backend` allocates for itself while a `kind` collective over a tensor
    of `full_bytes` (unsharded size) runs (0: none)."""
    return full_bytes if kind in STAGING_KINDS.get(backend or "", ()) else 0


def collective_time_s(network_bytes: int, calls: int, link: Interconnect) -> float:
    """Time of `calls` collective calls that move `network_bytes` per rank over `link`."""
    return network_bytes / link.bandwidth_bytes_per_s + calls * link.latency_s
