"""Costs of a `JointGraph`, the bridge from `costmodels` to the planner: time, FLOPs and bytes of
any op or chain of ops of the graph.

    >>> costs = CostModel(graph, "H100")                 # formulas + the H100 sheet
    >>> costs = CostModel(graph, table=load_table(path))  # measured times where the table has them
    >>> costs.op_cost(op)            # OpCost(flops, bytes_read, bytes_written, ..., time_s, source)
    >>> costs.chain_time_s(ops)      # recompute time of a chain of ops

Every `OpCost` says where its time comes from: ``source="measured"`` (a cost-table entry for the
same symbol, shapes, dtypes and attributes), ``"measured region"`` (a fusion region timed whole),
``"region share"`` (below) or ``"formula"`` (the roofline of the formula on the device spec).
`coverage_report` lists the ops that only have the fallback formula.

**Region shares.** With a fusion executor, `CostRemat` plans on the *unfused* graph (a tag re-runs
members, not regions) while the device runs Thunder's regions. Given the fused graph of the same
compilation (`region_graph`), an unfused forward op is priced as its share of the measured
whole-region time of the regions its pre-autodiff op runs in: its own time (measured alone, else
the roofline) times ``sum of those regions' measured times / sum of the own times of the unfused
ops they hold``. Regions and unfused ops are matched by pre-autodiff op (`OpNode.tag_units`, the
one name two dry runs share), and regions that share a pre-autodiff op are priced together.
Why a share: a recomputed member runs inside a backward region, fused with its neighbours, so its
fused cost is what the forward region shows, not its cost alone; recomputing a whole region's ops
costs exactly that region's measured time, and the members keep the ranking of their own times.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

from costmodels.devices import (
    GPU_SPECS,
    NOMINAL_CPU,
    DeviceSpec,
    cpu_device_spec,
    current_device_name,
    get_device_spec,
    roofline_time_s,
)
from costmodels.formulas import (
    OpArgs,
    OpCost,
    TensorMeta,
    formula_cost,
    has_formula,
    is_fusion_symbol,
    is_measured,
    missing_formulas,
    with_time,
)
from costmodels.table import CostTable, op_key
from remat_opt.core.graph import JointGraph, OpNode


def _tensor_meta(graph: JointGraph, name: str) -> TensorMeta:
    try:
        node = graph.tensors[name]
    except KeyError:
        raise KeyError(f"tensor {name!r} is used by an op but missing from graph.tensors") from None
    return TensorMeta(
        shape=node.shape,
        dtype=node.dtype,
        nbytes=node.nbytes,
        storage_bytes=node.storage_bytes,
        is_view=node.storage != node.name,
        name=name,
    )


def op_args(graph: JointGraph, op: OpNode) -> OpArgs:
    """The formula input of `op`: its tensors' shapes, dtypes and storage, its attributes and members."""
    return OpArgs(
        symbol=op.symbol,
        inputs=tuple(_tensor_meta(graph, n) for n in op.inputs),
        outputs=tuple(_tensor_meta(graph, n) for n in op.outputs),
        attrs=tuple(op.attrs),
        members=tuple(op_args(graph, m) for m in op.members),
    )


def resolve_device_spec(device_spec: DeviceSpec | str | None, table: CostTable | None, graph: JointGraph) -> DeviceSpec:
    """The device spec to cost for, from an explicit spec or name, the table, or the graph's device
    (a CPU graph: the nominal CPU; a CUDA graph: the sheet of that GPU, by its name).

    Raises:
        ValueError: nothing says which device spec (a meta graph without a device spec or table), a CUDA
            graph on a GPU with no spec sheet, or a device spec other than the table's.
    """
    if table is not None and device_spec is not None:
        _check_table_device(device_spec, table)
    if isinstance(device_spec, DeviceSpec):
        return device_spec
    if device_spec is None and table is not None:
        if table.calibration is not None:
            return cpu_device_spec(table.calibration, table.device)
        return get_device_spec(table.device)
    if device_spec == "cpu" or (device_spec is None and _graph_device(graph) == "cpu"):
        if table is not None and table.calibration is not None:
            return cpu_device_spec(table.calibration, table.device)
        return NOMINAL_CPU
    if device_spec is None and _graph_device(graph) == "cuda":
        return _cuda_device_spec(graph)
    if device_spec is None:
        raise ValueError(
            f"the graph is on {_graph_device(graph)!r}: name the device spec to cost for "
            f"(device_spec= one of {', '.join(GPU_SPECS)}, or 'cpu'), or pass a cost table measured there"
        )
    return get_device_spec(device_spec)


