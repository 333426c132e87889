"""Real memory measurements that the planner's predictions are checked against.

Everything here runs the callable for real (eager ``torch.nn.Module``, plain function, or the
result of ``thunder.jit``) on real tensors; for shapes-only analysis on the meta device use
``remat_opt.analyze``. The module does not import Thunder.

Definitions
-----------
Saved tensors (:func:`measure_saved_bytes`)
    Every tensor that autograd packs for backward while ``fn(*args, **kwargs)`` runs, observed
    through ``torch.autograd.graph.saved_tensors_hooks``. This covers built-in ops, custom
    ``torch.autograd.Function``s (``ctx.save_for_backward``) and Thunder's compiled functions,
    which save their ``saved_for_backward`` tensors with ``ctx.save_for_backward``. A tensor counts
    only if autograd still holds it when ``fn`` returns (a saved tensor of a sub-graph that was
    discarded during the forward is reported in ``n_released_during_forward`` only). Hooks that
    ``fn`` installs itself (e.g. non-reentrant activation checkpointing) take precedence over
    ours, so tensors packed by them are not seen.

Storage de-duplication
    Memory is owned by storages, not tensors: a saved slice keeps its whole base storage alive,
    and several saved views of one storage cost it once. Saved tensors are therefore grouped by
    ``(device, untyped_storage().data_ptr())`` (valid because all grouped storages are alive at
    the same time) and each group costs ``untyped_storage().nbytes()``.

Inputs versus activations
    Storages of the step's inputs are alive before and after the step, whatever the planner
    decides: the tensors in ``args``/``kwargs`` (flattened with ``torch.utils._pytree``), and the
    parameters and buffers of ``fn`` when it is an ``nn.Module`` (a ``thunder.ThunderModule`` is
    one) or of any ``nn.Module`` found among the arguments. Saved storages that are inputs are
    reported as ``input_bytes``, the others as ``activation_bytes``. Parameters that a plain
    function closes over are not recognised; pass the module as ``fn`` or as an argument.

Peak (:func:`measure_step_peak_bytes`)
    One training step: forward, loss (``out.float().sum()`` by default), backward. The output is
    released once the loss is computed, as in ``loss_fn(model(x)).backward()``.

    * CPU: the step runs under ``torch.profiler`` with ``profile_memory=True``; the allocation
      and free events of the CPU allocator are replayed in time order. ``step_peak_delta_bytes``
      is the maximum over time of the bytes of blocks the calling thread allocated during the
      step and not yet freed (by any thread; frees of blocks allocated before the step are
      ignored). Blocks that other threads allocate (gloo's worker threads stage collectives in
      64 KiB buffers) are reported apart, as ``other_threads_peak_bytes``: they overlap the step's
      own peak or not depending on thread timing, and they are the CPU counterpart of a
      communication library's own buffers, which ``torch.cuda.max_memory_allocated`` does not
      count either (NCCL allocates outside the caching allocator). A free on a thread the profiler
      does not record is not seen: a gloo worker thread that releases a finished collective after
      the step dropped its own reference frees the collective's tensors there, and the block then
      counts as alive to the end of the step (``tests/distributed/distributed_runs.py`` waits for
      gloo's workers after every wait, so that the step is the last holder). ``baseline_bytes`` is the
      bytes of the distinct storages the step uses that exist before it (inputs, parameters,
      buffers, and existing ``.grad`` tensors when they are kept). Allocations that bypass the
      c10 CPU allocator (oneDNN/MKL scratch space, Python objects) are not seen, and CPU bytes
      are exact storage sizes (no allocator rounding).
    * CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``;
      ``baseline_bytes`` is ``torch.cuda.memory_allocated`` before the step, i.e. everything
      allocated on the device (not only what the step uses), and sizes include the caching
      allocator's rounding (multiples of 512 bytes).

    In both cases ``peak_bytes = baseline_bytes + step_peak_delta_bytes`` and
    ``end_delta_bytes`` is the net allocation left after the step (the new ``.grad`` tensors,
    plus whatever the callable caches).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from remat_opt.core.report import format_bytes

__all__ = [
    "AllocationTrace",
    "PeakMeasurement",
    "SavedMeasurement",
    "SavedTensorRecord",
    "format_bytes",
    "measure_saved_bytes",
    "measure_step_peak_bytes",
    "trace_cpu_allocations",
]

META_ERROR = "measure needs real tensors; use remat_opt.analyze for meta"

StorageKey = tuple[Any, ...]


# --------------------------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------------------------

# --------------------------------------------------------------------------------------------
# Storages of tensors
# --------------------------------------------------------------------------------------------


def _storage_key_and_bytes(t: torch.Tensor) -> tuple[StorageKey, int]:
    """Identity and size of the storage that keeps ``t``'s memory alive.

    Meta tensors occupy no memory (0 bytes). Tensors without an accessible storage (sparse
    tensors, some wrapper subclasses) fall back to their own identity and their view bytes.
    """
    if t.device.type == "meta":
        return ("meta", id(t)), 0
    try:
        storage = t.untyped_storage()
        return (t.device, storage.data_ptr()), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):
        return ("no-storage", id(t)), t.numel() * t.element_size()


def _modules_in(fn: Callable[..., Any], leaves: Iterable[Any]) -> Iterator[torch.nn.Module]:
    if isinstance(fn, torch.nn.Module):
        yield fn
    for leaf in leaves:
        if isinstance(leaf, torch.nn.Module):
            yield leaf


def _step_input_tensors(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[torch.Tensor]:
    """Tensors that exist before the step: arguments, parameters and buffers (with repeats)."""
    leaves = pytree.tree_leaves((args, kwargs))
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    for module in _modules_in(fn, leaves):
        tensors.extend(module.parameters())
        tensors.extend(module.buffers())
    return tensors


def _check_not_meta(tensors: Iterable[torch.Tensor]) -> None:
    if any(t.device.type == "meta" for t in tensors):
        raise ValueError(META_ERROR)


def _distinct_storage_bytes(tensors: Iterable[torch.Tensor]) -> dict[StorageKey, int]:
    keyed: dict[StorageKey, int] = {}
    for t in tensors:
        key, n_bytes = _storage_key_and_bytes(t)
        keyed[key] = n_bytes
    return keyed


# --------------------------------------------------------------------------------------------
# Saved tensors
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SavedTensorRecord:
    """One tensor saved for backward.

    Attributes:
        shape: The saved tensor's shape.
        dtype: Its dtype.
        device: Its device, as a string (``"cpu"``, ``"cuda:0"``).
        nbytes: Bytes of the view itself (``numel * element_size``).
        storage_bytes: Bytes of the whole storage it keeps alive.
        is_input: Whether the storage belongs to an input, parameter or buffer of the step.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: str
    nbytes: int
    storage_bytes: int
    is_input: bool


