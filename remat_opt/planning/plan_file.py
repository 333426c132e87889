"""A plan written to a file (by `remat-opt fit --out`) and checked against a compilation before use.

`CostRemat(plan="fit.json")` applies the file's tags instead of solving, when the compilation is
the one the plan was made for; otherwise it refuses with one line saying what differs. "The one"
means: the same library versions (Thunder, torch, remat-opt), the same executors (the nvFuser
stand-in of an offline plan counts as nvFuser), the same world size, the same input shapes and
dtypes (the token batch, each parameter or its shard), and every tag target present with the op it
was planned on. Pure data and JSON: no Thunder.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from remat_opt.core.graph import JointGraph

FORMAT = "remat-opt plan 1"
# offline graphs on meta use the nvFuser stand-in, which makes nvFuser's regions without nvFuser
EXECUTOR_ALIASES = {"nvfuser_standin": "nvfuser"}
LIBRARIES = ("lightning-thunder", "torch", "remat-opt")


class PlanFileError(ValueError):
    """A plan file that cannot be used: unreadable, of another format, or made for another compilation."""


def library_versions() -> dict[str, str]:
    """The installed versions of the libraries a plan depends on (``"absent"`` when not installed)."""
    found = {}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "absent"
    return found


def executor_family(names) -> tuple[str, ...]:
    """Executor names as a plan compares them (the stand-in as nvFuser)."""
    return tuple(EXECUTOR_ALIASES.get(n, n) for n in names)


def input_signature(graph: JointGraph) -> list[list]:
    """Each graph input's ``[shape, dtype]``, sorted (names differ between traces; shapes do not)."""
    return sorted([list(graph.tensors[n].shape), graph.tensors[n].dtype] for n in graph.input_names)


def world_size_of(graph: JointGraph) -> int:
    """The ranks the graph's collectives span (1 without collectives)."""
    from costmodels.formulas import WORLD_SIZE_ATTR

    sizes = {int(dict(op.attrs)[WORLD_SIZE_ATTR]) for op in graph.ops if WORLD_SIZE_ATTR in dict(op.attrs)}
    return max(sizes, default=1)


def tag_target_symbols(graph: JointGraph) -> dict[str, str]:
    """Tag target -> the pre-autodiff symbol that produces it, for every tag target of the graph."""
    return {o.tag_target: o.origin_symbol or "" for o in graph.origins.values() if o.tag_target is not None}


@dataclass(frozen=True)
class PlanFile:
    """What `remat-opt fit --out` writes and `CostRemat(plan=...)` reads.

    Attributes:
        tag_targets: ``{tag target: producing symbol}`` the plan tags for recomputation.
        executors: executor names of the planned graph (`executor_family`).
        world_size: ranks (1: one process).
        collectives_in_flight: FSDP's collectives in flight the plan was made for (None: Thunder's order).
        inputs: `input_signature` of the planned graph.
        versions: `library_versions` where it was planned.
        description: what was planned (model, configuration, predictions): for people, not checked.
        format: `FORMAT`.
    """

    tag_targets: dict[str, str]
    executors: tuple[str, ...]
    world_size: int
    collectives_in_flight: int | None
    inputs: list[list]
    versions: dict[str, str] = field(default_factory=library_versions)
    description: dict = field(default_factory=dict)
    format: str = FORMAT

    @classmethod
    def of(cls, graph: JointGraph, tag_targets, *, collectives_in_flight: int | None = None,
           description: dict | None = None) -> PlanFile:
        """The plan file of `tag_targets` on `graph`."""
        symbols = tag_target_symbols(graph)
        missing = [t for t in tag_targets if t not in symbols]
        if missing:
            raise ValueError(f"tag targets not in the graph: {missing[:3]}")
        return cls({t: symbols[t] for t in tag_targets}, executor_family(graph.executors), world_size_of(graph),
                   collectives_in_flight, input_signature(graph), description=description or {})

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        data = asdict(self)
        data["executors"] = list(self.executors)
        path.write_text(json.dumps(data, indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> PlanFile:
        """Reads a plan file.

        Raises:
            PlanFileError: no such file, not JSON, or not a plan file of this format (one line each).
        """
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise PlanFileError(f"plan file {str(path)!r} does not exist; write one with `remat-opt fit ... --out "
                                f"{path.name}`") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise PlanFileError(f"plan file {str(path)!r} is not readable JSON ({type(e).__name__}: "
                                f"{str(e).splitlines()[0]})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise PlanFileError(f"{str(path)!r} is not a remat-opt plan file (format {found!r}, expected {FORMAT!r})")
        try:
            return cls(tag_targets=dict(data["tag_targets"]), executors=tuple(data["executors"]),
                       world_size=int(data["world_size"]), collectives_in_flight=data["collectives_in_flight"],
                       inputs=[list(x) for x in data["inputs"]], versions=dict(data["versions"]),
                       description=dict(data.get("description", {})))
        except (KeyError, TypeError, ValueError) as e:
            raise PlanFileError(f"plan file {str(path)!r} lacks or mangles {e}") from None

    def mismatch(self, graph: JointGraph, versions: dict[str, str] | None = None) -> str | None:
        """What differs between the compilation of `graph` and the one planned, in one line (None: nothing)."""
        versions = library_versions() if versions is None else versions
        for name in LIBRARIES:
            if self.versions.get(name) != versions.get(name):
                return f"planned with {name} {self.versions.get(name)}, this is {versions.get(name)}"
        executors = executor_family(graph.executors)
        if executors != self.executors:
            return f"planned for executors {list(self.executors)}, this compilation has {list(executors)}"
        world_size = world_size_of(graph)
        if world_size != self.world_size:
            return f"planned for {self.world_size} rank(s), this compilation runs on {world_size}"
        inputs = input_signature(graph)
        if inputs != self.inputs:
            return _inputs_difference(self.inputs, inputs)
        symbols = tag_target_symbols(graph)
        for target, symbol in self.tag_targets.items():
            if symbols.get(target) != symbol:
                found = f"is made by {symbols[target]}" if target in symbols else "is not in this trace"
                return f"tag target {target} (planned on {symbol}) {found}"
        return None


def _inputs_difference(planned: list[list], found: list[list]) -> str:
    """The first input shape one side has and the other lacks."""
    as_key = lambda x: f"{x[1]}{list(x[0])}"  # noqa: E731
    extra = Counter(map(as_key, found)) - Counter(map(as_key, planned))
    lacking = Counter(map(as_key, planned)) - Counter(map(as_key, found))
    parts = [f"{len(planned)} inputs planned, {len(found)} here"]
    if lacking:
        parts.append(f"planned {next(iter(lacking))}")
    if extra:
        parts.append(f"here {next(iter(extra))}")
    return "input shapes differ: " + "; ".join(parts)
