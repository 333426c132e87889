"""The architecture: import contracts (pyproject.toml), import side effects, the public surface."""

import importlib
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

# What a Thunder user reaches for; everything else lives in its module.
USER_API = {
    "CostRemat", "explain", "analyze", "analyze_model", "plan_graph", "pareto_curve", "fit", "FitError",
    "measure_saved_bytes", "measure_step_peak_bytes", "sdpa_cpu_ex",
    "InfeasibleBudgetError", "ModelTraceError", "DeepenError",
}  # fmt: skip


def _lint_imports(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def _python(*lines: str) -> str:
    """What a fresh interpreter prints running `lines` (which must succeed)."""
    result = subprocess.run([sys.executable, "-c", "\n".join(lines)], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_import_contracts_are_kept():
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("remat_opt/core/graph.py", "from remat_opt.planning import planner", "remat_opt packages"),
        ("remat_opt/solvers/mincut.py", "import remat_opt.cli.main", "remat_opt packages"),
        ("remat_opt/core/graph.py", "from remat_opt.core import problem", "the core: each module"),
        ("costmodels/formulas.py", "import remat_opt.core.graph", "costmodels is a leaf library"),
        ("remat_opt/core/plan.py", "from remat_opt import _compat", "never patch torch"),
        ("remat_opt/solvers/ilp.py", "import torch", "need no torch"),
    ],
    ids=["graph-imports-planning", "solver-imports-cli", "graph-imports-problem", "costmodels-imports-remat_opt",
         "plan-patches-torch", "solver-imports-torch"],
)
def test_a_deliberate_violation_breaks_a_contract(tmp_path, module, line, broken):
    """The contracts can fail: a copy of the tree with one upward import breaks the named one."""
    for package in ("remat_opt", "costmodels"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / module, "a") as f:
        f.write(f"\n{line}  # deliberate violation\n")
    result = _lint_imports(tmp_path, pythonpath=tmp_path)
    assert result.returncode != 0, result.stdout[-2000:]
    broken_lines = [ln for ln in result.stdout.splitlines() if ln.endswith("BROKEN")]
    assert any(broken in ln for ln in broken_lines), result.stdout[-3000:]


def test_the_data_model_solvers_and_costs_import_neither_torch_nor_thunder():
    printed = _python(
        "import sys",
        "import remat_opt, remat_opt.core.graph, remat_opt.core.plan, remat_opt.core.problem, remat_opt.solvers, remat_opt.planning.planner",
        "import costmodels, costmodels.formulas, costmodels.devices, costmodels.table",
        "print(sorted(m for m in ('torch', 'thunder', 'remat_opt._compat') if m in sys.modules))",
    )
    assert printed.strip() == "[]"


def test_the_user_api_applies_the_compatibility_step_before_thunder():
    """`from remat_opt import CostRemat` then `import thunder` works, where thunder alone may not."""
    printed = _python(
        "import sys",
        "from remat_opt import CostRemat, explain",
        "import thunder",
        "print('remat_opt._compat' in sys.modules, callable(thunder.jit))",
    )
    assert printed.split()[-2:] == ["True", "True"]
    needs_step = _python("import torch", "print(not hasattr(torch.Tensor, 'rename'))").strip() == "True"
    alone = subprocess.run([sys.executable, "-c", "import thunder"], capture_output=True, text=True, timeout=300)
    # the step can go once thunder imports on the installed torch by itself
    assert (alone.returncode != 0) == needs_step, alone.stderr[-1000:]


def test_public_surface_is_the_user_api():
    import remat_opt

    assert set(remat_opt.__all__) == USER_API
    for name in USER_API:
        assert getattr(remat_opt, name) is not None, name
    for internal in ("GraphCapture", "RecomputeProblem", "SOLVERS", "JointGraph", "check_plan"):
        with pytest.raises(AttributeError, match=internal):
            getattr(remat_opt, internal)


@pytest.mark.parametrize("package", ["remat_opt", "remat_opt.core", "remat_opt.solvers", "remat_opt.costing",
                                     "remat_opt.planning", "remat_opt.tracing", "remat_opt.distributed",
                                     "remat_opt.transform", "remat_opt.models", "remat_opt.analysis",
                                     "remat_opt.validation", "remat_opt.executors", "costmodels"])
def test_no_attribute_hides_a_module_of_the_same_name(package):
    """`package.x` is the module `package.x` whenever such a module exists (no function shadows it)."""
    pkg = importlib.import_module(package)
    names = [info.name for info in pkgutil.iter_modules(pkg.__path__)]
    assert names
    for name in names:
        module = importlib.import_module(f"{package}.{name}")
        assert getattr(pkg, name) is module, f"{package}.{name} is {getattr(pkg, name)!r}, not the module"


def test_test_fixtures_are_not_shipped():
    assert not any((ROOT / "remat_opt").rglob("synthetic.py"))
    assert importlib.util.find_spec("remat_opt.solvers.synthetic") is None
