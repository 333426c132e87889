"""The torch/Thunder compatibility step (remat_opt._compat)."""

import remat_opt  # noqa: F401

import pytest
import torch

from remat_opt._compat import NAMED_TENSOR_METHODS, ensure_thunder_importable


def test_thunder_imports_after_remat_opt():
    import thunder

    assert thunder.jit is not None


def test_placeholders_are_added_only_where_missing():
    class WithRename:
        def rename(self):
            return "torch's own"

    added = ensure_thunder_importable(WithRename)
    assert added == [m for m in NAMED_TENSOR_METHODS if m != "rename"]
    assert WithRename().rename() == "torch's own"
    assert ensure_thunder_importable(WithRename) == []  # a second call is a no-op


def test_placeholder_raises_a_clear_error():
    class Bare:
        pass

    ensure_thunder_importable(Bare)
    with pytest.raises(NotImplementedError, match="named tensors"):
        Bare().align_to("N")


def test_every_named_tensor_method_exists_on_torch_tensor():
    assert all(hasattr(torch.Tensor, name) for name in NAMED_TENSOR_METHODS)
