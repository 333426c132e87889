"""The case of lightning-thunder issue #1646, predicted: a blanket rule re-ran the SDPA forward in
the backward of Llama-2-7b (seq 4096, micro-batch 1, 32 layers, bf16, one H100) and cost 2.4% of the
step for 0.01 GB. `sdpa_case` prices recomputing every SDPA forward against save-all;
`seed_prediction` predicts the two iterations of Thunder's ``benchmark_litgpt.py`` the issue
measured (`THUNDER_1646_STEP_MS`, `THUNDER_1646_MEMORY_GB`: the issue's figures, for comparison
only, never for fitting)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from remat_opt.analysis.training_step import Parameters, TrainingStepPrediction, predict_training_step
from remat_opt.analysis.whatif import CostedGraph, Sweep, sdpa_forward_ops
from remat_opt.core.errors import GB
from remat_opt.core.graph import REASON_AUXILIARY, JointGraph
from remat_opt.core.problem import RecomputeProblem
from remat_opt.costing.graph_costs import CostModel


# Thunder issue #1646 (Llama-2-7b, seq 4096, micro-batch 1, 32 layers, bf16, one real H100): the
# blanket recompute rule re-ran the SDPA forward in the backward (lightning-thunder issue #1646).
THUNDER_1646_STEP_MS = {"sdpa saved": 341.78, "sdpa recomputed": 350.15}
THUNDER_1646_MEMORY_GB = {"sdpa saved": 64.18, "sdpa recomputed": 64.17}


def sdpa_units(problem: RecomputeProblem) -> tuple[str, ...]:
    """Allowed recompute units made of SDPA forward ops only, in forward order."""
    sdpa = {op.name for op in sdpa_forward_ops(problem.graph)}
    return tuple(u.name for u in problem.units.values() if u.allowed and u.ops and set(u.ops) <= sdpa)


def sdpa_auxiliary_bytes(graph: JointGraph) -> int:
    """Saved bytes of SDPA's auxiliary outputs (logsumexp, RNG state), distinct storages.

    They are what #1646's rule freed: it reran the SDPA kernel for them and kept its output saved.
    """
    names = set(graph.saved_names)
    auxiliary = [
        out for op in sdpa_forward_ops(graph) for out in op.outputs
        if out in names and (origin := graph.origins.get(out)) is not None and origin.reason == REASON_AUXILIARY
    ]
    return graph.storage_bytes(auxiliary)


def sdpa_verdict(sweeps: Iterable[Sweep]) -> str:
    """Whether the solver reruns an SDPA forward at any budget of the sweeps, in one sentence."""
    sweeps = list(sweeps)
    picks = [f"{s.label} at {p.swept_budget_bytes / GB:.2f} GB ({n} SDPA ops)"
             for s in sweeps for p, n in zip(s.points, s.sdpa_recomputed) if n]
    n_plans = sum(len(s.points) for s in sweeps)
    if not picks:
        return f"The solver reruns no SDPA forward in any of the {n_plans} plans of the sweeps."
    return f"The solver reruns SDPA in {len(picks)} of {n_plans} plans: " + "; ".join(picks) + "."


@dataclass(frozen=True)
class SdpaCase:
    """Recomputing every SDPA forward in the backward, against save-all.

    Attributes:
        n_sdpa_ops: SDPA forward ops in the graph.
        units: the recompute units tagged (SDPA ops only).
        saved_freed_bytes: saved bytes the SDPA plan frees (output and auxiliaries).
        peak_freed_bytes: how much lower its simulated step peak is.
        auxiliary_bytes: the part of the saved bytes that is SDPA auxiliaries (#1646 freed these).
        extra_time_s: what the SDPA plan adds to a step (rerunning the SDPA forwards).
        step_time_s: predicted save-all step time.
    """

    n_sdpa_ops: int
    units: tuple[str, ...]
    saved_freed_bytes: int
    peak_freed_bytes: int
    auxiliary_bytes: int
    extra_time_s: float
    step_time_s: float


def sdpa_case(costed: CostedGraph) -> SdpaCase:
    """Plans that tag only the SDPA units vs save-all (`RecomputeProblem.plan_for` on both)."""
    problem = costed.problem
    units = sdpa_units(problem)
    save_all = problem.plan_for((), solver="save_all", status="heuristic", solve_time_s=0.0)
    sdpa = problem.plan_for(units, solver="sdpa_only", status="heuristic", solve_time_s=0.0)
    return SdpaCase(
        n_sdpa_ops=len(sdpa_forward_ops(costed.graph)),
        units=units,
        saved_freed_bytes=save_all.saved_bytes - sdpa.saved_bytes,
        peak_freed_bytes=save_all.peak_bytes - sdpa.peak_bytes,
        auxiliary_bytes=sdpa_auxiliary_bytes(costed.graph),
        extra_time_s=sdpa.extra_time_s,
        step_time_s=costed.step_time_s,
    )


def sdpa_case_rows(case: SdpaCase) -> list[dict[str, str]]:
    """#1646 as measured, as it happened by our model (auxiliaries freed), and the SDPA plan.

    The "% of measured step" column compares with the measured Llama-2-7b step on one H100, so it
    means something for that model and device only.
    """
    measured_step_ms = THUNDER_1646_STEP_MS["sdpa saved"]
    measured_ms = THUNDER_1646_STEP_MS["sdpa recomputed"] - measured_step_ms
    measured_gb = THUNDER_1646_MEMORY_GB["sdpa saved"] - THUNDER_1646_MEMORY_GB["sdpa recomputed"]
    extra_ms = case.extra_time_s * 1e3
    predicted = {"extra ms": f"{extra_ms:.2f}",
                 "% of predicted step": f"{100 * extra_ms / (case.step_time_s * 1e3):.2f}",
                 "% of measured step": f"{100 * extra_ms / measured_step_ms:.2f}"}
    return [
        {"what": "Thunder #1646, measured on one H100", "GB freed": f"{measured_gb:.2f}",
         "extra ms": f"{measured_ms:.2f}", "% of predicted step": "-",
         "% of measured step": f"{100 * measured_ms / measured_step_ms:.2f}"},
        {"what": "SDPA rerun for its auxiliaries only, output kept (as #1646), predicted",
         "GB freed": f"{case.auxiliary_bytes / GB:.3f}", **predicted},
        {"what": f"tag the {len(case.units)} SDPA units (output and auxiliaries freed), predicted",
         "GB freed": f"{case.saved_freed_bytes / GB:.3f} (peak {case.peak_freed_bytes / GB:.3f})", **predicted},
    ]


def benchmark_parameters(name: str, parallel=None, **spec) -> Parameters:
    """The trainable parameters of litgpt config `name` (built on meta): what AdamW keeps states for;
    one rank's under `parallel` (`remat_opt.distributed.data_parallel.DataParallel`: FSDP shards them)."""
    from remat_opt.models.by_name import ModelSpec, trainable_parameters

    numels, dtype = trainable_parameters(ModelSpec(name, **spec))
    return Parameters(numels, dtype).per_rank(parallel)


@dataclass(frozen=True)
class SeedPrediction:
    """#1646's two runs of `benchmark_litgpt.py` predicted: SDPA kept (save-all) and SDPA rerun in the
    backward for its logsumexp with its output kept (the blanket rule #1646 reported).

    Attributes:
        kept: the save-all iteration (`remat_opt.analysis.training_step.TrainingStepPrediction`).
        rerun_peak_bytes: the peak with the SDPA auxiliaries not saved (freed at the peak when it
            comes before the backward starts freeing saved tensors; otherwise the same peak).
        rerun_time_s: the iteration time plus rerunning every SDPA forward.
    """

    kept: TrainingStepPrediction
    rerun_peak_bytes: int
    rerun_time_s: float


def seed_prediction(costed: CostedGraph, parameters: Parameters) -> SeedPrediction:
    """Predicts #1646's iterations for `costed` (Llama-2-7b, seq 4096, bf16 on an H100 for the seed)."""
    kept = predict_training_step(costed.graph, CostModel(costed.graph, costed.device), parameters)
    # every auxiliary is saved (and not yet freed) from the forward's end until the backward starts
    freed = sdpa_auxiliary_bytes(costed.graph) if kept.peak_phase in ("loss", "loss backward") else 0
    return SeedPrediction(kept, kept.peak_bytes - freed, kept.time_s + sdpa_case(costed).extra_time_s)


def seed_rows(seed: SeedPrediction) -> list[dict[str, str]]:
    """Predicted vs measured peak and iteration time of #1646's two runs, with the error."""
    rows = []
    for label, key, peak_bytes, time_s in (
        ("SDPA kept (save-all)", "sdpa saved", seed.kept.peak_bytes, seed.kept.time_s),
        ("SDPA rerun for its logsumexp, output kept (#1646's rule)", "sdpa recomputed", seed.rerun_peak_bytes,
         seed.rerun_time_s),
    ):
        measured_gb, measured_ms = THUNDER_1646_MEMORY_GB[key], THUNDER_1646_STEP_MS[key]
        rows.append({
            "run": label,
            "peak GB predicted / measured": f"{peak_bytes / GB:.2f} / {measured_gb:.2f}",
            "error": f"{100 * (peak_bytes / GB / measured_gb - 1):+.1f}%",
            "ms predicted / measured": f"{time_s * 1e3:.1f} / {measured_ms:.2f}",
            "error ": f"{100 * (time_s * 1e3 / measured_ms - 1):+.1f}%",
        })
    return rows


def seed_breakdown_rows(seed: SeedPrediction) -> list[dict[str, str]]:
    """What the save-all prediction is made of: live memory at the peak and time, term by term."""
    step = seed.kept
    memory = [{"term": f"memory at the peak ({step.peak_phase}): {k}", "value": f"{v / GB:.3f} GB"}
              for k, v in step.memory_terms.items()]
    time = [{"term": f"time: {k}", "value": f"{v * 1e3:.2f} ms"} for k, v in step.time_terms.items()]
    phases = [{"term": f"peak of phase: {k}", "value": f"{v / GB:.3f} GB"} for k, v in step.phase_peaks.items()]
    return memory + phases + time
