"""Device specs (vendor sheets for GPUs, a calibration for the CPU) and the roofline estimate.

GPU peaks are **dense** figures: NVIDIA's sheets print tensor-core numbers "with sparsity" and give
the dense value as half of it. "matrix" peaks are tensor-core peaks, used for matmul, linear and
attention; "vector" peaks are the non-tensor (CUDA core) FP32/FP64 peaks, used for everything else.
float32 matrix work is taken at the FP32 peak, not TF32, because torch leaves
``torch.backends.cuda.matmul.allow_tf32`` off by default; `with_tf32` gives the TF32 variant.

Sources (checked 2025):
    * H100 SXM5 80 GB: NVIDIA H100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h100/
      (FP64 34, FP64 TC 67, FP32 67, TF32 989*, BF16/FP16 1,979*, FP8 3,958* TFLOPS, * = with
      sparsity; HBM3 3.35 TB/s).
    * H200 SXM 141 GB: NVIDIA H200 datasheet, https://www.nvidia.com/en-us/data-center/h200/ (same
      Hopper compute as H100 SXM; HBM3e 4.8 TB/s).
    * A100 80 GB SXM: NVIDIA A100 datasheet, https://www.nvidia.com/en-us/data-center/a100/ (FP64 9.7,
      FP64 TC 19.5, FP32 19.5, TF32 156 (312*), BF16/FP16 312 (624*) TFLOPS; HBM2e 2,039 GB/s).
    * L40S 48 GB: NVIDIA L40S datasheet, https://www.nvidia.com/en-us/data-center/l40s/ (FP32 91.6,
      TF32 183 (366*), BF16/FP16 362.05 (733*), FP8 733 (1,466*) TFLOPS; GDDR6 864 GB/s).

Transcendental functions (exp, log, tanh, erf, rsqrt, ...) run on a GPU's special-function units:
16 results per clock per SM on compute capability 8.0-9.0 (CUDA C++ Programming Guide, "Arithmetic
Instructions" throughput table), i.e. SMs x 16 x boost clock: H100/H200 SXM 132 x 16 x 1.98 GHz =
4.2e12/s (FlashAttention-3, Shah et al. 2024, quotes 3.9 TFLOPS of exponentials on H100 SXM5), A100
108 x 16 x 1.41 GHz = 2.4e12/s, L40S 142 x 16 x 2.52 GHz = 5.7e12/s.

The CPU has no sheet: `calibrate_cpu` measures matmul FLOP/s per dtype, elementwise and exp
throughput on cache-resident data, copy bandwidth (cache-resident and from DRAM) and the per-op
overheads (a tiny kernel, a view) when a profile is taken.

Achievable matrix throughput (GPUs): no GEMM runs at the sheet's peak. A matrix product of shape
``(batch, M, N, K)`` (`OpCost.gemm_shapes`) runs at ``matrix_peak * gemm_efficiency``, the product of
    * the achievable fraction of peak for large GEMMs, per dtype (`MAMF_FRACTIONS`): Stas Bekman's
      "Maximum Achievable Matmul FLOPS" table (github.com/stas00/ml-engineering,
      compute/accelerator/README.md), the best ``torch.matmul`` shape of a brute-force search;
    * wave and tile quantization (`wave_utilization`): cuBLAS splits the output into
      ``GEMM_TILE`` tiles (M and N padded up to tile multiples) and runs them in waves of one tile
      per SM, a partly filled last wave taking as long as a full one (NVIDIA, "Matrix Multiplication
      Background User's Guide", ch. 3 "Dimension Quantization Effects"). Useful share: ``batch*M*N /
      (waves * SMs * tile_m * tile_n)`` with ``waves = ceil(batch * ceil(M/tile_m) * ceil(N/tile_n) /
      SMs)``, the better of the tile's two orientations.
Matrix FLOPs without a shape (fused attention, FLOPs counted by torch's counter) run at the large-GEMM
fraction alone. No small-K term: no public measurement to size it from. Nothing here is fitted to a
measured training step. CPU specs (nominal, calibrated) have no fractions and no SMs: their matmul
rate is the calibrated one, unchanged.

Roofline: ``time = max(matrix_time + other_flops / vector_peak + transcendentals /
special_rate, bytes / bandwidth)`` where the bandwidth is the cache's when the op's bytes fit in it
(CPU), + kernels * launch_overhead``; a view costs ``view_overhead`` and Thunder bookkeeping
(``shallow_copy``, ``update_aliases``: no torch call) nothing.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from dataclasses import dataclass, replace

from costmodels.formulas import OpCost, gemm_flops
from costmodels.interconnect import GLOO_LOOPBACK, NVLINK3, NVLINK4, PCIE4, Interconnect, collective_time_s

TERA = 1e12

# Per-op overheads assumed for GPUs: a CUDA kernel launch from PyTorch eager costs a few microseconds
# of host time; views are metadata only and overlap with running kernels.
GPU_LAUNCH_OVERHEAD_S = 4e-6
GPU_VIEW_OVERHEAD_S = 0.0


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """Peak throughput of one device.

    Attributes:
        name: short name (``"H100-SXM"``, ``"cpu"``).
        matrix_flops_per_s: ``(dtype, FLOP/s)`` pairs, dense peak of matrix units.
        vector_flops_per_s: ``(dtype, FLOP/s)`` pairs, peak of non-matrix units.
        memory_bandwidth_bytes_per_s: memory (DRAM, HBM) bandwidth.
        transcendentals_per_s: transcendental evaluations per second (special-function units).
        launch_overhead_s: fixed time per kernel.
        view_overhead_s: fixed time of an op that launches nothing (a view).
        source: where the numbers come from (a datasheet, or "calibrated on ...").
        cache_bytes: an op whose bytes fit in this much cache moves them at `cache_bandwidth_bytes_per_s`
            (0: always memory bandwidth).
        cache_bandwidth_bytes_per_s: bandwidth of cache-resident data.
        interconnect: the link collectives between ranks use (`costmodels.interconnect`); a GPU's
            intra-node link by default (`with_interconnect` for another, e.g. InfiniBand across nodes).
        memory_bytes: the device memory NVML reports (``nvidia-smi``'s total: a GPU's "80GB" H100
            shows 81,559 MiB); 0 where unknown (the CPU: give the limit explicitly).
        matmul_fractions: ``(dtype, fraction)`` pairs, the share of the matrix peak large GEMMs
            achieve (`MAMF_FRACTIONS`); a dtype not listed takes bfloat16's; empty: 1.0 (CPUs, whose
            matmul rate is measured).
        sm_count: streaming multiprocessors, over which GEMM tiles are spread in waves
            (`wave_utilization`); 0: no wave or tile quantization (CPUs).
    """

    name: str
    matrix_flops_per_s: tuple[tuple[str, float], ...]
    vector_flops_per_s: tuple[tuple[str, float], ...]
    memory_bandwidth_bytes_per_s: float
    transcendentals_per_s: float
    launch_overhead_s: float
    view_overhead_s: float
    source: str
    cache_bytes: int = 0
    cache_bandwidth_bytes_per_s: float = 0.0
    interconnect: Interconnect = GLOO_LOOPBACK
    memory_bytes: int = 0
    matmul_fractions: tuple[tuple[str, float], ...] = ()
    sm_count: int = 0

    def matrix_peak(self, dtype: str) -> float:
        """Matrix FLOP/s for `dtype` (float32's for a dtype the sheet does not list)."""
        return _lookup(self.matrix_flops_per_s, dtype, self.name)

    def vector_peak(self, dtype: str) -> float:
        """Vector FLOP/s for `dtype` (float32's for a dtype the sheet does not list)."""
        return _lookup(self.vector_flops_per_s, dtype, self.name)


def _lookup(pairs: tuple[tuple[str, float], ...], dtype: str, device: str) -> float:
    table = dict(pairs)
    value = table.get(dtype, table.get("float32"))
    if value is None or value <= 0:
        raise ValueError(f"device {device!r} has no peak for dtype {dtype!r} nor float32; has {sorted(table)}")
    return value


def _gpu(
    name: str, matrix_tflops: dict, vector_tflops: dict, bandwidth_tb_s: float, special_t: float, source: str,
    interconnect: Interconnect, memory_mib: int,
) -> DeviceSpec:
    return DeviceSpec(
        matmul_fractions=tuple(MAMF_FRACTIONS[name].items()),
        sm_count=SM_COUNT[name],
        name=name,
        matrix_flops_per_s=tuple((k, v * TERA) for k, v in matrix_tflops.items()),
        vector_flops_per_s=tuple((k, v * TERA) for k, v in vector_tflops.items()),
        memory_bandwidth_bytes_per_s=bandwidth_tb_s * TERA,
        transcendentals_per_s=special_t * TERA,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        view_overhead_s=GPU_VIEW_OVERHEAD_S,
        source=source,
        interconnect=interconnect,
        memory_bytes=memory_mib * 2**20,
    )


_HOPPER_MATRIX = {"float64": 67.0, "float32": 67.0, "tfloat32": 494.7, "bfloat16": 989.4, "float16": 989.4,
                  "float8_e4m3fn": 1978.9, "float8_e5m2": 1978.9}  # fmt: skip
_HOPPER_VECTOR = {"float64": 34.0, "float32": 67.0}
# Device memory as NVML reports it (nvidia-smi's "Total", MiB): what the allocator can be handed at
# most (the CUDA context takes a few hundred MiB of it). Product names round it: "80GB" H100 and
# A100 show 81,559 and 81,920 MiB, "141GB" H200 143,771 MiB, "48GB" L40S 46,068 MiB (nvidia-smi
# output as published, e.g. modal.com's table of GPU memory capacities, 2024).
_MEMORY_MIB = {"H100-SXM": 81_559, "H200": 143_771, "A100-80GB": 81_920, "L40S": 46_068}

# Achievable share of the dense matrix peak for large GEMMs ("MAMF" / theory): Stas Bekman, "Maximum
# Achievable Matmul FLOPS comparison table", github.com/stas00/ml-engineering,
# compute/accelerator/README.md (commit 744d01e, 2026-08; torch.matmul, mean of 100 iterations after
# 50 warm-up ones, caches flushed, best shape of a brute-force search):
#   BF16: "NVIDIA H100 SXM | 794.5 | 989 | 80.3% | 2048x2048x13312 | 2.7.0+cu126 | H200 is the same",
#         "NVIDIA A100 SXM | 271.2 | 312 | 86.9% | 1024x10240x5120 | 2.6.0+cu126";
#   FP8 (float8_e4m3fn): "NVIDIA H100 SXM | 1402.6 | 1979 | 70.9%", "NVIDIA H200 SXM | 1453.4 | 1979 | 73.4%".
# H200 takes the H100 SXM's bf16 row, as that row's note says (same 700 W Hopper compute; the table's
# GH200, 828.6 of 989 = 83.8%, is a 900 W part). The table's earlier rows, since replaced (no cache
# flush): H100 SXM 792.1 (80.1%), A100 SXM 267.9 (85.9%), GH200 821.0 (83.0%). The L40S is not in the
# table: it takes the H100 SXM's fractions (the lowest of its Ampere and Hopper rows), a placeholder
# until measured. float32/tfloat32/float64 have no row and take bfloat16's (`DeviceSpec.matmul_fractions`).
_H100_BF16, _H100_FP8, _H200_FP8, _A100_BF16 = 794.5 / 989, 1402.6 / 1979, 1453.4 / 1979, 271.2 / 312
_FP8 = ("float8_e4m3fn", "float8_e5m2")
MAMF_FRACTIONS: dict[str, dict[str, float]] = {
    "H100-SXM": {"bfloat16": _H100_BF16, "float16": _H100_BF16, **dict.fromkeys(_FP8, _H100_FP8)},
    "H200": {"bfloat16": _H100_BF16, "float16": _H100_BF16, **dict.fromkeys(_FP8, _H200_FP8)},
    "A100-80GB": {"bfloat16": _A100_BF16, "float16": _A100_BF16},
    "L40S": {"bfloat16": _H100_BF16, "float16": _H100_BF16, **dict.fromkeys(_FP8, _H100_FP8)},
}
# Streaming multiprocessors: NVIDIA H100 whitepaper (132 on the SXM5 part; the H200 is the same die
# and configuration), A100 whitepaper (108), Ada (AD102) whitepaper / L40S sheet (142).
SM_COUNT = {"H100-SXM": 132, "H200": 132, "A100-80GB": 108, "L40S": 142}
# Output tile of one thread block (M x N). NVIDIA's "Matrix Multiplication Background User's Guide",
# 2.3 "Typical Tile Dimensions In cuBLAS And Performance", lists 256x128 and 128x256 as cuBLAS's most
# efficient tiles, the ones large GEMMs (the MAMF shapes) run with; ml-engineering's wave-quantization
# example (training/performance/README.md) takes the same 128x256 tile. Small GEMMs, for which cuBLAS
# picks smaller tiles or splits K, come out slower than they run.
GEMM_TILE = (128, 256)

GPU_SPECS: dict[str, DeviceSpec] = {
    spec.name: spec
    for spec in (
        _gpu("H100-SXM", _HOPPER_MATRIX, _HOPPER_VECTOR, 3.35, 4.18, "NVIDIA H100 datasheet (SXM5 80GB)", NVLINK4,
             _MEMORY_MIB["H100-SXM"]),
        _gpu("H200", _HOPPER_MATRIX, _HOPPER_VECTOR, 4.8, 4.18, "NVIDIA H200 datasheet (SXM 141GB)", NVLINK4,
             _MEMORY_MIB["H200"]),
        _gpu(
            "A100-80GB",
            {"float64": 19.5, "float32": 19.5, "tfloat32": 156.0, "bfloat16": 312.0, "float16": 312.0},
            {"float64": 9.7, "float32": 19.5},
            2.039,
            2.44,
            "NVIDIA A100 datasheet (80GB SXM)",
            NVLINK3,
            _MEMORY_MIB["A100-80GB"],
        ),
        _gpu(
            "L40S",
            {"float32": 91.6, "tfloat32": 183.0, "bfloat16": 362.05, "float16": 362.05, "float8_e4m3fn": 733.0},
            {"float64": 1.43, "float32": 91.6},
            0.864,
            5.73,
            "NVIDIA L40S datasheet",
            PCIE4,
            _MEMORY_MIB["L40S"],
        ),
    )
}

# Substrings of `torch.cuda.get_device_name()` -> spec name (first match wins).
_CUDA_NAME_HINTS = (("H200", "H200"), ("H100", "H100-SXM"), ("A100", "A100-80GB"), ("L40S", "L40S"))
# The one alias table of device-spec names users type (CLI `--device-spec`, `device_spec=`), lower
# case -> spec name; "cpu" is the nominal CPU (or a cost table's calibration).
DEVICE_SPEC_ALIASES = {"h100": "H100-SXM", "h100-sxm": "H100-SXM", "h100-sxm5": "H100-SXM", "h200": "H200",
                       "a100": "A100-80GB", "a100-80gb": "A100-80GB", "l40s": "L40S", "cpu": "cpu"}  # fmt: skip
# The short names to offer in help and errors.
DEVICE_SPEC_CHOICES = ("h100", "h200", "a100", "l40s", "cpu")


def device_spec_name(name: object) -> str:
    """The spec name (a key of `GPU_SPECS`, or ``"cpu"``) of a name a user typed: a short name
    (``"h100"``), any case, or a spec name (``"H100-SXM"``).

    Raises:
        ValueError: `name` is not a string or names no spec; the message lists what works.
    """
    known = f"{', '.join(DEVICE_SPEC_CHOICES)} (or a spec name: {', '.join(GPU_SPECS)})"
    if not isinstance(name, str):
        raise ValueError(f"device_spec must be a name such as 'h100' or 'cpu', got {name!r} "
                         f"({type(name).__name__}); use one of {known}")
    key = name.strip()
    if key in GPU_SPECS:
        return key
    if key.lower() in DEVICE_SPEC_ALIASES:
        return DEVICE_SPEC_ALIASES[key.lower()]
    raise ValueError(f"unknown device spec {name!r}; use one of {known}, or profile this device with "
                     "`remat-opt profile` and pass its cost table")


def with_tf32(spec: DeviceSpec) -> DeviceSpec:
    """`spec` with float32 matrix work at the TF32 tensor-core peak (``allow_tf32=True``)."""
    table = dict(spec.matrix_flops_per_s)
    if "tfloat32" not in table:
        return spec
    table["float32"] = table["tfloat32"]
    return replace(spec, matrix_flops_per_s=tuple(table.items()), name=f"{spec.name}+tf32")


def with_interconnect(spec: DeviceSpec, interconnect: Interconnect) -> DeviceSpec:
    """`spec` with collectives over `interconnect` (e.g. `costmodels.interconnect.INFINIBAND_NDR`
    when the ranks span nodes)."""
    return replace(spec, interconnect=interconnect, name=f"{spec.name}+{interconnect.name}")


def get_device_spec(name: str) -> DeviceSpec:
    """The spec sheet of a GPU by name (``"H100"``, ``"h200"``, ``"A100-80GB"``, ``"L40S"``) or a CUDA device name.

    Raises:
        ValueError: no sheet matches `name`; the message lists the known devices.
    """
    key = DEVICE_SPEC_ALIASES.get(name.lower(), name)
    if key in GPU_SPECS:
        return GPU_SPECS[key]
    for hint, spec_name in _CUDA_NAME_HINTS:
        if hint.lower() in name.lower():
            return GPU_SPECS[spec_name]
    raise ValueError(
        f"no device spec for {name!r}; known: {', '.join(GPU_SPECS)} (or profile this device with "
        "`remat-opt profile` and pass its cost table)"
    )


# ---------------------------------------------------------------------------------------------
# CPU calibration
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CpuCalibration:
    """What `calibrate_cpu` measured on this CPU (rates exclude the per-op overhead).

    Attributes:
        matmul_flops_per_s: ``(dtype, FLOP/s)``: the best of square matmuls of a few sizes, per dtype.
        vector_flops_per_s: FLOP/s of an elementwise add on cache-resident float32 data.
        transcendentals_per_s: ``exp`` evaluations per second on cache-resident float32 data.
        memory_bandwidth_bytes_per_s: bytes read plus written per second by a copy larger than the caches.
        cache_bandwidth_bytes_per_s: the same for a copy that fits in `cache_bytes`.
        cache_bytes: size of the per-core cache the second copy fits in (L2).
        launch_overhead_s: median time of small kernels (multiply, add a scalar, row sum, negate
            of 64 elements): what a kernel costs beyond its work.
        view_overhead_s: median time of small views (permute, reshape, unsqueeze, expand).
        threads: ``torch.get_num_threads()`` when measured.
    """

    matmul_flops_per_s: tuple[tuple[str, float], ...]
    vector_flops_per_s: float
    transcendentals_per_s: float
    memory_bandwidth_bytes_per_s: float
    cache_bandwidth_bytes_per_s: float
    cache_bytes: int
    launch_overhead_s: float
    view_overhead_s: float
    threads: int

    def to_json(self) -> dict:
        data = {f: getattr(self, f) for f in self.__slots__}
        data["matmul_flops_per_s"] = dict(self.matmul_flops_per_s)
        return data

    @staticmethod
    def from_json(data: dict) -> CpuCalibration:
        special = ("matmul_flops_per_s", "threads", "cache_bytes")
        fields = {f: float(data[f]) for f in CpuCalibration.__slots__ if f not in special}
        return CpuCalibration(
            matmul_flops_per_s=tuple((str(k), float(v)) for k, v in data["matmul_flops_per_s"].items()),
            cache_bytes=int(data["cache_bytes"]),
            threads=int(data["threads"]),
            **fields,
        )


def median_time_s(
    fn, *, warmup: int = 3, repeats: int = 20, min_total_s: float = 0.02, max_repeats: int = 2000
) -> float:
    """Median wall time of `fn()` after `warmup` calls; repeats until `repeats` and `min_total_s` are reached."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    total = 0.0
    while len(times) < repeats or (total < min_total_s and len(times) < max_repeats):
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        total += elapsed
    return statistics.median(times)


def l2_cache_bytes(default: int = 1 << 20) -> int:
    """Size of this CPU's per-core L2 cache (Linux sysfs), or `default`."""
    for index in range(8):
        base = f"/sys/devices/system/cpu/cpu0/cache/index{index}"
        try:
            with open(f"{base}/level") as f:
                level = f.read().strip()
            with open(f"{base}/size") as f:
                size = f.read().strip()
        except OSError:
            break
        if level == "2":
            units = {"K": 1 << 10, "M": 1 << 20}
            return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    return default


def calibrate_cpu(*, matmul_sizes: tuple[int, ...] = (128, 256, 512), dram_bytes: int = 64 << 20) -> CpuCalibration:
    """Measures this CPU with torch's current thread count (about a second).

    Rates are taken net of the per-op overhead, so that ``overhead + work / rate`` reproduces them.
    """
    import torch

    overhead, view_overhead = _overheads_s()
    matmul = tuple((dt, max(_matmul_flops_per_s(n, dt) for n in matmul_sizes)) for dt in ("float32", "bfloat16"))
    cache_bytes = l2_cache_bytes()
    x, y = torch.rand(cache_bytes // 16), torch.rand(cache_bytes // 16)  # three of them fit in L2
    vector = x.numel() / _net(median_time_s(lambda: torch.add(x, y)), overhead)
    special = x.numel() / _net(median_time_s(lambda: torch.exp(x)), overhead)
    cache_bw = 2 * x.nbytes / _net(median_time_s(lambda: y.copy_(x)), overhead)
    src = torch.empty(dram_bytes // 4)
    dst = torch.empty_like(src)
    return CpuCalibration(
        matmul_flops_per_s=matmul,
        vector_flops_per_s=vector,
        transcendentals_per_s=special,
        memory_bandwidth_bytes_per_s=2 * dram_bytes / median_time_s(lambda: dst.copy_(src), repeats=5),
        cache_bandwidth_bytes_per_s=cache_bw,
        cache_bytes=cache_bytes,
        launch_overhead_s=overhead,
        view_overhead_s=view_overhead,
        threads=torch.get_num_threads(),
    )


def _matmul_flops_per_s(size: int, dtype: str) -> float:
    import torch

    a, b = (torch.rand(size, size, dtype=getattr(torch, dtype)) for _ in range(2))
    return 2 * size**3 / median_time_s(lambda: torch.mm(a, b), repeats=5)


def _overheads_s() -> tuple[float, float]:
    """Median time of small kernels and of small views (several ops each, so no single op's quirk decides)."""
    import torch

    a, b = torch.rand(8, 8), torch.rand(8, 8)
    kernels = (lambda: torch.mul(a, b), lambda: torch.add(a, 1.0), lambda: torch.sum(a, -1), lambda: torch.neg(a))
    views = (lambda: a.permute(1, 0), lambda: a.reshape(64), lambda: a.unsqueeze(0), lambda: a.expand(2, 8, 8))
    kernel_s = statistics.median(median_time_s(fn, repeats=100) for fn in kernels)
    view_s = statistics.median(median_time_s(fn, repeats=100) for fn in views)
    return kernel_s, view_s


def _net(seconds: float, overhead_s: float) -> float:
    # Work time without the fixed overhead, never below a tenth of the total (noise guard).
    return max(seconds - overhead_s, 0.1 * seconds)


def cpu_device_spec(calibration: CpuCalibration, name: str | None = None) -> DeviceSpec:
    """A `DeviceSpec` for this CPU from its calibration (vector rates used for every dtype)."""
    return DeviceSpec(
        name=name or cpu_device_name(),
        matrix_flops_per_s=calibration.matmul_flops_per_s,
        vector_flops_per_s=(("float32", calibration.vector_flops_per_s),),
        memory_bandwidth_bytes_per_s=calibration.memory_bandwidth_bytes_per_s,
        transcendentals_per_s=calibration.transcendentals_per_s,
        launch_overhead_s=calibration.launch_overhead_s,
        view_overhead_s=calibration.view_overhead_s,
        source="calibrated (costmodels.devices.calibrate_cpu)",
        cache_bytes=calibration.cache_bytes,
        cache_bandwidth_bytes_per_s=calibration.cache_bandwidth_bytes_per_s,
    )


def cpu_model_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or `platform.processor()` elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_device_name() -> str:
    """Identity of this CPU for cost tables: its model name and visible cores. The thread count a
    table was measured with is recorded in its calibration, and a different count only warns."""
    return f"cpu: {cpu_model_name()} ({os.cpu_count()} cores visible)"


def current_device_name(device: str = "cpu") -> str:
    """The name a cost table measured on `device` (``"cpu"``, ``"cuda"``, ``"cuda:1"``) records."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    if device != "cpu":
        raise ValueError(f"cannot name device {device!r}: use 'cpu' or 'cuda[:N]' (meta has no timing)")
    return cpu_device_name()


# An uncalibrated CPU for formula-only estimates (a laptop-class core pair); profile for real numbers.
NOMINAL_CPU = DeviceSpec(
    name="cpu (nominal, uncalibrated)",
    matrix_flops_per_s=(("float32", 5e10), ("bfloat16", 5e10)),
    vector_flops_per_s=(("float32", 5e9),),
    memory_bandwidth_bytes_per_s=1e10,
    transcendentals_per_s=1e9,
    launch_overhead_s=3e-6,
    view_overhead_s=1e-6,
    source="nominal values, not measured",
    cache_bytes=1 << 20,
    cache_bandwidth_bytes_per_s=5e10,
)


def roofline_time_s(cost: OpCost, spec: DeviceSpec) -> float:
    """Roofline time of one op: compute or memory bound, plus its launch overheads."""
    if cost.collective_calls:  # communication: the link's time, not the device's
        return collective_time_s(cost.network_bytes, cost.collective_calls, spec.interconnect)
    if cost.kernels == 0:  # each torch view pays the dispatcher; Thunder bookkeeping pays nothing
        return 0.0 if cost.formula == "free" else cost.views * spec.view_overhead_s
    compute_s = (
        matrix_time_s(cost, spec)
        + (cost.vector_flops - cost.transcendentals) / spec.vector_peak(cost.dtype)
        + cost.transcendentals / spec.transcendentals_per_s
    )
    in_cache = 0 < cost.bytes_total <= spec.cache_bytes
    bandwidth = spec.cache_bandwidth_bytes_per_s if in_cache else spec.memory_bandwidth_bytes_per_s
    return max(compute_s, cost.bytes_total / bandwidth) + cost.kernels * spec.launch_overhead_s


def matrix_fraction(spec: DeviceSpec, dtype: str) -> float:
    """Share of `spec`'s matrix peak that large GEMMs of `dtype` achieve (1.0 without data: CPUs)."""
    table = dict(spec.matmul_fractions)
    return table.get(dtype, table.get("bfloat16", 1.0))


def scheduled_gemm_flops(shape: tuple[int, int, int, int], sm_count: int, tile: tuple[int, int] = GEMM_TILE) -> int:
    """FLOPs the SMs spend on a ``(batch, M, N, K)`` GEMM, padding included: ``2 * K * waves *
    sm_count * tile_m * tile_n`` with ``waves = ceil(batch * ceil(M / tile_m) * ceil(N / tile_n) /
    sm_count)`` (tile quantization pads M and N, wave quantization fills the last wave), for the
    better of `tile`'s two orientations; the GEMM's own FLOPs when `sm_count` is 0 or it has none."""
    batch, m, n, k = shape
    if sm_count <= 0 or gemm_flops(shape) == 0:
        return gemm_flops(shape)
    waves = min(math.ceil(batch * math.ceil(m / tile_m) * math.ceil(n / tile_n) / sm_count)
                for tile_m, tile_n in (tile, tile[::-1]))
    return 2 * k * waves * sm_count * tile[0] * tile[1]


def wave_utilization(shape: tuple[int, int, int, int], sm_count: int, tile: tuple[int, int] = GEMM_TILE) -> float:
    """Useful share of the work a ``(batch, M, N, K)`` GEMM schedules on `sm_count` SMs: ``batch*M*N /
    (waves * sm_count * tile_m * tile_n)`` (`scheduled_gemm_flops`); 1.0 without SMs or FLOPs."""
    scheduled = scheduled_gemm_flops(shape, sm_count, tile)
    return gemm_flops(shape) / scheduled if scheduled else 1.0


def gemm_efficiency(spec: DeviceSpec, dtype: str, shape: tuple[int, int, int, int]) -> float:
    """Share of `spec`'s matrix peak a ``(batch, M, N, K)`` GEMM of `dtype` achieves: the large-GEMM
    fraction times `wave_utilization` (module docstring)."""
    return matrix_fraction(spec, dtype) * wave_utilization(shape, spec.sm_count)


def matrix_time_s(cost: OpCost, spec: DeviceSpec) -> float:
    """Time of `cost`'s matrix FLOPs: each of its `OpCost.gemm_shapes` as its `scheduled_gemm_flops`,
    the FLOPs no shape covers as they are, all at the large-GEMM fraction of the peak. A spec without
    fractions or SMs (a CPU) takes ``matrix_flops / matrix_peak``, as before shapes existed."""
    peak = spec.matrix_peak(cost.dtype)
    if not spec.matmul_fractions and spec.sm_count <= 0:
        return cost.matrix_flops / peak
    shaped_flops = sum(gemm_flops(shape) for shape in cost.gemm_shapes)
    covered = min(shaped_flops, cost.matrix_flops)  # shapes never add FLOPs the cost does not count
    scheduled = sum(scheduled_gemm_flops(shape, spec.sm_count) for shape in cost.gemm_shapes)
    if covered < shaped_flops:
        scheduled *= covered / shaped_flops
    return (scheduled + cost.matrix_flops - covered) / (peak * matrix_fraction(spec, cost.dtype))
