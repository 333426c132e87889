"""Thunder operator executors shipped with remat-opt, and the executor lists the CLI names."""

from __future__ import annotations

EXECUTOR_CHOICES = ("fused-sdpa", "default", "torch-compile", "nvfuser-standin")


def default_executors(device: str) -> str:
    """The `--executors` choice when none is given: on meta, the nvFuser stand-in (with the fused SDPA):
    what-if graphs of a GPU step, its fusion regions and Thunder's rematerialization included (a
    meta graph without them saves every intermediate: Llama-2-7b at seq 4096 would save 44.3 GB
    instead of 18.4 GB); on a real device, the fused SDPA with Thunder's executors for that device
    (on CUDA those include the real nvFuser)."""
    return "nvfuser-standin" if device == "meta" else "fused-sdpa"


def check_executor_choice(choice: object) -> str:
    """`choice` if it is one of `EXECUTOR_CHOICES`, else a ValueError naming them."""
    if choice not in EXECUTOR_CHOICES:
        raise ValueError(f"unknown executors {choice!r}; use one of {', '.join(EXECUTOR_CHOICES)}")
    return choice


def resolve_executors(executors, device: str) -> tuple[object, list | None]:
    """``(cache key, Thunder executor list)`` of what a user gave as executors: None (the default
    choice for `device`), a name of `EXECUTOR_CHOICES`, or a list of Thunder executors, as
    ``thunder.jit(executors=...)`` takes them.

    Raises:
        ValueError: anything else (an unknown name, a list holding something other than executors).
    """
    from remat_opt import _compat  # noqa: F401  (before thunder)
    from thunder.extend import Executor

    if executors is None or isinstance(executors, str):
        choice = default_executors(device) if executors is None else check_executor_choice(executors)
        return choice, executors_for(choice)
    if isinstance(executors, (list, tuple)) and executors and all(isinstance(e, Executor) for e in executors):
        return tuple(e.name for e in executors), list(executors)
    raise ValueError(f"executors must be one of {', '.join(EXECUTOR_CHOICES)} or a list of Thunder executors, "
                     f"got {executors!r:.80}")


def executors_for(choice: str) -> list | None:
    """Thunder executor list for a `--executors` choice (None: Thunder's defaults).

    Raises:
        ValueError: `choice` is not one of `EXECUTOR_CHOICES`.
    """
    check_executor_choice(choice)
    from remat_opt.executors.sdpa_cpu import sdpa_cpu_ex  # applies the torch compatibility step first

    import thunder

    if choice == "default":
        return None
    if choice == "nvfuser-standin":
        from remat_opt.executors.nvfuser_standin import nvfuser_standin_ex

        return [nvfuser_standin_ex, sdpa_cpu_ex, *thunder.get_default_executors()]
    if choice == "torch-compile":
        from thunder.executors.torch_compile import torch_compile_ex

        return [torch_compile_ex, sdpa_cpu_ex, *thunder.get_default_executors()]
    return [sdpa_cpu_ex, *thunder.get_default_executors()]
