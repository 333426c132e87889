"""Shared fixtures. The torch compatibility step runs first so that thunder imports on torch 2.13.

Three things keep the suite fast on 2 cores (README: ``pytest -n 2 --dist loadscope --no-loadscope-reorder``):
* pytest-xdist sends each file to one worker (what its module fixtures and caches share), and each
  test class on its own: `test_transform.py` has one class per model family, so that its ~40
  compilations spread over both workers;
* the longest files start first (`_LONGEST_FIRST`; ``--no-loadscope-reorder`` keeps xdist from
  sorting files by their number of tests instead);
* graphs the CLI traces are cached for the run in one directory shared by the workers
  (``REMAT_OPT_GRAPH_CACHE``, `remat_opt.models.graph_cache`): each tiny config is traced once per run.
"""

import os
import shutil
import tempfile
from pathlib import Path

from remat_opt import _compat  # noqa: F401

import pytest

# Tiny litgpt configs, one per family (see remat_opt.models.by_name.tiny_overrides).
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
    # One cache directory per run: made by the controller (or the only process) before xdist starts
    # its workers, which inherit the environment; removed when the run ends.
    if not hasattr(config, "workerinput") and "REMAT_OPT_GRAPH_CACHE" not in os.environ:
        config._remat_opt_graph_cache = tempfile.mkdtemp(prefix="remat-opt-graphs-")
        os.environ["REMAT_OPT_GRAPH_CACHE"] = config._remat_opt_graph_cache


def pytest_unconfigure(config):
    directory = getattr(config, "_remat_opt_graph_cache", None)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
        del os.environ["REMAT_OPT_GRAPH_CACHE"]


# Files that take longest on one worker start first, so that the others fill in around them.
# test_distributed.py is left in file order on purpose: its two spawned ranks are best overlapped with
# light tests, not with the other long ones.
# test_distributed.py is one scope (a module-wide 2-rank spawn, ~2 min): started last, it ran alone
# at the end. The extended files (README: -m extended) come after the rest of the longest.
_LONGEST_FIRST = ("test_distributed.py", "test_transform.py", "test_nvfuser_standin.py",
                  "test_extract.py", "test_data_parallel.py", "test_costmodels_families.py", "test_cli.py",
                  "test_per_block_checkpointing.py", "test_deepen_parallel.py", "test_notebook.py",
                  "test_torch_fsdp.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))  # stable: file order kept
