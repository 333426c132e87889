"""A stand-in for Thunder's nvFuser executor that runs on CPU and meta: the same fusion regions, the
same post-fusion passes, no nvFuser.

On a GPU, Thunder's nvFuser executor claims elementwise, reduction and shape ops, groups them into
``nvFusionN`` regions with Thunder's own partitioner and then runs Thunder's rematerialization
(a min-cut between producer and consumer regions), ``remove_redundant_casts``, CSE and DCE: fp32
upcasts, norms and activations mostly stay inside regions and are never saved. Off a GPU none of
that happens, so CPU/meta graphs save every intermediate. This executor reproduces the pass:

* **Which ops**: exactly the ids Thunder 0.2.6's ``nvfuserex_impl.py`` registers with
  ``register_supported`` (read from its source, which needs no nvFuser to parse), minus those
  nvFuser leaves off by default (their checker reads an ``nv_enable_*`` option: linear, matmul,
  SDPA, embedding, scatter), DTensor ids, and the ops nvFuser claims through an execution transform
  (``cross_entropy``) or its own symbols (``nv_sdpfa_*``). `nvfuser_registrations` lists them;
  ``tests/executors/test_nvfuser_standin.py`` checks the list against the source, so a Thunder upgrade that
  changes it fails a test.
* **Checker**: nvFuser's generic tensor check (supported dtype, rank <= 8, numbers allowed) with its
  CUDA device check relaxed to cpu and meta. Op-specific checkers of nvFuser (e.g. on pad widths)
  are not replicated: a region may claim an op nvFuser would leave out.
* **Pass**: the body of ``nvFuserExecutor.fusion_pass`` (``replace_uniform``, partitioning with
  ``fuse_bound_symbols``, no shape-only regions, rematerialization, ``remove_redundant_casts``,
  CSE, DCE), with regions named ``nvFusionN`` so that cost formulas treat them as nvFuser's;
  nvFuser's own ``remove_redundant_casts`` and region-aware ``cse`` are compiled from Thunder's
  source (`nvfuser_passes`), since their module cannot be imported without nvFuser.
* **Execution**: a region runs its member ops through Thunder's torch executor, one by one (on CPU
  gradients and saved bytes are measurable; on meta it only traces).
"""

from __future__ import annotations

import ast
import importlib.util
import time
import functools
from functools import lru_cache
from numbers import Number
from pathlib import Path

import torch

from remat_opt import _compat  # noqa: F401  (before thunder)
from thunder.core import dtypes, prims  # noqa: E402
from thunder.core.proxies import NumberProxy, TensorProxy  # noqa: E402
from thunder.core.pytree import tree_flatten  # noqa: E402
from thunder.core.rematerialization import rematerialize, replace_uniform  # noqa: E402
from thunder.core.symbol import BoundSymbol, Symbol  # noqa: E402
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace  # noqa: E402
from thunder.core.transform_common import dce  # noqa: E402
from thunder.executors.passes import update_fusion_call_ctx  # noqa: E402
from thunder.executors.utils import Region  # noqa: E402
from thunder.extend import FusionExecutor  # noqa: E402

from remat_opt.tracing.storage import member_workspace_bytes, region_program  # noqa: E402

NVFUSER_SOURCE = "executors/nvfuserex_impl.py"
_SUPPORTED_DTYPES = (dtypes.bool8, dtypes.uint8, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64,
                     dtypes.bfloat16, dtypes.float16, dtypes.float32, dtypes.float64)


def _thunder_source(relative: str) -> Path:
    return Path(importlib.util.find_spec("thunder").origin).parent / relative


def nvfuser_registrations() -> list[tuple[str, str | None, frozenset[str]]]:
    """``(target, checker, options)`` for every module-level ``register_supported`` call of Thunder's
    nvFuser executor: the registered id as written (``"PrimIDs.ADD"``, ``"ltorch.cumsum"``), its
    checker's name, and the ``nv_enable_*`` compile options that checker reads (empty: on by default)."""
    tree = ast.parse(_thunder_source(NVFUSER_SOURCE).read_text())
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}

    def options(checker: str | None) -> frozenset[str]:
        body = functions.get(checker or "")
        return frozenset(
            c.args[0].value
            for c in (ast.walk(body) if body else ())
            if isinstance(c, ast.Call) and getattr(c.func, "id", None) == "get_compile_option"
            and c.args and isinstance(c.args[0], ast.Constant) and str(c.args[0].value).startswith("nv_enable_")
        )

    found = []
    for node in tree.body:
        call = node.value if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) else None
        name = getattr(call.func, "id", None) or getattr(call.func, "attr", None) if call else None
        if name != "register_supported":
            continue
        keywords = {k.arg: k.value for k in call.keywords}
        checker = call.args[2] if len(call.args) > 2 else keywords.get("checker")
        checker_name = ast.unparse(checker) if checker is not None else None
        target = ast.unparse(call.args[0])
        if "execution_transform" in keywords:
            target += " (execution transform)"
        found.append((target, checker_name, options(checker_name)))
    return found


