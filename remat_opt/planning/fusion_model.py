"""A model of what Thunder's fusion pass saves for a plan of the unfused graph (no Thunder imports).

The solver plans on the unfused joint graph; Thunder's fusion pass then re-partitions the joint trace
after the tags and saves something else (`remat_opt.planning.fusion_search`). What it saves differs
from the solver's tensors in ways that repeat from one plan to the next, origin by origin (the
pre-autodiff proxy a saved tensor comes from, the unit a tag would recompute):

- the nvFuser stand-in's regions write fresh outputs, so a saved view of a large base keeps only its
  own bytes (Llama's query, a third of the qkv projection's output), where torch.compile's regions
  keep the base, as the unfused graph does: origins whose tensors view one another are one group;
- Thunder's rematerialization between a forward region and the backward region reading it recomputes
  cheap tensors from others it saves (a norm's statistics), so some of the solver's tensors vanish;
- a tag can be undone: after the stand-in's pass, tiny Pythia's tagged qkv projection was saved all
  the same.

`SavedBytesModel` learns these per origin group from the plans Thunder has realized (the untagged dry run
first, then each dry run of the search): per group, the ratio of the bytes Thunder saved to the bytes
the plan saved, and the bytes Thunder saved for groups the plan did not save. Its prediction for a
new plan steers the search (`fusion_search.search_with_model`) so that few dry runs are needed; the
dry run stays the check, and its bytes are the prediction CostRemat reports.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from remat_opt.core.graph import JointGraph


def origin_groups(graph: JointGraph) -> dict[str | None, str | None]:
    """Origin -> its group: origins joined where a tensor of one is a view of a tensor of another.
    Which of the two the pass saves depends on its regions (the stand-in saves the view as a fresh
    tensor, torch.compile's regions keep the base, as the unfused graph does), so the model counts
    bytes per group."""
    parent: dict[str | None, str | None] = {}

    def find(origin):
        while parent.setdefault(origin, origin) != origin:
            parent[origin] = parent[parent[origin]]
            origin = parent[origin]
        return origin

    def key(name):
        origin = graph.origins.get(name)
        return origin.tag_target if origin is not None else None

    for name, tensor in graph.tensors.items():
        if tensor.storage != name and graph.tensors[tensor.storage].kind != "input" and name in graph.origins:
            parent[find(key(name))] = find(key(tensor.storage))
    return {origin: find(origin) for origin in list(parent)}


def bytes_by_origin(graph: JointGraph, saved_names: Iterable[str],
                    groups: dict[str | None, str | None] | None = None) -> dict[str | None, int]:
    """Saved non-input storage bytes grouped by the origin (tag target) of the tensor that saves them,
    or by that origin's group in `groups`; a storage saved through several tensors counts once, for
    the first."""
    groups = groups or {}
    found: dict[str | None, int] = {}
    seen: set[str] = set()
    for name in saved_names:
        storage = graph.tensors[name].storage
        if storage in seen or graph.tensors[storage].kind == "input":
            continue
        seen.add(storage)
        origin = graph.origins.get(name)
        key = origin.tag_target if origin is not None else None
        key = groups.get(key, key)
        found[key] = found.get(key, 0) + graph.tensors[storage].storage_bytes
    return found


@dataclass
class SavedBytesModel:
    """Predicts the bytes Thunder's fusion pass saves for a plan of `unfused` (see the module docstring).

    Attributes:
        unfused: the graph the solver plans on.
        ratio: origin group -> realized bytes per planned byte, from the latest realized plan that
            saved it (`origin_groups`).
        extra_bytes: origin group -> bytes Thunder saved for it in the latest realized plan that did not.
        observations: how many realized plans the model has seen.
    """

    unfused: JointGraph
    ratio: dict[str | None, float] = field(default_factory=dict)
    extra_bytes: dict[str | None, int] = field(default_factory=dict)
    observations: int = 0
    groups: dict[str | None, str | None] = field(init=False, repr=False)

    def __post_init__(self):
        self.groups = origin_groups(self.unfused)

    def observe(self, planned_saved_names: Iterable[str], realized: JointGraph) -> None:
        """Learns from one plan (its tensors of the unfused graph) and what Thunder's pass saved for it."""
        planned = bytes_by_origin(self.unfused, planned_saved_names, self.groups)
        got = bytes_by_origin(realized, realized.saved_names, self.groups)
        for group, planned_bytes in planned.items():
            self.ratio[group] = got.get(group, 0) / planned_bytes
            self.extra_bytes.pop(group, None)
        for group, realized_bytes in got.items():
            if group not in planned:
                self.extra_bytes[group] = realized_bytes
        self.observations += 1

    def saved_bytes(self, planned_saved_names: Iterable[str]) -> int:
        """The bytes Thunder's pass is predicted to save for a plan saving `planned_saved_names`."""
        planned = bytes_by_origin(self.unfused, planned_saved_names, self.groups)
        total = sum(b * self.ratio.get(group, 1.0) for group, b in planned.items())
        total += sum(b for group, b in self.extra_bytes.items() if group not in planned)
        return round(total)
