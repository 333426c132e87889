"""Models by name for the CLI, the notebook and the tests: litgpt configs or `module:factory`.

`ModelSpec` says what to build; `build_model(spec)` returns `(model, example_inputs)` ready for
`remat_opt.analyze` or a training step. On ``device="meta"`` nothing is allocated, so 7B-scale
configs can be planned on any machine.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import sys
from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_dtype(device: str) -> str:
    """The dtype a model is built in when none is given, on every entry point (`analyze_model`, the
    CLI, `ModelSpec`): ``"bfloat16"`` on meta and CUDA, what GPU training runs (the graphs planned on
    meta are for GPUs), ``"float32"`` on the CPU, where eager comparisons and timings run in fp32."""
    return "float32" if isinstance(device, str) and device.partition(":")[0] == "cpu" else "bfloat16"


class ModelSpecError(ValueError):
    """The model named on the command line (or in a spec) cannot be built; the message says why."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What to build.

    Attributes:
        name: a litgpt config name (``"Llama-2-7b-hf"``) or ``"package.module:factory"``; a factory
            returns ``(model, example_inputs_tuple)``; it is called with ``device`` if it takes it,
            and with the options of ``n_layer``, ``seq``, ``batch``, ``dtype`` (a ``torch.dtype``)
            the user set (`factory_kwargs`), keeping its own defaults for the rest.
        n_layer: override the number of layers (litgpt only).
        seq: sequence length of the example input (litgpt only; default: 128 capped by the config).
        batch: micro-batch size (litgpt only).
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``; None: `default_dtype` of the device.
        device: ``"meta"`` (no memory), ``"cpu"`` or ``"cuda"``.
        tiny: shrink a litgpt config to a few-thousand-parameter model of the same family (width
            64, 4 heads, vocab 256), keeping its norm, MLP, attention layout and GQA ratio.
    """

    name: str
    n_layer: int | None = None
    seq: int | None = None
    batch: int = 1
    dtype: str | None = None
    device: str = "meta"
    tiny: bool = False

    def __post_init__(self):
        if self.dtype is None:
            object.__setattr__(self, "dtype", default_dtype(self.device))


def tiny_overrides(config) -> dict:
    """Overrides that shrink a litgpt config while keeping its family's structure."""
    n_head = 4
    if config.n_query_groups == 1:
        groups = 1
    elif config.n_query_groups < config.n_head:
        groups = 2
    else:
        groups = n_head
    return dict(
        n_embd=64,
        n_head=n_head,
        n_query_groups=groups,
        head_size=16,
        intermediate_size=128,
        padded_vocab_size=256,
        vocab_size=256,
    )


