"""A fused scaled-dot-product-attention executor for Thunder on CPU and on the meta device.

Why this exists:
    Thunder's own SDPA executors (``sdpa``, ``cudnn``) claim
    ``torch.nn.functional.scaled_dot_product_attention`` only on CUDA. On CPU and on the meta
    device Thunder therefore decomposes SDPA into matmul / softmax / matmul, and the autograd
    pass saves the ``[B, H, T, T]`` attention probabilities for backward. GPU runs save only
    ``(q, k, v, out, logsumexp)``. Rematerialization plans computed from a CPU or meta trace
    would then see a very different saved-for-backward set from the one a GPU run has.

    ``sdpa_cpu_ex`` closes that gap. It maps SDPA onto PyTorch's fused CPU flash-attention
    kernels, ``aten._scaled_dot_product_flash_attention_for_cpu`` and its ``_backward``. Both
    have meta kernels, so the same trace runs on meta tensors. With the executor in the list,
    a CPU or meta trace saves ``(q, k, v, out, logsumexp)``, with no ``[B, H, T, T]`` tensor,
    as a GPU trace does.

What the aten kernels do (torch 2.13, checked by calling them):
    * Inputs must be 4-D ``[B, H, T, D]``, and q, k and v must have the same head size ``D``.
      The kernel assumes a unit stride in the last dimension: with a non-unit last stride the
      forward returns wrong values without raising, so the implementation makes such inputs
      contiguous first.
    * ``out`` has the query's shape and dtype. ``logsumexp`` has shape ``[B, H, Tq]``, dtype
      float32 (float64 for float64 inputs), and a ``[B, Tq, H]`` memory layout (strides
      ``(Tq*H, 1, H)``). Thunder proxies carry no strides, and every consumer here is a torch
      op that accepts any layout, so the layout does not matter to this module.
    * float32, bfloat16, float16 and float64 all work, on CPU and on meta.
    * Grouped-query attention: the kernel accepts k/v with fewer heads than q, with the
      ``enable_gqa`` meaning, and returns k/v-shaped gradients. Thunder's ``ltorch`` SDPA has
      no ``enable_gqa`` argument. Its decomposition broadcasts heads, so only a single k/v head
      (multi-query) gets through Thunder's tracing. The checker accepts k/v head counts that
      divide the query head count, which covers that case. litgpt 0.5.13 calls
      ``repeat_interleave`` on k and v up to ``n_head`` before SDPA in training, so its SDPA
      always sees equal head counts.
    * ``is_causal`` masks from the top left, as Thunder's decomposition (``tril``) and eager
      PyTorch do, also when ``Tq != Tk``.

Scope:
    The executor claims SDPA only when q, k and v are all on CPU, or all on meta, have the same
    floating dtype, and ``attn_mask is None``, ``dropout_p == 0`` and ``is_causal`` is a bool.
    In every other case the checker returns False and Thunder uses its decomposition.

Usage:
    >>> import remat_opt  # must come before ``import thunder``
    >>> import thunder
    >>> from remat_opt.executors.sdpa_cpu import sdpa_cpu_ex
    >>> jfn = thunder.jit(fn, executors=[sdpa_cpu_ex, *thunder.get_default_executors()])
"""

from __future__ import annotations

from numbers import Number

import torch

from remat_opt import _compat  # noqa: F401  (must run before thunder is imported)

import thunder.core.devices as devices
import thunder.core.dtypes as dtypes
import thunder.torch as ltorch
from thunder.core.prims import OpTags
from thunder.core.proxies import TensorProxy, pyval
from thunder.core.transforms import get_grad, put_grads
from thunder.extend import OperatorExecutor, register_executor

__all__ = [
    "EXECUTOR_NAME",
    "FORWARD_NAME",
    "BACKWARD_NAME",
    "SUPPORTED_DTYPES",
    "sdpa_cpu_ex",
    "sdpa_cpu_fwd",
    "sdpa_cpu_bwd",
    "sdpa_cpu_checker",
]

