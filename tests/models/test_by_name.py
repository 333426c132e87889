"""Models by name: options checked where they are given, before any tracing."""

from __future__ import annotations

import pytest

import remat_opt
from remat_opt.models.by_name import ModelSpecError


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seq": "32"}, "seq must be a positive integer, got '32'"),
        ({"seq": 0}, "seq must be a positive integer, got 0"),
        ({"seq": 32, "batch": 1.5}, "batch must be a positive integer, got 1.5"),
        ({"seq": 32, "n_layer": True}, "n_layer must be a positive integer, got True"),
        ({"seq": 32, "dtype": "fp8"}, "unknown dtype 'fp8'"),
        ({"seq": 32, "traced_layers": "4"}, "traced_layers must be 0 (all) or at least 3, got '4'"),
    ],
    ids=["seq-string", "seq-zero", "batch-float", "n_layer-bool", "dtype", "traced-layers-string"],
)
def test_analyze_model_refuses_bad_sizes_in_one_line(kwargs, message):
    with pytest.raises(ValueError) as raised:
        remat_opt.analyze_model("Llama-2-7b-hf", tiny=True, **kwargs)
    assert message in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("executors", ["bogus", "nvfuser_standin", ["fused-sdpa"], []])
def test_analyze_model_refuses_an_unknown_executor_choice(executors):
    with pytest.raises(ValueError, match="executors .*(use )?one of fused-sdpa, default, torch-compile, nvfuser-standin"):
        remat_opt.analyze_model("Llama-2-7b-hf", seq=32, tiny=True, executors=executors)


@pytest.mark.slow  # two traces
def test_analyze_model_takes_executors_by_name_or_as_thunder_executors():
    # the same list `remat_opt.analyze` and `thunder.jit` take gives the graph of its name
    import thunder

    by_name = remat_opt.analyze_model("Llama-2-7b-hf", seq=32, n_layer=1, tiny=True, dtype="float32",
                                      executors="fused-sdpa")
    by_object = remat_opt.analyze_model("Llama-2-7b-hf", seq=32, n_layer=1, tiny=True, dtype="float32",
                                        executors=[remat_opt.sdpa_cpu_ex, *thunder.get_default_executors()])
    assert by_object.saved_activation_bytes == by_name.saved_activation_bytes > 0
    assert [op.symbol for op in by_object.ops] == [op.symbol for op in by_name.ops]


def test_a_model_spec_error_is_a_value_error():
    assert issubclass(ModelSpecError, ValueError)
