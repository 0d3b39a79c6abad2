"""`lltm bench`: forward and backward time of every backend, side by side with
peers (torch.compile of the python cell, nn.LSTMCell, the bare GEMMs).

Two timings per row:
- the tutorial's method: host clock around each pass, synchronised, over
  --runs passes (median and min), forward and backward separately;
- torch.utils.benchmark.Timer.blocked_autorange (median), forward alone and
  forward + backward; backward is their difference.

Backward is `torch.autograd.backward((new_h, new_cell), (grad_h, grad_cell))`
with fixed output gradients, so it times the backward pass alone (the
tutorial summed the outputs first, which adds three eager ops). By default
every input needs a gradient (input, state and parameters, as inside an
unrolled sequence); --param-grads-only reproduces the tutorial's setting.
Each backward starts from `.grad = None` on every leaf, as after
`optimizer.zero_grad()` in a training step, so AccumulateGrad hands the
gradient over instead of adding it; --accumulate-grads keeps the tutorial's
loop, which adds into `.grad` on every pass (one extra kernel per leaf).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import torch
from torch import Tensor, nn

from lltm import _backends, functional
from lltm.reference import lltm_cell_reference

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
BACKEND_ROWS = ("python", "aten", "fused")
PEER_ROWS = ("compile", "compile-ro", "lstmcell", "gemm")
SEQ_PEER_ROWS = ("lstm",)

Outputs = tuple[Tensor, ...]


@dataclass
class Case:
    """One row to time: forward() -> outputs, backward(outputs) -> None."""

    name: str
    forward: Callable[[], Outputs]
    backward: Callable[[Outputs], None]
    note: str = ""


@dataclass
class Result:
    name: str
    fwd_median_us: float
    fwd_min_us: float
    bwd_median_us: float
    bwd_min_us: float
    timer_fwd_us: float
    timer_bwd_us: float
    note: str = ""
    speedup_fwd: Optional[float] = None
    speedup_bwd: Optional[float] = None
    extra: dict = field(default_factory=dict)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _autograd_backward(grads: Outputs, leaves: list[Tensor], accumulate: bool) -> Callable[[Outputs], None]:
    """backward(outputs): autograd into `.grad` of `leaves`, reset to None
    first unless `accumulate` (set-to-None costs no kernel; zeroing would)."""
    leaves = [t for t in leaves if t.requires_grad]

    def backward(outputs: Outputs) -> None:
        if not accumulate:
            for t in leaves:
                t.grad = None
        torch.autograd.backward(outputs[: len(grads)], grads)

    return backward


def _cell_cases(args, device: torch.device, dtype: torch.dtype) -> list[Case]:
    B, I, S = args.batch_size, args.features, args.state_size
    gen = torch.Generator(device="cpu").manual_seed(args.seed)

    def rand(*shape, grad: bool, scale: float = 1.0) -> Tensor:
        t = (torch.rand(*shape, generator=gen) * 2 - 1) * scale
        return t.to(device=device, dtype=dtype).requires_grad_(grad)

    input_grad = not args.param_grads_only
    x = rand(B, I, grad=input_grad)
    h = rand(B, S, grad=input_grad)
    c = rand(B, S, grad=input_grad)
    bound = S**-0.5
    W = rand(3 * S, S + I, grad=True, scale=bound)
    b = rand(3 * S, grad=True, scale=bound)
    grads = (rand(B, S, grad=False), rand(B, S, grad=False))
    backward = _autograd_backward(grads, [x, h, c, W, b], args.accumulate_grads)

    cases: list[Case] = []
    for name in args.rows:
        if name in BACKEND_ROWS:
            if not _backends.is_available(name, device.type):
                print(f"lltm bench: skipping {name!r}: not available on {device.type}", file=sys.stderr)
                continue

            def fwd(name=name):
                return functional.lltm_cell(x, W, b, h, c, backend=name)

            cases.append(Case(name, fwd, backward))
        elif name in ("compile", "compile-ro"):
            if name == "compile-ro" and device.type != "cuda":
                continue  # reduce-overhead means CUDA graphs
            mode = "reduce-overhead" if name == "compile-ro" else None
            compiled = torch.compile(lltm_cell_reference, mode=mode, fullgraph=True)
            if mode is None:

                def fwd(compiled=compiled):
                    return compiled(x, W, b, h, c)

            else:

                def fwd(compiled=compiled):
                    torch.compiler.cudagraph_mark_step_begin()
                    return compiled(x, W, b, h, c)

            cases.append(Case(name, fwd, backward, note="torch.compile of the python cell" + (f", {mode}" if mode else "")))
        elif name == "lstmcell":
            cell = nn.LSTMCell(I, S, device=device, dtype=dtype)

            def fwd(cell=cell):
                return cell(x, (h, c))

            cell_backward = _autograd_backward(grads, [x, h, c, *cell.parameters()], args.accumulate_grads)
            cases.append(Case(name, fwd, cell_backward, note="nn.LSTMCell, same state size"))
        elif name == "gemm":
            # The floor: the GEMMs every backend must run. Forward: gates =
            # addmm(b, X, W^T); backward: dX = dG W and dW = dG^T X.
            X = rand(B, S + I, grad=False)
            Wd, bd = W.detach(), b.detach()
            dG = rand(B, 3 * S, grad=False)

            def fwd():
                return (torch.addmm(bd, X, Wd.t()),)

            def bwd(_outputs):
                torch.mm(dG, Wd)
                torch.mm(dG.t(), X)

            cases.append(Case(name, fwd, bwd, note="bare GEMMs: addmm / two mm"))
        else:
            raise ValueError(f"lltm bench: unknown row {name!r}; choose from {', '.join(BACKEND_ROWS + PEER_ROWS)}")
    return cases


def _seq_cases(args, device: torch.device, dtype: torch.dtype) -> list[Case]:
    from lltm.modules import LLTM

    T, B, I, S = args.seq, args.batch_size, args.features, args.state_size
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    x = (torch.rand(T, B, I, generator=gen) * 2 - 1).to(device=device, dtype=dtype)
    x.requires_grad_(not args.param_grads_only)
    grad_out = (torch.rand(T, B, S, generator=gen) * 2 - 1).to(device=device, dtype=dtype)
    cases: list[Case] = []
    for name in args.rows:
        if name in BACKEND_ROWS:
            if not _backends.is_available(name, device.type):
                print(f"lltm bench: skipping {name!r}: not available on {device.type}", file=sys.stderr)
                continue
            module = LLTM(I, S, backend=name, device=device, dtype=dtype)
        elif name == "lstm":
            module = nn.LSTM(I, S, device=device, dtype=dtype)
        else:
            continue

        def fwd(module=module):
            output, (h_n, c_n) = module(x)
            return (output,)

        backward = _autograd_backward((grad_out,), [x, *module.parameters()], args.accumulate_grads)
        note = "nn.LSTM, same state size" if name == "lstm" else f"lltm.LLTM, T={T}"
        cases.append(Case(name, fwd, backward, note=note))
    return cases


def _host_clock(case: Case, args, device: torch.device, progress) -> tuple[list[float], list[float]]:
    """The tutorial's method: host clock around each synchronised pass;
    returns the forward and backward times (s) of every pass."""
    for _ in range(args.warmup):  # compilation, caches, cuBLAS handles
        case.backward(case.forward())
    _sync(device)
    fwd_times, bwd_times = [], []
    for _ in range(args.runs):
        _sync(device)
        t0 = time.perf_counter()
        outputs = case.forward()
        _sync(device)
        t1 = time.perf_counter()
        case.backward(outputs)
        _sync(device)
        t2 = time.perf_counter()
        fwd_times.append(t1 - t0)
        bwd_times.append(t2 - t1)
        del outputs
        progress.update(1)
    return fwd_times, bwd_times


def _timer_round(case: Case, args) -> tuple[float, float]:
    """torch.utils.benchmark medians (µs) of the forward and of a whole
    step; backward is their difference."""
    from torch.utils.benchmark import Timer

    def step():
        case.backward(case.forward())

    scope = {"forward": case.forward, "step": step}
    t_fwd = Timer("forward()", globals=scope).blocked_autorange(min_run_time=args.min_run_time).median
    t_step = Timer("step()", globals=scope).blocked_autorange(min_run_time=args.min_run_time).median
    return t_fwd * 1e6, max(t_step - t_fwd, 0.0) * 1e6


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


def format_table(results: list[Result], meta: dict) -> str:
    head = (
        f"LLTM cell{'' if not meta.get('seq') else ' sequence T=' + str(meta['seq'])}: "
        f"batch {meta['batch_size']}, features {meta['features']}, state {meta['state_size']}, "
        f"{meta['dtype']} on {meta['device_name']}; torch {meta['torch']}; {meta['date']}\n"
        f"runs {meta['runs']} (host clock, synchronised) + torch.utils.benchmark blocked_autorange, "
        f"median of {meta.get('rounds', 1)} interleaved rounds; "
        f"gradients: {meta['gradients']}\n"
    )
    cols = ("row", "fwd med", "fwd min", "bwd med", "bwd min", "fwd Timer", "bwd Timer", "fwd x", "bwd x", "f+b x")
    lines = [" | ".join(f"{c:>10}" for c in cols)]
    lines.append("-" * len(lines[0]))
    base = next((r for r in results if r.name == "python"), None)
    for r in results:
        if base is not None:
            fx = base.timer_fwd_us / r.timer_fwd_us if r.timer_fwd_us else float("nan")
            bx = base.timer_bwd_us / r.timer_bwd_us if r.timer_bwd_us else float("nan")
            tot = (base.timer_fwd_us + base.timer_bwd_us) / max(r.timer_fwd_us + r.timer_bwd_us, 1e-9)
            ratios = (f"{fx:.2f}", f"{bx:.2f}", f"{tot:.2f}")
        else:
            ratios = ("-", "-", "-")
        vals = (
            r.name,
            f"{r.fwd_median_us:.1f}",
            f"{r.fwd_min_us:.1f}",
            f"{r.bwd_median_us:.1f}",
            f"{r.bwd_min_us:.1f}",
            f"{r.timer_fwd_us:.1f}",
            f"{r.timer_bwd_us:.1f}",
            *ratios,
        )
        lines.append(" | ".join(f"{v:>10}" for v in vals))
    foot = "times in µs; x = speed-up over python (Timer medians), higher is faster"
    gemm = next((r for r in results if r.name == "gemm"), None)
    if gemm is not None:
        foot += "\ntime / GEMM floor (Timer medians): " + ", ".join(
            f"{r.name} fwd {r.timer_fwd_us / gemm.timer_fwd_us:.2f} bwd {r.timer_bwd_us / max(gemm.timer_bwd_us, 1e-9):.2f}"
            for r in results
            if r.name != "gemm"
        )
    return head + "\n".join(lines) + "\n" + foot


def _plot(results: list[Result], meta: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.name for r in results]
    xs = range(len(names))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(names)), 4))
    width = 0.4
    ax.bar([x - width / 2 for x in xs], [r.timer_fwd_us for r in results], width, label="forward")
    ax.bar([x + width / 2 for x in xs], [r.timer_bwd_us for r in results], width, label="backward")
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("µs (torch.utils.benchmark median)")
    ax.set_title(
        f"LLTM {meta['batch_size']}x{meta['features']}x{meta['state_size']} {meta['dtype']}, {meta['device_name']}",
        fontsize=9,
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-b", "--batch-size", type=int, default=16)
    p.add_argument("-f", "--features", type=int, default=32)
    p.add_argument("-s", "--state-size", type=int, default=128)
    p.add_argument("-r", "--runs", type=int, default=100, help="timed passes of the host-clock method")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--min-run-time", type=float, default=0.5, help="seconds per blocked_autorange")
    p.add_argument(
        "--rounds", type=int, default=3, help="Timer measurements per row, rows interleaved; the median is reported"
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("-d", "--double", action="store_true", help="shorthand for --dtype float64")
    p.add_argument(
        "--rows",
        "--backends",
        dest="rows",
        default=None,
        help="comma-separated rows (default: all available): " + ",".join(BACKEND_ROWS + PEER_ROWS),
    )
    p.add_argument("--seq", type=int, default=0, help="time the LLTM module over SEQ steps, nn.LSTM as peer")
    p.add_argument("--param-grads-only", action="store_true", help="only parameters need gradients (the tutorial's setting)")
    p.add_argument(
        "--accumulate-grads",
        action="store_true",
        help="add into .grad on every pass (the tutorial's loop) instead of starting each backward from .grad = None",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results as JSON here")
    p.add_argument("--plot", help="write a PNG bar chart here (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("lltm bench: --device cuda asked for, but torch sees no CUDA device", file=sys.stderr)
        return 2
    if args.runs < 1 or args.rounds < 1:
        raise ValueError(f"lltm bench: --runs and --rounds must be at least 1, got {args.runs} and {args.rounds}")
    dtype = torch.float64 if args.double else DTYPES[args.dtype]
    if device.type == "cuda":
        if device.index is None:  # "cuda" means the current device
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    default_rows = BACKEND_ROWS + (SEQ_PEER_ROWS if args.seq else PEER_ROWS)
    args.rows = [r.strip() for r in args.rows.split(",")] if args.rows else list(default_rows)
    cases = _seq_cases(args, device, dtype) if args.seq else _cell_cases(args, device, dtype)

    from tqdm import tqdm

    total = (args.runs + args.rounds) * len(cases)
    with tqdm(total=total, desc="lltm bench", unit="pass", disable=args.no_progress or None, file=sys.stderr) as progress:
        clocks = []
        for case in cases:
            progress.set_postfix_str(case.name)
            clocks.append(_host_clock(case, args, device, progress))
        # The Timer rows are measured in rounds, every row once per round, and
        # each row reports its median over the rounds: a slow spell of a noisy
        # machine then hits every row alike instead of one row's whole sample.
        rounds: list[list[tuple[float, float]]] = [[] for _ in cases]
        for _ in range(args.rounds):
            for i, case in enumerate(cases):
                progress.set_postfix_str(f"{case.name} (Timer)")
                rounds[i].append(_timer_round(case, args))
                progress.update(1)
    us = 1e6
    results = [
        Result(
            name=case.name,
            fwd_median_us=statistics.median(fwd) * us,
            fwd_min_us=min(fwd) * us,
            bwd_median_us=statistics.median(bwd) * us,
            bwd_min_us=min(bwd) * us,
            timer_fwd_us=statistics.median(f for f, _ in samples),
            timer_bwd_us=statistics.median(b for _, b in samples),
            note=case.note,
            extra={"timer_rounds_us": [[round(f, 2), round(b, 2)] for f, b in samples]},
        )
        for case, (fwd, bwd), samples in zip(cases, clocks, rounds)
    ]
    base = next((r for r in results if r.name == "python"), None)
    if base is not None:
        for r in results:
            r.speedup_fwd = base.timer_fwd_us / r.timer_fwd_us if r.timer_fwd_us else None
            r.speedup_bwd = base.timer_bwd_us / r.timer_bwd_us if r.timer_bwd_us else None
    meta = {
        "batch_size": args.batch_size,
        "features": args.features,
        "state_size": args.state_size,
        "seq": args.seq,
        "dtype": str(dtype).replace("torch.", ""),
        "device": str(device),
        "device_name": _device_name(device),
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "runs": args.runs,
        "rounds": args.rounds,
        "gradients": ("parameters only" if args.param_grads_only else "input, state and parameters")
        + (", accumulated into .grad" if args.accumulate_grads else ", .grad reset to None per step"),
        "matmul_precision": torch.get_float32_matmul_precision(),
    }
    print(format_table(results, meta))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": [asdict(r) for r in results]}, f, indent=2)
    if args.plot:
        _plot(results, meta, args.plot)
    return 0
