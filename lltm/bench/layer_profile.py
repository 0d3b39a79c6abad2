"""Where the time of one fused layer's forward + backward goes on the GPU: a torch.profiler table per
size (kernels and the host ops around them) of a few fwd + bwd passes of lltm.LLTM / LSTM / GRU, input
(T, B, I) with I = S and a loss on the output. Uses only the public modules, so the same file profiles
an earlier tree too (run it with that tree first on PYTHONPATH).

    python -m lltm.bench.layer_profile [--sizes 16x128,16x256] [--steps 100] [--cell lltm] [--dtype float32]
                                       [--tf32] [--time | --timeline [--peer]]

--timeline prints, instead of the profile, one forward + backward pass's kernels in launch order (start,
idle gap before it, duration; µs), and with --peer the same for torch's module (nn.LSTM, or nn.GRU for
the GRU) on the same input: which kernel of the pass differs from cuDNN's, and where the device waits.

--time prints, instead of the profile, one line per size: the forward and forward + backward
(torch.utils.benchmark medians, device and host together) and the host's own cost of one
forward + backward (the calls queued behind a long GPU sleep, so the device never waits for the
host and the host never waits for the device). Where the host cost is above the device time,
the layer is host-bound at that size and a change of the host code shows in its time.
"""

from __future__ import annotations

import argparse
import time
from typing import Optional

import torch
from torch import Tensor
from torch.profiler import ProfilerActivity, profile
from torch.utils.benchmark import Timer

import lltm

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _layer(cell: str, T: int, B: int, S: int, dtype: torch.dtype) -> tuple[torch.nn.Module, Tensor, Tensor]:
    """The fused layer (input size S) and an input (T, B, S) and output gradient (T, B, S)."""
    torch.manual_seed(0)
    layer = {"lltm": lambda: lltm.LLTM(S, S, backend="fused"), "lstm": lambda: lltm.LSTM(S, S, backend="fused"),
             "gru": lambda: lltm.GRU(S, S, backend="fused")}[cell]()  # fmt: skip
    layer = layer.to("cuda", dtype)
    x = torch.randn(T, B, S, device="cuda", dtype=dtype, requires_grad=True)
    grad = torch.randn(T, B, S, device="cuda", dtype=dtype)
    return layer, x, grad


def time_layer(cell: str, T: int, B: int, S: int, dtype: torch.dtype, calls: int = 8) -> dict[str, float]:
    """µs per call: forward, forward + backward (Timer medians) and the host's cost of one
    forward + backward while the device is kept busy."""
    layer, x, grad = _layer(cell, T, B, S, dtype)

    def fb() -> None:
        out, _ = layer(x)
        out.backward(grad)

    def fwd() -> None:
        with torch.no_grad():
            layer(x)

    for _ in range(5):
        fb()
    torch.cuda.synchronize()
    times = {}
    for name, fn in (("forward", fwd), ("fwd+bwd", fb)):
        timer = Timer("fn(); sync()", globals={"fn": fn, "sync": torch.cuda.synchronize})
        times[name] = timer.blocked_autorange(min_run_time=0.5).median * 1e6
    # Host cost: `calls` passes queued behind a GPU sleep that outlasts them (few enough that the
    # launch queue never fills, which would make the host wait), the median of 7 such bursts.
    bursts = []
    for _ in range(7):
        torch.cuda._sleep(int(2e6 * calls))  # ~1 ms of GPU cycles a pass at 2 GHz
        start = time.perf_counter()
        for _ in range(calls):
            fb()
        bursts.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    times["host"] = sorted(bursts)[len(bursts) // 2]
    return times


def profile_layer(cell: str, T: int, B: int, S: int, dtype: torch.dtype, passes: int = 10) -> str:
    layer, x, grad = _layer(cell, T, B, S, dtype)
    for _ in range(5):
        out, _ = layer(x)
        out.backward(grad)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(passes):
            out, _ = layer(x)
            out.backward(grad)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=16, max_name_column_width=80)


