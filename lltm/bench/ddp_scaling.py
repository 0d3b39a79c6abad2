"""DDP scaling of `lltm train`'s step: tokens/s at 1, 2, 4 ... ranks, weak and strong scaling, the
gradient all-reduce against the backward, and DDP's options.

Run once per rank count (each run appends one JSON line per measurement), then make the tables:

    python -m lltm.bench.ddp_scaling run --json S.jsonl                                # 1 rank
    torchrun --standalone --nproc_per_node 2 -m lltm.bench.ddp_scaling run --json S.jsonl
    torchrun --standalone --nproc_per_node 4 -m lltm.bench.ddp_scaling run --json S.jsonl \\
        --variants "default;bucket_cap_mb=1;gradient_as_bucket_view;static_graph;rebuilt_buckets;accumulate=4"
    python -m lltm.bench.ddp_scaling table S.jsonl

What a run measures, for each hidden size and each per-rank batch (--per-rank-batch, the weak
scaling series, and --global-batch divided by the rank count, the strong scaling series): the
model of `lltm train --task charlm` (embedding 32, one LLTM layer, linear head; Adam), on
batches made once and kept on the device (so the host's data work is left out), wrapped in
DistributedDataParallel when there are several ranks:

- tokens/s: --steps steps after --warmup, the device synchronised at both ends, the slowest
  rank's time (global batch x sequence length per step);
- the phases of a step, each synchronised (--phase-steps steps, medians): forward, backward,
  optimizer; the backward again under DDP's no_sync (no all-reduce: the compute alone); DDP's
  cost in the backward, backward - no_sync backward (the all-reduce not hidden behind the
  backward, and the copies into the buckets); one all-reduce of all gradients alone (a flat
  float32 buffer); the share of that all-reduce hidden behind the backward.

Weak-scaling efficiency at N ranks: tokens/s / (N x one rank's tokens/s at the same per-rank
batch). Strong scaling: tokens/s at global batch G on N ranks over one rank's at batch G.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from typing import Any, Optional

import torch
import torch.nn.functional as F

from lltm._argtypes import Parser, backend_arg, int_at_least, output_file
from lltm.train import ddp
from lltm.train.loop import Options, build, step_on
from lltm.train.model import ModelConfig

# the weak- and strong-scaling targets of the issue, checked by `table`
TARGETS = (
    ("weak", 512, 256, 4, 0.90),  # kind, hidden, per-rank (weak) or global (strong) batch, ranks, efficiency
    ("strong", 512, 1024, 4, 0.75),
)
VOCAB, EMBED = 256, 32


def _ints(text: str) -> list[int]:
    """Comma-separated positive integers."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


STATIC_NO_SYNC = (
    "static_graph with accumulate > 1: DDP's static graph fails an internal assert in torch's reducer when its "
    "first backward runs under no_sync (torch 2.13)"
)
VARIANT_KEYS = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "rebuilt_buckets", "accumulate")


def parse_variant(text: str) -> dict[str, Any]:
    """'default', or '+'-joined settings: bucket_cap_mb=1, gradient_as_bucket_view, static_graph,
    rebuilt_buckets (DDP's own bucket layout, rebuilt after the first step, instead of lltm train's
    fixed one: ddp.fix_bucket_layout), accumulate=4 (gradient accumulation: that many micro-batches
    per step, all but the last in no_sync)."""
    out: dict[str, Any] = {}
    if text.strip() == "default":
        return out
    for part in text.split("+"):
        key, _, value = part.strip().partition("=")
        if key not in VARIANT_KEYS:
            raise ValueError(f"unknown DDP variant {key!r}; known: default, {', '.join(VARIANT_KEYS)}")
        if key == "bucket_cap_mb":
            out[key] = float(value)
        elif key == "accumulate":
            out[key] = int(value)
        elif value not in ("", "1", "true"):
            raise ValueError(f"{key} takes no value (got {value!r})")
        else:
            out[key] = True
    if out.get("static_graph") and out.get("accumulate", 1) > 1:
        raise ValueError(STATIC_NO_SYNC)
    return out


