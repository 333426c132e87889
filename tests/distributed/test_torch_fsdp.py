"""`remat_opt.analysis.torch_fsdp` against torch's FSDP1 on 2 gloo ranks: the iteration Thunder's
``benchmark_litgpt.py`` runs under ``--compile thunder-dynamo --checkpoint_activations=True
--distributed_mode=fsdp --shard_mode zero3`` (`tests/distributed/fsdp1_runs.py`), measured with the
CPU profiler, predicted from one block traced through ThunderFX and the FSDP1 event walk."""

from __future__ import annotations

import pytest

from remat_opt.analysis.torch_fsdp import (BlockActivations, Fsdp1Units, HeadShapes, flat_param_numel,
                                           predict_fsdp1_iteration)

pytestmark = pytest.mark.slow
# Two spawned ranks compile two tiny models with ThunderFX (about a minute), and the predictions trace
# their blocks: out of the README's test command; `benchmarks/thunder_1370.py --cpu-check` runs the same.
EXTENDED = pytest.mark.extended



@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    from fsdp1_runs import CONFIGS, spawn

    ranks = spawn(list(CONFIGS), str(tmp_path_factory.mktemp("fsdp1")))
    errors = [r["error"] for results in ranks for r in results if "error" in r]
    assert not errors, errors[0]
    return {r["config"]: r for r in ranks[0]}, ranks


@pytest.fixture(scope="module")
def predicted():
    from fsdp1_runs import CONFIGS, WORLD_SIZE, litgpt_config

    from remat_opt.analysis.thunder_1370 import case_of_config

    cases = {name: case_of_config(litgpt_config(name), seq=c["seq"], world_size=WORLD_SIZE, dtype="float32",
                                  device="cpu") for name, c in CONFIGS.items()}
    return {name: (case, case.predict(case.checkpoint())) for name, case in cases.items()}


@EXTENDED
@pytest.mark.parametrize("name", ["root", "blocks"])
def test_the_iterations_peak_is_predicted_from_fsdp1s_events(measured, predicted, name):
    by_config, _ = measured
    case, prediction = predicted[name]
    allocated_during = prediction.allocated_during_bytes  # the profiler counts what the iteration allocates
    got = by_config[name]["peak_delta_bytes"]
    assert abs(got - allocated_during) <= 0.005 * got, (name, got, allocated_during, prediction.peak_event,
                                                       prediction.terms)


@EXTENDED
def test_the_configs_put_the_peak_where_they_mean_to(predicted):
    assert predicted["root"][1].peak_event == "embedding backward: root flat gradient"
    assert predicted["blocks"][1].peak_event.startswith("backward of block")


@EXTENDED
def test_both_ranks_measure_the_same_peak(measured):
    _, ranks = measured
    assert [r["peak_delta_bytes"] for r in ranks[0]] == [r["peak_delta_bytes"] for r in ranks[1]]


@EXTENDED
def test_flat_parameter_sizes_are_fsdp1s(measured, predicted):
    by_config, _ = measured
    for name, (case, _) in predicted.items():
        units = case.units
        expected = sorted({flat_param_numel(units.block_numels, units.itemsize, units.world_size),
                           flat_param_numel(tuple(units.root_numels.values()), units.itemsize, units.world_size)})
        assert by_config[name]["unit_numels"] == expected, name


# --- the event walk on hand-made terms (no ranks) --------------------------------------------


def test_flat_parameter_padding():
    assert flat_param_numel((3, 5), itemsize=4, world_size=2) == 3 + 1 + 5 + 1  # 16-byte starts, then even
    assert flat_param_numel((8, 8), itemsize=2, world_size=8) == 16
    assert flat_param_numel((7,), itemsize=1, world_size=4) == 8


def _units(n_blocks=4, world_size=2) -> Fsdp1Units:
    return Fsdp1Units(block_numels=(1000,), root_numels={"lm_head": 4000, "ln_f": 8, "wte": 4000},
                      n_blocks=n_blocks, dtype="float32", world_size=world_size)


def test_the_roots_flat_gradient_event_holds_its_parameters_gradients_and_their_concatenation():
    block = BlockActivations(forward_bytes=3000, carried_bytes=400, backward_bytes=5000, end_bytes=4400,
                             input_bytes=400)
    prediction = predict_fsdp1_iteration(_units(), block, HeadShapes(400, 16000), granularity_bytes=1)
    assert prediction.peak_bytes == max(prediction.event_bytes.values()) == sum(prediction.terms.values())
    # fp32; a block: 1000 elements (4,000 B, 2,000 B a shard); the root: 4000 + 8 + 4000 elements
    # (32,032 B, 16,016 B a shard); the moments cover the shards' real elements (500 + 4004 per rank)
    assert prediction.peak_event == "embedding backward: root flat gradient"
    assert prediction.terms == {
        "parameter shards": 4 * 2000 + 16016, "AdamW moments": 2 * (4 * 500 + 4004) * 4, "logits": 16000,
        "root parameters": 32032, "root gradients waiting": 16000 + 32 + 16000, "gradient shards": 4 * 2000,
        "flat gradient": 32032}