@dataclass(frozen=True, slots=True)
class SavedMeasurement:
    """What autograd holds for backward at the end of a forward pass.

    Attributes:
        saved_bytes: Bytes of all distinct saved storages (``activation_bytes + input_bytes``).
        activation_bytes: Bytes of distinct saved storages that are not inputs, parameters or
            buffers: the memory that rematerialization can trade for compute.
        input_bytes: Bytes of distinct saved storages that belong to inputs, parameters or
            buffers (alive anyway).
        n_saved_tensors: Number of tensors saved (and still held) for backward.
        n_storages: Number of distinct storages among them.
        n_released_during_forward: Saved tensors that autograd had already released when the
            forward returned (their sub-graph was discarded); not counted above.
        tensors: One record per saved tensor, in the order they were saved.
        output: The forward output, so that callers can continue with backward. Excluded from
            ``repr`` and comparisons. Keeping the measurement keeps the autograd graph (and the
            saved tensors) alive.
    """

    saved_bytes: int
    activation_bytes: int
    input_bytes: int
    n_saved_tensors: int
    n_storages: int
    n_released_during_forward: int
    tensors: tuple[SavedTensorRecord, ...]
    output: Any = field(default=None, repr=False, compare=False)

    def summary(self) -> str:
        """One-line human-readable summary."""
        return (
            f"saved {format_bytes(self.saved_bytes)} in {self.n_storages} storages "
            f"({self.n_saved_tensors} tensors): activations {format_bytes(self.activation_bytes)}, "
            f"inputs/params {format_bytes(self.input_bytes)}"
        )


class _SavedTensorCollector:
    """Pack/unpack hooks that observe saved tensors without changing what autograd keeps.

    ``pack`` returns a detached alias (sharing the storage), so autograd keeps the storage alive
    exactly as long as it would without hooks. The collector holds only weak references; after
    the forward the tensors still referenced are those autograd holds, all alive at the same
    time, so their storage ``data_ptr``s cannot have been reused by one another.
    """

    def __init__(self) -> None:
        self.refs: list[weakref.ref[torch.Tensor]] = []

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        packed = t.detach()
        self.refs.append(weakref.ref(packed))
        return packed

    @staticmethod
    def unpack(packed: torch.Tensor) -> torch.Tensor:
        return packed

    def alive(self) -> list[torch.Tensor]:
        tensors = [ref() for ref in self.refs]
        return [t for t in tensors if t is not None]