@lru_cache(maxsize=1)
def claimed_ids() -> tuple:
    """The symbol ids the stand-in claims (see the module docstring for what is left out)."""
    import thunder.torch as ltorch

    ids = []
    for target, _, options in nvfuser_registrations():
        module, _, name = target.partition(".")
        if options or " " in target or module not in ("PrimIDs", "prims", "ltorch"):
            continue
        if module == "PrimIDs":
            ids.append(getattr(prims.PrimIDs, name))
        else:
            ids.append(getattr({"prims": prims, "ltorch": ltorch}[module], name).id)
    return tuple(dict.fromkeys(ids))


def _supported(value) -> bool:
    if isinstance(value, (Number, NumberProxy)) or value is None:
        return True
    if isinstance(value, TensorProxy):
        return (value.device.type in ("cpu", "meta", "cuda") and dtypes.to_dtype(value.dtype, true_dtype=True)
                in _SUPPORTED_DTYPES + tuple(dtypes.to_strong_dtype(d) for d in _SUPPORTED_DTYPES)
                and value.ndim <= 8)
    return True  # shapes, dtypes, devices, strings


def _checker(*args, **kwargs) -> bool:
    flat, _ = tree_flatten((args, kwargs))
    return all(_supported(a) for a in flat)


_WORKSPACE_BYTES: dict[tuple, int] = {}  # region structure -> its member workspace bytes


def _structure_key(bsyms: list[BoundSymbol], inputs: list, outputs: list) -> tuple:
    """What a region's allocations depend on, without its names: each member's symbol, and its
    arguments and outputs with every proxy replaced by its first-seen index, shape and dtype."""
    from thunder.core.proxies import Proxy

    index: dict[str, int] = {}

    def canonical(value):
        if isinstance(value, Proxy):
            number = index.setdefault(value.name, len(index))
            if isinstance(value, TensorProxy):
                return number, tuple(value.shape), str(value.dtype), str(value.device)
            return number, type(value).__name__
        return repr(value)

    def flat(value) -> tuple:
        leaves, spec = tree_flatten(value)
        return str(spec), tuple(canonical(v) for v in leaves)

    return (flat(tuple(inputs)),
            *((b.sym.name, flat((b.args, b.kwargs)), flat(tuple(b.flat_outs))) for b in bsyms),
            flat(tuple(outputs)))


class _RegionCallable:
    """Runs the region's ops through Thunder's torch executor (what `torch_compile.make_compiled`
    builds, without torch.compile). Built at the first call, as nvFuser's executor builds its fusion
    definition at the first call (`FusionDefinitionWrapper`): Thunder's fusion pass calls `fuse`
    twice per region, and CostRemat's dry runs never call the regions."""

    def __init__(self, bsyms: list[BoundSymbol], inputs: list, outputs: list):
        self._parts = (list(bsyms), list(inputs), list(outputs))
        self._run = None

    @functools.cached_property
    def member_trace(self):
        """The region's executable trace (torch ops): what the region allocates for itself, for the peak."""
        return region_program(*self._parts, "nvfuser_standin_region")

    @functools.cached_property
    def workspace_bytes(self) -> int:
        """`member_workspace_bytes` of the region, computed once per region structure: CostRemat's dry
        runs make the same regions again under new names, and this was most of a graph's extraction."""
        key = _structure_key(*self._parts)
        if key not in _WORKSPACE_BYTES:
            if len(_WORKSPACE_BYTES) >= 20_000:
                _WORKSPACE_BYTES.clear()
            _WORKSPACE_BYTES[key] = member_workspace_bytes(self.member_trace)
        return _WORKSPACE_BYTES[key]

    def __call__(self, *args):
        if self._run is None:
            self._run = self.member_trace.python_callable(include_decorators=False)
        # nvFuser writes every output to a fresh, contiguous allocation; torch ops may return views (of
        # an input, or of a larger intermediate whose whole storage a saved view would keep alive),
        # strided tensors (a transpose; its strides would decide whether a later reshape copies) and
        # the same tensor as two outputs
        outs = self._run(*args)
        seen = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        fresh = []
        for o in outs:
            if isinstance(o, torch.Tensor):
                # a view, a strided tensor, an input or an output already returned: a fresh copy
                if o._base is not None or not o.is_contiguous() or o.untyped_storage().data_ptr() in seen:
                    o = o.clone(memory_format=torch.contiguous_format)
                seen.add(o.untyped_storage().data_ptr())
            fresh.append(o)
        return type(outs)(fresh) if isinstance(outs, (tuple, list)) else fresh


