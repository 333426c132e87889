"""Shared fixtures. The torch compatibility step runs first so that thunder imports on torch 2.13.

Two things keep the suite fast on 2 cores (README: ``pytest -n 2 --dist loadgroup``):
* tests are grouped for pytest-xdist by file (what a file's module fixtures and caches share), except
  `test_transform.py`, grouped by model family, so that its ~60 compilations spread over workers;
* graphs the CLI traces are cached for the run in one directory shared by the workers
  (``REMAT_OPT_GRAPH_CACHE``, `remat_opt.graph_cache`): each tiny config is traced once per run.
"""

import os
import tempfile
from pathlib import Path

from remat_opt import _compat  # noqa: F401

import pytest

# Tiny litgpt configs, one per family (see remat_opt.models.tiny_overrides).
FAMILIES = ("Llama-2-7b-hf", "Llama-3-8B", "gemma-2b", "phi-2", "pythia-14m")


def executor_list(kind: str):
    """`"default"`: Thunder's executors (SDPA decomposed on CPU); `"fused"`: with the CPU fused SDPA;
    `"torch-compile"`: also Thunder's torch.compile executor (TorchCompileN fusion regions on CPU)."""
    from remat_opt.executors import EXECUTOR_CHOICES, executors_for

    choice = {"fused": "fused-sdpa"}.get(kind, kind)
    assert choice in EXECUTOR_CHOICES, kind
    return executors_for(choice)


@pytest.fixture(scope="session")
def executors():
    return executor_list


def pytest_configure(config):
    # one cache directory per run, shared by the xdist workers of that run
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
    os.environ.setdefault("REMAT_OPT_GRAPH_CACHE", str(Path(tempfile.gettempdir()) / f"remat-opt-graphs-{run}"))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        group = Path(str(item.fspath)).stem
        params = getattr(getattr(item, "callspec", None), "params", {})
        if group == "test_transform" and isinstance(params.get("name"), str):
            group = f"{group}-{params['name']}"
        item.add_marker(pytest.mark.xdist_group(name=group))