EXECUTOR_NAME = "remat_sdpa_cpu"
FORWARD_NAME = "remat_sdpa_cpu_fwd"
BACKWARD_NAME = "remat_sdpa_cpu_bwd"

#: Thunder dtypes (with and without the weak-type flag) that the CPU flash kernels accept.
SUPPORTED_DTYPES = (dtypes.float32, dtypes.bfloat16, dtypes.float16, dtypes.float64)

#: Device types on which the executor claims SDPA.
SUPPORTED_DEVICE_TYPES = (devices.DeviceType.CPU, devices.DeviceType.META)

sdpa_cpu_ex: OperatorExecutor = OperatorExecutor(EXECUTOR_NAME, version="0.1")
register_executor(sdpa_cpu_ex)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _unit_last_stride(a: torch.Tensor) -> torch.Tensor:
    """Returns ``a``, made contiguous if its last dimension has a non-unit stride.

    The CPU flash kernel reads the head dimension as if it were dense and silently gives wrong
    results otherwise.

    Args:
        a: A tensor passed to one of the aten kernels.

    Returns:
        ``a`` itself, or a contiguous copy of it.
    """
    if a.ndim == 0 or a.stride(-1) == 1:
        return a
    return a.contiguous()


def _logsumexp_dtype(query_dtype: dtypes.dtype) -> dtypes.dtype:
    """Returns the dtype of the kernel's logsumexp output for a given query dtype.

    Args:
        query_dtype: Thunder dtype of the query.

    Returns:
        ``float64`` for float64 queries and ``float32`` otherwise (the kernel's accumulation type).
    """
    return dtypes.float64 if dtypes.to_strong_dtype(query_dtype) == dtypes.float64 else dtypes.float32


def _as_python_number(x) -> Number | None:
    """Returns the Python value of a number or number proxy, or None for anything else.

    Args:
        x: A Python number, a Thunder ``NumberProxy``, or another object.

    Returns:
        The number, or None if ``x`` is not a number.
    """
    try:
        value = pyval(x)
    except Exception:
        return None
    return value if isinstance(value, Number) else None


# ---------------------------------------------------------------------------------------------
# Forward operator: (q, k, v) -> (out, logsumexp)
# ---------------------------------------------------------------------------------------------


def _sdpa_cpu_fwd_meta(
    query: TensorProxy,
    key: TensorProxy,
    value: TensorProxy,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: None | float = None,
) -> tuple[TensorProxy, TensorProxy]:
    """Describes the forward kernel's outputs.

    Args:
        query: ``[B, Hq, Tq, D]``.
        key: ``[B, Hkv, Tk, D]``.
        value: ``[B, Hkv, Tk, D]``.
        dropout_p: Dropout probability; always 0 for claimed calls.
        is_causal: Whether a top-left causal mask is applied.
        scale: Softmax scale, None for ``1/sqrt(D)``.

    Returns:
        ``out`` of the query's shape and dtype, and ``logsumexp`` of shape ``[B, Hq, Tq]`` in the
        kernel's accumulation dtype.
    """
    batch, heads, q_len, _ = query.shape
    out = TensorProxy(like=query, shape=(batch, heads, q_len, value.shape[-1]))
    logsumexp = TensorProxy(
        like=query,
        shape=(batch, heads, q_len),
        dtype=_logsumexp_dtype(query.dtype),
        requires_grad=False,
    )
    return out, logsumexp


