"""Per-op cost formulas, device specs and measured cost tables (see issue: cost models).

Modules:
    formulas: one registry of per-op FLOP and byte formulas (`register_cost`, `formula_cost`).
    devices: GPU spec sheets, CPU calibration, the roofline (`get_device_spec`, `roofline_time_s`).
    table: measured cost tables as JSON (`save_table`, `load_table`, `op_key`).
    runners: executing one op with torch (used by the profiler).
    timing: timing one call on a device (`ProfileOptions`, `time_call`).

A leaf library: it never imports `remat_opt` or Thunder (an import-linter contract in
pyproject.toml checks it). Costing a whole joint graph is `remat_opt.costing.graph_costs`; profiling one is
`remat_opt.costing.profiling`.
"""

from costmodels.formulas import OpArgs, OpCost, TensorMeta, formula_cost, register_cost

__all__ = ["OpArgs", "OpCost", "TensorMeta", "formula_cost", "register_cost"]
