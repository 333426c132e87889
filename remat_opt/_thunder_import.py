"""The compatibility step Thunder needs to import at all, and the hook that runs it before the
first ``import thunder``, so that ``import remat_opt, thunder`` works on torch 2.13.

lightning-thunder 0.2.6 lists torch's named-tensor methods (``align_as``, ``align_to``,
``has_names``, ``refine_names``, ``rename``) while it imports; torch 2.13 removed them, so
``import thunder`` raises ``AttributeError``. `ensure_thunder_importable` adds placeholders
that raise a clear error when called (step 1 of `remat_opt._compat`, which applies it too).
``import remat_opt`` installs `ThunderImportHook` on ``sys.meta_path`` without importing torch: the
first time anything imports ``thunder``, the hook adds the placeholders (importing torch, as
Thunder is about to) and steps aside for Python's own finders. Where torch has the methods it adds
nothing. Both can go when Thunder stops listing the methods or the pinned torch has them.
"""

from __future__ import annotations

import sys

NAMED_TENSOR_METHODS: tuple[str, ...] = ("align_as", "align_to", "has_names", "refine_names", "rename")


def _removed_method(name: str, torch_version: str):
    def method(self, *args, **kwargs):
        raise NotImplementedError(
            f"torch.Tensor.{name} (named tensors) was removed in torch {torch_version}; "
            "this placeholder exists only so that lightning-thunder can be imported"
        )

    method.__name__ = name
    method.__qualname__ = f"Tensor.{name}"
    method._remat_opt_placeholder = True
    return method


def ensure_thunder_importable(tensor_cls: type | None = None) -> list[str]:
    """Adds placeholders for missing named-tensor methods to `tensor_cls` (default
    ``torch.Tensor``); returns the names it added."""
    import torch

    tensor_cls = torch.Tensor if tensor_cls is None else tensor_cls
    added = []
    for name in NAMED_TENSOR_METHODS:
        if not hasattr(tensor_cls, name):
            setattr(tensor_cls, name, _removed_method(name, torch.__version__))
            added.append(name)
    return added


class ThunderImportHook:
    """A `sys.meta_path` finder that finds nothing: before the first import of ``thunder`` it adds
    the placeholders and removes itself."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "thunder":
            uninstall()
            ensure_thunder_importable()
        return None


def install() -> bool:
    """Installs the hook unless Thunder is imported already or a hook is installed; returns whether
    it installed one."""
    if "thunder" in sys.modules or any(isinstance(f, ThunderImportHook) for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, ThunderImportHook())
    return True


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, ThunderImportHook)]
