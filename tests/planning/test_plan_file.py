"""`remat_opt.planning.plan_file`: a plan written to a file, refused for another compilation (pure)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from remat_opt.planning.plan_file import FORMAT, PlanFile, PlanFileError, library_versions
from synthetic import random_joint_graph


@pytest.fixture
def graph():
    return random_joint_graph(3, n_ops=(8, 10))


def _targets(graph):
    return sorted({o.tag_target for o in graph.origins.values() if o.tag_target is not None})[:2]


def test_a_written_plan_reads_back_and_matches_its_graph(graph, tmp_path):
    plan = PlanFile.of(graph, _targets(graph), collectives_in_flight=1, description={"note": "x"})
    loaded = PlanFile.load(plan.write(tmp_path / "plan.json"))
    assert loaded == plan and loaded.mismatch(graph) is None
    assert json.loads((tmp_path / "plan.json").read_text())["format"] == FORMAT


def test_the_stand_in_counts_as_nvfuser(graph):
    planned = replace(graph, executors=("nvfuser_standin", "torch"))
    assert PlanFile.of(planned, ()).mismatch(replace(graph, executors=("nvfuser", "torch"))) is None


@pytest.mark.parametrize("change, message", [
    (lambda g: replace(g, executors=("torch",)), "planned for executors"),
    (lambda g: replace(g, tensors={**g.tensors, g.input_names[0]: replace(g.tensors[g.input_names[0]], shape=(7, 7))}),
     "input shapes differ: "),
])
def test_another_compilation_is_named_in_one_line(graph, change, message):
    plan = PlanFile.of(replace(graph, executors=("nvfuser",)), _targets(graph))
    found = plan.mismatch(change(replace(graph, executors=("nvfuser",))))
    assert found is not None and found.startswith(message) and "\n" not in found


def test_other_library_versions_are_refused(graph):
    plan = PlanFile.of(graph, ())
    other = {**library_versions(), "torch": "0.0.1"}
    assert plan.mismatch(graph, versions=other) == f"planned with torch {library_versions()['torch']}, this is 0.0.1"


def test_a_tag_target_made_by_another_op_is_refused(graph):
    target = _targets(graph)[0]
    plan = replace(PlanFile.of(graph, [target]), tag_targets={target: "no_such_symbol"})
    assert plan.mismatch(graph).startswith(f"tag target {target} (planned on no_such_symbol) is made by ")
    plan = replace(plan, tag_targets={"t_missing": "mul"})
    assert plan.mismatch(graph) == "tag target t_missing (planned on mul) is not in this trace"


@pytest.mark.parametrize("content, message", [
    (None, "does not exist; write one with `remat-opt fit ... --out plan.json`"),
    ("{not json", "is not readable JSON"),
    ('{"format": "something else"}', "is not a remat-opt plan file (format 'something else'"),
    (json.dumps({"format": FORMAT}), "lacks or mangles 'tag_targets'"),
])
def test_unusable_files_say_why(tmp_path, content, message):
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(PlanFileError, match=message.replace("(", r"\(").replace("`", ".")):
        PlanFile.load(path)


def test_cost_remat_takes_a_plan_file_instead_of_budgets(graph, tmp_path):
    from remat_opt.transform.cost_remat import CostRemat

    path = PlanFile.of(graph, _targets(graph), collectives_in_flight=1).write(tmp_path / "plan.json")
    transform = CostRemat(plan=path)
    assert transform.collectives_in_flight == 1 and transform.request.fixed_tag_targets == tuple(_targets(graph))
    with pytest.raises(ValueError, match="applies a plan made already: drop budget_gb, solver"):
        CostRemat(plan=path, budget_gb=10, solver="ilp")
    with pytest.raises(ValueError, match="was made for collectives_in_flight=1, not 2: drop collectives_in_flight"):
        CostRemat(plan=path, collectives_in_flight=2)
    with pytest.raises(PlanFileError, match="does not exist"):
        CostRemat(plan=tmp_path / "missing.json")
