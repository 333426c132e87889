"""The torch/Thunder compatibility step (remat_opt._compat)."""

import remat_opt  # noqa: F401

import pytest
import torch

from remat_opt._compat import ADDED_METHODS, NAMED_TENSOR_METHODS, ensure_thunder_importable


def test_thunder_jit_runs_and_matches_eager():
    import thunder

    def fn(x, w):
        return torch.tanh(x @ w).sum(-1) * x[:, 0]

    torch.manual_seed(0)
    x, w = torch.randn(4, 8), torch.randn(8, 3, requires_grad=True)
    jitted = thunder.jit(fn)
    out = jitted(x, w)
    torch.testing.assert_close(out, fn(x, w))
    (grad,) = torch.autograd.grad(out.sum(), w)
    (expected,) = torch.autograd.grad(fn(x, w).sum(), w)
    torch.testing.assert_close(grad, expected)
    assert thunder.last_traces(jitted)  # Thunder traced it (not an eager fallback)


@pytest.mark.parametrize("name", NAMED_TENSOR_METHODS)
def test_each_placeholder_raises_a_clear_error_when_called(name):
    if name not in ADDED_METHODS:
        pytest.skip(f"this torch has its own Tensor.{name}")
    method = getattr(torch.ones(2), name)
    with pytest.raises(NotImplementedError, match=rf"torch\.Tensor\.{name} \(named tensors\) was removed"):
        method("N")
    with pytest.raises(NotImplementedError, match="only so that lightning-thunder can be imported"):
        method()


def test_placeholders_are_added_only_where_missing():
    class WithRename:
        def rename(self):
            return "torch's own"

    added = ensure_thunder_importable(WithRename)
    assert added == [m for m in NAMED_TENSOR_METHODS if m != "rename"]
    assert WithRename().rename() == "torch's own"
    with pytest.raises(NotImplementedError, match="named tensors"):
        WithRename().align_to("N")
    assert ensure_thunder_importable(WithRename) == []  # a second call is a no-op


def test_nothing_changes_where_every_method_exists():
    def own(self, *args):
        return "own"

    WithAll = type("WithAll", (), dict.fromkeys(NAMED_TENSOR_METHODS, own))
    before = dict(vars(WithAll))
    assert ensure_thunder_importable(WithAll) == []
    assert dict(vars(WithAll)) == before
    assert all(getattr(WithAll(), name)("N") == "own" for name in NAMED_TENSOR_METHODS)
    # torch.Tensor itself, already patched at import: a second step adds nothing and replaces nothing.
    methods = {name: getattr(torch.Tensor, name) for name in NAMED_TENSOR_METHODS}
    assert ensure_thunder_importable() == []
    assert {name: getattr(torch.Tensor, name) for name in NAMED_TENSOR_METHODS} == methods
