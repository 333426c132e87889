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

    by_name = remat_opt.analyze_model("Llama-2-7b-hf", seq=32, n_layer=1, tiny=True,
                                      executors="fused-sdpa")
    by_object = remat_opt.analyze_model("Llama-2-7b-hf", seq=32, n_layer=1, tiny=True,
                                        executors=[remat_opt.sdpa_cpu_ex, *thunder.get_default_executors()])
    assert by_object.saved_activation_bytes == by_name.saved_activation_bytes > 0
    assert [op.symbol for op in by_object.ops] == [op.symbol for op in by_name.ops]


def test_a_model_spec_error_is_a_value_error():
    assert issubclass(ModelSpecError, ValueError)


def test_one_default_dtype_for_every_entry_point():
    """`analyze_model`, the CLI and `ModelSpec` build bfloat16 models on meta and CUDA (what GPU
    training runs), float32 on the CPU; an explicit dtype wins."""
    from remat_opt.cli.main import build_parser, model_spec
    from remat_opt.models.by_name import ModelSpec, default_dtype

    assert ModelSpec("Llama-2-7b-hf").dtype == default_dtype("meta") == default_dtype("cuda:1") == "bfloat16"
    assert ModelSpec("Llama-2-7b-hf", device="cpu").dtype == default_dtype("cpu") == "float32"
    assert ModelSpec("Llama-2-7b-hf", device="cpu", dtype="bfloat16").dtype == "bfloat16"
    for device, expected in [("meta", "bfloat16"), ("cpu", "float32")]:
        args = build_parser().parse_args(["plan", "Llama-2-7b-hf", "--tiny", "--device", device])
        assert model_spec(args).dtype == expected


@pytest.mark.slow  # two traces on meta (in the run's graph cache: test_deepen and test_deepen_parallel trace them)
def test_analyze_model_passes_the_data_parallel_options_to_the_graph():
    """`strategy`, `world_size` and `collectives_in_flight` reach the graph, as the CLI's flags do:
    one rank's FSDP graph gathers its weights, in Thunder's order all before the first computation,
    and with one collective in flight only the first (`tests/distributed/test_data_parallel.py` counts
    those in flight)."""
    # the graphs of the CLI's tests (`tests/cli`: ``--tiny --n-layer 1 --device meta``, the nvFuser
    # stand-in, bfloat16): within one run they are traced once and shared through the graph cache
    common = dict(seq=32, n_layer=1, tiny=True)
    single = remat_opt.analyze_model("Llama-2-7b-hf", **common)
    fsdp = remat_opt.analyze_model("Llama-2-7b-hf", strategy="fsdp", world_size=2, **common)
    in_flight = remat_opt.analyze_model("Llama-2-7b-hf", strategy="fsdp", world_size=2, collectives_in_flight=1,
                                        **common)

    def gathers_before_compute(graph) -> tuple[int, int]:
        gathers = [op for op in graph.forward_ops if "all_gather" in op.symbol]
        first_compute = next(op.index for op in graph.forward_ops if "collective" not in op.op_tags)
        return len(gathers), sum(op.index < first_compute for op in gathers)

    assert not [op for op in single.ops if "all_gather" in op.symbol]
    count, early = gathers_before_compute(fsdp)
    assert count > 2 and early == count  # Thunder's order: every all-gather issued first
    assert gathers_before_compute(in_flight) == (count, 1)  # the others are issued as the forward goes


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"strategy": "fsdp"}, "world_size and strategy go together"),
        ({"world_size": 2}, "world_size and strategy go together"),
        ({"strategy": "ddp", "world_size": 2, "collectives_in_flight": 1}, "collectives_in_flight goes with strategy fsdp"),
        ({"strategy": "zero", "world_size": 2}, "unknown data-parallel strategy 'zero'"),
    ],
    ids=["strategy-alone", "world-size-alone", "in-flight-with-ddp", "unknown-strategy"],
)
def test_analyze_model_refuses_incomplete_data_parallel_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        remat_opt.analyze_model("Llama-2-7b-hf", seq=32, tiny=True, **kwargs)
