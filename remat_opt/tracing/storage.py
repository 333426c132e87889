"""Storage identity of every tensor of a trace, found by running its ops on the meta device.

Whether a torch op returns a view depends on strides (`reshape` of a contiguous tensor is a view,
of a transposed one a copy) and, for some Thunder ops, on the executor's implementation
(`shallow_copy` returns its input). Rather than re-deriving those rules, `StorageTracker` runs each
op of the final trace, as printed by Thunder, on meta tensors and asks torch: a result whose
`_base` (or itself) is a tensor seen before shares that tensor's storage. Meta tensors allocate
nothing, so this is fast at any model size.

Fusion regions: their member ops' results are `internal` (never materialized). nvFuser writes every
output of a region to a fresh allocation (the nvFuser stand-in copies to match). A torch.compile
region's outputs that are views keep aliasing what they view (AOTAutograd regenerates an output
that aliases an input, or an intermediate it also returns, as a view of it): its members run on
meta through Thunder's torch executor (`region_program`) and the results' bases say which storage
each output lives in (a split of a region input stays in that input's storage). An op that fails on
meta gets fresh outputs, and a note says which.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from remat_opt import _compat  # noqa: F401  (before thunder)
from thunder.core import dtypes, prims  # noqa: E402
from thunder.core.codeutils import SigInfo  # noqa: E402
from thunder.core.proxies import FutureTensorProxy, TensorProxy  # noqa: E402
from thunder.core.symbol import BoundSymbol  # noqa: E402
from thunder.core.trace import TraceCtx, tracectx  # noqa: E402
from thunder.executors.passes import del_last_used, transform_for_execution  # noqa: E402

from costmodels.formulas import COLLECTIVE_KINDS, WAIT_SYMBOLS  # noqa: E402
from remat_opt.core.graph import TensorNode  # noqa: E402


def _torch_dtype(proxy: TensorProxy) -> torch.dtype:
    return dtypes.to_torch_dtype(proxy.dtype)


def _element_bytes(proxy: TensorProxy) -> int:
    return torch.empty((), dtype=_torch_dtype(proxy), device="meta").element_size()


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def proxy_bytes(proxy) -> int:
    """Bytes of a tensor (or a collective's future) proxy's elements."""
    return _numel(proxy.shape) * _element_bytes(proxy)


def _meta_empty(proxy: TensorProxy) -> torch.Tensor:
    return torch.empty(tuple(int(s) for s in proxy.shape), dtype=_torch_dtype(proxy), device="meta")


class _OnMeta(TorchFunctionMode):
    """Sends factory calls and device moves (`arange(..., device="cpu")`, `x.to("cuda")`) to meta."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = "meta"
        if func in (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu):
            args = tuple("meta" if isinstance(a, (torch.device, str)) else a for a in args)
            if func is not torch.Tensor.to:
                return args[0]
        return func(*args, **kwargs)


class StorageTracker:
    """Runs ops on meta tensors and records, per tensor name, which storage it lives in."""

    def __init__(self):
        self._values: dict[str, object] = {}
        self._owner_by_root: dict[int, str] = {}
        self._roots: list[torch.Tensor] = []  # keeps roots alive so ids stay unique
        self._nodes: dict[str, TensorNode] = {}
        self.notes: dict[str, int] = {}  # note -> how many ops it applies to

    def add_input(self, proxy: TensorProxy, *, kind: str) -> None:
        """Registers an input of a trace as a fresh, contiguous tensor."""
        if proxy.name not in self._nodes:
            self._register(proxy, _meta_empty(proxy), kind)

    def run(self, bsym: BoundSymbol, *, kind: str, trace_ctx: dict) -> None:
        """Runs one top-level op on meta and registers its tensor outputs.

        Args:
            bsym: a top-level bound symbol of a final trace.
            kind: the `TensorNode.kind` of its outputs.
            trace_ctx: the trace's `python_ctx()` (the names its printed program refers to).
        """
        outs = [o for o in bsym.flat_proxy_outs if isinstance(o, (TensorProxy, FutureTensorProxy))]
        if bsym.sym.name in WAIT_SYMBOLS:  # returns the buffer its collective's future holds
            future = bsym.flat_proxy_args[0]
            values = {o.name: self._values.get(future.name, _meta_empty(o)) for o in outs}
        elif bsym.sym.name in COLLECTIVE_KINDS:  # a fresh output buffer (no meta kernel to run)
            values = {o.name: _meta_empty(o) for o in outs}
        elif bsym.sym.is_fusion:
            self._register_internal(bsym, {o.name for o in outs})
            views_kept = bsym.sym.name.startswith(VIEW_KEEPING_REGIONS)
            values = self._run_members(bsym, outs) if views_kept else {o.name: _meta_empty(o) for o in outs}
        else:
            values = self._execute(bsym, outs, trace_ctx)
        for o in outs:
            if o.name not in self._nodes:
                self._register(o, values[o.name], kind)

    def tensor_nodes(self) -> dict[str, TensorNode]:
        return dict(self._nodes)

    def _execute(self, bsym: BoundSymbol, outs: list[TensorProxy], trace_ctx: dict) -> dict[str, torch.Tensor]:
        env = {p.name: self._values[p.name] for p in bsym.flat_proxy_args if p.name in self._values}
        code = "\n".join(bsym.python(indent=0, print_depth=1))

        def compute():
            exec(compile(code, f"<meta {bsym.sym.name}>", "exec"), trace_ctx, env)
            return {o.name: env[o.name] for o in outs}

        return self._on_meta_or_fresh(bsym.sym.name, outs, compute)

    def _run_members(self, region: BoundSymbol, outs: list[TensorProxy]) -> dict[str, torch.Tensor]:
        """A region's outputs computed by its members on meta (views of its inputs stay views)."""
        inputs = [p for p in region.flat_proxy_args if isinstance(p, TensorProxy)]

        def compute():
            program = region_program(region.subsymbols, inputs, outs, "remat_opt_region_on_meta")
            results = program.python_callable(include_decorators=False)(*(self._values[p.name] for p in inputs))
            return dict(zip((o.name for o in outs), results if isinstance(results, (tuple, list)) else (results,)))

        return self._on_meta_or_fresh(f"{region.sym.name}'s members", outs, compute)

    def _on_meta_or_fresh(self, what: str, outs: list[TensorProxy], compute) -> dict[str, torch.Tensor]:
        """`compute()` run on meta; when it fails or returns no tensor for an output, fresh outputs
        and a note saying so (an op without a meta kernel)."""
        try:
            with _OnMeta():
                values = compute()
            if len(values) == len(outs) and all(isinstance(v, torch.Tensor) for v in values.values()):
                return values
            reason = "returned a non-tensor"
        except Exception as e:
            reason = f"{type(e).__name__}: {e}"
        note = f"{what} could not run on meta ({reason}); outputs taken as fresh"
        self.notes[note] = self.notes.get(note, 0) + 1
        return {o.name: _meta_empty(o) for o in outs}

    def _register(self, proxy: TensorProxy, value: torch.Tensor, kind: str) -> None:
        root = value._base if value._base is not None else value
        owner = self._owner_by_root.get(id(root))
        if owner is None:
            owner = proxy.name
            self._owner_by_root[id(root)] = owner
            self._roots.append(root)
            storage_bytes = root.untyped_storage().nbytes()
        else:
            storage_bytes = self._nodes[owner].storage_bytes
        self._values[proxy.name] = value
        self._nodes[proxy.name] = self._node(proxy, kind, owner, storage_bytes)

    def _register_internal(self, region: BoundSymbol, region_outputs: set[str]) -> None:
        for sub in region.subsymbols:
            for o in sub.flat_proxy_outs:
                if isinstance(o, TensorProxy) and o.name not in region_outputs and o.name not in self._nodes:
                    self._nodes[o.name] = self._node(o, "internal", o.name, 0)

    @staticmethod
    def _node(proxy: TensorProxy, kind: str, storage: str, storage_bytes: int) -> TensorNode:
        shape = tuple(int(s) for s in proxy.shape)
        return TensorNode(
            name=proxy.name,
            shape=shape,
            dtype=str(_torch_dtype(proxy)).removeprefix("torch."),
            device=proxy.device.device_str(),
            nbytes=_numel(shape) * _element_bytes(proxy),
            storage=storage,
            storage_bytes=storage_bytes,
            kind=kind,
        )


# Fusion regions whose outputs may be views (torch.compile's, through AOTAutograd); nvFuser's are fresh.
VIEW_KEEPING_REGIONS = ("TorchCompile",)


def region_program(bsyms: list[BoundSymbol], inputs: list, outputs: list, name: str) -> TraceCtx:
    """An executable trace running a fusion region's member ops through Thunder's torch executor,
    each member's output freed after its last use (as Thunder frees a trace's tensors)."""
    from thunder.executors.torchex import ex as torch_ex

    region = TraceCtx(None)
    region.args, region.kwargs, region.names = inputs, {}, {a.name for a in inputs}
    with tracectx(region):
        for a in inputs:
            prims.unpack_trivial(a, name=a.name)
    region.bound_symbols += list(bsyms)
    region.bound_symbols.append(prims.python_return.bind(outputs, output=None))
    for bsym in region.bound_symbols:
        for o in (*bsym.flat_outs, *(o for s in bsym.subsymbols for o in s.flat_outs)):
            if o is not None and hasattr(o, "name") and o.name not in region.names:
                region.add_name(o.name)
    region._siginfo = SigInfo(name)
    region._siginfo.args = [(a.name, None) for a in inputs]
    return del_last_used(transform_for_execution(region, executors_list=(torch_ex,)))


def member_workspace_bytes(member_trace) -> int:
    """What a fusion region whose members run one by one (the nvFuser stand-in on CPU) adds to the
    step's live bytes while it runs, beyond its outputs: the peak of its own tensors (internals until
    their last use, outputs made so far) less its outputs, each a fresh tensor as the step counts them. `member_trace` is the region's
    executable trace (torch ops); views share their base's storage (ops run on meta)."""
    from thunder.core.prims import PrimIDs

    bsyms = [b for b in member_trace.bound_symbols
             if b.sym.id not in (PrimIDs.UNPACK_TRIVIAL, PrimIDs.RETURN, PrimIDs.DEL)]
    tracker = StorageTracker()
    inputs = [a for a in member_trace.args if isinstance(a, TensorProxy)]
    for a in inputs:
        tracker.add_input(a, kind="input")
    ctx = member_trace.python_ctx()
    for bsym in bsyms:
        tracker.run(bsym, kind="internal", trace_ctx=ctx)
    nodes = tracker.tensor_nodes()
    returned = member_trace.bound_symbols[-1].args[0] if member_trace.bound_symbols else ()
    input_storages = {nodes[p.name].storage for p in inputs if p.name in nodes}
    output_storages = {nodes[p.name].storage for p in returned if isinstance(p, TensorProxy) and p.name in nodes}
    output_storages -= input_storages
    last_use = {}
    for i, bsym in enumerate(bsyms):
        for p in bsym.flat_proxy_args:
            if p.name in nodes:
                last_use[nodes[p.name].storage] = i
    # live bytes of the region's own tensors after each member: internals (freed after their last
    # use) and the outputs made so far; the step's simulation counts every output from the start, so
    # the workspace is what exceeds them
    seen, internal_live, outputs_live, peak = set(input_storages), {}, 0, 0
    for i, bsym in enumerate(bsyms):
        for p in bsym.flat_proxy_outs:
            node = nodes.get(p.name)
            if node is None or node.storage in seen:
                continue
            seen.add(node.storage)
            if node.storage in output_storages:
                outputs_live += nodes[node.storage].storage_bytes
            else:
                internal_live[node.storage] = nodes[node.storage].storage_bytes
        peak = max(peak, sum(internal_live.values()) + outputs_live)
        for storage in [s for s in internal_live if last_use.get(s, i) <= i]:
            del internal_live[storage]
    # the region returns fresh copies of view outputs (nvFuser allocates every output), and the step
    # counts each output as its own storage
    fresh_outputs_bytes = sum(_numel(p.shape) * _element_bytes(p) for p in returned if isinstance(p, TensorProxy))
    return max(peak - fresh_outputs_bytes, 0)
