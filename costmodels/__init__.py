"""Per-op cost formulas, device specs and measured cost tables (see issue: cost models).

Modules:
    formulas: one registry of per-op FLOP and byte formulas (`register_cost`, `formula_cost`).
    devices: GPU spec sheets, CPU calibration, the roofline (`get_device_spec`, `roofline_time_s`).
    table: measured cost tables as JSON (`save_table`, `load_table`, `op_key`).
    api: the cost API of the solvers (`CostModel`, `coverage_report`).
    runners: executing one op with torch (used by the profiler).
    profiler: ``remat-opt profile`` (`profile_graph`, `add_profile_arguments`, `run_profile`).
    report: roofline against measured times (`compare`, `spearman`, `format_comparison`).

No module imports Thunder (the profiler's command line builds the graph through `remat_opt.cli`).
"""

from costmodels.formulas import OpArgs, OpCost, TensorMeta, formula_cost, register_cost

__all__ = ["OpArgs", "OpCost", "TensorMeta", "formula_cost", "register_cost"]
