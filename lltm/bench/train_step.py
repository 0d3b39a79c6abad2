"""Steady-state time of one `lltm train` step, eager against torch.compile.

The same model (one copy per mode, the same initial weights) and the same
batches, each mode timed in blocks of steps with the blocks interleaved, so
a slow spell of a shared machine hits every mode alike; the first step of
each mode (compilation) is reported apart. With --profile, the ops that
cost the most host and device time in a few steady steps of each mode.

    python -m lltm.bench.train_step --device cuda --hidden 256 --batch 64 --seq-len 128
    python -m lltm.bench.train_step --modes eager,default,reduce-overhead --profile
"""

from __future__ import annotations

import copy
import statistics
import time

import torch

from lltm._argtypes import Parser, backend_arg, device_arg, int_at_least
from lltm.bench.cli import device_name
from lltm.train.loop import Options, build, train_step
from lltm.train.model import ModelConfig
from lltm.train.tasks import TASKS, make_task

MODES = ("eager", "default", "reduce-overhead", "max-autotune-no-cudagraphs")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _profile(step, device: torch.device, steps: int, rows: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        _sync(device)
    keys = ["self_cpu_time_total"] + (["self_device_time_total"] if device.type == "cuda" else [])
    return "\n".join(prof.key_averages().table(sort_by=k, row_limit=rows) for k in keys)


def main(argv=None) -> int:
    p = Parser(prog="python -m lltm.bench.train_step", description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=TASKS, default="charlm")
    p.add_argument("--hidden", type=int_at_least(1), default=256)
    p.add_argument("--batch", type=int_at_least(1), default=64)
    p.add_argument("--seq-len", type=int_at_least(1), default=128)
    p.add_argument("--layers", type=int_at_least(1), default=1)
    p.add_argument("--model", choices=("lltm", "lstm"), default="lltm")
    p.add_argument("--backend", type=backend_arg, default="auto")
    p.add_argument("--device", type=device_arg, default=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    p.add_argument("--modes", default="eager,default", help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--warmup", type=int_at_least(1), default=5, help="untimed steps per mode (compilation included)")
    p.add_argument("--blocks", type=int_at_least(1), default=8)
    p.add_argument("--steps-per-block", type=int_at_least(1), default=10)
    p.add_argument("--profile", action="store_true", help="the costliest ops of each mode")
    args = p.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        p.error(f"argument --modes: expected some of {', '.join(MODES)}, got {args.modes!r}")
    device = args.device

    task = make_task(args.task, seed=0, batch=args.batch, seq_len=args.seq_len)
    cfg = ModelConfig(
        kind=args.model,
        n_in=task.n_in,
        n_out=task.n_out,
        hidden=args.hidden,
        layers=args.layers,
        embed=32,
        tokens=task.tokens,
        readout=task.readout,
    )
    opts = Options(backend=args.backend)
    from lltm.train.ddp import Context

    ctx = Context(rank=0, world=1, local_rank=0, device=device)
    model, _ = build(opts, ctx, cfg)
    steps, first = {}, {}
    for mode in modes:
        m = copy.deepcopy(model)
        net = m if mode == "eager" else torch.compile(m, mode=None if mode == "default" else mode)
        opt = torch.optim.Adam(m.parameters(), lr=opts.lr)
        counter = iter(range(10**9))
        steps[mode] = lambda net=net, m=m, opt=opt, counter=counter: train_step(
            net, m, opt, task, ctx, opts, next(counter) % 64
        )
        start = time.perf_counter()
        steps[mode]()
        _sync(device)
        first[mode] = time.perf_counter() - start
        for _ in range(args.warmup - 1):
            steps[mode]()
        _sync(device)

    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(args.blocks):
        for mode in modes:
            _sync(device)
            start = time.perf_counter()
            for _ in range(args.steps_per_block):
                steps[mode]()
            _sync(device)
            times[mode].append((time.perf_counter() - start) / args.steps_per_block * 1e3)

    name = device_name(device)
    print(
        f"lltm train step: {args.task} {args.model} hidden {args.hidden}, batch {args.batch}, seq {args.seq_len}, "
        f"{args.layers} layer(s), backend {args.backend}; {name}; torch {torch.__version__}"
    )
    print(f"{args.blocks} interleaved blocks of {args.steps_per_block} steps per mode, after {args.warmup} untimed")
    base = statistics.median(times[modes[0]])
    print(f"{'mode':>28} | {'first step s':>12} | {'median ms/step':>14} | {'min':>8} | {'max':>8} | vs {modes[0]}")
    for mode in modes:
        med = statistics.median(times[mode])
        print(
            f"{mode:>28} | {first[mode]:>12.2f} | {med:>14.3f} | {min(times[mode]):>8.3f} | "
            f"{max(times[mode]):>8.3f} | {med / base:.3f}x"
        )
    if args.profile:
        for mode in modes:
            print(f"\n== {mode}: the costliest ops over 10 steady steps")
            print(_profile(steps[mode], device, 10, 15))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