def _cuda_device_spec(graph: JointGraph) -> DeviceSpec:
    """The spec sheet of the GPU a CUDA graph runs on, found by the device's name."""
    import torch

    if not torch.cuda.is_available():  # e.g. a trace recorded on a GPU, planned here
        raise ValueError(f"the graph is on CUDA, and no CUDA device here says which GPU: pass device_spec= one of "
                         f"{', '.join(GPU_SPECS)}, or a cost table measured on that GPU")
    device = next(t.device for t in graph.tensors.values() if t.device.startswith("cuda"))
    name = current_device_name(device if ":" in device else "cuda")
    try:
        return get_device_spec(name)
    except ValueError:
        raise ValueError(
            f"the trace runs on {name!r}, which has no spec sheet: pass device_spec= one of "
            f"{', '.join(GPU_SPECS)} (the closest GPU), or cost_table= a table measured on it "
            "(`remat-opt profile MODEL --device cuda`)"
        ) from None


def _check_table_device(device_spec: DeviceSpec | str, table: CostTable) -> None:
    name = device_spec.name if isinstance(device_spec, DeviceSpec) else device_spec
    if table.device_kind == "cpu":
        ok = name == "cpu" or name.startswith("cpu")
    else:
        ok = not name.startswith("cpu") and get_device_spec(table.device).name == get_device_spec(name).name
    if not ok:
        raise ValueError(
            f"cost table measured on {table.device!r} cannot price ops on {name!r}: pass device_spec=None to cost "
            "for the table's device, or no table to cost from formulas alone"
        )


def _graph_device(graph: JointGraph) -> str:
    devices = {t.device.split(":")[0] for t in graph.tensors.values()}
    return devices.pop() if len(devices) == 1 else "mixed"


class CostModel:
    """Costs of the ops of one joint graph on one device.

    Args:
        graph: the joint graph.
        device_spec: a `DeviceSpec`, a spec name (``"H100"``, ``"A100-80GB"``), ``"cpu"``, or None to
            take it from `table` (or from the graph's device for a CPU or CUDA graph).
        table: measured times, preferred over formulas where an entry matches.
        region_graph: the fused graph of the same compilation, when `graph` is its unfused twin:
            forward ops of regions the table timed whole are priced by their share (module docstring).
    """

    def __init__(self, graph: JointGraph, device_spec: DeviceSpec | str | None = None, table: CostTable | None = None,
                 region_graph: JointGraph | None = None):
        self.graph = graph
        self.table = table
        self.device_spec = resolve_device_spec(device_spec, table, graph)
        self.region_graph = region_graph
        self._costs: dict[str, OpCost] = {}
        self._by_name = {op.name: op for op in graph.ops}
        self._region_factors: dict[str, float] | None = None

    def op_cost(self, op: OpNode | str) -> OpCost:
        """Cost of one op (an `OpNode` or its name), with ``time_s`` and ``source`` set."""
        op = self._by_name[op] if isinstance(op, str) else op
        cached = self._costs.get(op.name)
        if cached is None:
            cost = self.own_cost(op)
            factor = self.region_factors().get(op.name)
            cached = cost if factor is None else with_time(cost, cost.time_s * factor, "region share")
            self._costs[op.name] = cached
        return cached

    def own_cost(self, op: OpNode) -> OpCost:
        """`op`'s cost from the table or its formula alone (no region share)."""
        args = op_args(self.graph, op)
        cost = formula_cost(args)
        entry = self.table.lookup(op_key(args)) if self.table is not None else None
        if entry is not None:
            return with_time(cost, entry.time_s, "measured region" if is_fusion_symbol(op.symbol) else "measured")
        return with_time(cost, roofline_time_s(cost, self.device_spec), "formula")

    def region_factors(self) -> dict[str, float]:
        """Unfused forward op name -> the factor its own time is scaled by (see the module docstring)."""
        if self._region_factors is None:
            self._region_factors = {}
            if self.region_graph is not None and self.table is not None:
                regions = CostModel(self.region_graph, self.device_spec, self.table)
                for region_ops, ops in region_groups(self.graph, self.region_graph):
                    times = [regions.op_cost(r) for r in region_ops]
                    own_s = sum(self.own_cost(op).time_s for op in ops)
                    if own_s > 0 and all(t.source == "measured region" for t in times):
                        factor = sum(t.time_s for t in times) / own_s
                        self._region_factors.update((op.name, factor) for op in ops)
        return self._region_factors

    def chain_cost(self, ops: Iterable[OpNode | str]) -> OpCost:
        """Summed cost of a chain of ops (e.g. what recomputing a tensor runs).

        ``source`` is ``"measured"`` only when every op's time was measured; ``formula`` is
        ``"chain"``; ``kernels`` and the FLOP and byte counts add up, the GEMM shapes concatenate.
        """
        costs = [self.op_cost(op) for op in ops]
        if not costs:
            return OpCost(flops=0, bytes_read=0, bytes_written=0, kernels=0, formula="chain", time_s=0.0)
        total = OpCost(
            flops=sum(c.flops for c in costs),
            bytes_read=sum(c.bytes_read for c in costs),
            bytes_written=sum(c.bytes_written for c in costs),
            matrix_flops=sum(c.matrix_flops for c in costs),
            vector_flops=sum(c.vector_flops for c in costs),
            transcendentals=sum(c.transcendentals for c in costs),
            kernels=sum(c.kernels for c in costs),
            dtype=costs[0].dtype,
            formula="chain",
            gemm_shapes=tuple(shape for c in costs for shape in c.gemm_shapes),
        )
        source = "measured" if all(is_measured(c.source) for c in costs) else "formula"
        return replace(total, time_s=sum(c.time_s for c in costs), source=source)

    def chain_time_s(self, ops: Iterable[OpNode | str]) -> float:
        """Time in seconds of running `ops` once each."""
        return sum(self.op_cost(op).time_s for op in ops)

    def producer_cost(self, tensor: str) -> OpCost:
        """Cost of the top-level op that writes `tensor` (recomputing it re-runs that whole op)."""
        producer = self.graph.producers.get(tensor)
        if producer is None:
            raise KeyError(f"tensor {tensor!r} has no producing op (an input or parameter?)")
        return self.op_cost(producer)

    def total_time_s(self, *, backward: bool | None = None) -> float:
        """Predicted time of the forward (False), backward (True) or both (None)."""
        ops = [op for op in self.graph.ops if backward is None or op.is_backward == backward]
        return self.chain_time_s(ops)

    def measured_share(self) -> float:
        """Fraction of the graph's ops whose time comes from the table."""
        ops = self.graph.ops
        return sum(is_measured(self.op_cost(op).source) for op in ops) / max(1, len(ops))