def test_saving_more_in_a_block_raises_every_later_event_by_its_carried_bytes():
    light = BlockActivations(3000, 400, 5000, 4400, 400)
    heavy = BlockActivations(3000, 2400, 5000, 4400, 400)
    units = _units()
    base = predict_fsdp1_iteration(units, [light] * 4, HeadShapes(400, 16000), granularity_bytes=1).event_bytes
    more = predict_fsdp1_iteration(units, [heavy, light, light, light], HeadShapes(400, 16000),
                                   granularity_bytes=1).event_bytes
    diffs = {label: more[label] - base[label] for label in base}
    assert diffs["forward of block 0"] == 0  # block 0's forward makes what it carries (in forward_bytes)
    assert all(diffs[f"forward of block {k}"] == 2000 for k in (1, 2, 3))
    assert all(diffs[f"backward of block {k}"] == 2000 for k in (1, 2, 3))
    assert diffs["backward of block 0"] == 0 and diffs["optimizer step"] == 0


def test_a_wrong_number_of_block_plans_is_refused():
    with pytest.raises(ValueError, match="3 block plans for 4 blocks"):
        predict_fsdp1_iteration(_units(), [BlockActivations(1, 1, 1, 1)] * 3, HeadShapes(4, 4))


# --- CostRemat's options in that iteration (the tiny "blocks" config, no ranks) ---------------


@EXTENDED
def test_block_menu_and_assignments_price_every_plan_and_pick_the_fastest_that_fits(predicted):
    from remat_opt.analysis.thunder_1370 import assignments, block_menu, fastest_under

    case, _ = predicted["blocks"]
    menu = block_menu(case, n_points=3, time_limit_s=5.0)
    times = [p.recompute_time_s for p in menu]
    assert times == sorted(times, reverse=True) and times[-1] == 0.0  # slowest first, save-all last
    assert menu[-1].activations.carried_bytes > menu[0].activations.carried_bytes
    tagged = [p for p in menu if p.tag_targets != ("*",)]
    uniform = assignments(case, tagged, uniform_only=True)
    mixed = assignments(case, tagged)
    assert len(uniform) == len(tagged) and len(mixed) > len(uniform)
    for a in mixed:  # each assignment's time is its blocks' recompute, its peak the walk's
        n = case.units.n_blocks
        assert a.recompute_time_s == pytest.approx((n - a.n_last) * a.first.recompute_time_s
                                                   + a.n_last * a.last.recompute_time_s)
    least = min(a.prediction.peak_bytes for a in mixed)
    assert fastest_under(mixed, least - 1) is None
    budgets = sorted({a.prediction.peak_bytes for a in mixed})
    chosen = [fastest_under(mixed, b) for b in budgets]
    assert all(c.prediction.peak_bytes <= b for c, b in zip(chosen, budgets))
    assert [c.recompute_time_s for c in chosen] == sorted((c.recompute_time_s for c in chosen), reverse=True)
    # save-all on every block fits only the largest budget, and costs nothing
    assert chosen[-1].recompute_time_s == 0.0


# --- the micro-step on two streams (no ranks) -------------------------------------------------


def _times(**kw):
    from remat_opt.analysis.torch_fsdp import Fsdp1StepTimes

    fields = dict(block_forward_s=1.0, block_backward_s=2.0, head_s=0.5, block_all_gather_s=0.0,
                  block_reduce_scatter_s=0.0, root_all_gather_s=0.0, root_reduce_scatter_s=0.0)
    return Fsdp1StepTimes(**{**fields, **kw})


def test_without_collectives_a_micro_step_is_its_compute():
    from remat_opt.analysis.torch_fsdp import fsdp1_micro_step_time

    step = fsdp1_micro_step_time(4, _times())
    assert step.time_s == step.compute_s == 4 * (1.0 + 2.0) + 0.5 and step.exposed_communication_s == 0


def test_collectives_shorter_than_a_block_hide_behind_compute_but_the_first_and_last():
    from remat_opt.analysis.torch_fsdp import fsdp1_micro_step_time

    step = fsdp1_micro_step_time(4, _times(block_all_gather_s=0.25, block_reduce_scatter_s=0.25,
                                           root_all_gather_s=0.25, root_reduce_scatter_s=0.25))
    # exposed: the root's and the first block's all-gathers before the forward, the last block's
    # before the backward, and the last two reduce-scatters after it
    assert step.communication_s == pytest.approx(4 * 0.25 + 4 * 0.5 + 0.5)
    assert step.exposed_communication_s == pytest.approx(0.25 + 0.25 + 0.25 + 0.25 + 0.25)


def test_collectives_longer_than_compute_set_the_pace():
    from remat_opt.analysis.torch_fsdp import fsdp1_micro_step_time

    step = fsdp1_micro_step_time(8, _times(block_all_gather_s=10.0, block_reduce_scatter_s=10.0))
    # one stream of collectives: 8 forward and 8 backward all-gathers, 8 reduce-scatters, in turn
    assert step.communication_s == pytest.approx(240.0)
    assert step.communication_s <= step.time_s <= step.communication_s + step.compute_s
