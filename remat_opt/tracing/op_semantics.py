"""What a Thunder op does, decided from what it runs rather than from one tag.

Two questions the planner must get right for every op, however Thunder spells it:

* **Does its value depend on the RNG state?** Recomputing such an op in the backward draws new
  numbers and silently breaks gradients. Thunder tags only ``uniform`` and ``multinomial`` with
  ``RANDOM_OP`` (0.2.6); ``randn``, ``randint`` and ops it runs through its generic torch fallback
  (``randint_like``, ``alpha_dropout``, ``dropout1d/2d``, ``rrelu``, ...) carry no tag. An op is
  random here when a leaf of its decomposition is one of Thunder's random prims, or when it is a
  fallback op whose torch function dispatches an aten op torch tags ``nondeterministic_seeded``
  (found by running it on fake tensors). A fallback op that cannot be run is taken to be random:
  it is never recomputed (safe), and `FallbackWork.known` says so.
* **What does a fallback op cost?** Thunder runs an op it has no symbol for (``torch.mm`` traces as
  ``torch.spmm`` on torch 2.13) through the torch function itself, and its backward ``<name>_vjp``
  re-runs the forward under torch autograd. `fallback_work` counts the FLOPs of what it runs with
  torch's own flop counter (``aten.mm`` is a matmul), and the backward's workspace: the forward
  outputs it rebuilds, alive while the vjp runs.

Thunder-internal facts used (lightning-thunder 0.2.6; ``tests/tracing/test_op_semantics.py`` checks each):
fallback symbols carry ``OpTags.AUTO_REGISTERED`` and keep the torch function as ``meta.__torchfn``
before autodiff; after it, their forward and backward executor symbols are closures
(``meta_adaptor``/``backward_adaptor``) over ``torch_func``; the vjp is ``thunder.torch._vjp_impl``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from remat_opt import _compat  # noqa: F401  (before thunder)
from thunder.core import prims  # noqa: E402
from thunder.core.pytree import tree_flatten, tree_map  # noqa: E402
from thunder.core.symbol import BoundSymbol  # noqa: E402

# Thunder's prims that draw from the RNG (``uniform`` and ``multinomial`` also carry RANDOM_OP).
RANDOM_PRIMS = frozenset(
    {
        prims.PrimIDs.UNIFORM,
        prims.PrimIDs.UNIFORM_PHILOX,
        prims.PrimIDs.RANDN,
        prims.PrimIDs.RANDINT,
        prims.PrimIDs.MULTINOMIAL,
        prims.PrimIDs.GET_AND_UPDATE_RNG_STATE,
    }
)


@dataclass(frozen=True, slots=True)
class FallbackWork:
    """What a fallback op runs, counted on fake tensors.

    Attributes:
        torch_function: the torch function behind it (``"torch.spmm"``).
        is_vjp: whether this is the backward (``spmm_vjp``), which re-runs the forward.
        known: whether it could be run on fake tensors; when not, the rest are guesses (0, random).
        aten_ops: the aten ops it dispatched, in order, without repeats.
        flops: FLOPs as torch's flop counter counts them (matmuls, convolutions, attention).
        random: whether an aten op it ran is ``nondeterministic_seeded``.
        workspace_bytes: bytes it allocates beyond its outputs while it runs (a vjp's rebuilt forward
            outputs); 0 for a forward op.
    """

    torch_function: str
    is_vjp: bool
    known: bool
    aten_ops: tuple[str, ...] = ()
    flops: int = 0
    random: bool = True
    workspace_bytes: int = 0


def torch_function_of(bsym: BoundSymbol) -> tuple[Callable, bool] | None:
    """``(torch function, is_vjp)`` for an op run through Thunder's torch fallback, else None."""
    meta = bsym.sym.meta
    fn = getattr(meta, "__torchfn", None)
    if fn is not None:
        return fn, False
    qualname = getattr(meta, "__qualname__", "")
    if not qualname.startswith(("meta_adaptor.<locals>", "backward_adaptor.<locals>")):
        return None
    fn = inspect.getclosurevars(meta).nonlocals.get("torch_func")
    return (fn, qualname.startswith("backward_adaptor")) if fn is not None else None


def draws_random_itself(bsym: BoundSymbol) -> bool:
    """Whether `bsym` itself draws from the RNG (its decomposition not looked at): a random prim or
    tag, or a fallback op (no decomposition) whose torch function is seeded-nondeterministic."""
    if prims.OpTags.RANDOM_OP in (bsym.sym.tags or ()) or bsym.sym.id in RANDOM_PRIMS:
        return True
    if bsym.subsymbols:
        return False
    work = fallback_work(bsym)
    return work is not None and work.random


def is_random(bsym: BoundSymbol) -> bool:
    """Whether `bsym`'s value depends on the RNG state (see the module docstring)."""
    return draws_random_itself(bsym) or any(is_random(s) for s in bsym.subsymbols)


class _AtenRecorder(TorchDispatchMode):
    """Records the aten ops run and whether any is seeded-nondeterministic."""

    def __init__(self):
        super().__init__()
        self.ops: dict[str, None] = {}
        self.random = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] = None
        self.random |= torch.Tag.nondeterministic_seeded in func.tags
        return func(*args, **(kwargs or {}))


def _nbytes(values) -> int:
    flat, _ = tree_flatten(values)
    return sum(t.numel() * t.element_size() for t in flat if isinstance(t, torch.Tensor))


def _function_name(fn: Callable) -> str:
    module = getattr(fn, "__module__", None) or "torch"  # builtins such as torch.spmm have none
    return f"{module}.{getattr(fn, '__name__', repr(fn))}"


def fallback_work(bsym: BoundSymbol) -> FallbackWork | None:
    """`FallbackWork` of an op Thunder runs through its torch fallback; None for any other op."""
    found = torch_function_of(bsym)
    if found is None:
        return None
    fn, is_vjp = found
    try:
        return _count(fn, is_vjp, bsym.args, bsym.kwargs)
    except Exception:  # noqa: BLE001 - an op fake tensors cannot run is reported as unknown
        return FallbackWork(_function_name(fn), is_vjp, known=False)


def _count(fn: Callable, is_vjp: bool, args, kwargs) -> FallbackWork:
    import thunder.torch as ltorch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake_args, fake_kwargs = tree_map(ltorch._get_fake_arg, (args, kwargs))
        forward_args = fake_args[0] if is_vjp else (fake_args, fake_kwargs)
        with FlopCounterMode(display=False) as counter, _AtenRecorder() as recorder:
            if is_vjp:
                ltorch._vjp_impl(fn, forward_args, *fake_args[1:])
            else:
                fn(*fake_args, **fake_kwargs)
        workspace = _nbytes(fn(*forward_args[0], **forward_args[1])) if is_vjp else 0
    return FallbackWork(
        torch_function=_function_name(fn),
        is_vjp=is_vjp,
        known=True,
        aten_ops=tuple(recorder.ops),
        flops=int(counter.get_total_flops()),
        random=recorder.random,
        workspace_bytes=workspace,
    )