def region_groups(unfused: JointGraph, fused: JointGraph) -> list[tuple[list[OpNode], list[OpNode]]]:
    """``(forward regions of fused, forward ops of unfused)`` that run the same pre-autodiff ops.

    An op belongs to the pre-autodiff op it was decomposed from (its first `OpNode.tag_units`, the
    shallowest; a region: the union over its members); regions sharing one are grouped together.
    """
    parent: dict[str, str] = {}

    def root(unit: str) -> str:
        while parent.setdefault(unit, unit) != unit:
            unit = parent[unit]
        return unit

    regions = [op for op in fused.forward_ops if op.members]
    region_units = [[m.tag_units[0] for m in r.members if m.tag_units] for r in regions]
    for units in region_units:
        for unit in units[1:]:
            parent[root(unit)] = root(units[0])
    groups: dict[str, tuple[list[OpNode], list[OpNode]]] = {}
    for region, units in zip(regions, region_units):
        if units:
            groups.setdefault(root(units[0]), ([], []))[0].append(region)
    for op in unfused.forward_ops:
        if op.tag_units and op.tag_units[0] in parent and root(op.tag_units[0]) in groups:
            groups[root(op.tag_units[0])][1].append(op)
    return [group for group in groups.values() if group[1]]


@dataclass(frozen=True, slots=True)
class CoverageReport:
    """Which ops of a graph have a formula.

    Attributes:
        ops: top-level ops.
        members: fusion-region member ops.
        without_formula: symbol -> count of top-level ops that fall back.
        members_without_formula: symbol -> count of member ops that fall back.
        by_formula: formula name -> count of top-level ops it costs.
    """

    ops: int
    members: int
    without_formula: dict[str, int]
    members_without_formula: dict[str, int]
    by_formula: dict[str, int]

    @property
    def ok(self) -> bool:
        return not self.without_formula and not self.members_without_formula

    def format(self) -> str:
        """One line, e.g. ``"298 ops (0 members): 0 without a formula"``, then the missing symbols."""
        missing = sum(self.without_formula.values()) + sum(self.members_without_formula.values())
        lines = [f"{self.ops} ops ({self.members} fusion members): {missing} without a formula"]
        lines += [f"  fallback: {s} x{n}" for s, n in sorted(self.without_formula.items())]
        lines += [f"  fallback (member): {s} x{n}" for s, n in sorted(self.members_without_formula.items())]
        return "\n".join(lines)


def coverage_report(graph: JointGraph) -> CoverageReport:
    """Counts the ops of `graph` (and of its fusion regions) that only get the fallback formula."""
    top, members, by_formula = Counter(), Counter(), Counter()
    n_members = 0
    for op in graph.ops:
        args = op_args(graph, op)
        if not has_formula(op.symbol):
            top[op.symbol] += 1
        for member in args.members:
            members.update(missing_formulas(member))
        n_members += len(op.members)
        by_formula[formula_cost(args).formula] += 1
    return CoverageReport(
        ops=len(graph.ops),
        members=n_members,
        without_formula=dict(top),
        members_without_formula=dict(members),
        by_formula=dict(by_formula),
    )