def litgpt_config(spec: ModelSpec):
    """The litgpt `Config` for `spec`, with a clear error for an unknown name."""
    from litgpt import Config
    from litgpt.config import name_to_config

    by_lower = {n.lower(): n for n in name_to_config}
    if spec.name.lower() not in by_lower:
        close = difflib.get_close_matches(spec.name, list(name_to_config), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see litgpt.config.name_to_config"
        raise ModelSpecError(f"unknown litgpt config name {spec.name!r}{hint}")
    name = by_lower[spec.name.lower()]
    overrides = {} if spec.n_layer is None else {"n_layer": spec.n_layer}
    config = Config.from_name(name, **overrides)
    if spec.tiny:
        overrides.update(tiny_overrides(config))
    seq = spec.seq or min(32 if spec.tiny else 128, config.block_size)
    if seq > config.block_size or spec.tiny:
        overrides["block_size"] = seq
    return Config.from_name(name, **overrides), seq


def check_spec(spec: ModelSpec) -> None:
    """Raises `ModelSpecError` for a bad dtype, non-positive sizes, or CUDA requested without CUDA."""
    if not isinstance(spec.name, str) or not spec.name:
        raise ModelSpecError(f"the model name must be a litgpt config name or 'module:factory', got {spec.name!r}")
    if spec.dtype not in DTYPES:
        raise ModelSpecError(f"unknown dtype {spec.dtype!r}; use one of {', '.join(DTYPES)}")
    for field_name in ("n_layer", "seq", "batch"):
        value = getattr(spec, field_name)
        if value is None and field_name != "batch":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelSpecError(f"{field_name} must be a positive integer, got {value!r}")
    if not isinstance(spec.device, str) or spec.device.partition(":")[0] not in ("meta", "cpu", "cuda"):
        raise ModelSpecError(f"device must be 'meta', 'cpu' or 'cuda', got {spec.device!r}")
    if spec.device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelSpecError("device 'cuda' requested but torch.cuda.is_available() is False; use cpu or meta")


def build_litgpt(spec: ModelSpec):
    """A litgpt GPT and a token batch; the model is built directly on `spec.device`."""
    import litgpt

    config, seq = litgpt_config(spec)
    dtype = DTYPES[spec.dtype]
    torch.manual_seed(0)
    with torch.device(spec.device):
        model = litgpt.GPT(config).to(dtype)
    idx = torch.randint(0, config.padded_vocab_size, (spec.batch, seq), device=spec.device)
    return model, (idx,)


FACTORY_OPTIONS = ("n_layer", "seq", "batch", "dtype", "device")


def load_factory(name: str):
    """The callable named ``module:factory`` (modules of the working directory included)."""
    module_name, _, attr = name.partition(":")
    if os.getcwd() not in sys.path:  # like `python -m`, find modules of the working directory
        sys.path.insert(0, os.getcwd())
    try:
        return getattr(importlib.import_module(module_name), attr)
    except Exception as e:  # ImportError, AttributeError, or the module's own failure on import
        raise ModelSpecError(f"cannot load factory {name!r}: {type(e).__name__}: {e}") from e


def factory_kwargs(spec: ModelSpec, given: frozenset[str] = frozenset()) -> dict:
    """The keyword arguments `build_factory` passes: ``device`` if the factory takes it, and the
    options the user set (`given`), each of which the factory must take.

    Args:
        spec: names a ``module:factory``.
        given: options the user set explicitly.

    Raises:
        ModelSpecError: a given option the factory does not take, or a required parameter the spec
            cannot fill.
    """
    factory = load_factory(spec.name)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    values = {"n_layer": spec.n_layer, "seq": spec.seq, "batch": spec.batch, "dtype": DTYPES.get(spec.dtype),
              "device": spec.device}
    wanted = {k for k in values if k in given or k == "device"}
    kwargs = {k: values[k] for k in FACTORY_OPTIONS if k in wanted and (takes_any or k in params)}
    taken = ", ".join(p for p in params if p in FACTORY_OPTIONS) or "none of them"
    ignored = sorted(k for k in given if k not in kwargs)
    if ignored:
        flags = ", ".join("--" + k.replace("_", "-") for k in ignored)
        raise ModelSpecError(f"factory {spec.name!r} takes no {flags} (of {', '.join(FACTORY_OPTIONS)} it takes "
                             f"{taken}); set it in the factory or drop the option")
    required = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in kwargs
                and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    if required:
        raise ModelSpecError(f"factory {spec.name!r} needs {', '.join(required)}; it is called with keyword "
                             f"arguments among {', '.join(FACTORY_OPTIONS)} only: give the others defaults")
    return kwargs


def describe_model(spec: ModelSpec, given: frozenset[str] = frozenset()) -> dict:
    """What was built, without guessing: a litgpt spec's fields, or a factory's name and the
    arguments it was called with (its own defaults are not known here)."""
    if ":" not in spec.name:
        return {k: getattr(spec, k) for k in ModelSpec.__slots__}
    kwargs = factory_kwargs(spec, given)
    return {"name": spec.name, **{k: str(v).removeprefix("torch.") for k, v in kwargs.items()}}


def build_factory(spec: ModelSpec, given: frozenset[str] = frozenset()):
    """Calls ``module:factory`` with `factory_kwargs` and checks that it returned ``(model, inputs)``."""
    kwargs = factory_kwargs(spec, given)
    try:
        result = load_factory(spec.name)(**kwargs)
    except Exception as e:
        raise ModelSpecError(f"factory {spec.name!r} raised {type(e).__name__}: {e}") from e
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], tuple)):
        raise ModelSpecError(f"factory {spec.name!r} must return (model, example_inputs_tuple)")
    return result


def build_model(spec: ModelSpec, given: frozenset[str] = frozenset()):
    """Returns ``(model, example_inputs)`` for `spec`; raises `ModelSpecError` on bad input.

    `given`: the options the user set explicitly (a factory must take each of them)."""
    check_spec(spec)
    if ":" in spec.name:
        return build_factory(spec, given)
    return build_litgpt(spec)


def trainable_parameters(spec: ModelSpec) -> tuple[tuple[int, ...], str]:
    """``(element count of each trainable parameter, their dtype)`` of the model `spec` builds, built
    on meta (no memory): what an optimizer keeps states for. Raises `ModelSpecError` for mixed dtypes."""
    from dataclasses import replace

    model, _ = build_model(replace(spec, device="meta"))
    params = [p for p in model.parameters() if p.requires_grad]
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in params})
    if len(dtypes) != 1:
        raise ModelSpecError(f"{spec.name}: trainable parameters of several dtypes ({', '.join(dtypes)})")
    return tuple(p.numel() for p in params), dtypes[0]


def check_same_device(model: torch.nn.Module, inputs: tuple) -> None:
    """Raises `ModelSpecError` if the inputs and parameters are not all on one device."""
    tensors = [*model.parameters(), *model.buffers(), *(t for t in inputs if isinstance(t, torch.Tensor))]
    device_set = sorted({str(t.device) for t in tensors})
    if len(device_set) > 1:
        raise ModelSpecError(
            f"inputs and parameters are on several devices ({', '.join(device_set)}); move them to one device"
        )


__all__ = ["ModelSpec", "ModelSpecError", "build_model", "check_same_device", "litgpt_config", "trainable_parameters"]
