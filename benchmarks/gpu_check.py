"""GPU check: Thunder alone vs CostRemat at several peak budgets, measured against the plan's prediction.

    .venv/bin/python benchmarks/gpu_check.py --model Llama-2-7b-hf --n-layer 2 --seq 4096 --steps 10
    .venv/bin/python benchmarks/gpu_check.py --n-layer 4 --budgets-frac 1.0,0.9,0.8

For one Llama-style litgpt config (bf16, micro-batch 1, on one CUDA device; nvFuser and cuDNN
executors when importable) it runs, one after the other:

* ``thunder``: `thunder.jit` with no transform;
* ``CostRemat zero-time``: `CostRemat()` with no budget, whose plan gives the predicted save-all peak;
* ``CostRemat x.xx``: `CostRemat(budget_gb=frac * predicted save-all peak)` per ``--budgets-frac``.

Per run it prints the measured step peak (`remat_opt.validation.measure.measure_step_peak_bytes`, i.e.
``torch.cuda.max_memory_allocated`` over one step) next to the plan's ``peak_bytes`` (`remat_opt.transform.explain.last_planned_step`), the
median step time (CUDA events, after warm-up), and whether an SDPA forward was recomputed (an SDPA
forward symbol in ``thunder.last_backward_traces(jitted)[-1]``).

Then the ``nvFusionN`` regions of Thunder's own compilation are timed whole on the GPU
through the fusion definitions Thunder built (`remat_opt.costing.profiling.profile_graph`, CUDA events), and
the summed table is printed beside Thunder alone's median step; with ``--auto-costs`` one more run
plans at the first budget with ``cost_table="auto"`` (regions timed whole price the recomputed ops).

Without CUDA it exits with status 2 and ``needs CUDA: ...``.
"""

from __future__ import annotations

import argparse
import gc
import re
import statistics
import sys

