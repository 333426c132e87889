"""A model of what Thunder's fusion pass saves for a plan of the unfused graph (no Thunder imports).

The solver plans on the unfused joint graph; Thunder's fusion pass then re-partitions the joint trace
after the tags and saves something else (`remat_opt.planning.fusion_search`). What it saves differs
from the solver's tensors in ways that repeat from one plan to the next, origin by origin (the
pre-autodiff proxy a saved tensor comes from, the unit a tag would recompute):

- a region writes fresh outputs, so a saved view of a large base keeps only its own bytes (Llama's
  query, a third of the qkv projection's output);
- Thunder's rematerialization between a forward region and the backward region reading it recomputes
  cheap tensors from others it saves (a norm's statistics), so some of the solver's tensors vanish;
- nvFuser's CSE merges a recomputed op that is not fused (a linear whose inputs are saved) with the
  forward's, so a tag can be undone and the op's output saved after all.

`SavedBytesModel` learns these per origin from the plans Thunder has realized (the untagged dry run
first, then each dry run of the search): per origin, the ratio of the bytes Thunder saved to the bytes
the plan saved, and the bytes Thunder saved for origins the plan did not save. Its prediction for a
new plan steers the search (`fusion_search.search_with_model`) so that few dry runs are needed; the
dry run stays the check, and its bytes are the prediction CostRemat reports.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from remat_opt.core.graph import JointGraph


def bytes_by_origin(graph: JointGraph, saved_names: Iterable[str]) -> dict[str | None, int]:
    """Saved non-input storage bytes grouped by the origin (tag target) of the tensor that saves them;
    a storage saved through several tensors counts once, for the first."""
    found: dict[str | None, int] = {}
    seen: set[str] = set()
    for name in saved_names:
        storage = graph.tensors[name].storage
        if storage in seen or graph.tensors[storage].kind == "input":
            continue
        seen.add(storage)
        origin = graph.origins.get(name)
        key = origin.tag_target if origin is not None else None
        found[key] = found.get(key, 0) + graph.tensors[storage].storage_bytes
    return found


@dataclass
class SavedBytesModel:
    """Predicts the bytes Thunder's fusion pass saves for a plan of `unfused` (see the module docstring).

    Attributes:
        unfused: the graph the solver plans on.
        ratio: origin -> realized bytes per planned byte, from the latest realized plan that saved it.
        extra_bytes: origin -> bytes Thunder saved for it in the latest realized plan that did not.
        observations: how many realized plans the model has seen.
    """

    unfused: JointGraph
    ratio: dict[str | None, float] = field(default_factory=dict)
    extra_bytes: dict[str | None, int] = field(default_factory=dict)
    observations: int = 0

    def observe(self, planned_saved_names: Iterable[str], realized: JointGraph) -> None:
        """Learns from one plan (its tensors of the unfused graph) and what Thunder's pass saved for it."""
        planned = bytes_by_origin(self.unfused, planned_saved_names)
        got = bytes_by_origin(realized, realized.saved_names)
        for origin, planned_bytes in planned.items():
            self.ratio[origin] = got.get(origin, 0) / planned_bytes
            self.extra_bytes.pop(origin, None)
        for origin, realized_bytes in got.items():
            if origin not in planned:
                self.extra_bytes[origin] = realized_bytes
        self.observations += 1

    def saved_bytes(self, planned_saved_names: Iterable[str]) -> int:
        """The bytes Thunder's pass is predicted to save for a plan saving `planned_saved_names`."""
        planned = bytes_by_origin(self.unfused, planned_saved_names)
        total = sum(b * self.ratio.get(origin, 1.0) for origin, b in planned.items())
        total += sum(b for origin, b in self.extra_bytes.items() if origin not in planned)
        return round(total)