class NvFuserStandIn(FusionExecutor):
    """See the module docstring. Register it before the default executors:
    ``thunder.jit(model, executors=[nvfuser_standin_ex, sdpa_cpu_ex, *thunder.get_default_executors()])``."""

    def __init__(self):
        super().__init__("nvfuser_standin", version="thunder-0.2.6-nvfuser-registrations")
        self._use_rematerialization = True  # as nvFuser's executor
        for sym_id in claimed_ids():
            self.register_supported(sym_id, _checker)

    def fuse(self, region: Region, fusion_counter: int) -> BoundSymbol:
        from thunder.core.proxies import unvariableify

        inputs = [unvariableify(x) for x in region.inputs]
        outputs = [unvariableify(x) for x in region.outputs]
        name = f"nvFusion{fusion_counter}"
        fusion = Symbol(name, meta=None, is_fusion=True, executor=self)
        return BoundSymbol(fusion, inputs, {}, outputs, region.bound_symbols,
                           _call_ctx={name: _RegionCallable(region.bound_symbols, inputs, outputs)})

    def fusion_pass(self, trace: TraceCtx) -> TraceCtx:
        from thunder.core import utils
        from thunder.executors.data_dependent_partition import fuse_bound_symbols

        start_ns = time.perf_counter_ns()
        trace = replace_uniform(trace)
        fused = from_trace(trace)
        producers, consumers = utils.producers_and_consumers(trace)

        def can_fuse_node(node) -> bool:
            return len(node.group_bsyms) > 1 or self.can_fuse(node.group_bsyms[0])

        bsyms_out, counter = [], 0
        for bsyms in fuse_bound_symbols(trace, lambda a, b: can_fuse_node(a) and can_fuse_node(b)):
            if all(prims.OpTags.SHAPE_OP in (b.sym.tags or ()) for b in bsyms):  # nvFuser: no shape-only regions
                bsyms_out.extend(bsyms)
                continue
            if len(bsyms) == 1 and not self.can_fuse(bsyms[0]):
                bsyms_out.append(bsyms[0])
                continue
            bsyms_out.append(self.fuse(Region(producers, consumers, bsyms), counter))
            counter += 1
        fused.bound_symbols = bsyms_out
        passes = nvfuser_passes()
        if self._use_rematerialization:
            fused = rematerialize(fused)
        fused = passes["remove_redundant_casts"](fused)
        fused = dce(passes["cse"](self, fused))
        fused = update_fusion_call_ctx(fused)
        fused.set_provenance(TraceProvenance(f"nvFuser stand-in fusion (took {(time.perf_counter_ns() - start_ns) // 10**6} ms)"))
        return fused


@lru_cache(maxsize=1)
def nvfuser_passes() -> dict:
    """nvFuser's own ``remove_redundant_casts`` and ``cse`` (a method that never reads ``self``),
    compiled from Thunder's source: ``nvfuserex_impl`` cannot be imported without nvFuser, but these
    two passes use only Thunder. The module's imports run first, except those of nvFuser."""
    tree = ast.parse(_thunder_source(NVFUSER_SOURCE).read_text())
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
               and not any("nvfuser" in (getattr(n, "module", None) or a.name) for a in n.names)]
    wanted = {"remove_redundant_casts": None, "cse": None}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in wanted and wanted[node.name] is None:
            wanted[node.name] = node
    missing = [name for name, node in wanted.items() if node is None]
    if missing:
        raise RuntimeError(f"Thunder's {NVFUSER_SOURCE} no longer defines {missing}: update the nvFuser stand-in")
    namespace: dict = {"__name__": "remat_opt.executors._nvfuser_passes"}
    exec(compile(ast.Module(body=[*imports, *wanted.values()], type_ignores=[]), str(_thunder_source(NVFUSER_SOURCE)),
                 "exec"), namespace)
    return {"remove_redundant_casts": namespace["remove_redundant_casts"], "cse": namespace["cse"]}


nvfuser_standin_ex = NvFuserStandIn()