def _sdpa_cpu_fwd_impl(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: None | float = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs ``aten._scaled_dot_product_flash_attention_for_cpu``.

    Args:
        query: ``[B, Hq, Tq, D]`` on CPU or meta.
        key: ``[B, Hkv, Tk, D]``.
        value: ``[B, Hkv, Tk, D]``.
        dropout_p: Dropout probability.
        is_causal: Whether a top-left causal mask is applied.
        scale: Softmax scale, None for ``1/sqrt(D)``.

    Returns:
        ``(out, logsumexp)``.
    """
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        _unit_last_stride(query),
        _unit_last_stride(key),
        _unit_last_stride(value),
        dropout_p,
        is_causal,
        attn_mask=None,
        scale=scale,
    )


sdpa_cpu_fwd = sdpa_cpu_ex.register_operator(
    FORWARD_NAME,
    meta=_sdpa_cpu_fwd_meta,
    fn=_sdpa_cpu_fwd_impl,
    tags=(OpTags.DONT_AUTO_RECOMPUTE_IN_BACKWARD,),
)


# ---------------------------------------------------------------------------------------------
# Backward operator: (grad_out, q, k, v, out, logsumexp) -> (grad_q, grad_k, grad_v)
# ---------------------------------------------------------------------------------------------


def _sdpa_cpu_bwd_meta(
    grad_out: TensorProxy,
    query: TensorProxy,
    key: TensorProxy,
    value: TensorProxy,
    out: TensorProxy,
    logsumexp: TensorProxy,
    dropout_p: float,
    is_causal: bool,
    *,
    scale: None | float = None,
) -> tuple[TensorProxy, TensorProxy, TensorProxy]:
    """Describes the backward kernel's outputs: gradients shaped like q, k and v.

    Args:
        grad_out: Gradient of ``out``.
        query: Forward query.
        key: Forward key.
        value: Forward value.
        out: Forward output.
        logsumexp: Forward logsumexp.
        dropout_p: Dropout probability.
        is_causal: Whether a top-left causal mask was applied.
        scale: Softmax scale, None for ``1/sqrt(D)``.

    Returns:
        ``(grad_query, grad_key, grad_value)``.
    """
    return (
        TensorProxy(like=query, requires_grad=False),
        TensorProxy(like=key, requires_grad=False),
        TensorProxy(like=value, requires_grad=False),
    )


def _sdpa_cpu_bwd_impl(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    dropout_p: float,
    is_causal: bool,
    *,
    scale: None | float = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Runs ``aten._scaled_dot_product_flash_attention_for_cpu_backward``.

    Args:
        grad_out: Gradient of ``out``.
        query: Forward query.
        key: Forward key.
        value: Forward value.
        out: Forward output.
        logsumexp: Forward logsumexp.
        dropout_p: Dropout probability.
        is_causal: Whether a top-left causal mask was applied.
        scale: Softmax scale, None for ``1/sqrt(D)``.

    Returns:
        ``(grad_query, grad_key, grad_value)``.
    """
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        _unit_last_stride(grad_out),
        _unit_last_stride(query),
        _unit_last_stride(key),
        _unit_last_stride(value),
        _unit_last_stride(out),
        logsumexp,
        dropout_p,
        is_causal,
        attn_mask=None,
        scale=scale,
    )


sdpa_cpu_bwd = sdpa_cpu_ex.register_operator(
    BACKWARD_NAME,
    meta=_sdpa_cpu_bwd_meta,
    fn=_sdpa_cpu_bwd_impl,
)


# ---------------------------------------------------------------------------------------------
# Checker
# ---------------------------------------------------------------------------------------------


def _supported_tensor(t, device: devices.Device, dtype: dtypes.dtype) -> bool:
    """Whether ``t`` is a 4-D non-empty tensor on ``device`` with ``dtype`` (a supported one).

    Args:
        t: The candidate argument.
        device: The query's device.
        dtype: The query's dtype, weak-type flag stripped.

    Returns:
        True if the kernels accept ``t`` next to the query.
    """
    return (
        isinstance(t, TensorProxy)
        and t.ndim == 4
        and t.numel > 0
        and t.device.devicetype in SUPPORTED_DEVICE_TYPES
        and t.device == device
        and dtypes.to_strong_dtype(t.dtype) == dtype
        and dtype in SUPPORTED_DTYPES
    )


