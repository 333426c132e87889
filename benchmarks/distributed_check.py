"""CostRemat under Thunder's FSDP and DDP on 2 gloo ranks (CPU): the full matrix of budgets.

Runs `tests/distributed_runs.py`'s cases (save-all, 50%, 1 B below what keeping every unsharded
weight can reach, the minimum, for FSDP; save-all, 50%, minimum for DDP) on tiny Llama-2 and prints,
per rank and case, predicted and measured saved bytes, the re-gathered weights, predicted and
measured step peak and the gradient error against single-process eager.

    .venv/bin/python benchmarks/distributed_check.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from distributed_runs import spawn  # noqa: E402
from test_distributed import FULL_CASES  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as out:
        ranks = spawn(FULL_CASES, out, timeout_s=900.0)
    for rank, result in enumerate(ranks):
        if "error" in result:
            print(f"rank {rank} failed:\n{result['error']}")
            continue
        for label, _, _ in FULL_CASES:
            c = result[label]
            print(f"rank {rank} {label:>16}: budget {c['budget_bytes']:>9,} B | saved predicted {c['predicted_saved_bytes']:>9,}"
                  f" measured {c['measured_saved_bytes']:>9,} B | re-gathers {len(c['regathered'])} | peak predicted "
                  f"{c['predicted_peak_bytes']:>9,} measured {_bytes(c['measured_peak_bytes'])} | grad err {c['grad_error']:.1e}")


def _bytes(n) -> str:
    return "not measured (FSDP)" if n is None else f"{n:>9,} B"


if __name__ == "__main__":
    main()
