"""The ``remat-opt`` command line (`main`): ``inspect``, ``profile``, ``plan``, ``pareto``."""
