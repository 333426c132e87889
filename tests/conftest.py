"""Shared fixtures. The torch compatibility step runs first so that thunder imports on torch 2.13."""

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
