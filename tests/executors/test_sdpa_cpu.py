"""Tests for ``remat_opt.executors.sdpa_cpu``: the fused SDPA executor for CPU and meta."""

from __future__ import annotations

from remat_opt import _compat  # noqa: F401  (applies the torch compatibility step before thunder)

import pytest
import torch
import torch.nn.functional as F

import thunder
from thunder.core.proxies import TensorProxy
from thunder.core.pytree import tree_flatten

from remat_opt.executors.sdpa_cpu import BACKWARD_NAME, FORWARD_NAME, sdpa_cpu_ex


def _executors():
    return [sdpa_cpu_ex, *thunder.get_default_executors()]


def _make_qkv(shape_q, shape_kv, dtype=torch.float32, device="cpu", seed=0):
    """Leaf q, k, v with requires_grad=True; values are drawn on CPU so they are reproducible."""
    gen = torch.Generator().manual_seed(seed)
    shapes = (shape_q, shape_kv, shape_kv)
    return tuple(
        torch.randn(s, generator=gen).to(device=device, dtype=dtype).requires_grad_(True) for s in shapes
    )


def _forward_and_grads(fn, q, k, v, seed=1):
    """Runs ``fn`` and returns (out, grad_q, grad_k, grad_v) for a fixed random cotangent."""
    out = fn(q, k, v)
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype)
    grads = torch.autograd.grad(out, (q, k, v), cotangent)
    return (out, *grads)


def _symbol_names(trace) -> set[str]:
    return {bsym.sym.name for bsym in trace.bound_symbols}


def _saved_shapes(jfn) -> list[tuple[int, ...]]:
    """Shapes of the tensors the last forward execution trace saves for backward."""
    forward_trace = thunder.last_traces(jfn)[-1]
    _, saved = forward_trace.output
    leaves, _ = tree_flatten(saved)
    return [tuple(p.shape) for p in leaves if isinstance(p, TensorProxy)]


def _has_attention_matrix(shapes, b, h, tq, tk) -> bool:
    return (b, h, tq, tk) in shapes


# ---------------------------------------------------------------------------------------------
# Numerics against eager PyTorch
# ---------------------------------------------------------------------------------------------

SHAPES = {
    "self_b1h2t8d16": ((1, 2, 8, 16), (1, 2, 8, 16)),
    "cross_b2h3tq5tk9d8": ((2, 3, 5, 8), (2, 3, 9, 8)),
}


@pytest.mark.parametrize("shape_name", list(SHAPES))
@pytest.mark.parametrize("scale", [None, 0.3], ids=["default_scale", "scale0.3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("is_causal", [True, False], ids=["causal", "noncausal"])
def test_matches_eager(shape_name, scale, dtype, is_causal):
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)

    shape_q, shape_kv = SHAPES[shape_name]
    q, k, v = _make_qkv(shape_q, shape_kv, dtype=dtype)
    jfn = thunder.jit(fn, executors=_executors())

    expected = _forward_and_grads(fn, q, k, v)
    actual = _forward_and_grads(jfn, q, k, v)

    assert FORWARD_NAME in _symbol_names(thunder.last_traces(jfn)[-1])
    for name, a, e in zip(("out", "grad_q", "grad_k", "grad_v"), actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape, name
        torch.testing.assert_close(a, e, msg=lambda m: f"{name}: {m}")


def test_float64_matches_eager():
    """float64 is claimed too; its logsumexp is float64 (the kernel's accumulation type)."""

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = _make_qkv((1, 2, 8, 8), (1, 2, 8, 8), dtype=torch.float64)
    jfn = thunder.jit(fn, executors=_executors())
    for a, e in zip(_forward_and_grads(jfn, q, k, v), _forward_and_grads(fn, q, k, v)):
        torch.testing.assert_close(a, e)
    assert FORWARD_NAME in _symbol_names(thunder.last_traces(jfn)[-1])


def test_non_unit_last_stride_matches_eager():
    """The kernel misreads a strided head dimension; the executor must copy such inputs."""

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q[..., ::2], k[..., ::2], v[..., ::2], is_causal=True)

    q, k, v = _make_qkv((1, 2, 8, 16), (1, 2, 8, 16))
    jfn = thunder.jit(fn, executors=_executors())
    for a, e in zip(_forward_and_grads(jfn, q, k, v), _forward_and_grads(fn, q, k, v)):
        torch.testing.assert_close(a, e)
    assert FORWARD_NAME in _symbol_names(thunder.last_traces(jfn)[-1])


def test_multi_query_broadcast_matches_eager():
    """A single k/v head broadcast over the query heads is claimed, with k/v-shaped gradients."""

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = _make_qkv((2, 4, 8, 8), (2, 1, 8, 8))
    jfn = thunder.jit(fn, executors=_executors())
    for a, e in zip(_forward_and_grads(jfn, q, k, v), _forward_and_grads(fn, q, k, v)):
        torch.testing.assert_close(a, e)
    assert FORWARD_NAME in _symbol_names(thunder.last_traces(jfn)[-1])


# ---------------------------------------------------------------------------------------------
# The executor claims the op and saves no [B, H, T, T] tensor
# ---------------------------------------------------------------------------------------------


def test_claims_op_and_saves_no_attention_matrix():
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    b, h, t, d = 2, 3, 16, 8
    q, k, v = _make_qkv((b, h, t, d), (b, h, t, d))
    jfn = thunder.jit(fn, executors=_executors())
    jfn(q, k, v).sum().backward()

    forward_trace = thunder.last_traces(jfn)[-1]
    backward_trace = thunder.last_backward_traces(jfn)[-1]
    assert FORWARD_NAME in _symbol_names(forward_trace)
    assert "softmax" not in str(forward_trace)
    assert BACKWARD_NAME in _symbol_names(backward_trace)
    assert "softmax" not in str(backward_trace)

    saved = _saved_shapes(jfn)
    assert not _has_attention_matrix(saved, b, h, t, t), saved
    assert (b, h, t) in saved  # logsumexp
    assert saved.count((b, h, t, d)) == 4  # q, k, v, out


def test_default_executors_save_attention_matrix():
    """Control for the test above: without the executor, CPU traces keep the [B, H, T, T] tensor."""

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    b, h, t, d = 2, 3, 16, 8
    q, k, v = _make_qkv((b, h, t, d), (b, h, t, d))
    jfn = thunder.jit(fn)
    jfn(q, k, v).sum().backward()

    assert FORWARD_NAME not in _symbol_names(thunder.last_traces(jfn)[-1])
    assert _has_attention_matrix(_saved_shapes(jfn), b, h, t, t)


# ---------------------------------------------------------------------------------------------
# Declined calls fall back to Thunder's decomposition
# ---------------------------------------------------------------------------------------------

MASKS = {
    "additive_mask": lambda t: torch.randn(t, t, generator=torch.Generator().manual_seed(3)),
    "bool_mask": lambda t: torch.ones(t, t, dtype=torch.bool).tril(),
}


@pytest.mark.parametrize("mask_name", list(MASKS))
def test_declines_attn_mask_and_matches_eager(mask_name):
    b, h, t, d = 1, 2, 8, 8
    mask = MASKS[mask_name](t)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q, k, v = _make_qkv((b, h, t, d), (b, h, t, d))
    jfn = thunder.jit(fn, executors=_executors())
    actual = _forward_and_grads(jfn, q, k, v)
    expected = _forward_and_grads(fn, q, k, v)

    assert not any(n.startswith("remat_sdpa_cpu") for n in _symbol_names(thunder.last_traces(jfn)[-1]))
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)


