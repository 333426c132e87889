"""Compatibility steps that let lightning-thunder 0.2.6 run on torch >= 2.13.

Only the modules that touch Thunder import this one (before ``thunder``). Each step is guarded: it
changes nothing where torch and Thunder already work together.

1. **Import** (can go when Thunder stops listing torch's removed named-tensor methods, or the
   pinned torch has them): Thunder's ``thunder/torch/default_torch_ops.py`` lists the named-tensor
   methods of ``torch.Tensor`` (``align_as``, ``align_to``, ``has_names``, ``refine_names``,
   ``rename``) at import time; torch 2.13 removed them, so ``import thunder`` raises
   ``AttributeError``. Where a method is missing, a placeholder that raises a clear error when
   called is added.
2. **ThunderFX** (can go when Thunder's interpreter can take ``len()`` of a dict keys view, i.e.
   ``thunder.core.interpreter.MappingKeysView`` has ``__len__``): ``ThunderCompiler`` splits
   Dynamo's graph into submodules that torch.fx generates lazily (``_LazyGraphModule``); the first
   call then generates their code inside Thunder's interpreter, where torch.fx's
   ``delete_unused_values`` fails with ``TypeError: object of type 'MappingKeysView' has no
   len()``. The step wraps ``ThunderCompiler.__call__`` to generate that code at once, outside
   the interpreter (what torch does on the first call anyway).
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


def recompile_lazy_graph_modules(module: torch.nn.Module) -> int:
    """Generates now the code of every lazily compiled fx GraphModule under `module`; returns how
    many needed it."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    lazy = [m for m in module.modules() if isinstance(m, _LazyGraphModule) and m._needs_recompile()]
    for m in lazy:
        _LazyGraphModule.force_recompile(m)
    return len(lazy)


def interpreter_lacks_keys_view_len(interpreter=None) -> bool:
    """Whether Thunder's interpreter cannot take ``len()`` of a dict keys view (step 2's trigger)."""
    if interpreter is None:
        from thunder.core import interpreter
    view = getattr(interpreter, "MappingKeysView", None)
    return view is not None and not hasattr(view, "__len__")


def ensure_thunderfx_recompiles(compiler_cls: type | None = None, interpreter=None) -> bool:
    """Step 2: wraps ``compiler_cls.__call__`` (default ``thunder.dynamo.ThunderCompiler``) so the
    submodules it returns are recompiled before Thunder interprets them. Returns whether it wrapped
    (False where the interpreter has no such gap, or it is wrapped already)."""
    if compiler_cls is None:
        from thunder.dynamo.compiler import ThunderCompiler as compiler_cls
    call = compiler_cls.__call__
    if getattr(call, "_remat_opt_recompiles", False) or not interpreter_lacks_keys_view_len(interpreter):
        return False

    def __call__(self, gm, sample_args):
        split = call(self, gm, sample_args)
        recompile_lazy_graph_modules(split)
        return split

    __call__.__doc__, __call__.__wrapped__ = call.__doc__, call
    __call__._remat_opt_recompiles = True
    compiler_cls.__call__ = __call__
    return True


THUNDERFX_PATCHED: bool = ensure_thunderfx_recompiles()
