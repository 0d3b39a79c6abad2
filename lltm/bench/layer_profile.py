"""Where the time of one fused layer's forward + backward goes on the GPU: a torch.profiler table per
size (kernels and the host ops around them) of a few fwd + bwd passes of lltm.LLTM / LSTM / GRU, input
(T, B, I) with I = S and a loss on the output. Uses only the public modules, so the same file profiles
an earlier tree too (run it with that tree first on PYTHONPATH).

    python -m lltm.bench.layer_profile [--sizes 16x128,16x256] [--steps 100] [--cell lltm] [--dtype float32]
                                       [--tf32] [--time]

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


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lltm.bench.layer_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="16x128,16x256", help="B x S pairs")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--cell", choices=("lltm", "lstm", "gru"), default="lltm")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--tf32", action="store_true", help="torch.backends.cuda.matmul.allow_tf32 = True")
    parser.add_argument("--time", action="store_true", help="time each size instead of profiling it")
    opts = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.exit(2, "layer_profile: needs a CUDA device\n")
    torch.backends.cuda.matmul.allow_tf32 = opts.tf32
    where = f"{torch.cuda.get_device_name()}, torch {torch.__version__}, lltm from {lltm.__path__[0]}"
    for size in opts.sizes.split(","):
        B, S = (int(v) for v in size.split("x"))
        what = f"{opts.cell} T={opts.steps} B={B} S={S} {opts.dtype}{' tf32' if opts.tf32 else ''}"
        if opts.time:
            t = time_layer(opts.cell, opts.steps, B, S, DTYPES[opts.dtype])
            print(f"{what}: forward {t['forward']:.1f} µs, fwd+bwd {t['fwd+bwd']:.1f} µs, host {t['host']:.1f} µs"
                  f" ({where})", flush=True)  # fmt: skip
        else:
            print(f"{what}, {where}")
            print(profile_layer(opts.cell, opts.steps, B, S, DTYPES[opts.dtype]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
