"""Times the two implementations of the fused CUDA backend against each other
and against the bare GEMMs, to place the small/blas switch
(kSmallPathMaxMacsEager / kSmallPathMaxMacsGraph in
lltm/csrc/cuda/launch_utils.h) and to split each
step's time into GEMM floor and the rest.

For each size and path (LLTM_CUDA_PATH=small|blas):
- eager: wall time per forward+backward step, steps queued back to back
  (synchronised once at the end) and one step at a time (synchronised);
- graph: GPU time per forward and per forward+backward step, from replays
  of a captured CUDA graph (no host overhead at all);
- gemm: GPU time of the bare GEMMs of the same shapes (addmm forward,
  mm + mm backward), from graph replays too.

    python -m lltm.bench.cuda_path_sweep [--sizes 16x32x128,...] [--dtype float32] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from lltm import functional

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
DEFAULT_SIZES = "16x32x128,32x64x128,64x128x128,64x256x256,128x256x256,64x1024x128,256x512x512,4096x1024x1024"


def inputs(B, I, S, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return ((torch.rand(*shape, generator=gen) * 2 - 1) * scale).to("cuda", dtype).requires_grad_(True)

    return [rand(B, I), rand(3 * S, S + I, scale=S**-0.5), rand(3 * S, scale=S**-0.5), rand(B, S), rand(B, S)]


def graph_time(fn, reps):
    """GPU µs per call of fn, from replays of a CUDA graph of `reps` calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    del g
    return statistics.median(times)


def eager_times(step, iters):
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    torch.cuda.synchronize()
    queued = (time.perf_counter() - t0) / iters * 1e6
    one = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        one.append((time.perf_counter() - t0) * 1e6)
    return queued, statistics.median(one)


def measure(B, I, S, dtype, path):
    os.environ["LLTM_CUDA_PATH"] = path
    x, W, b, h, c = inputs(B, I, S, dtype)
    gh, gc = torch.randn(B, S, device="cuda", dtype=dtype), torch.randn(B, S, device="cuda", dtype=dtype)
    wrt = [x, W, b, h, c]

    def fwd():
        return functional.lltm_cell(x, W, b, h, c, backend="fused")

    def step():
        new_h, new_cell = fwd()
        torch.autograd.grad((new_h, new_cell), wrt, (gh, gc))

    big = B * S * (S + I) > 1 << 28
    iters = 20 if big else 200
    reps = 5 if big else 50
    queued, one = eager_times(step, iters)
    with torch.no_grad():
        g_fwd = graph_time(fwd, reps)
    g_step = graph_time(step, reps)
    return {"eager_step_queued_us": queued, "eager_step_sync_us": one, "graph_fwd_us": g_fwd, "graph_step_us": g_step}


def gemm_floor(B, I, S, dtype):
    X = torch.randn(B, S + I, device="cuda", dtype=dtype)
    W = torch.randn(3 * S, S + I, device="cuda", dtype=dtype)
    b = torch.randn(3 * S, device="cuda", dtype=dtype)
    dG = torch.randn(B, 3 * S, device="cuda", dtype=dtype)
    big = B * S * (S + I) > 1 << 28
    reps = 5 if big else 50
    fwd = graph_time(lambda: torch.addmm(b, X, W.t()), reps)
    bwd = graph_time(lambda: (torch.mm(dG, W), torch.mm(dG.t(), X)), reps)
    return {"gemm_fwd_us": fwd, "gemm_bwd_us": bwd}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default=DEFAULT_SIZES)
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--json")
    args = p.parse_args()
    dtype = DTYPES[args.dtype]
    a = torch.randn(4096, 4096, device="cuda")  # clocks up before timing anything
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 1.0:
        a @ a
    torch.cuda.synchronize()
    rows = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}; µs")
    hdr = f"{'size':>16} {'path':>6} {'eager q':>9} {'eager s':>9} {'gpu fwd':>9} {'gpu f+b':>9} "
    hdr += f"{'gemm f':>8} {'gemm b':>8} {'fwd/gemm':>8} {'bwd/gemm':>8}"
    print(hdr)
    for size in args.sizes.split(","):
        B, I, S = (int(v) for v in size.split("x"))
        floor = gemm_floor(B, I, S, dtype)
        paths = ("blas",) if B * S * (S + I) > 1 << 26 else ("small", "blas")
        for path in paths:
            r = measure(B, I, S, dtype, path)
            r.update(floor, size=size, path=path, dtype=args.dtype)
            bwd = r["graph_step_us"] - r["graph_fwd_us"]
            print(
                f"{size:>16} {path:>6} {r['eager_step_queued_us']:9.1f} {r['eager_step_sync_us']:9.1f} "
                f"{r['graph_fwd_us']:9.1f} {r['graph_step_us']:9.1f} "
                f"{floor['gemm_fwd_us']:8.1f} {floor['gemm_bwd_us']:8.1f} "
                f"{r['graph_fwd_us'] / floor['gemm_fwd_us']:8.2f} {bwd / floor['gemm_bwd_us']:8.2f}",
                flush=True,
            )
            rows.append(r)
    os.environ.pop("LLTM_CUDA_PATH", None)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