def test_declines_three_dim_inputs_and_matches_eager():
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = _make_qkv((2, 8, 8), (2, 8, 8))
    jfn = thunder.jit(fn, executors=_executors())
    actual = _forward_and_grads(jfn, q, k, v)
    expected = _forward_and_grads(fn, q, k, v)

    assert FORWARD_NAME not in _symbol_names(thunder.last_traces(jfn)[-1])
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)


def test_declines_dropout():
    """Dropout masks are random, so only the fallback and well-formed gradients are checked."""

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True)

    q, k, v = _make_qkv((1, 2, 8, 8), (1, 2, 8, 8))
    jfn = thunder.jit(fn, executors=_executors())
    out, *grads = _forward_and_grads(jfn, q, k, v)

    assert not any(n.startswith("remat_sdpa_cpu") for n in _symbol_names(thunder.last_traces(jfn)[-1]))
    assert out.shape == q.shape
    for g, x in zip(grads, (q, k, v)):
        assert g.shape == x.shape and torch.isfinite(g).all()


# ---------------------------------------------------------------------------------------------
# Meta device
# ---------------------------------------------------------------------------------------------


def test_meta_device_trace():
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    b, h, t, d = 2, 4, 64, 16
    q, k, v = _make_qkv((b, h, t, d), (b, h, t, d), device="meta")
    jfn = thunder.jit(fn, executors=_executors())
    out = jfn(q, k, v)
    out.sum().backward()

    assert out.device.type == "meta" and out.shape == (b, h, t, d)
    for x in (q, k, v):
        assert x.grad is not None and x.grad.device.type == "meta" and x.grad.shape == x.shape
    assert FORWARD_NAME in _symbol_names(thunder.last_traces(jfn)[-1])
    assert BACKWARD_NAME in _symbol_names(thunder.last_backward_traces(jfn)[-1])
    saved = _saved_shapes(jfn)
    assert not _has_attention_matrix(saved, b, h, t, t), saved


# ---------------------------------------------------------------------------------------------
# litgpt
# ---------------------------------------------------------------------------------------------

LITGPT_CONFIGS = {
    "llama_mha": dict(n_head=4, n_query_groups=4),
    # litgpt 0.5.13 repeat_interleaves k/v up to n_head before SDPA, so SDPA sees equal heads.
    "llama_gqa": dict(n_head=4, n_query_groups=2),
}


@pytest.mark.parametrize("config_name", list(LITGPT_CONFIGS))
def test_litgpt_gradients_match_eager(config_name):
    litgpt = pytest.importorskip("litgpt")
    config = litgpt.Config.from_name(
        "Llama-2-7b-hf",
        n_layer=1,
        n_embd=64,
        intermediate_size=128,
        padded_vocab_size=256,
        block_size=64,
        **LITGPT_CONFIGS[config_name],
    )
    torch.manual_seed(0)
    model = litgpt.GPT(config)
    idx = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(0))
    weights = torch.randn(1, 32, 256, generator=torch.Generator().manual_seed(1))

    def grads_of(module):
        model.zero_grad(set_to_none=True)
        (module(idx) * weights).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    expected = grads_of(model)
    jmodel = thunder.jit(model, executors=_executors())
    actual = grads_of(jmodel)

    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")

    forward_trace = thunder.last_traces(jmodel)[-1]
    assert FORWARD_NAME in _symbol_names(forward_trace)
    assert "softmax" not in str(forward_trace)
    assert BACKWARD_NAME in _symbol_names(thunder.last_backward_traces(jmodel)[-1])
    saved = _saved_shapes(jmodel)
    assert not _has_attention_matrix(saved, 1, config.n_head, 32, 32), saved
