"""Tests of remat_opt.validation.measure: saved-tensor bytes and training-step peaks on real tensors."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch

from remat_opt import _compat  # noqa: F401  (applies the torch compatibility step before thunder)
from remat_opt.validation.measure import (
    PeakMeasurement,
    SavedMeasurement,
    format_bytes,
    measure_saved_bytes,
    measure_step_peak_bytes,
    _replay_allocations,
    trace_cpu_allocations,
)

MiB = 1 << 20
N = 1 << 14  # elements; float32 -> 64 KiB
F32_BYTES = 4


def _leaf(n: int = N) -> torch.Tensor:
    return torch.randn(n, requires_grad=True)


class _SaveGiven(torch.autograd.Function):
    """Saves exactly the tensors it is given (not ``x``) and returns ``x * 2``."""

    @staticmethod
    def forward(ctx, x, *to_save):
        ctx.save_for_backward(*to_save)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        _ = ctx.saved_tensors  # unpack once, like a real backward
        return (grad * 2,) + (None,) * len(ctx.needs_input_grad[1:])


# --------------------------------------------------------------------------------------------
# saved bytes
# --------------------------------------------------------------------------------------------


def test_sin_saves_its_input_as_input_bytes():
    x = _leaf()
    m = measure_saved_bytes(torch.sin, x)
    assert (m.saved_bytes, m.input_bytes, m.activation_bytes) == (N * F32_BYTES, N * F32_BYTES, 0)
    assert (m.n_saved_tensors, m.n_storages) == (1, 1)
    assert m.tensors[0].is_input and m.tensors[0].shape == (N,)


def test_mul_saves_both_operands_and_intermediates_are_activations():
    x, y = _leaf(), _leaf()
    m = measure_saved_bytes(lambda a, b: torch.sin(a * b), x, y)
    # mul saves a and b (inputs); sin saves the product (activation).
    assert m.input_bytes == 2 * N * F32_BYTES
    assert m.activation_bytes == N * F32_BYTES
    assert m.saved_bytes == 3 * N * F32_BYTES
    assert (m.n_saved_tensors, m.n_storages) == (3, 3)


def test_saved_view_counts_whole_storage_once():
    x = _leaf()
    base = torch.randn(4 * N)
    a, b = base[:N], base[N : 2 * N]  # two views of one 4N storage
    m = measure_saved_bytes(lambda x_: _SaveGiven.apply(x_, (x_ * 3)[: N // 2], (x_ * 3)[: N // 2]), x)
    # each `x_ * 3` is a fresh N-element storage; the half-slices keep all of it alive
    assert m.activation_bytes == 2 * N * F32_BYTES
    assert [r.nbytes for r in m.tensors] == [N // 2 * F32_BYTES] * 2
    assert [r.storage_bytes for r in m.tensors] == [N * F32_BYTES] * 2

    m = measure_saved_bytes(lambda x_, a_, b_: _SaveGiven.apply(x_, a_, b_, a_), x, a, b)
    # a and b are views of an input storage: counted once, as input
    assert (m.n_saved_tensors, m.n_storages) == (3, 1)
    assert (m.input_bytes, m.activation_bytes) == (4 * N * F32_BYTES, 0)


def test_same_activation_storage_saved_twice_counts_once():
    x = _leaf()

    def fn(x_):
        h = x_ * 3
        return _SaveGiven.apply(x_, h, h.view(2, -1), h[1:])

    m = measure_saved_bytes(fn, x)
    assert (m.n_saved_tensors, m.n_storages) == (3, 1)
    assert (m.activation_bytes, m.input_bytes) == (N * F32_BYTES, 0)


def test_module_parameters_count_as_inputs_and_output_is_usable():
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32)
    x = torch.randn(8, 64)
    m = measure_saved_bytes(lambda inp: torch.tanh(lin(inp)), x)
    # without the module known, nothing but x is an input: the weight is not saved by addmm for
    # x's grad (x does not require grad), x is saved for the weight grad, tanh saves its output.
    assert m.input_bytes == 8 * 64 * F32_BYTES
    assert m.activation_bytes == 8 * 32 * F32_BYTES

    seq = torch.nn.Sequential(lin, torch.nn.Tanh())
    m = measure_saved_bytes(seq, x)
    assert m.activation_bytes == 8 * 32 * F32_BYTES
    m.output.sum().backward()  # the graph is still attached
    assert lin.weight.grad is not None


def test_discarded_subgraph_is_not_counted():
    x = _leaf()

    def fn(x_):
        torch.sin(x_ * 5)  # sin saves x_ * 5 (a scalar mul saves no tensor); then dropped
        return torch.exp(x_)  # exp saves its output

    m = measure_saved_bytes(fn, x)
    assert m.n_released_during_forward == 1
    assert (m.n_saved_tensors, m.activation_bytes, m.input_bytes) == (1, N * F32_BYTES, 0)


def test_measurement_is_frozen_and_output_not_in_repr():
    m = measure_saved_bytes(torch.sin, _leaf())
    assert isinstance(m, SavedMeasurement)
    assert "output" not in repr(m)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.saved_bytes = 0  # type: ignore[misc]
    assert "saved" in m.summary()


def test_meta_is_refused():
    x = torch.randn(4, device="meta", requires_grad=True)
    with pytest.raises(ValueError, match="remat_opt.analyze"):
        measure_saved_bytes(torch.sin, x)
    with pytest.raises(ValueError, match="needs real tensors"):
        measure_step_peak_bytes(torch.nn.Linear(4, 4, device="meta"), torch.randn(2, 4))


# --------------------------------------------------------------------------------------------
# CPU allocation trace and step peak
# --------------------------------------------------------------------------------------------


def test_profiler_allocation_replay_is_exact():
    def allocate():
        a = torch.empty(MiB // F32_BYTES)
        b = torch.empty(2 * MiB // F32_BYTES)  # 3 MiB live
        del a  # 2 MiB live
        c = torch.empty(4 * MiB // F32_BYTES)  # 6 MiB live: the peak
        keep.append(c)  # survives the call
        del b

    keep: list[torch.Tensor] = []
    trace = trace_cpu_allocations(allocate)
    assert trace.peak_delta_bytes == 6 * MiB
    assert trace.end_delta_bytes == 4 * MiB
    assert (trace.n_allocations, trace.n_frees, trace.n_foreign_frees) == (3, 2, 0)


def test_profiler_ignores_frees_of_older_blocks():
    old = [torch.empty(MiB // F32_BYTES)]
    trace_cpu_allocations(lambda: old.append(torch.empty(2 * MiB // F32_BYTES)))  # profiled block

    def free_old_then_allocate():
        old.clear()  # frees a pre-existing block and one allocated in an earlier profile
        torch.empty(MiB // F32_BYTES)

    trace = trace_cpu_allocations(free_old_then_allocate)
    assert trace.peak_delta_bytes == MiB and trace.end_delta_bytes == 0
    # The free of the earlier-profiled block is reported (and ignored); the free of `old`'s
    # first block is not reported at all (the allocator never learned its size).
    assert trace.n_foreign_frees >= 1


def test_other_threads_blocks_are_reported_apart_from_the_callers():
    # (time, order, ptr, signed bytes, on the caller's thread): gloo's worker threads stage
    # collectives in blocks of their own; a block of the caller's may be freed on another thread
    events = [
        (1, 0, 0x10, 100, True),
        (2, 1, 0x20, 64, False),  # a worker's staging buffer, alive across the caller's peak
        (3, 2, 0x30, 50, True),
        (4, 3, 0x10, -100, False),  # the caller's block, released by the worker
        (5, 4, 0x20, -64, False),
    ]
    trace = _replay_allocations(events)
    assert (trace.peak_delta_bytes, trace.end_delta_bytes, trace.other_threads_peak_bytes) == (150, 50, 64)
    assert (trace.n_allocations, trace.n_frees) == (2, 1)
    assert trace.live_delta_bytes == (100, 150, 50)


def test_peak_measurement_repr_leaves_out_the_timeline():
    peak = PeakMeasurement(peak_bytes=10, baseline_bytes=4, step_peak_delta_bytes=6, end_delta_bytes=0,
                           device="cpu", method="cpu_profiler", timeline_bytes=tuple(range(1000)))
    assert "timeline" not in repr(peak) and len(repr(peak)) < 300


class _KnownAllocations(torch.autograd.Function):
    """Forward allocates N floats; backward allocates 2N (freed) and the N-float gradient."""

    @staticmethod
    def forward(ctx, x):
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, grad):
        scratch = torch.empty(2 * grad.numel())
        grad_x = torch.empty(grad.numel())
        del scratch
        return grad_x


def test_step_peak_of_known_allocations_is_exact():
    x = _leaf()
    m = measure_step_peak_bytes(_KnownAllocations.apply, x)
    assert isinstance(m, PeakMeasurement) and m.method == "cpu_profiler" and m.device == "cpu"
    # The output (N floats) is released once the 0-d loss exists; backward then holds the
    # 0-d loss and its 0-d ones seed (2 * 4 bytes) plus scratch (2N) and grad_x (N) floats.
    assert m.step_peak_delta_bytes == 3 * N * F32_BYTES + 2 * F32_BYTES
    assert m.end_delta_bytes == N * F32_BYTES  # x.grad (grad_x is stolen, not copied)
    assert m.baseline_bytes == N * F32_BYTES  # x; its old .grad was set to None
    # In all, at the peak: x, scratch and grad_x (4N floats) and the two 0-d tensors.
    assert m.peak_bytes == 4 * N * F32_BYTES + 2 * F32_BYTES
    assert x.grad is not None and x.grad.shape == x.shape
    # the measured timeline: from the baseline, through the peak, to what the step leaves
    assert m.timeline_bytes[0] == m.baseline_bytes and max(m.timeline_bytes) == m.peak_bytes
    assert m.timeline_bytes[-1] == m.baseline_bytes + m.end_delta_bytes


class _ScaleExp(torch.nn.Module):
    """``exp(x * w)`` with a weight of N floats: a one-layer model whose allocations are known."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(N))

    def forward(self, x):
        return torch.exp(x * self.w)


