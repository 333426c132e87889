"""What a plan request accepts, checked where an option is given (`PlanRequest`, `CostRemat`, the CLI)."""

from __future__ import annotations

import re

import pytest

from costmodels.devices import DEVICE_SPEC_ALIASES, GPU_SPECS, device_spec_name
from remat_opt.core.errors import GB, InfeasibleBudgetError
from remat_opt.planning.planner import PlanRequest, budget_bytes_of


@pytest.mark.parametrize("name", ["h100", "H100", "h100-sxm5", "H100-SXM", "a100-80gb", "cpu", "CPU"])
def test_every_alias_names_one_spec(name):
    resolved = device_spec_name(name)
    assert resolved in GPU_SPECS or resolved == "cpu"
    assert PlanRequest.create(device_spec=name).device_spec == resolved


def test_the_cli_and_the_api_share_one_alias_table():
    from remat_opt.cli.main import resolve_device_spec

    for alias, spec in DEVICE_SPEC_ALIASES.items():
        assert resolve_device_spec(alias) == spec == device_spec_name(alias)


@pytest.mark.parametrize("bad", [5, "bogus", 1.5, ["h100"]], ids=["int", "unknown-name", "float", "list"])
def test_a_bad_device_spec_is_refused_when_the_transform_is_made(bad):
    from remat_opt import CostRemat

    with pytest.raises(ValueError, match=r"device_spec|device spec") as raised:
        CostRemat(device_spec=bad)
    message = str(raised.value)
    assert "\n" not in message and "cpu" in message and "h100" in message


@pytest.mark.parametrize("minimum_bytes", [1, 4_096, 999_999, 123_456_789, 52_178_000_001])
def test_the_infeasible_budget_advice_works_when_followed(minimum_bytes):
    error = InfeasibleBudgetError("peak_budget_bytes", 0, minimum_bytes, in_gb=True)
    advised_gb = float(re.search(r"use budget_gb=([0-9.]+) or more", str(error)).group(1))
    advised_bytes = budget_bytes_of("budget_gb", advised_gb)
    assert minimum_bytes <= advised_bytes <= minimum_bytes * 1.001 + 1, (str(error), advised_bytes)


def test_the_layered_solvers_local_search_scales_with_the_time_limit():
    from remat_opt.planning.planner import solver_options
    from remat_opt.solvers import LayeredOptions

    default = solver_options(PlanRequest.create(), "layered")
    assert default.polish_work_events == LayeredOptions().polish_work_events  # the 10 s default
    assert default.bound_time_limit_s == 5.0
    short = solver_options(PlanRequest.create(time_limit_s=1.0), "layered")
    assert short.polish_work_events * 10 == default.polish_work_events
