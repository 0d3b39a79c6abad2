"""Memory and time of the fused Conv2d+BatchNorm2d training layer vs nn.Conv2d + nn.BatchNorm2d.

    python -m lltm.bench.conv_bn_memory                      # cuda if available, else cpu
    python -m lltm.bench.conv_bn_memory --device cpu --min-run-time 20
    python -m lltm.bench.conv_bn_memory --batch 32 --size 28 --markdown

Measures, for one training step of the layer (input requires grad, as in the
middle of a network):

* bytes saved for backward, with torch.autograd.graph.saved_tensors_hooks
  (each storage counted once; "activations" leaves out parameters and
  buffers) -- exact, any device;
* on CUDA, memory held after forward and the peak during forward+backward,
  from torch.cuda.memory_allocated / max_memory_allocated, relative to the
  memory in use before the step (input, parameters);
* forward and forward+backward time with torch.utils.benchmark.Timer
  (blocked_autorange medians, which synchronise CUDA; the two layers
  alternate over --rounds rounds and the median round is reported).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
from typing import Callable

import torch
from torch import nn
from torch.utils.benchmark import Timer

from lltm.extending import FusedConvBN2d, saved_tensors_report

MB = 1024**2


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--in-channels", type=int, default=64)
    p.add_argument("--out-channels", type=int, default=64)
    p.add_argument("--size", type=int, default=56, help="input height and width")
    p.add_argument("--kernel", type=int, default=3)
    p.add_argument("--dtype", choices=["float32", "float64", "float16", "bfloat16"], default="float32")
    p.add_argument("--min-run-time", type=float, default=None,
                   help="seconds per timing measurement (default: 2 on cuda, 10 on cpu)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3, help="alternating timing rounds per layer")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU); default: torch's")
    p.add_argument("--no-time", action="store_true", help="memory only")
    p.add_argument("--markdown", action="store_true", help="print the result as markdown tables")
    return p.parse_args()


def build(args: argparse.Namespace) -> tuple[nn.Module, nn.Module, torch.Tensor, torch.Tensor]:
    dtype = getattr(torch, args.dtype)
    factory = {"device": args.device, "dtype": dtype}
    conv = nn.Conv2d(args.in_channels, args.out_channels, args.kernel, padding=args.kernel // 2, bias=False, **factory)
    bn = nn.BatchNorm2d(args.out_channels, **factory)
    unfused = nn.Sequential(conv, bn)
    fused = FusedConvBN2d.from_modules(conv, bn)
    x = torch.randn(args.batch, args.in_channels, args.size, args.size, **factory, requires_grad=True)
    with torch.no_grad():
        grad = torch.randn_like(unfused(x))
    return unfused, fused, x, grad


def saved_bytes(module: nn.Module, x: torch.Tensor) -> tuple[int, int]:
    state = [*module.parameters(), *module.buffers()]
    report = saved_tensors_report(lambda: module(x), exclude=state)
    return report.total_bytes, report.activation_bytes


def cuda_memory(module: nn.Module, x: torch.Tensor, grad: torch.Tensor) -> tuple[int, int]:
    """(bytes held after forward, peak bytes during forward+backward), above the starting point."""
    x.grad = None
    module.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = module(x)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base
    out.backward(grad)
    del out
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    x.grad = None
    module.zero_grad(set_to_none=True)
    return held, peak


def median_ms(stmt: Callable[[], object], min_run_time: float, label: str) -> float:
    timer = Timer(stmt="stmt()", globals={"stmt": stmt}, label=label, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e3


def main() -> None:
    args = parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device available")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    unfused, fused, x, grad = build(args)
    modules = {"unfused (nn.Conv2d + nn.BatchNorm2d)": unfused, "fused (FusedConvBN2d)": fused}

    if args.device == "cuda":
        device_name = torch.cuda.get_device_name()
    else:
        device_name = f"CPU, {torch.get_num_threads()} threads ({os.cpu_count()} cores)"
    shape = f"N={args.batch}, {args.in_channels}->{args.out_channels} channels, {args.kernel}x{args.kernel}, " \
            f"{args.size}x{args.size}, {args.dtype}"  # fmt: skip
    header = f"{device_name}; torch {torch.__version__}; {datetime.date.today().isoformat()}; {shape}"

    # Warm up (kernel selection, allocator) before measuring anything.
    for m in modules.values():
        m(x).backward(grad)
    x.grad = None

    rows = []
    for name, m in modules.items():
        total, act = saved_bytes(m, x)
        row = {"name": name, "saved": total, "saved_act": act}
        if args.device == "cuda":
            row["held"], row["peak"] = cuda_memory(m, x, grad)
        rows.append(row)

    timings = []
    if not args.no_time:
        min_run_time = args.min_run_time or (2.0 if args.device == "cuda" else 10.0)
        stmts = {}
        for name, m in modules.items():

            def forward(m: nn.Module = m) -> object:
                return m(x)

            def step(m: nn.Module = m) -> None:
                m(x).backward(grad)
                x.grad = None
                m.zero_grad(set_to_none=True)

            stmts[name] = (forward, step)
        # Alternate the two layers over several rounds and keep the median per layer, so that
        # drift in machine load (shared CPUs, clocks) does not favour whichever ran first.
        samples: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in stmts}
        for _ in range(args.rounds):
            for name, (forward, step) in stmts.items():
                samples[name][0].append(median_ms(forward, min_run_time / args.rounds, "forward"))
                samples[name][1].append(median_ms(step, min_run_time / args.rounds, "fwd+bwd"))
        for name, (fwd, steps) in samples.items():
            timings.append((name, statistics.median(fwd), statistics.median(steps)))

    base, ours = rows
    saving = 1 - ours["saved"] / base["saved"]
    if args.markdown:
        print(f"\n{header}\n")
        cols = "| layer | saved for backward (MB) | of which activations (MB) |"
        cols += " held after forward (MB) | peak fwd+bwd (MB) |" if args.device == "cuda" else ""
        print(cols)
        print("|" + "---|" * (cols.count("|") - 1))
        for r in rows:
            line = f"| {r['name']} | {r['saved'] / MB:.1f} | {r['saved_act'] / MB:.1f} |"
            if args.device == "cuda":
                line += f" {r['held'] / MB:.1f} | {r['peak'] / MB:.1f} |"
            print(line)
        print(f"\nSaved for backward: {saving:.1%} less with the fused layer.")
        if args.device == "cuda":
            print(f"Peak memory of forward+backward: {1 - ours['peak'] / base['peak']:.1%} less.")
        if timings:
            print("\n| layer | forward (ms) | forward+backward (ms) |\n|---|---|---|")
            for name, fwd, step in timings:
                print(f"| {name} | {fwd:.1f} | {step:.1f} |")
            (_, f0, s0), (_, f1, s1) = timings
            print(f"\nTime cost of fusing: forward {f1 / f0 - 1:+.1%}, forward+backward {s1 / s0 - 1:+.1%}.")
        return

    print(header)
    for r in rows:
        line = f"{r['name']:<40} saved {r['saved'] / MB:9.2f} MB (activations {r['saved_act'] / MB:9.2f} MB)"
        if args.device == "cuda":
            line += f"  held after fwd {r['held'] / MB:9.2f} MB  peak fwd+bwd {r['peak'] / MB:9.2f} MB"
        print(line)
    print(f"saved-for-backward reduction: {saving:.1%}")
    if args.device == "cuda":
        print(f"peak fwd+bwd reduction: {1 - ours['peak'] / base['peak']:.1%}")
    for name, fwd, step in timings:
        print(f"{name:<40} forward {fwd:9.2f} ms   forward+backward {step:9.2f} ms")
    if timings:
        (_, f0, s0), (_, f1, s1) = timings
        print(f"time cost of fusing: forward {f1 / f0 - 1:+.1%}, forward+backward {s1 / s0 - 1:+.1%}")


if __name__ == "__main__":
    main()