def test_step_peak_of_a_tiny_model_matches_a_hand_count():
    model, x = _ScaleExp(), torch.randn(N)  # x needs no gradient
    m = measure_step_peak_bytes(model, x)
    # Live storages, in N-float units, step by step:
    #   before the step: x and w (the baseline: 2)
    #   forward:  t = x * w (3); e = exp(t) (4, the forward's peak); t freed, e kept: exp saves its
    #             output (3); loss = e.sum() (3 + a 0-d float)
    #   backward: seed ones (3 + two 0-d); exp's gradient g = seed * e (4 + two 0-d: the peak);
    #             e freed (3); w's gradient g * x (4 + two 0-d: the peak again), kept as w.grad;
    #             g freed (3)
    #   after the step: x, w and w.grad (3)
    assert m.baseline_bytes == 2 * N * F32_BYTES
    assert m.peak_bytes == 4 * N * F32_BYTES + 2 * F32_BYTES
    assert m.end_delta_bytes == N * F32_BYTES
    torch.testing.assert_close(model.w.grad, x * torch.exp(x * model.w.detach()))


def test_kept_grads_are_part_of_the_baseline():
    x = _leaf()
    m = measure_step_peak_bytes(torch.sin, x, set_grads_to_none=False)  # warmup made x.grad
    assert m.baseline_bytes == 2 * N * F32_BYTES