def _variants_arg(text: str) -> str:
    """';'-separated variants, each checked (returned as given)."""
    for v in filter(None, text.split(";")):
        try:
            parse_variant(v)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _pair(text: str) -> list[int]:
    values = _ints(text)
    if len(values) != 2:
        raise argparse.ArgumentTypeError(f"expected HIDDEN,ROWS, got {text!r}")
    return values


class _LM:
    """The charlm loss, for step_on."""

    @staticmethod
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.float().flatten(0, 1), y.flatten())


def _sync(ctx: ddp.Context) -> None:
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)


def _timed(ctx: ddp.Context, fn, repeat: int) -> float:
    """Median seconds of fn(), the device synchronised around each call."""
    times = []
    for _ in range(repeat):
        _sync(ctx)
        t0 = time.perf_counter()
        fn()
        _sync(ctx)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _slowest(ctx: ddp.Context, seconds: float) -> float:
    return max(ctx.gather(seconds))


def measure(ctx: ddp.Context, *, hidden: int, rows: int, seq_len: int, variant: dict, args: Any) -> dict[str, Any]:
    """One measurement: `rows` rows per rank, hidden units, the DDP variant."""
    accumulate = variant.get("accumulate", 1)
    if rows % accumulate:
        raise ValueError(f"accumulate={accumulate} does not divide {rows} rows")
    ctx.ddp = ddp.DDPOptions(
        variant.get("bucket_cap_mb"),
        variant.get("gradient_as_bucket_view", False),
        variant.get("static_graph", False),
        fixed_buckets=not variant.get("rebuilt_buckets", False),
    )
    cfg = ModelConfig("lltm", VOCAB, VOCAB, hidden, 1, EMBED, True, "all")
    opts = Options(backend=args.backend, bf16=args.dtype == "bfloat16", accumulate=accumulate, progress=False)
    model, optimizer = build(opts, ctx, cfg)
    net = ctx.wrap(model)
    gen = torch.Generator().manual_seed(1000 + ctx.rank)
    batches = [torch.randint(0, VOCAB, (rows, seq_len + 1), generator=gen).to(ctx.device) for _ in range(4)]

    def step(i: int) -> None:
        b = batches[i % len(batches)]
        step_on(net, model, optimizer, _LM, ctx, opts, b[:, :-1], b[:, 1:])

    for i in range(args.warmup):
        step(i)
    ctx.barrier()
    _sync(ctx)
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(i)
        ctx.beat(f"step {i}")
    _sync(ctx)
    seconds = _slowest(ctx, time.perf_counter() - t0)
    world_rows = rows * ctx.world
    out: dict[str, Any] = {
        "world": ctx.world,
        "hidden": hidden,
        "seq_len": seq_len,
        "per_rank_batch": rows,
        "global_batch": world_rows,
        "dtype": args.dtype,
        "variant": {k: v for k, v in variant.items()},
        "steps": args.steps,
        "step_ms": 1e3 * seconds / args.steps,
        "tokens_per_s": args.steps * world_rows * seq_len / seconds,
        "params": sum(p.numel() for p in model.parameters()),
    }
    out["tokens_per_s_per_rank"] = out["tokens_per_s"] / ctx.world

    # phases, each synchronised: forward, backward (with and without DDP's all-reduce), optimizer
    b = batches[0]
    x, y = b[:, :-1], b[:, 1:]
    losses: list = []

    def forward() -> None:
        with torch.autocast(ctx.device.type, torch.bfloat16, enabled=opts.bf16):
            losses.append(_LM.loss(net(x), y))

    def backward() -> None:
        losses.pop().backward()

    fwd, bwd, bwd_local = [], [], []
    for i in range(args.phase_steps):
        optimizer.zero_grad(set_to_none=True)
        fwd.append(_timed(ctx, forward, 1))
        bwd.append(_timed(ctx, backward, 1))
        optimizer.zero_grad(set_to_none=True)
        with ddp.Context.no_sync(net):  # forward and backward inside: DDP then skips the all-reduce
            forward()
            bwd_local.append(_timed(ctx, backward, 1))
        ctx.beat(f"phase step {i}")
    opt_s = _timed(ctx, optimizer.step, args.phase_steps)
    optimizer.zero_grad(set_to_none=True)
    out.update(
        fwd_ms=1e3 * statistics.median(fwd),
        bwd_ms=1e3 * statistics.median(bwd),
        bwd_local_ms=1e3 * statistics.median(bwd_local),
        opt_ms=1e3 * opt_s,
        grad_mb=out["params"] * 4 / 2**20,
    )
    if ctx.distributed:
        flat = torch.zeros(out["params"], device=ctx.device)
        allreduce_s = _timed(ctx, lambda: torch.distributed.all_reduce(flat), args.phase_steps)
        exposed = max(out["bwd_ms"] - out["bwd_local_ms"], 0.0)
        out.update(
            allreduce_ms=1e3 * allreduce_s,
            ddp_in_backward_ms=exposed,
            hidden_share=max(0.0, min(1.0, 1 - exposed / max(1e3 * allreduce_s, 1e-9))),
        )
    return out


