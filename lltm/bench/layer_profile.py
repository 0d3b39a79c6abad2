"""Where the time of one fused layer's forward + backward goes on the GPU: a torch.profiler table per
size (kernels and the host ops around them) of a few fwd + bwd passes of lltm.LLTM / LSTM / GRU, input
(T, B, I) with I = S and a loss on the output. Uses only the public modules, so the same file profiles
an earlier tree too (run it with that tree first on PYTHONPATH).

    python -m lltm.bench.layer_profile [--sizes 16x128,16x256] [--steps 100] [--cell lltm] [--dtype float32]
"""

from __future__ import annotations

import argparse
from typing import Optional

import torch
from torch.profiler import ProfilerActivity, profile

import lltm

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def profile_layer(cell: str, T: int, B: int, S: int, dtype: torch.dtype, passes: int = 10) -> str:
    torch.manual_seed(0)
    layer = {"lltm": lambda: lltm.LLTM(S, S, backend="fused"), "lstm": lambda: lltm.LSTM(S, S, backend="fused"),
             "gru": lambda: lltm.GRU(S, S, backend="fused")}[cell]()  # fmt: skip
    layer = layer.to("cuda", dtype)
    x = torch.randn(T, B, S, device="cuda", dtype=dtype, requires_grad=True)
    grad = torch.randn(T, B, S, device="cuda", dtype=dtype)
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
    opts = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.exit(2, "layer_profile: needs a CUDA device\n")
    for size in opts.sizes.split(","):
        B, S = (int(v) for v in size.split("x"))
        where = f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
        print(f"{opts.cell} T={opts.steps} B={B} S={S} {opts.dtype}, {where}")
        print(profile_layer(opts.cell, opts.steps, B, S, DTYPES[opts.dtype]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
