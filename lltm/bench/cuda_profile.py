"""Where the time of a fused LLTM step goes on the GPU machine.

1. Host cost per call (steps queued back to back, one sync at the end, so
   the GPU is never the bottleneck at these sizes): a bare eager op, torch.mm,
   the fused forward/backward ops called directly (no autograd), the autograd
   forward through lltm.functional, and the whole forward+backward step, for
   both paths of the backend.
2. GPU time per kernel (torch.profiler) of a few forward+backward steps at
   the given large sizes: GEMMs, pointwise passes, anything else.

    python -m lltm.bench.cuda_profile [--host-sizes 16x32x128,...] [--kernel-sizes 4096x1024x1024]
                                      [--dtypes float32,bfloat16]
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile

from lltm import _extension, functional

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def per_call_us(fn, iters=300):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / iters * 1e6)
    return best


def make(B, I, S, dtype, grad=True):
    def r(*shape):
        return (torch.rand(*shape, device="cuda", dtype=dtype) * 2 - 1).requires_grad_(grad)

    return r(B, I), r(3 * S, S + I), r(3 * S), r(B, S), r(B, S)


def host_costs(sizes, dtype):
    print(f"\nhost cost per call, µs (best of 3 x 300 queued calls), {dtype}")
    # step: forward + autograd backward into .grad (accumulating); step0: the
    # same from .grad = None (no AccumulateGrad kernels); grad(): autograd.grad
    # (no .grad at all); py step0: the python cell's step0, the T1 reference;
    # AD floor: step0 of the smallest graph (one leaf, one mul), i.e. what the
    # autograd engine costs by itself (hand-off to the device thread and back).
    cols = (
        "size",
        "path",
        "add",
        "mm",
        "AD floor",
        "fwd op",
        "bwd op",
        "fwd+AD",
        "step",
        "step0",
        "grad()",
        "py step0",
    )
    print(" ".join(f"{c:>10}" for c in cols))
    for size in sizes:
        B, I, S = (int(v) for v in size.split("x"))
        x, W, b, h, c = make(B, I, S, dtype)
        xd, Wd, bd, hd, cd = (t.detach() for t in (x, W, b, h, c))
        X = torch.randn(B, S + I, device="cuda", dtype=dtype)
        gh, gc = torch.randn(B, S, device="cuda", dtype=dtype), torch.randn(B, S, device="cuda", dtype=dtype)
        add = per_call_us(lambda: torch.add(hd, cd))
        mm = per_call_us(lambda: torch.mm(X, Wd.t()))

        def ad_floor():
            h.grad = None
            torch.autograd.backward(h * 2, gh)

        floor = per_call_us(ad_floor, iters=200)
        for path in ("small", "blas"):
            os.environ["LLTM_CUDA_PATH"] = path
            fwd_op = per_call_us(lambda: torch.ops.lltm.fused_cell_forward(xd, Wd, bd, hd, cd))
            _, new_cell, gates = torch.ops.lltm.fused_cell_forward(xd, Wd, bd, hd, cd)
            mask = [True] * 5
            bwd_op = per_call_us(lambda: torch.ops.lltm.fused_cell_backward(gh, gc, new_cell, gates, xd, Wd, hd, mask))
            fwd_ad = per_call_us(lambda: functional.lltm_cell(x, W, b, h, c, backend="fused"))

            def step():
                new_h, new_c = functional.lltm_cell(x, W, b, h, c, backend="fused")
                torch.autograd.backward((new_h, new_c), (gh, gc))

            def step0(backend="fused"):
                for t in (x, W, b, h, c):
                    t.grad = None
                new_h, new_c = functional.lltm_cell(x, W, b, h, c, backend=backend)
                torch.autograd.backward((new_h, new_c), (gh, gc))

            def step_grad():
                new_h, new_c = functional.lltm_cell(x, W, b, h, c, backend="fused")
                torch.autograd.grad((new_h, new_c), (x, W, b, h, c), (gh, gc))

            st = per_call_us(step, iters=200)
            st0 = per_call_us(step0, iters=200)
            stg = per_call_us(step_grad, iters=200)
            py0 = per_call_us(lambda: step0("python"), iters=100)
            vals = (size, path) + tuple(f"{v:.1f}" for v in (add, mm, floor, fwd_op, bwd_op, fwd_ad, st, st0, stg, py0))
            print(" ".join(f"{v:>10}" for v in vals), flush=True)
        os.environ.pop("LLTM_CUDA_PATH", None)


def kernel_times(size, dtype):
    B, I, S = (int(v) for v in size.split("x"))
    x, W, b, h, c = make(B, I, S, dtype)
    gh, gc = torch.randn(B, S, device="cuda", dtype=dtype), torch.randn(B, S, device="cuda", dtype=dtype)

    def step():
        new_h, new_c = functional.lltm_cell(x, W, b, h, c, backend="fused")
        torch.autograd.grad((new_h, new_c), (x, W, b, h, c), (gh, gc))

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    steps = 5
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    print(f"\nGPU time per step by kernel, {size} {dtype} (torch.profiler, {steps} steps)")
    total = 0.0
    rows = []
    for evt in prof.key_averages():
        t = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0)
        if t <= 0 or evt.count == 0:
            continue
        rows.append((t / steps, evt.count // steps, evt.key))
    rows.sort(reverse=True)
    for us, n, key in rows[:14]:
        total += us
        print(f"  {us:9.1f} µs  x{n:<2} {key[:110]}")
    print(f"  {'':>9}      (sum of the rows above: {total:.1f} µs)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host-sizes", default="16x32x128,64x1024x128,256x512x512")
    p.add_argument("--kernel-sizes", default="4096x1024x1024")
    p.add_argument("--dtypes", default="float32,bfloat16")
    args = p.parse_args()
    _extension.load()
    # clocks up before timing anything
    a = torch.randn(4096, 4096, device="cuda")
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 1.0:
        a @ a
    torch.cuda.synchronize()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name in args.dtypes.split(","):
        host_costs(args.host_sizes.split(","), DTYPES[name])
    for name in args.dtypes.split(","):
        for size in args.kernel_sizes.split(","):
            kernel_times(size, DTYPES[name])


if __name__ == "__main__":
    main()
