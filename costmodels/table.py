"""Measured cost tables: JSON files of per-op times on one device, checked when loaded.

A table records the device it was measured on, the torch and Thunder versions, the CPU calibration
(on a CPU), and one entry per distinct op (symbol, input shapes and dtypes, attributes, output
shapes) with its median time. `load_table` refuses a table measured on another device or with other
versions, or one that is not a valid table, with a message saying what differs and what to do;
``allow_mismatch=True`` accepts another device's or version's table with a warning.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from costmodels.devices import CpuCalibration, current_device_name
from costmodels.formulas import FUSION_PATTERN, OpArgs, TensorMeta

SCHEMA = "remat-opt-cost-table"
SCHEMA_VERSION = 1


class CostTableError(ValueError):
    """A cost table cannot be used: corrupt, or measured on another device or with other versions."""


@dataclass(frozen=True, slots=True)
class TableEntry:
    """One measured op.

    Attributes:
        key: `op_key` of the op.
        symbol: Thunder symbol name.
        time_s: median time in seconds.
        repeats: timed repetitions behind the median.
        note: how the op was executed when not exactly (see `costmodels.runners.approximation`).
    """

    key: str
    symbol: str
    time_s: float
    repeats: int
    note: str = ""


@dataclass(frozen=True, slots=True)
class CostTable:
    """Per-op times measured on one device.

    Attributes:
        device: device name (``torch.cuda.get_device_name()``, or the CPU model and thread count).
        device_kind: ``"cpu"`` or ``"cuda"``.
        torch_version: ``torch.__version__`` when measured.
        thunder_version: lightning-thunder's version when measured.
        entries: `op_key` -> `TableEntry`.
        calibration: the CPU calibration (None on a GPU).
        skipped: ``(op_key, reason)`` for ops that were not timed (fusion regions, no runner).
        model: what was profiled (free text, e.g. the `ModelSpec`).
    """

    device: str
    device_kind: str
    torch_version: str
    thunder_version: str
    entries: dict[str, TableEntry] = field(default_factory=dict)
    calibration: CpuCalibration | None = None
    skipped: tuple[tuple[str, str], ...] = ()
    model: str = ""

    def lookup(self, key: str) -> TableEntry | None:
        return self.entries.get(key)


def _tensor_text(t: TensorMeta) -> str:
    return f"{t.dtype}[{','.join(str(s) for s in t.shape)}]"


def op_key(args: OpArgs) -> str:
    """Key of an op in a cost table: symbol, input and output shapes and dtypes, attributes.

    Example: ``"matmul(float32[1,4,32,16], float32[1,4,16,32]) -> float32[1,4,32,32]"``. A fusion
    region is keyed by its signature instead of its name (`region_signature`): ``TorchCompile3`` of
    one run is ``TorchCompile0`` of another.
    """
    inputs = ", ".join(_tensor_text(t) for t in args.inputs)
    attrs = "".join(f"; {k}={v!r}" for k, v in args.attrs)
    outputs = ", ".join(_tensor_text(t) for t in args.outputs)
    symbol = region_signature(args) if FUSION_PATTERN.match(args.symbol) else args.symbol
    return f"{symbol}({inputs}{attrs}) -> {outputs}"


def region_signature(args: OpArgs) -> str:
    """A fusion region's name in a table key: its executor's family and a digest of its member ops
    (each one's `op_key`, in order), e.g. ``"TorchCompile[12 ops #3f9a0c1b2d4e]"``; with the
    region's own input and output shapes around it (`op_key`) it names the same computation in
    any run and any model."""
    family = FUSION_PATTERN.match(args.symbol).group(1)
    digest = hashlib.sha256("\n".join(op_key(m) for m in args.members).encode()).hexdigest()[:12]
    return f"{family}[{len(args.members)} ops #{digest}]"


def library_versions() -> tuple[str, str]:
    """``(torch version, lightning-thunder version)`` of this environment."""
    import torch

    try:
        thunder_version = metadata.version("lightning-thunder")
    except metadata.PackageNotFoundError:
        thunder_version = "not installed"
    return torch.__version__, thunder_version


def save_table(table: CostTable, path: str | Path) -> Path:
    """Writes `table` as JSON (creating parent folders) and returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "device": table.device,
        "device_kind": table.device_kind,
        "torch_version": table.torch_version,
        "thunder_version": table.thunder_version,
        "model": table.model,
        "calibration": table.calibration.to_json() if table.calibration else None,
        "entries": [
            {"key": e.key, "symbol": e.symbol, "time_s": e.time_s, "repeats": e.repeats, "note": e.note}
            for e in table.entries.values()
        ],
        "skipped": [{"key": k, "reason": r} for k, r in table.skipped],
    }
    path.write_text(json.dumps(data, indent=1))
    return path


