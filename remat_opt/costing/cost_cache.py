"""``cost_table="auto"``: costs measured on this device at the first compilation, cached on disk.

`auto_cost_table(graph)` times the forward ops of `graph` (the candidates for recompute: what
the decision depends on) that the cache does not hold yet, on the graph's device, with the runners
of ``remat-opt profile`` (`remat_opt.costing.profiling.replay`: the graph replayed in order, every call timed as
it runs), within a time cap; ops it could not time
keep their formula costs. Fusion regions (``TorchCompileN``, ``nvFusionN``) are timed whole through
the callables Thunder built for them (`remat_opt.costing.profiling`), keyed by their signature; when the
planner works on an unfused graph (`CostRemat` through a fusion pass), the fused graph of the same
compilation is passed as `region_graph` and its forward regions are timed too, to price the
unfused ops by their share (`remat_opt.costing.graph_costs`). The table is one file per device and library versions, in
``REMAT_OPT_COST_CACHE`` (default ``$XDG_CACHE_HOME/remat-opt/cost-tables``, else
``~/.cache/remat-opt/cost-tables``), shared across runs and models: an op timed once (same symbol,
shapes, dtypes and arguments) is never timed again. A file that does not load (corrupt, another
device or versions under this name) is rebuilt with a warning, never trusted. A meta graph runs
nothing: its costs stay formulas, and the note says so.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from costmodels.devices import calibrate_cpu, current_device_name
from costmodels.formulas import is_fusion_symbol
from costmodels.timing import ProfileOptions
from costmodels.table import CostTable, CostTableError, library_versions, load_table, op_key, save_table
from remat_opt.costing.graph_costs import op_args
from remat_opt.core.graph import JointGraph
from remat_opt.costing.profiling import NO_REGION_CALLABLE, replay

ENV_VAR = "REMAT_OPT_COST_CACHE"
DEFAULT_TIME_LIMIT_S = 60.0


@dataclass(frozen=True)
class AutoCosts:
    """What `auto_cost_table` did.

    Attributes:
        table: the table to plan with (None on meta: formulas).
        path: its file (None on meta).
        cached_ops: distinct forward ops the cache already held.
        timed_ops: distinct forward ops timed now.
        untimed_ops: distinct forward ops left to formulas (no runner, or past the time cap).
        profiling_s: seconds spent timing (0 on a cache hit).
        measured_regions: distinct forward fusion regions with a whole-region time (cached or now).
        untimed_regions: distinct forward fusion regions left to formulas (no callable, past the cap).
    """

    table: CostTable | None
    path: Path | None
    cached_ops: int = 0
    timed_ops: int = 0
    untimed_ops: int = 0
    profiling_s: float = 0.0
    measured_regions: int = 0
    untimed_regions: int = 0

    def note(self) -> str:
        if self.table is None:
            return "cost_table='auto': a meta graph runs nothing, so costs are formulas"
        regions = ""
        if self.measured_regions or self.untimed_regions:
            regions = (f"; fusion regions: {self.measured_regions} timed whole (their ops' costs: 'measured region', "
                       f"or 'region share' for the unfused ops the plan recomputes), {self.untimed_regions} left to "
                       "formulas")
        return (f"cost_table='auto' ({self.path}): {self.cached_ops} forward ops from the cache, {self.timed_ops} timed "
                f"now in {self.profiling_s:.1f} s, {self.untimed_ops} left to formulas{regions}")


def cost_cache_dir() -> Path:
    """``REMAT_OPT_COST_CACHE``, else the user cache directory."""
    if os.environ.get(ENV_VAR, "").strip():
        return Path(os.environ[ENV_VAR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or Path.home() / ".cache"
    return Path(base) / "remat-opt" / "cost-tables"


def table_path(device: str) -> Path:
    """The cache file for `device` (``"cpu"``, ``"cuda:0"``) and these library versions."""
    torch_version, thunder_version = library_versions()
    # the timing method is part of the name: tables of ops timed alone in a loop (before in-order
    # timing was the default) measured other times and are not mixed in
    name = f"{current_device_name(device)}-torch-{torch_version}-thunder-{thunder_version}-{ProfileOptions().method}"
    slug = "".join(c if c.isalnum() or c in ".+" else "-" for c in name).strip("-").lower()
    while "--" in slug:
        slug = slug.replace("--", "-")
    return cost_cache_dir() / f"{slug[:150]}.json"


def _graph_device(graph: JointGraph) -> str:
    devices = {t.device for t in graph.tensors.values()}
    return devices.pop() if len(devices) == 1 else "mixed"


def _load_cached(path: Path, device: str) -> CostTable | None:
    if not path.exists():
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a thread-count warning is not a reason to rebuild
            return load_table(path, device=device)
    except CostTableError as e:
        warnings.warn(f"cost_table='auto': {e}; rebuilding it", stacklevel=3)
        return None


def _wanted_keys(graph: JointGraph, *, regions_only: bool = False) -> set[str]:
    return {op_key(op_args(graph, op)) for op in graph.forward_ops if not regions_only or is_fusion_symbol(op.symbol)}


def _new_table(device: str) -> CostTable:
    torch_version, thunder_version = library_versions()
    return CostTable(device=current_device_name(device), device_kind=device.split(":")[0],
                     torch_version=torch_version, thunder_version=thunder_version, entries={},
                     calibration=calibrate_cpu() if device == "cpu" else None, model="cost_table='auto'")


def _save_atomically(table: CostTable, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    save_table(table, temporary)
    temporary.replace(path)  # atomic: a concurrent reader sees the old file or the new one


def auto_cost_table(graph: JointGraph, *, region_graph: JointGraph | None = None,
                    time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> AutoCosts:
    """The measured table for `graph`'s forward ops on its device (see the module docstring), and
    for the forward fusion regions of `region_graph` (the fused twin of an unfused `graph`)."""
    device = _graph_device(graph)
    if device.split(":")[0] not in ("cpu", "cuda"):
        return AutoCosts(table=None, path=None)
    path = table_path(device)
    table = _load_cached(path, device) or _new_table(device)
    wanted = [(graph, _wanted_keys(graph))]  # (graph to replay, the keys it is replayed for)
    if region_graph is not None:
        wanted.append((region_graph, _wanted_keys(region_graph, regions_only=True)))
    all_wanted = set().union(*(keys for _, keys in wanted))
    missing = all_wanted - set(table.entries) - {k for k, _ in table.skipped}
    start_s = time.perf_counter()
    for replayed, keys in wanted:
        if keys & missing:
            result = replay(replayed, device, time_keys=keys & missing, deadline_s=start_s + time_limit_s)
            # a region without its callable is a property of this graph (a cached or deepened one),
            # not of the region: another graph of the same region may time it
            skipped = {k: r for k, r in result.skipped.items() if k in missing and r != NO_REGION_CALLABLE}
            table = replace(table, entries={**table.entries, **result.times},
                            skipped=tuple(sorted({**dict(table.skipped), **skipped}.items())))
    if missing:
        _save_atomically(table, path)
    measured = all_wanted & set(table.entries)
    regions = set().union(*(_wanted_keys(g, regions_only=True) for g, _ in wanted))
    return AutoCosts(
        table=table,
        path=path,
        cached_ops=len(measured - missing),
        timed_ops=len(measured & missing),
        untimed_ops=len(all_wanted - measured),
        profiling_s=time.perf_counter() - start_s if missing else 0.0,
        measured_regions=len(regions & measured),
        untimed_regions=len(regions - measured),
    )


def with_auto_costs(request, graph: JointGraph, region_graph: JointGraph | None = None):
    """``(request, note)``: a `remat_opt.planning.planner.PlanRequest` asking for ``cost_table="auto"`` made
    concrete for `graph` (its table, and a note for `explain`; `region_graph`: see
    `auto_cost_table`); any other request as it is, None."""
    if not request.auto_costs:
        return request, None
    costs = auto_cost_table(graph, region_graph=region_graph)
    return replace(request, table=costs.table, auto_costs=False), costs.note()
