"""Compatibility steps that let lightning-thunder 0.2.6 run on torch >= 2.13.

Only the modules that touch Thunder import this one (before ``thunder``). Each step is guarded: it
changes nothing where torch and Thunder already work together.

1. **Import** (can go when Thunder stops listing torch's removed named-tensor methods, or the
   pinned torch has them): Thunder's ``thunder/torch/default_torch_ops.py`` lists the named-tensor
   methods of ``torch.Tensor`` (``align_as``, ``align_to``, ``has_names``, ``refine_names``,
   ``rename``) at import time; torch 2.13 removed them, so ``import thunder`` raises
   ``AttributeError``. Where a method is missing, a placeholder that raises a clear error when
   called is added (`remat_opt._thunder_import`, which ``import remat_opt`` also installs as a
   hook that runs before the first ``import thunder``).
2. **ThunderFX** (can go when Thunder's interpreter can take ``len()`` of a dict keys view, i.e.
   ``thunder.core.interpreter.MappingKeysView`` has ``__len__``): ``ThunderCompiler`` splits
   Dynamo's graph into submodules that torch.fx generates lazily (``_LazyGraphModule``); the first
   call then generates their code inside Thunder's interpreter, where torch.fx's
   ``delete_unused_values`` fails with ``TypeError: object of type 'MappingKeysView' has no
   len()``. The step wraps ``ThunderCompiler.__call__`` to generate that code at once, outside
   the interpreter (what torch does on the first call anyway).
3. **Dicts that shrink while Thunder wraps their items** (can go when Thunder's
   ``thunder.core.interpreter.populate_item_wrappers`` iterates a snapshot of a dict's items, not
   ``obj.value.items()``): tracing a model that builds a module in its forward (litgpt's
   ``nn.Identity()`` head) runs Dynamo's ``mutation_guard`` in Thunder's interpreter, which looks
   a key up in an ``ExactWeakKeyDictionary`` of every module built so far; Thunder wraps every item
   of that dict first, and when a collection frees a module in the middle, the weakref callback
   deletes its entry and the trace fails with ``RuntimeError: dictionary changed size during
   iteration`` (seen once in a full test run, when the dict had grown large). The step retries the
   wrapping, which skips items already wrapped, so that only the items left are visited again.
"""

from __future__ import annotations

import warnings

import torch

# Step 1 lives where `import remat_opt` can install it before `import thunder` without torch.
from remat_opt._thunder_import import NAMED_TENSOR_METHODS, ensure_thunder_importable

ensure_thunder_importable()
# The placeholders on torch.Tensor, whether added here or by the import hook before.
ADDED_METHODS: list[str] = [
    name for name in NAMED_TENSOR_METHODS if getattr(getattr(torch.Tensor, name, None), "_remat_opt_placeholder", False)
]


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


# The first import of Thunder happens here. Thunder warns on import that an optional package it does
# not need here is missing (transformer_engine, a GPU-only executor); remat-opt's users did not ask.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="transformer_engine module not found", category=UserWarning)
    THUNDERFX_PATCHED: bool = ensure_thunderfx_recompiles()


DICT_CHANGED = "dictionary changed size during iteration"


def retry_when_a_dict_shrinks(fn, attempts: int = 8):
    """`fn` called again (up to `attempts` times in all) when it fails because a dict it iterates
    changed size; any other error, or the last attempt's, propagates. For idempotent `fn` only."""

    def retrying(*args, **kwargs):
        for attempt in range(attempts):
            try:
                return fn(*args, **kwargs)
            except RuntimeError as e:
                if DICT_CHANGED not in str(e) or attempt == attempts - 1:
                    raise

    retrying.__doc__, retrying.__wrapped__, retrying.__name__ = fn.__doc__, fn, fn.__name__
    retrying._remat_opt_retries = True
    return retrying


def interpreter_iterates_live_dicts(interpreter=None) -> bool:
    """Whether Thunder wraps a dict's items while iterating the dict itself (step 3's trigger)."""
    import inspect

    if interpreter is None:
        from thunder.core import interpreter
    fn = getattr(interpreter, "populate_item_wrappers", None)
    if fn is None or getattr(fn, "_remat_opt_retries", False):
        return False
    return "in obj.value.items():" in inspect.getsource(fn)


def ensure_item_wrapping_retries(interpreter=None) -> bool:
    """Step 3: replaces ``populate_item_wrappers`` of Thunder's interpreter module (looked up there
    as a global at each call) by one that retries when the dict shrank. Returns whether it did."""
    if interpreter is None:
        from thunder.core import interpreter
    if not interpreter_iterates_live_dicts(interpreter):
        return False
    interpreter.populate_item_wrappers = retry_when_a_dict_shrinks(interpreter.populate_item_wrappers)
    return True


ITEM_WRAPPING_PATCHED: bool = ensure_item_wrapping_retries()
