"""Per-op cost formulas, device specs and measured cost tables (see issue: cost models)."""