def kernel_timeline(kernels: list[tuple[float, float, str]], passes: int = 1) -> list[tuple[float, float, float, str]]:
    """The middle pass of `passes` equal passes of (start, end, name) kernel records (µs, any order), as
    (start from the pass's first kernel, idle gap since every earlier kernel ended, duration, name) in
    launch order; a negative gap is an overlap. Where the records do not split into equal passes (a pass
    launched more kernels than another), all of them."""
    ordered = sorted(kernels)
    if passes > 1 and ordered and len(ordered) % passes == 0:
        n = len(ordered) // passes
        ordered = ordered[(passes // 2) * n : (passes // 2 + 1) * n]
    if not ordered:
        return []
    rows = []
    first, busy_until = ordered[0][0], ordered[0][0]
    for start, end, name in ordered:
        rows.append((start - first, start - busy_until, end - start, name))
        busy_until = max(busy_until, end)
    return rows


def format_timeline(title: str, rows: list[tuple[float, float, float, str]], name_width: int = 90) -> str:
    span = max((r[0] + r[2] for r in rows), default=0.0)
    lines = [f"== {title}: {len(rows)} kernels, span {span:,.0f} µs, kernel time {sum(r[2] for r in rows):,.0f} µs"]
    lines.append(f"{'start':>9} {'gap':>8} {'duration':>9}  kernel")
    lines += [f"{a:9.1f} {g:8.1f} {d:9.1f}  {n[:name_width]}" for a, g, d, n in rows]
    return "\n".join(lines)


def timeline_layer(
    layer: torch.nn.Module, x: Tensor, grad: Tensor, passes: int = 3
) -> list[tuple[float, float, float, str]]:
    """One forward + backward pass's CUDA kernels (kernel_timeline's rows) of `layer` on x (T, B, I) with
    output gradient grad (T, B, S): the middle of `passes` passes, each followed by a synchronisation;
    the gradients start from None every pass."""

    def fb() -> None:
        out, _ = layer(x)
        out.backward(grad)
        x.grad = None
        for p in layer.parameters():
            p.grad = None

    for _ in range(3):
        fb()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(passes):
            fb()
            torch.cuda.synchronize()
    kernels = [
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    ]
    return kernel_timeline(kernels, passes)


def _peer(cell: str, S: int, dtype: torch.dtype) -> torch.nn.Module:
    """torch's module the benchmarks compare `cell` with: nn.GRU for the GRU, else nn.LSTM (input size S)."""
    torch.manual_seed(0)
    return (torch.nn.GRU if cell == "gru" else torch.nn.LSTM)(S, S).to("cuda", dtype)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lltm.bench.layer_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="16x128,16x256", help="B x S pairs")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--cell", choices=("lltm", "lstm", "gru"), default="lltm")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument(
        "--tf32", action="store_true", help="allow TF32: torch.backends.cuda.matmul (lltm) and cudnn (--peer)"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--time", action="store_true", help="time each size instead of profiling it")
    mode.add_argument("--timeline", action="store_true", help="one pass's kernels in order instead of the profile")
    parser.add_argument("--peer", action="store_true", help="with --timeline: torch's module's pass too")
    opts = parser.parse_args(argv)
    if opts.peer and not opts.timeline:
        parser.error("--peer goes with --timeline")
    if not torch.cuda.is_available():
        parser.exit(2, "layer_profile: needs a CUDA device\n")
    torch.backends.cuda.matmul.allow_tf32 = opts.tf32
    torch.backends.cudnn.allow_tf32 = opts.tf32  # the peer like with like: strict against strict
    where = f"{torch.cuda.get_device_name()}, torch {torch.__version__}, lltm from {lltm.__path__[0]}"
    for size in opts.sizes.split(","):
        B, S = (int(v) for v in size.split("x"))
        what = f"{opts.cell} T={opts.steps} B={B} S={S} {opts.dtype}{' tf32' if opts.tf32 else ''}"
        if opts.time:
            t = time_layer(opts.cell, opts.steps, B, S, DTYPES[opts.dtype])
            print(f"{what}: forward {t['forward']:.1f} µs, fwd+bwd {t['fwd+bwd']:.1f} µs, host {t['host']:.1f} µs"
                  f" ({where})", flush=True)  # fmt: skip
        elif opts.timeline:
            layer, x, grad = _layer(opts.cell, opts.steps, B, S, DTYPES[opts.dtype])
            print(format_timeline(f"lltm {what} ({where})", timeline_layer(layer, x, grad)), flush=True)
            if opts.peer:
                peer = _peer(opts.cell, S, DTYPES[opts.dtype])
                title = f"{type(peer).__name__} {what}"
                print(format_timeline(title, timeline_layer(peer, x, grad)), flush=True)
        else:
            print(f"{what}, {where}")
            print(profile_layer(opts.cell, opts.steps, B, S, DTYPES[opts.dtype]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
