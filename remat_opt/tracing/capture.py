"""`remat_opt.analyze`: the joint graph of a model as Thunder would compile it, without running a
step. `GraphCapture` is a Thunder transform whose pre-prologue hook (the point where `CostRemat`
plans) runs the dry run (`remat_opt.tracing.dry_run`) and builds the graph
(`remat_opt.tracing.extract`)."""

from __future__ import annotations

from remat_opt import _compat  # noqa: F401  (before thunder)
import thunder  # noqa: E402
import torch  # noqa: E402
from thunder.core.trace import TraceCtx  # noqa: E402
from thunder.core.transform_common import Transform  # noqa: E402

from remat_opt.core import graph as g  # noqa: E402
from remat_opt.tracing.dry_run import dry_run, needs_backward  # noqa: E402
from remat_opt.tracing.extract import build_joint_graph  # noqa: E402


class _CaptureDone(Exception):
    """Raised by `GraphCapture(stop=True)` to end a compilation once the graph is captured."""


class GraphCapture(Transform):
    """Captures the `JointGraph` of each compilation in the pre-prologue hook.

    Args:
        stop: end the compilation once the graph is captured (used by `analyze`, which never runs
            the model). With False the compilation proceeds, unchanged.
    """

    def __init__(self, *, stop: bool = False, collectives_in_flight: int | None = None):
        self.stop, self.collectives_in_flight = stop, collectives_in_flight
        self.graph: g.JointGraph | None = None
        self.computation_trace: TraceCtx | None = None  # the pre-autodiff trace that tags go on
        self.forward_trace: TraceCtx | None = None
        self.backward_trace: TraceCtx | None = None

    def transform_traces_pre_prologue(self, prologue_trace, computation_trace, epilogue_trace, **kwargs):
        executors_list = kwargs.get("executors_list") or thunder.get_default_executors()
        self.computation_trace = computation_trace
        if needs_backward(computation_trace):
            self.forward_trace, self.backward_trace = dry_run(computation_trace, executors_list, self.collectives_in_flight)
        if self.backward_trace is None:
            raise ValueError("no backward: no input or parameter requires grad, nothing is saved for backward")
        names = tuple(ex.name for ex in executors_list if not ex.name.startswith("__ad_hoc"))
        self.graph = build_joint_graph(self.forward_trace, self.backward_trace, names)
        if self.stop:
            raise _CaptureDone
        return prologue_trace, computation_trace, epilogue_trace


def analyze(fn, *example_inputs, executors=None, transforms=(), collectives_in_flight: int | None = None,
            **example_kwargs) -> g.JointGraph:
    """The joint forward-backward graph of `fn` as Thunder would compile it, without running it.

    Works with inputs and parameters on ``torch.device("meta")``.

    Args:
        fn: a ``torch.nn.Module`` or a function of tensors.
        *example_inputs: inputs as the step will see them (at least one input or parameter must
            require grad).
        executors: Thunder executors, in priority order (Thunder's defaults when None).
        transforms: Thunder transforms to run first (FSDPTransform, DDPTransform: the graph is one rank's).
        collectives_in_flight: FSDP's all-gathers and reduce-scatters in flight at most, as
            ``CostRemat(collectives_in_flight=...)`` runs them (None: Thunder's order).
        **example_kwargs: keyword inputs.

    Returns:
        The `JointGraph`.
    """
    capture = GraphCapture(stop=True, collectives_in_flight=collectives_in_flight)
    jitted = thunder.jit(fn, transforms=[*transforms, capture], executors=executors)
    try:
        jitted(*example_inputs, **example_kwargs)
    except _CaptureDone:
        return capture.graph
    except Exception as e:  # the model's own failure, reported in one line
        raise ModelTraceError(f"tracing {_describe(fn)} failed: {type(e).__name__}: {e}") from e
    raise RuntimeError("the compilation finished without reaching the capture hook")


def analyze_thunderfx(fn, *example_inputs, executors=None, **example_kwargs) -> g.JointGraph:
    """The joint graph of `fn` as ThunderFX compiles it (``torch.compile`` with
    ``thunder.dynamo.ThunderCompiler`` as the backend): Dynamo's graph, its parameters as inputs,
    ``torch.utils.checkpoint`` turned into Thunder's checkpoint, then Thunder. Not run; works on meta.

    What `analyze` gives for ``thunder.jit`` differs where Dynamo changes the program (a
    checkpointed module, parameters as graph inputs). The graph is the first Thunder graph Dynamo
    hands over; raises `ModelTraceError` when Dynamo splits `fn` or the compilation fails.
    """
    from thunder.dynamo import ThunderCompiler

    capture = GraphCapture(stop=True)
    backend = ThunderCompiler(executors=executors, transforms=[capture])
    compiled = torch._dynamo.optimize(backend=backend)(fn)
    try:
        compiled(*example_inputs, **example_kwargs)
    except Exception as e:  # Dynamo wraps the capture's stop in its own error
        cause = e
        while cause is not None and not isinstance(cause, _CaptureDone):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise ModelTraceError(f"ThunderFX tracing of {_describe(fn)} failed: {type(e).__name__}: {e}") from e
    finally:
        torch._dynamo.reset()
    splits = [reason for info in backend.subgraph_infos for reason in info.split_reasons]
    if capture.graph is None or splits:
        what = f"Dynamo split it ({splits[0]})" if splits else "no Thunder graph was compiled"
        raise ModelTraceError(f"ThunderFX tracing of {_describe(fn)}: {what}; trace a smaller module")
    return capture.graph


class ModelTraceError(RuntimeError):
    """The model could not be traced by Thunder (its forward raised, or inputs were invalid)."""


def _describe(fn) -> str:
    return type(fn).__name__ if isinstance(fn, torch.nn.Module) else getattr(fn, "__name__", repr(fn))