def _saved_record(t: torch.Tensor, storage_bytes: int, is_input: bool) -> SavedTensorRecord:
    return SavedTensorRecord(
        shape=tuple(t.shape),
        dtype=t.dtype,
        device=str(t.device),
        nbytes=t.numel() * t.element_size(),
        storage_bytes=storage_bytes,
        is_input=is_input,
    )


def _summarize_saved(
    saved: list[torch.Tensor], input_keys: set[StorageKey], n_released: int, output: Any
) -> SavedMeasurement:
    records = []
    storages: dict[StorageKey, tuple[int, bool]] = {}
    for t in saved:
        key, storage_bytes = _storage_key_and_bytes(t)
        is_input = key in input_keys
        storages[key] = (storage_bytes, is_input)
        records.append(_saved_record(t, storage_bytes, is_input))
    input_bytes = sum(n for n, is_input in storages.values() if is_input)
    activation_bytes = sum(n for n, is_input in storages.values() if not is_input)
    return SavedMeasurement(
        saved_bytes=input_bytes + activation_bytes,
        activation_bytes=activation_bytes,
        input_bytes=input_bytes,
        n_saved_tensors=len(saved),
        n_storages=len(storages),
        n_released_during_forward=n_released,
        tensors=tuple(records),
        output=output,
    )


def measure_saved_bytes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> SavedMeasurement:
    """Runs ``fn(*args, **kwargs)`` with grad enabled and measures what it saves for backward.

    Args:
        fn: Any callable: an eager module or function, or a ``thunder.jit`` result.
        *args: Positional arguments of ``fn``.
        **kwargs: Keyword arguments of ``fn``.

    Returns:
        The measurement; its ``output`` attribute is ``fn``'s return value, still attached to
        the autograd graph.

    Raises:
        ValueError: If an input, parameter or buffer is on the meta device.
    """
    inputs = _step_input_tensors(fn, args, kwargs)
    _check_not_meta(inputs)
    input_keys = set(_distinct_storage_bytes(inputs))
    collector = _SavedTensorCollector()
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(collector.pack, collector.unpack):
        output = fn(*args, **kwargs)
    saved = collector.alive()
    n_released = len(collector.refs) - len(saved)
    return _summarize_saved(saved, input_keys, n_released, output)


# --------------------------------------------------------------------------------------------
# CPU allocation trace (torch.profiler memory events)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AllocationTrace:
    """CPU allocator activity during a profiled call.

    Only blocks allocated during the call are tracked; a free of a block allocated before it
    is ignored (the profiler cannot always size those).

    Attributes:
        peak_delta_bytes: Maximum over time of the bytes the calling thread allocated during the
            call and not yet freed (>= 0).
        end_delta_bytes: Bytes the calling thread allocated during the call, still alive at its end.
        n_allocations: Number of allocation events on the calling thread.
        n_frees: Number of free events of blocks the calling thread allocated during the call.
        n_foreign_frees: Number of free events of blocks allocated before the call (ignored).
        other_threads_peak_bytes: Maximum over time of the bytes other threads the profiler saw
            (gloo's workers) allocated during the call and not yet freed; not in the other figures.
        live_delta_bytes: `peak_delta_bytes`' series: the calling thread's live bytes after each of
            its allocations and counted frees, in time order.
    """

    peak_delta_bytes: int
    end_delta_bytes: int
    n_allocations: int
    n_frees: int
    n_foreign_frees: int
    other_threads_peak_bytes: int = 0
    live_delta_bytes: tuple[int, ...] = field(default=(), repr=False)


# The profiler names the thread that calls the measured function by this annotation's thread id.
_CALLER_MARK = "remat_opt.measured_call"


def _iter_profiler_events(roots: list[Any]) -> Iterator[Any]:
    stack = list(roots)
    while stack:
        event = stack.pop()
        yield event
        stack.extend(event.children)


def _cpu_allocation_events(prof: torch.profiler.profile) -> tuple[list[tuple[int, int, int, int, bool]], bool]:
    """Allocation events ``(time_ns, order, ptr, signed_bytes, on_caller_thread)`` on the CPU, in
    time order, and whether the caller's thread was found (`_CALLER_MARK`).

    Uses the profiler's event tree, whose allocation events carry the block pointer and thread (the
    flat ``[memory]`` events of ``prof.events()`` do not, and are attributed inclusively to every
    enclosing op).
    """
    roots = prof.profiler.kineto_results.experimental_event_tree()
    events = list(_iter_profiler_events(roots))
    caller_tids = {e.start_tid for e in events if e.name == _CALLER_MARK}
    allocations = []
    for event in events:
        if event.tag != torch._C._profiler._EventType.Allocation:
            continue
        extra = event.extra_fields
        if extra.device.type != "cpu" or extra.alloc_size == 0:
            continue
        on_caller = event.start_tid in caller_tids
        allocations.append((event.start_time_ns, len(allocations), extra.ptr, extra.alloc_size, on_caller))
    allocations.sort()
    return allocations, bool(caller_tids)