def load_table(path: str | Path, *, device: str | None = "auto", allow_mismatch: bool = False) -> CostTable:
    """Reads a cost table and checks it belongs to this device and these library versions.

    Args:
        path: the JSON file written by `save_table` (``remat-opt profile``).
        device: the device the table will be used for (``"cpu"``, ``"cuda:1"``); ``"auto"``: this
            machine's device of the table's kind (its CPU, or the current CUDA device); None skips the
            device check (e.g. planning for another machine on purpose).
        allow_mismatch: accept a table from another device or versions, with a warning.

    Raises:
        CostTableError: the file is missing, not a cost table, corrupt, or (without
            `allow_mismatch`) measured on another device or with other torch/Thunder versions.
    """
    path = Path(path)
    table = parse_table(_read_json(path), source=str(path))
    _warn_other_threads(table, path)
    problems = mismatches(table, device)
    if problems:
        message = f"cost table {path} does not match this machine: {'; '.join(problems)}"
        if not allow_mismatch:
            raise CostTableError(
                f"{message}. Profile this machine with `remat-opt profile MODEL ...`, or accept the table "
                "anyway with allow_mismatch=True (the CLI's --allow-other-device)"
            )
        warnings.warn(f"{message}; using it anyway (allow_mismatch=True)", stacklevel=2)
    return table


def _warn_other_threads(table: CostTable, path: Path) -> None:
    """CPU times depend on the thread count: a table measured with another count is used, with a warning."""
    import torch

    if table.calibration is not None and table.calibration.threads != torch.get_num_threads():
        warnings.warn(
            f"cost table {path} was measured with {table.calibration.threads} CPU threads, this process uses "
            f"{torch.get_num_threads()}: its times may be off by the difference (profile again with "
            f"--threads {torch.get_num_threads()}, or call torch.set_num_threads({table.calibration.threads}))",
            stacklevel=3,
        )


def mismatches(table: CostTable, device: str | None) -> list[str]:
    """What differs between `table` and this environment (empty when it matches)."""
    torch_version, thunder_version = library_versions()
    problems = []
    if device == "auto":
        device = table.device_kind
    if device is not None:
        here = _device_name_here(device)
        if table.device != here:
            problems.append(f"measured on {table.device!r}, this device is {here!r}")
    if table.torch_version != torch_version:
        problems.append(f"torch {table.torch_version} when measured, {torch_version} here")
    if table.thunder_version != thunder_version:
        problems.append(f"lightning-thunder {table.thunder_version} when measured, {thunder_version} here")
    return problems


def _device_name_here(device: str) -> str:
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        return "no CUDA device"
    return current_device_name(device)


def _read_json(path: Path) -> dict:
    try:
        text = path.read_text()
    except OSError as e:
        raise CostTableError(f"cannot read cost table {path}: {e.strerror or e}") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CostTableError(
            f"cost table {path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
            "re-create it with `remat-opt profile`"
        ) from e
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise CostTableError(f'{path} is not a remat-opt cost table (no "schema": {SCHEMA!r} field)')
    return data


def parse_table(data: dict, *, source: str = "<table>") -> CostTable:
    """Builds a `CostTable` from parsed JSON, checking every field.

    Raises:
        CostTableError: a field is missing, has the wrong type, or a time is not a positive number.
    """
    if data.get("schema_version") != SCHEMA_VERSION:
        raise CostTableError(
            f"{source}: schema_version {data.get('schema_version')!r} is not supported (this remat-opt "
            f"reads {SCHEMA_VERSION}); re-create the table with `remat-opt profile`"
        )
    for name in ("device", "device_kind", "torch_version", "thunder_version"):
        if not isinstance(data.get(name), str):
            raise CostTableError(f"{source}: field {name!r} is missing or not a string (got {data.get(name)!r})")
    if not isinstance(data.get("entries"), list):
        raise CostTableError(f"{source}: field 'entries' is missing or not a list")
    entries = {}
    for i, raw in enumerate(data["entries"]):
        entry = _parse_entry(raw, f"{source}: entries[{i}]")
        entries[entry.key] = entry
    try:
        calibration = CpuCalibration.from_json(data["calibration"]) if data.get("calibration") else None
        skipped = tuple((str(s["key"]), str(s["reason"])) for s in data.get("skipped", []))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CostTableError(f"{source}: malformed calibration or skipped list ({type(e).__name__}: {e})") from e
    return CostTable(
        device=data["device"],
        device_kind=data["device_kind"],
        torch_version=data["torch_version"],
        thunder_version=data["thunder_version"],
        entries=entries,
        calibration=calibration,
        skipped=skipped,
        model=str(data.get("model", "")),
    )


def _parse_entry(raw, where: str) -> TableEntry:
    if not isinstance(raw, dict) or not isinstance(raw.get("key"), str) or not isinstance(raw.get("symbol"), str):
        raise CostTableError(f"{where} must be an object with string 'key' and 'symbol', got {raw!r:.200}")
    time_s = raw.get("time_s")
    if isinstance(time_s, bool) or not isinstance(time_s, (int, float)) or not math.isfinite(time_s) or time_s <= 0:
        raise CostTableError(f"{where} ({raw['key']!r}) has time_s={time_s!r}; times must be finite numbers > 0")
    repeats = raw.get("repeats", 1)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise CostTableError(f"{where} ({raw['key']!r}) has repeats={repeats!r}; must be an integer >= 1")
    note = str(raw.get("note", ""))
    return TableEntry(key=raw["key"], symbol=raw["symbol"], time_s=float(time_s), repeats=repeats, note=note)
