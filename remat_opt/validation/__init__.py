"""The yardsticks the predictions are checked against, for tests, benchmarks and users: real saved
bytes and step peaks (`measure`), per-op times inside a real training step (`step_timing`), joint
graphs compared up to renaming (`graph_diff`), and the cost formulas against a measured table
(`cost_report`).
"""
