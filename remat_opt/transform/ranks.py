"""CostRemat under Thunder's data parallelism (FSDP, DDP): what ranks must agree on at compile time.

Every rank plans its own compilation. The plans must be the same on every rank: a re-gathered
weight is an all-gather every rank has to join, so a plan that re-gathers on one rank only hangs
the others. Solvers are deterministic for one graph (their limits count work, not wall time:
`remat_opt.solvers._clock`), but a measured cost table (``cost_table="auto"``) differs from rank to
rank. So after planning, rank 0's tag targets are broadcast and used by all ranks.
"""

from __future__ import annotations

from dataclasses import replace

import torch.distributed as dist

from remat_opt.planning.planner import PlannedStep
from remat_opt.core.problem import is_regather_unit


def is_distributed() -> bool:
    """Whether this process is one rank of an initialized default process group."""
    return dist.is_available() and dist.is_initialized()


def for_ranks(step: PlannedStep) -> PlannedStep:
    """What CostRemat does to a fresh plan under data parallelism: the ranks agree on rank 0's
    plan, and `explain` lists the weights it re-gathers (a no-op without collectives)."""
    step = agree_across_ranks(step)
    remark = regather_remark(step)
    return replace(step, remarks=(*step.remarks, remark)) if remark else step


def regather_units(step: PlannedStep) -> list[str]:
    """The FSDP weights (their tag targets) the plan re-gathers in the backward, in forward order."""
    problem, tagged = step.problem, set(step.plan.recomputed_tag_targets)
    return [name for name, unit in problem.units.items()
            if name in tagged and is_regather_unit([problem.ops_by_name[op] for op in unit.ops])]


def regather_remark(step: PlannedStep) -> str | None:
    """One line per re-gathered weight: its bytes and the all-gather's time and link, or None."""
    names = regather_units(step)
    if not names:
        return None
    problem, link = step.problem, step.costs.device_spec.interconnect
    lines = []
    for name in names:
        unit = problem.units[name]
        full_bytes = sum(step.graph.tensors[t].storage_bytes for t in unit.outputs if step.graph.tensors[t].storage == t)
        network = sum(step.costs.op_cost(op).network_bytes for op in unit.ops)
        lines.append(f"  {name}: {full_bytes:,} B unsharded, all-gather {unit.time_s * 1e3:.3f} ms "
                     f"({network:,} B per rank)")
    return (f"re-gathers {len(names)} FSDP weight(s) in the backward instead of keeping them (communication over "
            f"{link.name}: {link.source}):\n" + "\n".join(lines))


def agree_across_ranks(step: PlannedStep) -> PlannedStep:
    """`step`, or the plan of rank 0's tag targets on this rank's graph when they differ.

    A collective call when the graph has collectives (FSDP, DDP): every rank of the default process
    group compiles that step together. Otherwise, and outside `torch.distributed`, returns `step`.
    """
    if not is_distributed() or not any("collective" in op.op_tags for op in step.graph.ops):
        return step  # no collectives: the ranks may well be compiling different functions
    targets = [tuple(step.plan.recomputed_tag_targets)]
    dist.broadcast_object_list(targets, src=0)
    if targets[0] == tuple(step.plan.recomputed_tag_targets):
        return step
    plan = step.plan
    agreed = step.problem.plan_for(
        targets[0], solver=f"{plan.solver} (rank 0's plan)", status=plan.status, solve_time_s=plan.solve_time_s,
        gap=plan.gap, activation_budget_bytes=plan.activation_budget_bytes, peak_budget_bytes=plan.peak_budget_bytes, notes=plan.notes,
    )
    remark = (f"rank {dist.get_rank()} planned {len(plan.recomputed_tag_targets)} tag targets and uses rank 0's "
              f"{len(agreed.recomputed_tag_targets)}: every rank must issue the same collectives")
    return replace(step, plan=agreed, remarks=(*step.remarks, remark))


# Thunder's data-parallel transforms, by class name (this module does not import Thunder)
DATA_PARALLEL_TRANSFORMS = ("FSDPTransform", "DDPTransform")


def _data_parallel_name(transform) -> str | None:
    cls = type(transform)
    is_thunder = cls.__module__.startswith("thunder.distributed")
    return cls.__name__ if is_thunder and cls.__name__ in DATA_PARALLEL_TRANSFORMS else None


def check_transform_order(transforms, cost_remat_type: type) -> None:
    """Raises `ValueError` when a CostRemat comes before FSDPTransform or DDPTransform in `transforms`:
    it would plan the unsharded trace, before the collectives exist."""
    first = next((i for i, t in enumerate(transforms) if isinstance(t, cost_remat_type)), None)
    later = [name for t in transforms[first + 1:] if (name := _data_parallel_name(t))] if first is not None else []
    if later:
        raise ValueError(
            f"CostRemat comes before {later[0]} in thunder.jit's transforms: it must come after, to plan the "
            f"per-rank trace; use transforms=[{later[0]}(...), CostRemat(...)] (fsdp()/ddp() of a jitted "
            "model append theirs last)"
        )