def _replay_allocations(events: list[tuple[int, int, int, int, bool]]) -> AllocationTrace:
    """Replays allocations in time order: the caller thread's blocks (freed by whichever thread
    frees them) make the step's series; other threads' blocks only their own peak."""
    owner_and_bytes_by_ptr: dict[int, tuple[bool, int]] = {}
    current_bytes = peak_bytes = other_bytes = other_peak_bytes = 0
    n_allocations = n_frees = n_foreign_frees = 0
    series = []
    for _, _, ptr, signed_bytes, on_caller in events:
        if signed_bytes > 0:
            owner_and_bytes_by_ptr[ptr] = (on_caller, signed_bytes)
            if not on_caller:
                other_bytes += signed_bytes
                other_peak_bytes = max(other_peak_bytes, other_bytes)
                continue
            current_bytes += signed_bytes
            peak_bytes = max(peak_bytes, current_bytes)
            n_allocations += 1
        elif ptr in owner_and_bytes_by_ptr:
            owned_by_caller, size = owner_and_bytes_by_ptr.pop(ptr)
            if not owned_by_caller:
                other_bytes -= size
                continue
            current_bytes -= size
            n_frees += 1
        else:
            n_foreign_frees += 1
            continue
        series.append(current_bytes)
    return AllocationTrace(
        peak_delta_bytes=peak_bytes,
        end_delta_bytes=current_bytes,
        n_allocations=n_allocations,
        n_frees=n_frees,
        n_foreign_frees=n_foreign_frees,
        other_threads_peak_bytes=other_peak_bytes,
        live_delta_bytes=tuple(series),
    )


def trace_cpu_allocations(thunk: Callable[[], Any]) -> AllocationTrace:
    """Calls ``thunk()`` under the CPU memory profiler and replays its allocations: the calling
    thread's as the call's series and peak, other threads' (gloo's workers) apart.

    The return value of ``thunk`` is dropped inside the profiled region, so tensors it returns
    count as freed. Python garbage is collected first, so that earlier garbage is not freed
    during the call. Cannot be nested inside another active ``torch.profiler`` session.

    Args:
        thunk: Function of no arguments to profile.

    Returns:
        The allocation trace of the call.
    """
    activities = [torch.profiler.ProfilerActivity.CPU]
    gc.collect()
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        with torch.profiler.record_function(_CALLER_MARK):
            thunk()
    events, caller_found = _cpu_allocation_events(prof)
    if not caller_found:
        raise RuntimeError(f"the profiler did not record the {_CALLER_MARK!r} annotation around the call")
    return _replay_allocations(events)


# --------------------------------------------------------------------------------------------
# Training-step peak
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeakMeasurement:
    """Memory of one training step (forward, loss, backward).

    Attributes:
        peak_bytes: ``baseline_bytes + step_peak_delta_bytes``.
        baseline_bytes: CPU: bytes of the distinct storages alive before the step that it uses
            (inputs, parameters, buffers, kept ``.grad`` tensors). CUDA: all bytes allocated on
            the device before the step.
        step_peak_delta_bytes: Maximum, during the step, of the bytes allocated by the step and
            not yet freed.
        end_delta_bytes: Net bytes the step left allocated (the new ``.grad`` tensors, plus
            whatever the callable caches).
        device: The measured device (``"cpu"``, ``"cuda:0"``).
        method: ``"cpu_profiler"`` or ``"cuda_allocator"``.
        timeline_bytes: CPU: ``baseline_bytes`` plus the step's live bytes after each allocator
            event, in time order (a measured timeline; its maximum is `peak_bytes`). CUDA: empty.
        other_threads_peak_bytes: CPU: the most bytes that threads other than the caller's (gloo's
            workers staging collectives) held at once during the step, not part of `peak_bytes`.
            CUDA: 0 (NCCL's buffers are outside the caching allocator).
    """

    peak_bytes: int
    baseline_bytes: int
    step_peak_delta_bytes: int
    end_delta_bytes: int
    device: str
    method: str
    timeline_bytes: tuple[int, ...] = field(default=(), repr=False)
    other_threads_peak_bytes: int = 0

    def summary(self) -> str:
        """One-line human-readable summary."""
        return (
            f"peak {format_bytes(self.peak_bytes)} = baseline {format_bytes(self.baseline_bytes)} "
            f"+ step {format_bytes(self.step_peak_delta_bytes)} on {self.device} ({self.method}); "
            f"end delta {format_bytes(self.end_delta_bytes)}"
            + (f"; other threads up to {format_bytes(self.other_threads_peak_bytes)}" if self.other_threads_peak_bytes else "")
        )


