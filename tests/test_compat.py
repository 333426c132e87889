"""The torch/Thunder compatibility step (remat_opt._compat)."""

import remat_opt  # noqa: F401

import subprocess
import sys

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


def test_thunderfx_step_is_applied_only_where_the_interpreter_lacks_a_keys_view_len():
    import types

    from thunder.core import interpreter
    from thunder.dynamo.compiler import ThunderCompiler

    from remat_opt._compat import THUNDERFX_PATCHED, ensure_thunderfx_recompiles, interpreter_lacks_keys_view_len

    assert THUNDERFX_PATCHED == interpreter_lacks_keys_view_len(interpreter)
    if THUNDERFX_PATCHED:
        assert ThunderCompiler.__call__._remat_opt_recompiles
    assert not ensure_thunderfx_recompiles()  # a second call is a no-op

    class Compiler:
        def __call__(self, gm, sample_args):
            return gm

    fixed = types.SimpleNamespace(MappingKeysView=type("MappingKeysView", (), {"__len__": lambda self: 0}))
    assert not ensure_thunderfx_recompiles(Compiler, fixed)  # Thunder fixed: nothing to do
    assert "_remat_opt_recompiles" not in vars(Compiler.__call__)
    broken = types.SimpleNamespace(MappingKeysView=type("MappingKeysView", (), {}))
    assert ensure_thunderfx_recompiles(Compiler, broken)
    assert Compiler.__call__.__wrapped__ is not None


def test_lazy_graph_modules_are_recompiled_outside_thunders_interpreter():
    from torch.fx._lazy_graph_module import _LazyGraphModule, _use_lazy_graph_module

    from remat_opt._compat import recompile_lazy_graph_modules

    with _use_lazy_graph_module(True):
        gm = _LazyGraphModule(torch.nn.Module(), torch.fx.symbolic_trace(lambda x: x.sin() + 1).graph)
    outer = torch.nn.Sequential(gm)
    assert gm._needs_recompile()
    assert recompile_lazy_graph_modules(outer) == 1
    assert not gm._needs_recompile() and recompile_lazy_graph_modules(outer) == 0
    torch.testing.assert_close(gm(torch.zeros(2)), torch.ones(2))


def test_thunderfx_runs_and_matches_eager():
    """The ThunderFX failure on torch 2.13 (`MappingKeysView has no len()`) is gone."""
    from thunder.dynamo import ThunderCompiler

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8))
    x = torch.randn(2, 8)
    try:
        torch.compile(mlp, backend=ThunderCompiler())(x).sum().backward()
    finally:
        torch._dynamo.reset()
    grads = [p.grad for p in mlp.parameters()]
    mlp.zero_grad(set_to_none=True)
    mlp(x).sum().backward()
    for got, p in zip(grads, mlp.parameters()):
        torch.testing.assert_close(got, p.grad)


def test_wrapping_a_dict_that_shrinks_mid_iteration_is_retried():
    """Step 3 on a real dict that loses an entry during the first iteration (as a weakref callback
    does when a collection runs inside Thunder's item wrapping): the retry wraps what is left."""
    from remat_opt._compat import retry_when_a_dict_shrinks

    items = {i: str(i) for i in range(6)}
    wrapped, calls = {}, []

    def populate(d):  # idempotent, as Thunder's populate_item_wrappers: skips what it wrapped
        calls.append(len(d))
        for k, v in d.items():
            if k not in wrapped:
                wrapped[k] = v
                if len(calls) == 1 and k == 2:
                    del d[5]  # the callback of a freed key

    retry_when_a_dict_shrinks(populate)(items)
    assert calls == [6, 5] and wrapped == {i: str(i) for i in range(5)}

    def always_shrinks(d):
        raise RuntimeError("dictionary changed size during iteration")

    with pytest.raises(RuntimeError, match="changed size"):
        retry_when_a_dict_shrinks(always_shrinks, attempts=3)({})

    def other_error(d):
        calls.append("other")
        raise RuntimeError("something else")

    calls.clear()
    with pytest.raises(RuntimeError, match="something else"):
        retry_when_a_dict_shrinks(other_error)({})
    assert calls == ["other"]  # not retried


def test_item_wrapping_step_is_applied_only_where_thunder_iterates_the_live_dict():
    import types

    from thunder.core import interpreter

    from remat_opt._compat import ITEM_WRAPPING_PATCHED, ensure_item_wrapping_retries

    if ITEM_WRAPPING_PATCHED:
        assert interpreter.populate_item_wrappers._remat_opt_retries
    assert not ensure_item_wrapping_retries()  # a second call is a no-op

    def live(obj):
        for k, v in obj.value.items():
            pass

    def snapshot(obj):
        for k, v in list(obj.value.items()):
            pass

    fixed = types.SimpleNamespace(populate_item_wrappers=snapshot)
    assert not ensure_item_wrapping_retries(fixed) and fixed.populate_item_wrappers is snapshot
    broken = types.SimpleNamespace(populate_item_wrappers=live)
    assert ensure_item_wrapping_retries(broken) and broken.populate_item_wrappers.__wrapped__ is live


def _fresh_interpreter(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_import_remat_opt_then_thunder_works_in_a_fresh_interpreter():
    # the natural order: `import remat_opt` installs the step before `import thunder` runs
    result = _fresh_interpreter(
        "import sys, remat_opt; assert 'torch' not in sys.modules, 'import remat_opt imported torch'\n"
        "import thunder, torch\n"
        "print(thunder.jit(lambda x: x * 2)(torch.ones(2)).tolist())"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("[2.0, 2.0]")


def test_the_import_hook_steps_aside_once_thunder_is_imported():
    from remat_opt import _thunder_import

    import thunder  # noqa: F401

    assert not _thunder_import.install()  # Thunder is imported: nothing to do
    assert not any(isinstance(f, _thunder_import.ThunderImportHook) for f in sys.meta_path)


def test_thunders_unrelated_import_warning_is_silenced_where_remat_opt_imports_it():
    # transformer_engine is an optional GPU executor of Thunder's: its absence is not the user's concern
    result = _fresh_interpreter("from remat_opt import CostRemat; import thunder; print(thunder.jit is not None)")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "transformer_engine" not in result.stderr, result.stderr[-2000:]
