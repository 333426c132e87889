"""Executes every notebook in notebooks/ (except those listed in notebooks/.ignore.ci) with nbclient.

A cell that raises fails the test (nbclient's `CellExecutionError`): nothing is skipped on errors.
The kernel is the ``python3`` kernel of the interpreter running the tests (the project's venv).
`what_if.ipynb` traces three models on meta and plans them; its first cell tagged ``parameters``
holds what the README's figures use (the nvFuser stand-in from 4 traced layers, 8 budgets, 10 s),
and the suite replaces it with `CHEAP_PARAMETERS`: 2 budgets each (least peak, save-all), a 1 s
solver limit, and its cheapest graphs, 3 traced layers with the fused SDPA alone (the stand-in needs
4 traced layers and twice the tracing time), Llama-2-7b in the place of all three models (one trace:
the other two come from the run's graph cache, ``REMAT_OPT_GRAPH_CACHE``, tests/conftest.py). Every
cell still runs, in about a minute on 2 cores.
The stand-in graphs the notebook uses by default are checked by `tests/core/test_deepen.py`
(extension) and `tests/analysis/test_whatif.py` (the notebook's analyses on them).
"""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
CELL_TIMEOUT_S = 600
CHEAP_PARAMETERS = ('SWEEP_POINTS = 2\nTIME_LIMIT_S = 1.0\nTRACED_LAYERS = 3\nEXECUTORS = "fused-sdpa"\n'
                    'MODEL_NAMES = ("Llama-2-7b-hf",) * 3\n')


def _listed_notebooks() -> list[str]:
    ignored_file = NOTEBOOKS / ".ignore.ci"
    lines = ignored_file.read_text().splitlines() if ignored_file.exists() else []
    ignored = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    return sorted(p.name for p in NOTEBOOKS.glob("*.ipynb") if p.name not in ignored)


def _outputs(notebook, output_type: str) -> list:
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    return [o for cell in cells for o in cell.outputs if o.output_type == output_type]


@pytest.mark.parametrize("name", _listed_notebooks())
def test_notebook_is_committed_without_outputs(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert not [c for c in notebook.cells if c.cell_type == "code" and c.outputs], f"{name}: clear its outputs"


@pytest.mark.slow
@pytest.mark.extended  # a minute of tracing and sweeps: out of the README's test command
@pytest.mark.parametrize("name", _listed_notebooks())
def test_notebook_executes(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    parameters = [c for c in notebook.cells if "parameters" in c.get("metadata", {}).get("tags", ())]
    for cell in parameters[:1]:  # papermill's convention: the first cell tagged "parameters"
        cell.source = CHEAP_PARAMETERS
    client = nbclient.NotebookClient(
        notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    client.execute()  # raises CellExecutionError when a cell raises
    assert not _outputs(notebook, "error")
    shown = _outputs(notebook, "execute_result") + _outputs(notebook, "display_data")
    figures = [o for o in shown if "image/png" in o.data]
    assert figures, f"{name} shows no figure"


def test_what_if_notebook_is_listed():
    assert "what_if.ipynb" in _listed_notebooks()
