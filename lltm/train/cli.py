"""`lltm train`: arguments and the run function (lltm/cli.py registers the subcommand).

lltm train --task charlm --compare --match-params --steps 500
torchrun --nproc_per_node 2 -m lltm train --task copy --ckpt runs/ck
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from lltm import _backends, _registry
from lltm._argtypes import (
    backend_arg,
    device_or_auto,
    fail,
    float_in,
    int_at_least,
    output_dir,
    positive_float,
)
from lltm.train import ddp
from lltm.train.loop import Options, Result, train_model
from lltm.train.model import KINDS, ModelConfig, matched_hidden
from lltm.train.plot import plot_available, plot_runs
from lltm.train.tasks import TASKS, make_task

__all__ = ["add_arguments", "run"]

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    p.description = (
        "Train an LLTM (or nn.LSTM) sequence model. Bad arguments end in one line on stderr and exit status 2 "
        "before any work."
    )
    g = p.add_argument_group("task")
    g.add_argument("--task", choices=TASKS, default="charlm", help="copy memory, adding problem, or character LM")
    g.add_argument("--text", metavar="FILE", help="charlm text (default: the Python standard library's sources)")
    g.add_argument(
        "--seq-len", type=int_at_least(1), help="sequence length (default per task: copy 20, adding 30, charlm 64)"
    )
    g.add_argument("--copy-len", type=int_at_least(1), default=5, help="copy task: symbols to remember")
    g.add_argument("--batch", type=int_at_least(1), default=32, help="global batch, split evenly over the ranks")
    g.add_argument("--eval-batches", type=int_at_least(1), default=4, help="held-out batches per evaluation")
    g = p.add_argument_group("model")
    g.add_argument("--model", choices=KINDS, default="lltm", help="recurrent layers: lltm.LLTM or torch.nn.LSTM")
    g.add_argument("--compare", action="store_true", help="train both models, one after the other; plot both")
    g.add_argument("--hidden", type=int_at_least(1), default=64, help="hidden size (of the LLTM when --match-params)")
    g.add_argument(
        "--match-params",
        action="store_true",
        help="give nn.LSTM the hidden size whose parameter count is closest to the LLTM model's",
    )
    g.add_argument("--layers", type=int_at_least(1), default=1)
    g.add_argument("--embed", type=int_at_least(1), default=32, help="embedding width (copy, charlm)")
    g.add_argument("--dropout", type=float_in(0.0, 1.0), default=0.0, help="between recurrent layers")
    g.add_argument(
        "--backend",
        type=backend_arg,
        default="auto",
        help=f"lltm backend: auto (the fastest available) or {_registry.help_text()}",
    )
    g = p.add_argument_group("optimisation")
    g.add_argument(
        "--steps", type=int_at_least(1), default=200, help="total global steps (a resumed run counts earlier ones)"
    )
    g.add_argument("--lr", type=positive_float, default=3e-3, help="Adam learning rate")
    g.add_argument("--clip", type=float_in(0.0), default=1.0, help="gradient norm clip (0: off)")
    g.add_argument("--seed", type=int, default=0, help="weights and data stream")
    g.add_argument(
        "--device", type=device_or_auto, default="auto", help="cpu, cuda, cuda:N or auto (torchrun: cuda:LOCAL_RANK)"
    )
    g.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="bfloat16: torch.autocast on the device (weights stay float32)",
    )
    g.add_argument(
        "--compile",
        nargs="?",
        const="default",
        default=None,
        choices=COMPILE_MODES,
        metavar="MODE",
        help="torch.compile the model (MODE: default, reduce-overhead, max-autotune-no-cudagraphs), "
        "compiled in this process (not inductor's worker pool, which keeps taking cores from the "
        "step; TORCHINDUCTOR_COMPILE_THREADS overrides). Its compilation falls in the warm-up steps, "
        "timed apart from the steady-state steps/s. The LLTM layer is one custom operator with or "
        "without it, so compiling can only change the small layers around it (embedding, head) "
        "and adds a fixed cost per step (guards, autograd wrappers): expect eager's speed or a "
        "little less (charlm hidden 256, batch 64, seq 128 on the H100: 0.93x eager's steps/s; "
        "hidden 64 on 2 CPU cores: 0.94-1.01x; docs/training.md)",
    )
    g.add_argument(
        "--warmup-steps",
        type=int_at_least(0),
        default=5,
        help="this process's first steps, timed apart from the steady state (compilation, first-call "
        "allocations and kernel choices)",
    )
    g.add_argument("--threads", type=int_at_least(1), help="torch.set_num_threads on each rank")
    g = p.add_argument_group("output")
    g.add_argument("--out", type=output_dir, default="runs/train", help="metrics <model>.jsonl, loss.png, summary.json")
    g.add_argument("--log-every", type=int_at_least(1), default=10, help="steps per training-loss row")
    g.add_argument("--eval-every", type=int_at_least(1), default=50, help="steps per held-out evaluation")
    g.add_argument("--ckpt", metavar="DIR", type=output_dir, help="checkpoint directory (<DIR>/<model> with --compare)")
    g.add_argument("--ckpt-every", type=int_at_least(1), default=100)
    g.add_argument("--keep", type=int_at_least(0), default=3, help="checkpoints kept (0: all)")
    g.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --ckpt")
    g.add_argument("--no-plot", action="store_true", help='no loss curves (they need matplotlib: "lltm[plot]")')
    g.add_argument("--quiet", action="store_true", help="no progress bar")


def _check(args: argparse.Namespace, device: torch.device) -> None:
    """What argparse cannot see alone: combinations, the backend on the device, the output folders."""
    if args.resume and not args.ckpt:
        raise ValueError("--resume needs --ckpt DIR (the directory to resume from)")
    if args.model == "lltm" or args.compare:
        try:
            _backends.resolve(args.backend, device.type, "seq")
        except (ValueError, RuntimeError) as exc:
            raise ValueError(str(exc).removeprefix("lltm: ")) from None
    for folder in (args.out, args.ckpt):
        if folder:
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as exc:
                raise ValueError(f"cannot create {folder}: {exc.strerror}") from None


def _table(results: list[Result], task_name: str) -> str:
    """steps/s and tokens/s are those of the steady state, after the warm-up steps (timed apart)."""
    head = (
        "| model | hidden | params | steps | train loss | held-out loss | held-out acc | steps/s | tokens/s | warm-up |"
    )
    rows = [head, "|" + "---|" * 10]
    for r in results:
        speed = "- | -" if r.steps_per_s is None else f"{r.steps_per_s:.2f} | {r.tokens_per_s:,.0f}"
        rows.append(
            f"| {r.kind} | {r.hidden} | {r.params:,} | {r.steps} | {r.train_loss:.4f} | {r.eval_loss:.4f} | "
            f"{r.eval_acc:.4f} | {speed} | {r.warmup_steps} steps, {r.warmup_s:.2f} s |"
        )
    return (
        f"task {task_name}\n"
        + "\n".join(rows)
        + "\n(steps/s, tokens/s: steady state, after the warm-up steps, which are timed apart)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (ValueError, FileExistsError) as e:  # wrong options or checkpoint: the message says what to change
        return fail("lltm train", str(e).removeprefix("lltm train: "))


def _run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    ctx = ddp.setup(args.device)
    try:
        _check(args, ctx.device)
        task = make_task(
            args.task,
            seed=args.seed,
            batch=args.batch,
            seq_len=args.seq_len,
            eval_batches=args.eval_batches,
            copy_len=args.copy_len,
            text=args.text,
        )
        if args.batch % ctx.world:
            raise ValueError(f"lltm train: --batch {args.batch} must be divisible by the number of ranks ({ctx.world})")
        base = ModelConfig(
            kind="lltm",
            n_in=task.n_in,
            n_out=task.n_out,
            hidden=args.hidden,
            layers=args.layers,
            embed=args.embed,
            tokens=task.tokens,
            readout=task.readout,
        )
        lstm_hidden = matched_hidden(base, "lstm") if args.match_params else args.hidden
        kinds = list(KINDS) if args.compare else [args.model]
        opts = Options(
            steps=args.steps,
            lr=args.lr,
            clip=args.clip,
            dropout=args.dropout,
            seed=args.seed,
            backend=args.backend,
            bf16=args.dtype == "bfloat16",
            compile=args.compile or "",
            log_every=args.log_every,
            eval_every=args.eval_every,
            ckpt_every=args.ckpt_every,
            keep=args.keep,
            resume=args.resume,
            progress=not args.quiet,
            warmup_steps=args.warmup_steps,
        )
        results: list[Result] = []
        for kind in kinds:
            hidden = lstm_hidden if kind == "lstm" else args.hidden
            cfg = ModelConfig(**{**base.as_dict(), "kind": kind, "hidden": hidden})
            ckpt_dir: str | None = None
            if args.ckpt:
                ckpt_dir = os.path.join(args.ckpt, kind) if args.compare else args.ckpt
            metrics = os.path.join(args.out, f"{kind}.jsonl")
            results.append(train_model(opts, ctx, task, cfg, metrics, ckpt_dir))
        if ctx.is_main:
            print(
                _table(results, args.task) + f"\n(baseline: {task.baseline}; {ctx.world} rank(s), {ctx.device}, "
                f"torch {torch.__version__})"
            )
            with open(os.path.join(args.out, "summary.json"), "w") as f:
                json.dump(
                    {
                        "task": args.task,
                        "world": ctx.world,
                        "device": str(ctx.device),
                        "dtype": args.dtype,
                        "batch": task.batch,
                        "seq_len": task.seq_len,
                        "torch": torch.__version__,
                        "compile": args.compile,
                        "speeds": "steady state, after the warm-up steps",
                        "results": [r.__dict__ for r in results],
                    },
                    f,
                    indent=1,
                )
            metrics = f"metrics: {', '.join(r.metrics for r in results)}"
            if args.no_plot:
                print(metrics)
            elif not plot_available():
                print(
                    f'{metrics}; no loss curves: they need matplotlib (pip install "lltm[plot]"; --no-plot: do not ask)'
                )
            else:
                runs = {f"{r.kind} h={r.hidden} ({r.params:,} params)": r.metrics for r in results}
                png = plot_runs(
                    runs,
                    os.path.join(args.out, "loss.png"),
                    title=f"{args.task}: batch {task.batch}, seq {task.seq_len}, {ctx.world} rank(s)",
                    ylabel=task.loss_name,
                )
                print(f"{metrics}; curves: {png}")
    finally:
        ddp.teardown()
    return 0
