"""One request path: `CostRemat`, offline planning (`remat_opt.plan_graph`, `remat_opt.pareto_curve`)
and the CLI's `plan` and `pareto` build the same `PlanRequest`, and every option reaches the planner.
Each test fails if its option is dropped on the way."""

from __future__ import annotations

import pytest

import remat_opt
from remat_opt import solvers
from remat_opt.cli.main import main

TINY = ["Llama-2-7b-hf", "--tiny", "--n-layer", "1", "--device", "meta", "--device-spec", "h100",
        "--executors", "fused-sdpa"]


@pytest.fixture(scope="module")
def graph():
    from remat_opt.models.examples import block

    model, (x,) = block()
    return remat_opt.analyze(model, x, executors=[remat_opt.sdpa_cpu_ex])


@pytest.fixture
def calls(monkeypatch):
    """Every solver call: ``(solver name, options)``, through the one `SOLVERS` table."""
    seen = []
    for name, solve in list(solvers.SOLVERS.items()):
        def spy(problem, *args, _name=name, _solve=solve, **kwargs):
            seen.append((_name, kwargs.get("options")))
            return _solve(problem, *args, **kwargs)

        monkeypatch.setitem(solvers.SOLVERS, name, spy)
    return seen


def _half(graph) -> float:
    return graph.saved_activation_bytes / 2 / 1e9


@pytest.mark.parametrize("entry", ["plan_graph", "pareto_curve"])
def test_the_solver_and_its_time_limit_reach_the_planner(graph, calls, entry):
    if entry == "plan_graph":
        remat_opt.plan_graph(graph, activation_budget_gb=_half(graph), solver="mincut", device_spec="cpu")
        remat_opt.plan_graph(graph, activation_budget_gb=_half(graph), time_limit_s=0.75, device_spec="cpu")
    else:
        remat_opt.pareto_curve(graph, 2, solver="mincut", device_spec="cpu")
        remat_opt.pareto_curve(graph, 2, time_limit_s=0.75, device_spec="cpu")
    assert "mincut" in {name for name, _ in calls}
    assert {options.time_limit_s for name, options in calls if name == "ilp"} == {0.75}


@pytest.mark.slow  # two Thunder compilations
def test_cost_remat_passes_the_solver_and_its_time_limit(graph, calls):
    import thunder

    from remat_opt.models.examples import block

    model, (x,) = block()
    for options in ({"solver": "mincut"}, {"time_limit_s": 0.75}):
        transform = remat_opt.CostRemat(activation_budget_gb=_half(graph), device_spec="cpu", **options)
        jitted = thunder.jit(model, transforms=[transform], executors=[remat_opt.sdpa_cpu_ex])
        jitted(x).sum().backward()
    assert "mincut" in {name for name, _ in calls}
    assert {options.time_limit_s for name, options in calls if name == "ilp"} == {0.75}


@pytest.mark.parametrize("command", ["plan", "pareto"])
def test_the_cli_passes_the_solver_and_its_time_limit(tmp_path, calls, command, capsys):
    budget = ["--activation-budget-gb", "0.0001"] if command == "plan" else ["--points", "2", "--out", str(tmp_path)]
    assert main([command, *TINY, *budget, "--solver", "mincut"]) == 0
    assert main([command, *TINY, *budget, "--time-limit-s", "0.75"]) == 0
    assert "mincut" in {name for name, _ in calls}
    assert {options.time_limit_s for name, options in calls if name == "ilp"} == {0.75}


@pytest.mark.parametrize("entry", ["plan_graph", "pareto_curve"])
def test_auto_cost_tables_are_timed_offline_too(graph, entry, tmp_path, monkeypatch, capsys):
    # cost_table="auto" times the graph's ops on its device and caches them (it used to plan with formulas)
    monkeypatch.setenv("REMAT_OPT_COST_CACHE", str(tmp_path))
    if entry == "plan_graph":
        remat_opt.plan_graph(graph, activation_budget_gb=_half(graph), cost_table="auto")
    else:
        remat_opt.pareto_curve(graph, 2, cost_table="auto")
    assert list(tmp_path.rglob("*.json")), "no table was timed"
    assert "timed" in capsys.readouterr().err


def test_the_budget_kind_of_a_curve_is_what_it_says(graph):
    points = remat_opt.pareto_curve(graph, 3, budget_kind="peak", device_spec="cpu")
    assert {p.budget_kind for p in points} == {"peak"}
    assert all(p.peak_bytes <= p.swept_budget_bytes for p in points)
    with pytest.raises(ValueError, match="budget_kind must be one of 'activation', 'peak', got 'saved'"):
        remat_opt.pareto_curve(graph, 3, budget_kind="saved", device_spec="cpu")