def test_default_loss_needs_a_tensor_output():
    with pytest.raises(TypeError, match="loss_fn"):
        measure_step_peak_bytes(lambda x: "not a tensor", _leaf(), warmup_steps=0)
    m = measure_step_peak_bytes(lambda x: {"a": x * 2}, _leaf(), loss_fn=lambda out: out["a"].sum())
    assert m.end_delta_bytes == N * F32_BYTES


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(6 * MiB) == "6.00 MiB"
    assert format_bytes(int(2.25 * (1 << 30))) == "2.25 GiB"
    assert format_bytes(-3 * MiB // 2) == "-1.50 MiB"


# --------------------------------------------------------------------------------------------
# Thunder
# --------------------------------------------------------------------------------------------


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 32))


def _thunder_saved_for_backward(jitted) -> tuple[Counter, int, int]:
    """(shape, dtype, is_input) counts and activation/input bytes from the forward trace."""
    import thunder

    fw = thunder.last_traces(jitted)[-1]
    saved_proxies = fw.output[1][0]  # return ({'output': ...}, ((saved tensors), (saved other)))
    input_names = {a.name for a in fw.args}
    counts: Counter = Counter()
    nbytes = {True: 0, False: 0}
    for p in saved_proxies:
        is_input = p.name in input_names
        counts[(tuple(p.shape), thunder.dtypes.to_torch_dtype(p.dtype), is_input)] += 1
        numel = 1
        for s in p.shape:
            numel *= s
        nbytes[is_input] += numel * p.dtype.bytes
    return counts, nbytes[False], nbytes[True]


def test_thunder_jit_saved_tensors_match_the_trace():
    import thunder

    mlp = _mlp()
    jm = thunder.jit(mlp)
    x = torch.randn(8, 64)
    m = measure_saved_bytes(jm, x)
    counts, activation_bytes, input_bytes = _thunder_saved_for_backward(jm)
    measured = Counter((r.shape, r.dtype, r.is_input) for r in m.tensors)
    assert measured == counts
    assert m.activation_bytes == activation_bytes > 0
    assert m.input_bytes == input_bytes > 0  # a weight and x are saved
    m.output.sum().backward()
    assert mlp[0].weight.grad is not None


def test_thunder_jit_step_peak_covers_saved_activations():
    import thunder

    jm = thunder.jit(_mlp())
    x = torch.randn(8, 64)
    saved = measure_saved_bytes(jm, x)
    params_bytes = sum(p.numel() * p.element_size() for p in jm.parameters())
    m = measure_step_peak_bytes(jm, x)
    assert m.baseline_bytes == params_bytes + x.numel() * x.element_size()
    assert m.peak_bytes >= m.baseline_bytes + saved.activation_bytes
    assert m.end_delta_bytes == params_bytes  # one new .grad per parameter


@pytest.mark.requires_cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_step_peak_uses_the_caching_allocator():
    mlp = _mlp().cuda()
    x = torch.randn(8, 64, device="cuda")
    saved = measure_saved_bytes(mlp, x)
    m = measure_step_peak_bytes(mlp, x)
    assert m.method == "cuda_allocator" and m.device.startswith("cuda")
    # Everything allocated on the device before the step counts: at least the parameters and x.
    params_bytes = sum(p.numel() * p.element_size() for p in mlp.parameters())
    assert m.baseline_bytes >= params_bytes + x.numel() * x.element_size()
    assert m.step_peak_delta_bytes >= saved.activation_bytes > 0
    assert m.end_delta_bytes >= sum(p.numel() * p.element_size() for p in mlp.parameters())
