"""Thunder operator executors shipped with remat-opt, and the executor lists the CLI names."""

from __future__ import annotations

EXECUTOR_CHOICES = ("fused-sdpa", "default", "torch-compile", "nvfuser-standin")


def executors_for(choice: str) -> list | None:
    """Thunder executor list for a `--executors` choice (None: Thunder's defaults)."""
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
