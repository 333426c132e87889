"""Compatibility step that lets lightning-thunder 0.2.6 import on torch >= 2.13.

Thunder's ``thunder/torch/default_torch_ops.py`` lists the named-tensor methods of
``torch.Tensor`` (``align_as``, ``align_to``, ``has_names``, ``refine_names``, ``rename``) at
import time. torch 2.13 removed them, so ``import thunder`` raises ``AttributeError``. This module
adds, only where a method is missing, a placeholder that raises a clear error when called. Where
torch still has the methods it does nothing. It must run before ``thunder`` is imported; importing
``remat_opt`` runs it. Nothing else in the project depends on it.
"""

from __future__ import annotations

import torch

NAMED_TENSOR_METHODS: tuple[str, ...] = ("align_as", "align_to", "has_names", "refine_names", "rename")


def _removed_method(name: str):
    def method(self, *args, **kwargs):
        raise NotImplementedError(
            f"torch.Tensor.{name} (named tensors) was removed in torch {torch.__version__}; "
            "this placeholder exists only so that lightning-thunder can be imported"
        )

    method.__name__ = name
    method.__qualname__ = f"Tensor.{name}"
    method._remat_opt_placeholder = True
    return method


def ensure_thunder_importable(tensor_cls: type = torch.Tensor) -> list[str]:
    """Adds placeholders for missing named-tensor methods; returns the names it added."""
    added = []
    for name in NAMED_TENSOR_METHODS:
        if not hasattr(tensor_cls, name):
            setattr(tensor_cls, name, _removed_method(name))
            added.append(name)
    return added


ADDED_METHODS: list[str] = ensure_thunder_importable()
