"""Cost tables: written and read back, refused when from another device, version, or corrupt."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from costmodels.devices import CpuCalibration, current_device_name
from costmodels.table import CostTable, CostTableError, TableEntry, library_versions, load_table, save_table

CALIBRATION = CpuCalibration(
    matmul_flops_per_s=(("float32", 5e10), ("bfloat16", 1e11)),
    vector_flops_per_s=5e9,
    transcendentals_per_s=1e9,
    memory_bandwidth_bytes_per_s=2e10,
    cache_bandwidth_bytes_per_s=6e10,
    cache_bytes=1 << 20,
    launch_overhead_s=2e-6,
    view_overhead_s=1e-6,
    threads=torch.get_num_threads(),  # as measured by this process: no thread-count warning
)


def _table(device=None, torch_version=None, thunder_version=None) -> CostTable:
    here_torch, here_thunder = library_versions()
    key = "matmul(float32[32,64], float32[64,48]) -> float32[32,48]"
    return CostTable(
        device=device or current_device_name("cpu"),
        device_kind="cpu",
        torch_version=torch_version or here_torch,
        thunder_version=thunder_version or here_thunder,
        entries={key: TableEntry(key=key, symbol="matmul", time_s=1.25e-5, repeats=20)},
        calibration=CALIBRATION,
        skipped=(("TorchCompile0() -> ", "fusion region"),),
        model="ModelSpec(name='x')",
    )


def test_round_trip(tmp_path):
    table = _table()
    path = save_table(table, tmp_path / "sub" / "cpu.json")
    assert load_table(path) == table


def test_other_device_is_refused_with_the_way_out(tmp_path):
    path = save_table(_table(device="NVIDIA H100 80GB HBM3"), tmp_path / "h100.json")
    with pytest.raises(CostTableError, match="measured on 'NVIDIA H100 80GB HBM3'.*--allow-other-device"):
        load_table(path)


def test_gpu_table_is_refused_on_a_machine_without_that_gpu(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    table = _table(device="NVIDIA H100 80GB HBM3")
    path = save_table(CostTable(**{**_fields(table), "device_kind": "cuda", "calibration": None}), tmp_path / "g.json")
    with pytest.raises(CostTableError, match="this device is 'no CUDA device'"):
        load_table(path)


def _fields(table: CostTable) -> dict:
    return {name: getattr(table, name) for name in table.__slots__}


def test_other_device_accepted_with_a_warning_when_asked(tmp_path):
    path = save_table(_table(device="NVIDIA H100 80GB HBM3"), tmp_path / "h100.json")
    with pytest.warns(UserWarning, match="using it anyway"):
        table = load_table(path, allow_mismatch=True)
    assert table.device == "NVIDIA H100 80GB HBM3"


def test_device_check_can_be_skipped_for_planning_elsewhere(tmp_path):
    path = save_table(_table(device="NVIDIA H100 80GB HBM3"), tmp_path / "h100.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_table(path, device=None).device == "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(
    "field,pattern",
    [("torch_version", "torch 0.0.1 when measured"), ("thunder_version", "lightning-thunder 0.0.2 when measured")],
)
def test_other_versions_are_refused(tmp_path, field, pattern):
    path = save_table(_table(**{field: "0.0.1" if field == "torch_version" else "0.0.2"}), tmp_path / "t.json")
    with pytest.raises(CostTableError, match=pattern):
        load_table(path)


def _write(tmp_path, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    return path


def _valid_json(tmp_path) -> dict:
    return json.loads(save_table(_table(), tmp_path / "ok.json").read_text())


def test_truncated_file_is_refused(tmp_path):
    text = save_table(_table(), tmp_path / "ok.json").read_text()
    with pytest.raises(CostTableError, match=r"not valid JSON \(line \d+, column \d+"):
        load_table(_write(tmp_path, text[: len(text) // 2]))


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(CostTableError, match="cannot read cost table"):
        load_table(tmp_path / "nope.json")


def test_other_json_is_not_a_table(tmp_path):
    with pytest.raises(CostTableError, match="not a remat-opt cost table"):
        load_table(_write(tmp_path, json.dumps({"hello": 1})))


@pytest.mark.parametrize(
    "mutate,pattern",
    [
        (lambda d: d.update(schema_version=99), "schema_version 99 is not supported"),
        (lambda d: d.pop("device"), "field 'device' is missing"),
        (lambda d: d.update(entries={}), "field 'entries' is missing or not a list"),
        (lambda d: d["entries"][0].update(time_s=-1.0), r"entries\[0\] .* time_s=-1.0; times must be finite"),
        (lambda d: d["entries"][0].update(time_s="fast"), "time_s='fast'"),
        (lambda d: d["entries"][0].update(repeats=0), "repeats=0"),
        (lambda d: d["entries"][0].pop("key"), r"entries\[0\] must be an object with string 'key'"),
        (lambda d: d["calibration"].pop("threads"), "malformed calibration"),
    ],
    ids=["schema", "device", "entries", "negative_time", "text_time", "repeats", "key", "calibration"],
)
def test_corrupt_fields_are_refused(tmp_path, mutate, pattern):
    data = _valid_json(tmp_path)
    mutate(data)
    with pytest.raises(CostTableError, match=pattern):
        load_table(_write(tmp_path, json.dumps(data)))


def test_another_thread_count_warns_but_is_the_same_device(tmp_path):
    """The thread count is recorded, not part of the device: a table profiled with --threads 1 is
    used by a process with more threads, with a warning naming both counts."""
    import dataclasses

    table = dataclasses.replace(_table(), calibration=dataclasses.replace(CALIBRATION, threads=CALIBRATION.threads + 3))
    path = save_table(table, tmp_path / "cpu.json")
    with pytest.warns(UserWarning, match=f"measured with {CALIBRATION.threads + 3} CPU threads, this process uses "
                                         f"{CALIBRATION.threads}"):
        assert load_table(path) == table


def _region(symbol: str, member_shape: tuple[int, ...]):
    from costmodels.formulas import OpArgs, TensorMeta

    def meta(shape):
        return TensorMeta(shape=shape, dtype="float32", nbytes=4 * shape[0], storage_bytes=4 * shape[0])

    member = OpArgs(symbol="exp", inputs=(meta(member_shape),), outputs=(meta(member_shape),))
    return OpArgs(symbol=symbol, inputs=(meta((8,)),), outputs=(meta((8,)),), members=(member, member))


def test_a_region_is_keyed_by_its_members_not_its_number():
    from costmodels.table import op_key

    assert op_key(_region("TorchCompile0", (8,))) == op_key(_region("TorchCompile7", (8,)))
    assert op_key(_region("TorchCompile0", (8,))).startswith("TorchCompile[2 ops #")
    assert op_key(_region("TorchCompile0", (8,))) != op_key(_region("TorchCompile0", (16,)))  # other members
    assert op_key(_region("nvFusion0", (8,))) != op_key(_region("TorchCompile0", (8,)))  # another executor