def _run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    ctx = ddp.setup(args.device, collective_timeout=args.collective_timeout)
    rows = sorted(set(args.per_rank_batch) | {g // ctx.world for g in args.global_batch if g % ctx.world == 0})
    header: dict[str, Any] = {
        "device": str(ctx.device),
        "gpu": torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "backend": args.backend,
    }
    plan = [(h, r, {}) for h in args.hidden for r in rows]
    if ctx.distributed and args.variants:
        at_hidden, at_rows = args.variants_at
        plan += [(at_hidden, at_rows, parse_variant(v)) for v in args.variants.split(";") if v.strip() != "default"]
    status = 0
    try:
        for hidden, r, variant in plan:
            try:
                rec = {
                    **header,
                    **measure(ctx, hidden=hidden, rows=r, seq_len=args.seq_len, variant=variant, args=args),
                }
            except torch.OutOfMemoryError:
                rec = {**header, "world": ctx.world, "hidden": hidden, "per_rank_batch": r, "error": "out of memory"}
                status = 1
            if ctx.device.type == "cuda":
                torch.cuda.empty_cache()  # the measurement's model and batches are gone
            if ctx.is_main:
                print(_line(rec), flush=True)
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(json.dumps(rec) + "\n")
    finally:
        ddp.teardown(ctx)
    return status


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['world']} rank(s) hidden {r['hidden']} rows {r['per_rank_batch']}: {r['error']}"
    text = (
        f"{r['world']} rank(s) hidden {r['hidden']} rows/rank {r['per_rank_batch']} {_variant_name(r['variant'])}: "
        f"{r['tokens_per_s']:,.0f} tokens/s ({r['step_ms']:.2f} ms/step); fwd {r['fwd_ms']:.2f} bwd {r['bwd_ms']:.2f} "
        f"(no all-reduce {r['bwd_local_ms']:.2f}) opt {r['opt_ms']:.2f} ms"
    )
    if "allreduce_ms" in r:
        text += f"; all-reduce alone {r['allreduce_ms']:.2f} ms, {100 * r['hidden_share']:.0f}% hidden"
    return text


def _variant_name(v: dict) -> str:
    if not v:
        return "default"
    return "+".join(k if val is True else f"{k}={val:g}" for k, val in v.items())


# --- tables -----------------------------------------------------------------------------------


def _load(paths: list[str]) -> list[dict]:
    records = []
    for path in paths:
        with open(path) as f:
            records += [json.loads(line) for line in f if line.strip()]
    return records


def tables(records: list[dict]) -> str:
    """Markdown: tokens/s and weak scaling, strong scaling, the all-reduce against the backward,
    the DDP variants, and the targets (met or not)."""
    ok = [r for r in records if "error" not in r]
    default = {(r["hidden"], r["world"], r["per_rank_batch"]): r for r in ok if not r["variant"]}
    if not ok:
        return "no measurements"
    h = ok[0]
    lines = [
        f"{h['gpu']} ({', '.join(str(w) for w in sorted({r['world'] for r in ok}))} per run), torch {h['torch']}, "
        f"{h['date']}; {h['dtype']}, sequence length {h['seq_len']}, backend {h['backend']}, Adam; tokens/s of the "
        "slowest rank, steady state, batches already on the device.",
        "",
    ]
    worlds = sorted({w for _, w, _ in default})
    hiddens = sorted({hd for hd, _, _ in default})

    def tps(hd, w, b):
        r = default.get((hd, w, b))
        return None if r is None else r["tokens_per_s"]

    # weak scaling
    lines += ["**Weak scaling** (per-rank batch fixed): tokens/s, and efficiency against N x one rank", ""]
    lines += ["| hidden | per-rank batch | " + " | ".join(f"{w} rank(s)" for w in worlds) + " |"]
    lines += ["|---|---|" + "---|" * len(worlds)]
    weak_rows = sorted({(hd, b) for hd, w, b in default if w > 1})
    for hd, b in weak_rows:
        base = tps(hd, 1, b)
        cells = []
        for w in worlds:
            t = tps(hd, w, b)
            if t is None:
                cells.append("-")
            elif w == 1 or base is None:
                cells.append(f"{t:,.0f}")
            else:
                cells.append(f"{t:,.0f} ({t / (w * base):.2f})")
        lines.append(f"| {hd} | {b} | " + " | ".join(cells) + " |")
    # strong scaling
    globals_ = sorted({w * b for hd, w, b in default if w > 1 and (hd, 1, w * b) in default})
    if globals_:
        lines += ["", "**Strong scaling** (global batch fixed): tokens/s, speed-up over one rank and efficiency", ""]
        lines += ["| hidden | global batch | " + " | ".join(f"{w} rank(s)" for w in worlds) + " |"]
        lines += ["|---|---|" + "---|" * len(worlds)]
        for hd in hiddens:
            for g in globals_:
                base = tps(hd, 1, g)
                if base is None:
                    continue
                cells = []
                for w in worlds:
                    t = tps(hd, w, g // w) if g % w == 0 else None
                    if t is None:
                        cells.append("-")
                    elif w == 1:
                        cells.append(f"{t:,.0f}")
                    else:
                        cells.append(f"{t:,.0f} ({t / base:.2f}x, {t / (w * base):.2f})")
                lines.append(f"| {hd} | {g} | " + " | ".join(cells) + " |")
    # the all-reduce against the backward
    multi = sorted(
        (r for r in default.values() if r["world"] > 1), key=lambda r: (r["hidden"], r["world"], r["per_rank_batch"])
    )
    if multi:
        lines += [
            "",
            "**The gradient all-reduce against the backward** (ms, each phase synchronised; DDP in backward = "
            "backward - backward without all-reduce; hidden = share of the all-reduce alone not seen in the step)",
            "",
            "| hidden | ranks | per-rank batch | grads MB | forward | backward | backward, no all-reduce | "
            "DDP in backward | all-reduce alone | hidden | step |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in multi:
            lines.append(
                f"| {r['hidden']} | {r['world']} | {r['per_rank_batch']} | {r['grad_mb']:.1f} | {r['fwd_ms']:.2f} | "
                f"{r['bwd_ms']:.2f} | {r['bwd_local_ms']:.2f} | {r['ddp_in_backward_ms']:.2f} | "
                f"{r['allreduce_ms']:.2f} | {100 * r['hidden_share']:.0f}% | {r['step_ms']:.2f} |"
            )
    variants = [r for r in ok if r["variant"]]
    if variants:
        lines += ["", "**DDP options** (tokens/s against the default at the same size)", ""]
        lines += ["| ranks | hidden | per-rank batch | option | tokens/s | vs default | DDP in backward (ms) |"]
        lines += ["|---|---|---|---|---|---|---|"]
        for r in variants:
            base = tps(r["hidden"], r["world"], r["per_rank_batch"])
            rel = "-" if base is None else f"{r['tokens_per_s'] / base:.3f}"
            lines.append(
                f"| {r['world']} | {r['hidden']} | {r['per_rank_batch']} | {_variant_name(r['variant'])} | "
                f"{r['tokens_per_s']:,.0f} | {rel} | {r['ddp_in_backward_ms']:.2f} |"
            )
    lines += ["", "**Targets**", ""]
    for kind, hd, batch, w, goal in TARGETS:
        if kind == "weak":
            base, t = tps(hd, 1, batch), tps(hd, w, batch)
            what = f"weak scaling, hidden {hd}, per-rank batch {batch}, {w} ranks"
        else:
            base, t = tps(hd, 1, batch), tps(hd, w, batch // w)
            what = f"strong scaling, hidden {hd}, global batch {batch}, {w} ranks"
        if base is None or t is None:
            lines.append(f"- {what}: not measured")
        else:
            eff = t / (w * base)
            lines.append(f"- {what}: efficiency {eff:.2f} (target {goal:.2f}: {'met' if eff >= goal else 'missed'})")
    errors = [r for r in records if "error" in r]
    for r in errors:
        lines.append(f"- not measured: {_line(r)}")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    p = Parser(prog="python -m lltm.bench.ddp_scaling", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="measure on the ranks torchrun started (or on one)")
    r.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    r.add_argument("--hidden", type=_ints, default=[512, 1024], help="hidden sizes, comma-separated")
    r.add_argument("--seq-len", type=int_at_least(1), default=128, help="sequence length")
    r.add_argument("--per-rank-batch", type=_ints, default=[64, 256], help="weak scaling: rows per rank")
    r.add_argument("--global-batch", type=_ints, default=[1024], help="strong scaling: rows over all ranks")
    r.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="bfloat16: autocast")
    r.add_argument("--backend", type=backend_arg, default="auto", help="the LLTM's backend")
    r.add_argument("--warmup", type=int_at_least(1), default=5, help="untimed steps per measurement")
    r.add_argument("--steps", type=int_at_least(1), default=20, help="timed steps per measurement")
    r.add_argument("--phase-steps", type=int_at_least(1), default=5, help="synchronised steps timing the phases")
    r.add_argument(
        "--variants",
        type=_variants_arg,
        default="",
        help="';'-separated DDP options measured at --variants-at with several ranks: default, "
        "bucket_cap_mb=MB, gradient_as_bucket_view, static_graph, accumulate=K (no_sync), or '+'-joined",
    )
    r.add_argument(
        "--variants-at", type=_pair, default=[512, 256], metavar="HIDDEN,ROWS", help="where the variants run"
    )
    r.add_argument(
        "--collective-timeout", type=float, default=300.0, help="seconds without progress before a rank ends"
    )
    r.add_argument("--threads", type=int_at_least(1), help="torch.set_num_threads")
    r.add_argument("--json", type=output_file, help="append one JSON line per measurement (rank 0)")
    t = sub.add_parser("table", help="Markdown tables from the JSON lines of the runs")
    t.add_argument("files", nargs="+", help="JSON-lines files of `run`")
    args = p.parse_args(argv)
    if args.command == "table":
        print(tables(_load(args.files)))
        return 0
    return _run(args)


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    sys.exit(main())