def _default_loss(output: Any) -> torch.Tensor:
    """``output.float().sum()``; for a container, the sum over its differentiable tensors."""
    if isinstance(output, torch.Tensor):
        return output.float().sum()
    tensors = [
        t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad
    ]
    if not tensors:
        raise TypeError(
            f"cannot build a default loss from output of type {type(output).__name__}; "
            "pass loss_fn"
        )
    return sum(t.float().sum() for t in tensors)


def _set_grads_to_none(tensors: Iterable[torch.Tensor]) -> None:
    for t in tensors:
        if t.is_leaf and t.requires_grad:
            t.grad = None


def _existing_grads(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    return [t.grad for t in tensors if t.is_leaf and t.grad is not None]


def _measured_device(tensors: list[torch.Tensor]) -> torch.device:
    cuda = [t.device for t in tensors if t.device.type == "cuda"]
    return cuda[0] if cuda else torch.device("cpu")


def _make_step(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    loss_fn: Callable[[Any], torch.Tensor],
) -> Callable[[], None]:
    def step() -> None:
        with torch.enable_grad():
            loss = loss_fn(fn(*args, **kwargs))  # the output is released here
            loss.backward()

    return step


def _cuda_peak(step: Callable[[], None], device: torch.device) -> tuple[int, int, int]:
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base_bytes = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize(device)
    peak_delta_bytes = torch.cuda.max_memory_allocated(device) - base_bytes
    end_delta_bytes = torch.cuda.memory_allocated(device) - base_bytes
    return base_bytes, peak_delta_bytes, end_delta_bytes


def measure_step_peak_bytes(
    fn: Callable[..., Any],
    *args: Any,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    warmup_steps: int = 1,
    set_grads_to_none: bool = True,
    **kwargs: Any,
) -> PeakMeasurement:
    """Measures the memory peak of one training step ``loss_fn(fn(*args, **kwargs)).backward()``.

    The device is CUDA if any input, parameter or buffer is on CUDA, else CPU. After the step
    the new gradients are left in ``.grad``, as after a real step.

    Args:
        fn: Any callable: an eager module or function, or a ``thunder.jit`` result.
        *args: Positional arguments of ``fn``.
        loss_fn: Maps the output to a scalar loss; default ``out.float().sum()``.
        warmup_steps: Unmeasured steps run first, so that compilation (Thunder), lazy
            initialisation and caches do not enter the measurement.
        set_grads_to_none: Set ``.grad`` of the leaf inputs and parameters to ``None`` before
            the measured step (as ``optimizer.zero_grad()`` does). If False, existing gradients
            are part of the baseline.
        **kwargs: Keyword arguments of ``fn``.

    Returns:
        The measurement.

    Raises:
        ValueError: If an input, parameter or buffer is on the meta device.
    """
    inputs = _step_input_tensors(fn, args, kwargs)
    _check_not_meta(inputs)
    step = _make_step(fn, args, kwargs, loss_fn or _default_loss)
    for _ in range(warmup_steps):
        step()
    if set_grads_to_none:
        _set_grads_to_none(inputs)
    device = _measured_device(inputs)
    if device.type == "cuda":
        baseline_bytes, peak_delta_bytes, end_delta_bytes = _cuda_peak(step, device)
        method, timeline, other_threads_bytes = "cuda_allocator", (), 0
    else:
        baseline_bytes = sum(_distinct_storage_bytes(inputs + _existing_grads(inputs)).values())
        trace = trace_cpu_allocations(step)
        peak_delta_bytes, end_delta_bytes = trace.peak_delta_bytes, trace.end_delta_bytes
        method, other_threads_bytes = "cpu_profiler", trace.other_threads_peak_bytes
        timeline = (baseline_bytes, *(baseline_bytes + b for b in trace.live_delta_bytes))
    return PeakMeasurement(
        peak_bytes=baseline_bytes + peak_delta_bytes,
        baseline_bytes=baseline_bytes,
        step_peak_delta_bytes=peak_delta_bytes,
        end_delta_bytes=end_delta_bytes,
        device=str(device),
        method=method,
        timeline_bytes=timeline,
        other_threads_peak_bytes=other_threads_bytes,
    )
