"""Times the time loops of the fused CUDA sequence operators against each
other: the per-step cuBLAS loop (LLTM_SEQ_PATH=loop) and the persistent
cluster kernels (LLTM_SEQ_PATH=persistent) at each cluster size
(LLTM_SEQ_CLUSTER), to place the default cluster size in
lltm/csrc/cuda/seq_persistent.cu and to show the per-step cost of each.

For each case and configuration: forward and forward+backward of
functional.lltm (every input needing a gradient, loss on the output), µs
from torch.utils.benchmark (median of blocked_autorange), and µs per step.

    python -m lltm.bench.seq_sweep [--cases 100x16x32x128,...] [--dtype float32] [--clusters 2,4,8,16]
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.utils import benchmark

from lltm import functional

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
DEFAULT_CASES = "100x16x32x128,1000x16x32x128,100x64x256x256,100x64x1024x1024"


def inputs(T, B, I, S, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        t = (torch.rand(*shape, generator=gen) * 2 - 1) * scale
        return t.to("cuda", dtype).requires_grad_(True)

    return [rand(T, B, I), rand(3 * S, S + I, scale=S**-0.5), rand(3 * S, scale=S**-0.5), rand(B, S), rand(B, S)]


def measure(args, min_run_time):
    grad = torch.randn_like(functional.lltm(*args, backend="fused")[0])

    def forward():
        return functional.lltm(*args, backend="fused")

    def both():
        out, _ = functional.lltm(*args, backend="fused")
        torch.autograd.grad(out, args, grad)

    times = []
    for fn in (forward, both):
        fn()
        torch.cuda.synchronize()
        timer = benchmark.Timer(stmt="fn()", globals={"fn": fn})
        times.append(timer.blocked_autorange(min_run_time=min_run_time).median * 1e6)
    return times


def configure(path, cluster):
    os.environ["LLTM_SEQ_PATH"] = path
    if cluster is None:
        os.environ.pop("LLTM_SEQ_CLUSTER", None)
    else:
        os.environ["LLTM_SEQ_CLUSTER"] = str(cluster)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m lltm.bench.seq_sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated TxBxIxS")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--clusters", default="2,4,8,16", help="cluster sizes to force, besides the default")
    parser.add_argument("--min-run-time", type=float, default=0.2)
    opts = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.exit(1, "seq_sweep: needs a CUDA device\n")
    dtype = DTYPES[opts.dtype]
    configs = [("loop", None), ("persistent", None)] + [
        ("persistent", int(c)) for c in opts.clusters.split(",") if c
    ]
    print(f"fused sequence time loops, {opts.dtype}, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| case TxBxIxS | path | cluster | fwd µs | f+b µs | fwd µs/step | f+b µs/step |")
    print("|---|---|---|---|---|---|---|")
    try:
        for case in opts.cases.split(","):
            T, B, I, S = (int(v) for v in case.split("x"))
            args = inputs(T, B, I, S, dtype)
            for path, cluster in configs:
                configure(path, cluster)
                try:
                    fwd, both = measure(args, opts.min_run_time)
                except RuntimeError as err:  # a forced persistent kernel that cannot run
                    why = str(err).splitlines()[0][:80]
                    print(f"| {case} | {path} | {cluster or 'default'} | - | - | - | - |  ({why})")
                    continue
                print(
                    f"| {case} | {path} | {cluster or 'default'} | {fwd:.1f} | {both:.1f} "
                    f"| {fwd / T:.2f} | {both / T:.2f} |",
                    flush=True,
                )
    finally:
        configure("", None)
        os.environ.pop("LLTM_SEQ_PATH", None)


if __name__ == "__main__":
    main()