def _supported_shapes(query: TensorProxy, key: TensorProxy, value: TensorProxy) -> bool:
    """Whether the shapes fit the kernel: same batch, same head size, k/v heads dividing q heads.

    Args:
        query: ``[B, Hq, Tq, D]``.
        key: ``[B, Hkv, Tk, D]``.
        value: ``[B, Hkv, Tk, D]``.

    Returns:
        True if the kernel computes the same result as Thunder's decomposition for these shapes.
    """
    batch, q_heads, _, head_size = query.shape
    _, kv_heads, kv_len, _ = key.shape
    return (
        key.shape[0] == batch
        and tuple(value.shape) == (batch, kv_heads, kv_len, head_size)
        and key.shape[-1] == head_size
        and q_heads % kv_heads == 0
    )


def sdpa_cpu_checker(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: None | float = None,
) -> bool:
    """Decides whether ``sdpa_cpu_ex`` takes a call of ``ltorch.scaled_dot_product_attention``.

    Args:
        query: Query proxy.
        key: Key proxy.
        value: Value proxy.
        attn_mask: Must be None.
        dropout_p: Must be 0.
        is_causal: Must be a Python bool.
        scale: None or a number.

    Returns:
        True if the call can go to the fused CPU kernels; False makes Thunder decompose it.
    """
    if attn_mask is not None or not isinstance(query, TensorProxy):
        return False
    if _as_python_number(dropout_p) != 0 or not isinstance(_as_python_number(is_causal), bool):
        return False
    if scale is not None and _as_python_number(scale) is None:
        return False
    device, dtype = query.device, dtypes.to_strong_dtype(query.dtype)
    if not all(_supported_tensor(t, device, dtype) for t in (query, key, value)):
        return False
    return _supported_shapes(query, key, value)


# ---------------------------------------------------------------------------------------------
# Execution and grad transforms
# ---------------------------------------------------------------------------------------------


def _sdpa_cpu_execution_transform(
    query: TensorProxy,
    key: TensorProxy,
    value: TensorProxy,
    attn_mask: None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: None | float = None,
) -> TensorProxy:
    """Forward without autograd: runs the fused kernel and drops the logsumexp.

    Args:
        query: Query proxy.
        key: Key proxy.
        value: Value proxy.
        attn_mask: Always None for claimed calls.
        dropout_p: Always 0 for claimed calls.
        is_causal: Whether a top-left causal mask is applied.
        scale: Softmax scale, None for ``1/sqrt(D)``.

    Returns:
        The attention output.
    """
    out, _ = sdpa_cpu_fwd(query, key, value, dropout_p, is_causal, scale=scale)
    return out


def _sdpa_cpu_grad_transform(
    query: TensorProxy,
    key: TensorProxy,
    value: TensorProxy,
    attn_mask: None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: None | float = None,
) -> TensorProxy:
    """Forward and backward for autograd, in the style of Thunder's ``sdpaex``.

    The forward keeps ``(q, k, v, out, logsumexp)`` for backward, and nothing of size
    ``[B, H, T, T]``.

    Args:
        query: Query proxy.
        key: Key proxy.
        value: Value proxy.
        attn_mask: Always None for claimed calls.
        dropout_p: Always 0 for claimed calls.
        is_causal: Whether a top-left causal mask is applied.
        scale: Softmax scale, None for ``1/sqrt(D)``.

    Returns:
        The attention output (the primal only).
    """
    out, logsumexp = sdpa_cpu_fwd(query, key, value, dropout_p, is_causal, scale=scale)
    grad_query, grad_key, grad_value = sdpa_cpu_bwd(
        get_grad(out), query, key, value, out, logsumexp, dropout_p, is_causal, scale=scale
    )
    put_grads((query, key, value), (grad_query, grad_key, grad_value))
    return out


sdpa_cpu_ex.register_implementation(
    ltorch.scaled_dot_product_attention,
    checker=sdpa_cpu_checker,
    execution_transform=_sdpa_cpu_execution_transform,
    grad_transform=_sdpa_cpu_grad_transform,
)
