"""Joint graphs of named models: a litgpt config traced with a few layers on meta, extended to
its full depth (`remat_opt.core.deepen`). Touches Thunder (through `remat_opt.tracing.extract`)."""

from __future__ import annotations

import time
from dataclasses import replace

from remat_opt.distributed.collective_order import reorder_graph
from remat_opt.core.deepen import DeepenError, extend_layers
from remat_opt.core.graph import JointGraph
from remat_opt.models.graph_cache import cache_key, load_graph, store_graph, tracing_once

DEFAULT_TRACED_LAYERS = 4


def analyze_spec(spec, *, traced_layers: int = DEFAULT_TRACED_LAYERS, executors=None, parallel=None) -> JointGraph:
    """The joint graph of `spec` (a `remat_opt.models.by_name.ModelSpec` of a litgpt config) at full depth.

    Traces `min(depth, traced_layers)` layers and extends the graph to the spec's depth (its
    `n_layer`, else the config's); `traced_layers=0` traces every layer. With
    ``REMAT_OPT_GRAPH_CACHE`` set, the traced graph is kept there (`remat_opt.models.graph_cache`).
    `executors` is a `--executors` choice or a list of Thunder executors (as ``thunder.jit`` and
    `remat_opt.analyze` take them); None: `remat_opt.executors.default_executors` for the spec's
    device (the nvFuser stand-in on meta). With `parallel` (a
    `remat_opt.distributed.data_parallel.DataParallel`), the graph is one rank's under Thunder's FSDP or DDP over
    that many ranks (traced with a fake process group); extending it copies a layer's collectives
    with the layer. Raises `DeepenError` (one line, naming what broke) when the graph cannot be extended.
    FSDP's ``collectives_in_flight`` is applied last, to the graph at full depth
    (`remat_opt.distributed.collective_order.reorder_graph`): it is traced and extended in Thunder's order.
    """
    from remat_opt.executors import resolve_executors
    from remat_opt.models.by_name import build_model, check_spec, litgpt_config

    check_spec(spec)
    if isinstance(traced_layers, bool) or not isinstance(traced_layers, int) or traced_layers < 0 \
            or traced_layers in (1, 2):
        raise ValueError(f"traced_layers must be 0 (all) or at least 3, got {traced_layers!r}")
    executors_key, executor_list = resolve_executors(executors, spec.device)
    config, seq = litgpt_config(spec)
    spec = replace(spec, seq=seq)  # the default sequence length spelled out: one cache key per graph
    depth = config.n_layer
    traced = depth if traced_layers == 0 else min(depth, traced_layers)
    start_s = time.perf_counter()
    in_flight = parallel.collectives_in_flight if parallel else None
    parallel = replace(parallel, collectives_in_flight=None) if parallel else None
    traced_spec = replace(spec, n_layer=traced)
    key = cache_key(traced_spec, executors_key, *((parallel,) if parallel else ()))
    with tracing_once(key):
        cached = load_graph(key)
        if cached is not None:
            graph = cached[1]
        else:
            model, inputs = build_model(traced_spec)
            graph = _analyze(model, inputs, executor_list, parallel, spec.device)
            store_graph(key, traced_spec, graph)
    if traced == depth:
        return reorder_graph(graph, in_flight)
    try:
        graph = extend_layers(graph, depth - traced, traced_layers=traced)
    except DeepenError as e:
        what = f"the {parallel.strategy.upper()} graph" if parallel else "the graph"
        raise DeepenError(f"{what} of {spec.name} cannot be extended from {traced} traced layers to {depth}: {e}; "
                          "use --traced-layers 0 (trace every layer) or a smaller --n-layer") from e
    note = f"{spec.name}: traced {traced} of {depth} layers in {time.perf_counter() - start_s:.1f} s"
    return reorder_graph(replace(graph, notes=(*graph.notes, note)), in_flight)


def _analyze(model, inputs, executors, parallel, device: str) -> JointGraph:
    """The traced graph, one rank's under `parallel` (FSDP: the world size must divide the shards)."""
    from remat_opt.tracing.capture import analyze

    if parallel is None:
        return analyze(model, *inputs, executors=executors)
    import torch

    from remat_opt.distributed.data_parallel import check_shardable, fake_process_group, parallel_transform

    if parallel.strategy == "fsdp":
        check_shardable(model, parallel.world_size)
    with fake_process_group(parallel.world_size):
        transform = parallel_transform(parallel.strategy, torch.device(device))
        return analyze(model, *inputs, executors=executors, transforms=[transform])


def analyze_model(
    name: str,
    *,
    seq: int,
    batch: int = 1,
    dtype: str | None = None,
    n_layer: int | None = None,
    traced_layers: int = DEFAULT_TRACED_LAYERS,
    executors=None,
    strategy: str | None = None,
    world_size: int | None = None,
    collectives_in_flight: int | None = None,
    tiny: bool = False,
) -> JointGraph:
    """The joint graph of a litgpt config at full depth, traced on meta with `traced_layers` layers.

    Args:
        name: litgpt config name, e.g. ``"Llama-2-7b-hf"``.
        seq: sequence length.
        batch: micro-batch size.
        dtype: ``"bfloat16"`` (default: what GPU training runs), ``"float32"`` or ``"float16"``.
        n_layer: depth to plan for (default: the config's).
        traced_layers: layers actually traced (0: all; shallower models are traced whole).
        executors: a `remat_opt.executors.EXECUTOR_CHOICES` entry (see `remat-opt inspect`) or a list
            of Thunder executors, as `remat_opt.analyze` takes them; default ``"nvfuser-standin"``:
            nvFuser's fusion regions and Thunder's rematerialization, as a GPU runs it.
        strategy: ``"fsdp"`` (Thunder's ZeRO-3) or ``"ddp"``: the graph is one rank's of
            `world_size` ranks, as ``remat-opt plan --strategy --world-size`` traces it.
        world_size: ranks, with `strategy`.
        collectives_in_flight: with FSDP, at most this many all-gathers and reduce-scatters in
            flight beside the one in use, as ``CostRemat(collectives_in_flight=...)`` runs them
            (None: Thunder's order, every forward all-gather issued at the start).
        tiny: shrink the config's width (tests).
    """
    from remat_opt.distributed.data_parallel import data_parallel_of
    from remat_opt.models.by_name import ModelSpec

    spec = ModelSpec(name=name, n_layer=n_layer, seq=seq, batch=batch, dtype=dtype, device="meta", tiny=tiny)
    parallel = data_parallel_of(strategy, world_size, collectives_in_flight)
    return analyze_spec(spec, traced_layers=traced_layers, executors=executors, parallel=parallel)