GB = 10**9
SDPA_FWD = re.compile(r"(sdpa|sdpfa|scaled_dot_product|flash_attn).*(fwd|forward)|(fwd|forward).*(sdpa|scaled_dot_product)")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Llama-2-7b-hf", help="litgpt config name")
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1, help="micro-batch size")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run (at least 10 recommended)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before timing")
    parser.add_argument("--budgets-frac", default="1.0,0.9,0.8",
                        help="peak budgets as fractions of the predicted save-all peak")
    parser.add_argument("--device-spec", default=None,
                        help="cost-model device spec (default: from torch.cuda.get_device_name())")
    parser.add_argument("--no-cudnn", action="store_true", help="leave the cuDNN executor out")
    parser.add_argument("--auto-costs", action="store_true",
                        help="one more run at the first budget with cost_table='auto' (ops and regions timed first)")
    args = parser.parse_args(argv)
    try:
        args.fractions = [float(x) for x in args.budgets_frac.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--budgets-frac: expected comma-separated numbers, got {args.budgets_frac!r}")
    if not args.fractions or any(not f > 0 for f in args.fractions):
        parser.error(f"--budgets-frac: expected positive fractions, got {args.budgets_frac!r}")
    if args.steps < 1 or args.n_layer < 1 or args.seq < 1:
        parser.error("--steps, --n-layer and --seq must be positive")
    return args


def require_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        reason = "torch.cuda.is_available() is False"
        if torch.version.cuda is None:
            reason += " (this torch is a CPU-only build)"
        print(f"needs CUDA: {reason}; run this on a machine with an NVIDIA GPU", file=sys.stderr)
        sys.exit(2)


def executors(no_cudnn: bool) -> tuple[list, list[str]]:
    """cuDNN (if importable and available), Thunder's SDPA executor, then Thunder's defaults (nvFuser...)."""
    import thunder

    extra = []
    if not no_cudnn:
        try:
            from thunder.executors.cudnnex import cudnn_ex

            if cudnn_ex is not None and cudnn_ex.is_available():
                extra.append(cudnn_ex)
        except Exception as e:  # noqa: BLE001  (cuDNN frontend missing or broken: run without it)
            print(f"note: no cuDNN executor ({type(e).__name__}: {e})", file=sys.stderr)
    try:
        from thunder.executors.sdpaex import sdpa_ex

        extra.append(sdpa_ex)
    except Exception as e:  # noqa: BLE001
        print(f"note: no torch SDPA executor ({type(e).__name__}: {e})", file=sys.stderr)
    names = {ex.name for ex in extra}
    ex_list = [*extra, *(ex for ex in thunder.get_default_executors() if ex.name not in names)]
    return ex_list, [ex.name for ex in ex_list]


def build_model(args):
    import torch
    from litgpt import GPT, Config

    config = Config.from_name(args.model, n_layer=args.n_layer, block_size=args.seq)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = GPT(config).to(torch.bfloat16)
    x = torch.randint(0, config.padded_vocab_size, (args.batch, args.seq), device="cuda")
    return model, x


def _symbol_names(bsyms):
    for b in bsyms:
        yield b.sym.name
        yield from _symbol_names(b.subsymbols)


def sdpa_recomputed(jitted) -> tuple[bool, list[str]]:
    """Whether an SDPA forward symbol appears in the last backward trace, and which."""
    import thunder

    traces = thunder.last_backward_traces(jitted)
    if not traces:
        return False, []
    found = sorted({n for n in _symbol_names(traces[-1].bound_symbols) if SDPA_FWD.search(n.lower())})
    return bool(found), found


def step(jitted, model, x) -> None:
    model.zero_grad(set_to_none=True)
    jitted(x).float().sum().backward()


def median_step_ms(jitted, model, x, warmup: int, steps: int) -> float:
    import torch

    for _ in range(warmup):
        step(jitted, model, x)
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(jitted, model, x)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run_one(label, transform, model, x, ex_list, args) -> dict:
    import thunder
    import torch

    from remat_opt.validation.measure import measure_step_peak_bytes

    row = {"label": label, "predicted": None, "measured": None, "max_alloc": None, "ms": None,
           "sdpa": None, "tags": None, "error": None}
    jitted = thunder.jit(model, transforms=[] if transform is None else [transform], executors=ex_list)
    try:
        model.zero_grad(set_to_none=True)
        peak = measure_step_peak_bytes(jitted, x, warmup_steps=1)
        row["measured"] = peak.peak_bytes
        row["max_alloc"] = torch.cuda.max_memory_allocated()
        if transform is not None:
            from remat_opt.transform.explain import last_planned_step

            step = last_planned_step(jitted)
            row["predicted"] = step.plan.peak_bytes
            row["tags"] = len(step.plan.recomputed_tag_targets)
            row["save_all_peak"] = _save_all_peak(step)
        row["sdpa"] = sdpa_recomputed(jitted)
        row["ms"] = median_step_ms(jitted, model, x, args.warmup, args.steps)
    except Exception as e:  # noqa: BLE001  (e.g. an infeasible budget: report it and go on)
        row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    finally:
        del jitted
        model.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache()
    return row


def _save_all_peak(planned_step) -> int:
    from remat_opt.planning.explanation import explain_step

    return explain_step(planned_step).save_all_peak_bytes


def _fmt_gb(n) -> str:
    return "-" if n is None else f"{n / GB:.3f}"


def print_row(row, base_ms) -> None:
    if row["error"]:
        print(f"{row['label']:<24} ERROR {row['error']}", flush=True)
        return
    recomputed, names = row["sdpa"]
    ratio = "-" if not base_ms else f"{row['ms'] / base_ms:.3f}"
    err = "-"
    if row["predicted"]:
        err = f"{(row['measured'] - row['predicted']) / row['predicted']:+.1%}"
    print(f"{row['label']:<24}{_fmt_gb(row['measured']):>12}{_fmt_gb(row['max_alloc']):>12}"
          f"{_fmt_gb(row['predicted']):>12}{err:>9}{row['ms']:>11.2f}{ratio:>8}"
          f"{'-' if row['tags'] is None else row['tags']:>6}  "
          f"{'yes ' + ','.join(names) if recomputed else 'no'}", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    require_cuda()

    # isort: off
    from remat_opt import _compat  # noqa: F401  (applies the torch compatibility step before thunder)
    import thunder
    import torch

    # isort: on
    from costmodels.devices import get_device_spec
    from remat_opt.transform.cost_remat import CostRemat

    device_name = torch.cuda.get_device_name()
    spec = get_device_spec(args.device_spec or device_name).name
    ex_list, ex_names = executors(args.no_cudnn)
    model, x = build_model(args)
    print(f"{args.model} n_layer={args.n_layer} seq={args.seq} batch={args.batch} bf16 on {device_name} "
          f"(spec {spec}); executors {', '.join(ex_names)}; torch {torch.__version__}, thunder "
          f"{getattr(thunder, '__version__', '?')}; {args.warmup} warm-up + {args.steps} timed steps", flush=True)
    print(f"{'run':<24}{'meas GB':>12}{'maxalloc GB':>12}{'pred GB':>12}{'err':>9}{'median ms':>11}"
          f"{'ratio':>8}{'tags':>6}  SDPA recomputed", flush=True)

    base = run_one("thunder", None, model, x, ex_list, args)
    base_ms = base["ms"]
    print_row(base, base_ms)
    zero = run_one("CostRemat zero-time", CostRemat(device_spec=spec), model, x, ex_list, args)
    print_row(zero, base_ms)
    save_all_peak = zero.get("save_all_peak")
    if not save_all_peak:
        print("no predicted save-all peak (the zero-time run failed); skipping the budget runs", flush=True)
        return 1
    print(f"predicted save-all peak {save_all_peak / GB:.3f} GB", flush=True)
    for frac in args.fractions:
        budget_gb = frac * save_all_peak / GB
        row = run_one(f"CostRemat {frac:.2f} ({budget_gb:.1f}GB)", CostRemat(budget_gb=budget_gb, device_spec=spec),
                      model, x, ex_list, args)
        print_row(row, base_ms)
    if args.auto_costs:
        budget_gb = args.fractions[0] * save_all_peak / GB
        row = run_one(f"auto costs {args.fractions[0]:.2f}", CostRemat(budget_gb=budget_gb, cost_table="auto"),
                      model, x, ex_list, args)
        print_row(row, base_ms)
    for check in (standin_against_nvfuser, regions_timed_whole):
        try:
            check(args, model, x, ex_list, base)
        except Exception as e:  # noqa: BLE001  (report it; the runs above stand)
            print(f"{check.__name__} failed: {type(e).__name__}: {e}", flush=True)
    return 0


def regions_timed_whole(args, model, x, ex_list, base: dict) -> None:
    """On a GPU: every op and nvFusion region of Thunder's compilation timed on the device
    (regions whole, through the fusion definitions Thunder built), summed beside the measured step."""
    from costmodels.formulas import is_fusion_symbol
    from remat_opt import analyze
    from remat_opt.costing.graph_costs import CostModel
    from remat_opt.costing.profiling import REGION_NOTE, profile_graph

    graph = analyze(model, x, executors=ex_list)
    table = profile_graph(graph, device="cuda", progress=False, model=f"{args.model} n_layer={args.n_layer}")
    regions = sum(is_fusion_symbol(op.symbol) for op in graph.ops)
    timed = sum(e.note == REGION_NOTE for e in table.entries.values())
    total_ms = 1e3 * CostModel(graph, table=table).total_time_s()
    print(f"regions timed whole on the GPU: {timed} distinct of {regions} regions in the graph; {len(table.entries)} "
          f"distinct ops and regions timed, {len(table.skipped)} skipped; summed table {total_ms:.2f} ms vs Thunder's "
          f"median step {base.get('ms', float('nan')):.2f} ms", flush=True)
    for key, reason in table.skipped[:10]:
        print(f"  skipped {key[:100]}: {reason}", flush=True)


def standin_against_nvfuser(args, model, x, ex_list, base: dict) -> None:
    """What a GPU run settles about the nvFuser stand-in: the saved set it predicts on meta
    beside the one Thunder saves with the real nvFuser, per layer, matched by (producer, shape, dtype),
    and the stand-in's predicted save-all peak beside Thunder alone's measured peak."""
    import torch

    from remat_opt import analyze
    from remat_opt.executors import executors_for
    from remat_opt.validation.graph_diff import saved_set_differences, saved_signatures
    from remat_opt.core.simulation import simulate_peak_bytes

    real = analyze(model, x, executors=ex_list)
    with torch.device("meta"):
        meta_model = type(model)(model.config).to(torch.bfloat16)
    meta_x = torch.zeros_like(x, device="meta")
    predicted = analyze(meta_model, meta_x, executors=executors_for("nvfuser-standin"))
    print(f"nvFuser stand-in on meta: saves {predicted.saved_activation_bytes / GB:.3f} GB, save-all peak "
          f"{simulate_peak_bytes(predicted) / GB:.3f} GB; Thunder with nvFuser: saves "
          f"{real.saved_activation_bytes / GB:.3f} GB, measured peak {(base.get('measured') or float('nan')) / GB:.3f} GB")
    differences = saved_set_differences(saved_signatures(predicted), saved_signatures(real))
    print("saved sets match per layer (producer, shape, dtype)" if not differences else
          "saved-set differences (stand-in vs nvFuser):\n  " + "\n  ".join(differences), flush=True)


if __name__ == "__main__":
    sys.exit(main())
