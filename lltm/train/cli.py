"""`lltm train`: arguments and the run function (lltm/cli.py registers the subcommand).

lltm train --task charlm --compare --match-params --steps 500
torchrun --nproc_per_node 2 --max-restarts 1 -m lltm train --task copy --ckpt runs/ck --auto-resume
"""

from __future__ import annotations

import argparse
import json
import os
import sys

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
from lltm.train.loop import OPTIMIZERS, Options, Result, find_resume, run_config, train_model
from lltm.train.model import KINDS, ModelConfig, matched_hidden
from lltm.train.plot import plot_available, plot_runs
from lltm.train.tasks import TASKS, make_task

__all__ = ["add_arguments", "run"]

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
# Defaults of options whose default is None on the command line (so that an option given where it
# has no effect can be told from one left out).
DEFAULT_COPY_LEN = 5
DEFAULT_EMBED = 32
DEFAULT_CKPT_EVERY = 100
DEFAULT_KEEP = 3
DEFAULT_TIMEOUT = 600.0
DEFAULT_PROBE = 20


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except None and False (options whose default the help text states or
    that are off unless given)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False:
            return action.help or ""
        return super()._get_help_string(action)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = _HelpFormatter
    p.description = (
        "Train an LLTM (or nn.LSTM) sequence model. Bad arguments, and options that would be ignored, end in "
        "one line on stderr and exit status 2 before any work. Under torchrun --nproc_per_node N (or --nnodes "
        "M) every rank runs this command: DDP over gloo (CPU) or NCCL (CUDA), see docs/training.md."
    )
    g = p.add_argument_group("task")
    g.add_argument("--task", choices=TASKS, default="charlm", help="copy memory, adding problem, or character LM")
    g.add_argument(
        "--text", metavar="FILE", help="charlm only: the text to model (default: the Python standard library's sources)"
    )
    g.add_argument(
        "--seq-len", type=int_at_least(1), help="sequence length (default per task: copy 20, adding 30, charlm 64)"
    )
    g.add_argument(
        "--copy-len", type=int_at_least(1), help=f"copy only: symbols to remember (default {DEFAULT_COPY_LEN})"
    )
    g.add_argument("--batch", type=int_at_least(1), default=32, help="global batch, split evenly over the ranks")
    g.add_argument("--eval-batches", type=int_at_least(1), default=4, help="held-out batches per evaluation")
    g = p.add_argument_group("model")
    g.add_argument(
        "--model", choices=KINDS, help="recurrent layers: lltm.LLTM or torch.nn.LSTM (default lltm; not with --compare)"
    )
    g.add_argument(
        "--cell",
        default="lltm",
        metavar="CELL",
        help="the lltm model's recurrent cell on lltm's kernels: lltm (lltm.LLTM, the default), lstm, gru "
        "(lltm.LSTM, lltm.GRU), or your own: FILE.py:FUNCTION or module:FUNCTION returning lltm.cells.define(...) "
        "(docs/cells.md); with --compare it is trained beside torch.nn.LSTM",
    )
    g.add_argument("--compare", action="store_true", help="train both models, one after the other; plot both")
    g.add_argument("--hidden", type=int_at_least(1), default=64, help="hidden size (of the LLTM when --match-params)")
    g.add_argument(
        "--match-params",
        action="store_true",
        help="give nn.LSTM the hidden size whose parameter count is closest to the LLTM model's "
        "(with --compare, or --model lstm)",
    )
    g.add_argument("--layers", type=int_at_least(1), default=1, help="recurrent layers, stacked")
    g.add_argument(
        "--embed", type=int_at_least(1), help=f"copy, charlm: token embedding width (default {DEFAULT_EMBED})"
    )
    g.add_argument(
        "--dropout", type=float_in(0.0, 1.0), default=0.0, help="dropout between recurrent layers (needs --layers 2+)"
    )
    g.add_argument(
        "--backend",
        type=backend_arg,
        help=f"the LLTM's backend: auto (the fastest available; the default) or {_registry.help_text()}",
    )
    g = p.add_argument_group("optimisation")
    g.add_argument(
        "--steps", type=int_at_least(1), default=200, help="total global steps (a resumed run counts earlier ones)"
    )
    g.add_argument("--optimizer", choices=OPTIMIZERS, default="adam", help="Adam, or plain SGD (no momentum)")
    g.add_argument("--lr", type=positive_float, default=3e-3, help="learning rate")
    g.add_argument("--clip", type=float_in(0.0), default=1.0, help="gradient norm clip (0: off)")
    g.add_argument(
        "--accumulate",
        type=int_at_least(1),
        default=1,
        help="micro-batches per rank and step (gradient accumulation; under DDP the first ones in no_sync, "
        "so the gradients are all-reduced once per step): N ranks with 1 compute what 1 process with N computes",
    )
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
    g.add_argument("--threads", type=int_at_least(1), help="torch.set_num_threads on each rank (default: torch's)")
    g = p.add_argument_group("several ranks (torchrun)")
    g.add_argument(
        "--collective-timeout",
        type=positive_float,
        metavar="S",
        help=f"a rank that makes no progress for S seconds (it hangs, or waits in a collective for one that "
        f"does) ends with a message saying so, and torchrun ends the job (default {DEFAULT_TIMEOUT:g}; "
        f"the process group's own timeout is S + {ddp.BACKSTOP_S:g})",
    )
    g.add_argument(
        "--bucket-cap-mb",
        type=positive_float,
        metavar="MB",
        help="DDP's gradient bucket size: smaller buckets start all-reducing earlier in the backward, larger "
        "ones make fewer calls (default: torch's, 25)",
    )
    g.add_argument(
        "--gradient-as-bucket-view",
        action="store_true",
        help="DDP: gradients are views into the all-reduce buckets (saves a copy and the memory of one gradient set)",
    )
    g.add_argument(
        "--static-graph",
        action="store_true",
        help="DDP: the set of parameters used is the same every step (lets DDP skip the search for unused ones)",
    )
    g.add_argument(
        "--scaling-probe",
        type=int_at_least(0),
        metavar="STEPS",
        help=f"after training on several ranks, rank 0 alone trains a copy of the model for STEPS steps on "
        f"a rank's rows and on the global batch, and the run prints its weak- and strong-scaling efficiency "
        f"against them (default {DEFAULT_PROBE}; 0: only the per-rank throughput)",
    )
    g = p.add_argument_group("output")
    g.add_argument("--out", type=output_dir, default="runs/train", help="metrics <model>.jsonl, loss.png, summary.json")
    g.add_argument("--log-every", type=int_at_least(1), default=10, help="steps per training-loss row")
    g.add_argument("--eval-every", type=int_at_least(1), default=50, help="steps per held-out evaluation")
    g.add_argument(
        "--ckpt",
        metavar="DIR",
        type=output_dir,
        help="checkpoint directory (<DIR>/<model> with --compare); written by rank 0",
    )
    g.add_argument(
        "--ckpt-every",
        type=int_at_least(1),
        help=f"steps between checkpoints (default {DEFAULT_CKPT_EVERY}; the last step is always saved)",
    )
    g.add_argument(
        "--keep", type=int_at_least(0), help=f"checkpoints kept, newest first (default {DEFAULT_KEEP}; 0: all)"
    )
    g.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest checkpoint in --ckpt that loads; an error when there is none",
    )
    g.add_argument(
        "--auto-resume",
        action="store_true",
        help="continue from the newest checkpoint in --ckpt if there is one, else start at step 0: the same "
        "command starts a run and restarts it (torchrun --max-restarts)",
    )
    g.add_argument(
        "--override",
        action="store_true",
        help="with --resume/--auto-resume: continue even where --seed, --lr, --batch, --seq-len, --clip or "
        "--dropout differ from the checkpoint's (the new values apply from its step)",
    )
    g.add_argument("--no-plot", action="store_true", help='no loss curves (they need matplotlib: "lltm[plot]")')
    g.add_argument("--quiet", action="store_true", help="no progress bar")


def _validate(args: argparse.Namespace, world: int) -> list[str]:
    """Every rule between options, checked before any work (no process group, no data): raises
    ValueError naming the options and the fix for a conflict or an option that would be ignored;
    returns warnings for options that only matter under torchrun, given to one process."""
    if args.resume and args.auto_resume:
        raise ValueError("--resume and --auto-resume exclude each other (--auto-resume also starts a new run)")
    for flag, given in (("--resume", args.resume), ("--auto-resume", args.auto_resume)):
        if given and not args.ckpt:
            raise ValueError(f"{flag} needs --ckpt DIR (the directory to resume from)")
    if args.override and not (args.resume or args.auto_resume):
        raise ValueError("--override applies to a resumed run: pass it with --resume or --auto-resume")
    for flag, value in (("--ckpt-every", args.ckpt_every), ("--keep", args.keep)):
        if value is not None and not args.ckpt:
            raise ValueError(f"{flag} has no effect without --ckpt DIR")
    if args.text is not None and args.task != "charlm":
        raise ValueError(f"--text is the charlm task's text; --task {args.task} does not read it")
    if args.copy_len is not None and args.task != "copy":
        raise ValueError(f"--copy-len applies to --task copy only, not --task {args.task}")
    if args.embed is not None and args.task == "adding":
        raise ValueError("--embed has no effect on --task adding (its two features go in as they are)")
    if args.dropout > 0 and args.layers == 1:
        raise ValueError(
            "--dropout acts between recurrent layers, so it has no effect with --layers 1; pass --layers 2 or more"
        )
    if args.compare and args.model is not None:
        raise ValueError("--compare trains both models (lltm, then lstm); drop --model")
    model = args.model or "lltm"
    if args.match_params and not args.compare and model == "lltm":
        raise ValueError(
            "--match-params sizes nn.LSTM to the LLTM's parameter count: use it with --compare or --model lstm"
        )
    if args.cell != "lltm" and not args.compare and model == "lstm":
        raise ValueError("--cell picks the lltm model's cell; --model lstm (torch.nn.LSTM) has none")
    if args.backend is not None and not args.compare and model == "lstm":
        raise ValueError("--backend picks the LLTM's backend; --model lstm (torch.nn.LSTM) has none")
    if args.batch % world:
        raise ValueError(f"--batch {args.batch} must be divisible by the number of ranks ({world})")
    rows = args.batch // world
    if rows % args.accumulate:
        raise ValueError(
            f"--accumulate {args.accumulate} must divide each rank's {rows} rows (--batch {args.batch} over "
            f"{world} rank(s))"
        )
    if args.static_graph and args.accumulate > 1:
        raise ValueError(
            "--static-graph with --accumulate: DDP's static graph fails an internal assert in torch's reducer when "
            "its first backward runs under no_sync (torch 2.13); drop one of them"
        )
    if world > 1 and args.device.startswith("cuda:"):
        raise ValueError(f"under torchrun each rank uses cuda:LOCAL_RANK; pass --device cuda, not {args.device}")
    warnings = []
    if world == 1:
        given = [
            flag
            for flag, value in (
                ("--collective-timeout", args.collective_timeout),
                ("--bucket-cap-mb", args.bucket_cap_mb),
                ("--gradient-as-bucket-view", args.gradient_as_bucket_view or None),
                ("--static-graph", args.static_graph or None),
                ("--scaling-probe", args.scaling_probe),
            )
            if value is not None
        ]
        if given:
            warnings.append(f"{', '.join(given)}: no effect in one process (they apply under torchrun)")
    return warnings


def _lstm_bf16_runs_on_cpu() -> bool:
    """Whether torch.nn.LSTM runs under CPU bfloat16 autocast here (oneDNN has no bfloat16
    LSTM primitive on CPUs without native bfloat16, e.g. AVX2-only ones)."""
    lstm = torch.nn.LSTM(2, 2, batch_first=True)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lstm(torch.zeros(1, 1, 2))
    except RuntimeError:
        return False
    return True


def _check(args: argparse.Namespace, device: torch.device, kinds: list[str]) -> None:
    """What needs the device: the backend on it, bfloat16 nn.LSTM on the CPU, the output folders."""
    if "lltm" in kinds:
        try:
            from lltm import cells

            family = "seq" if args.cell == "lltm" else cells.load(args.cell).op_family()
            _backends.resolve(args.backend or "auto", device.type, family)
        except (ValueError, RuntimeError, TypeError) as exc:
            raise ValueError(str(exc).removeprefix("lltm: ")) from None
    if "lstm" in kinds and args.dtype == "bfloat16" and device.type == "cpu" and not _lstm_bf16_runs_on_cpu():
        raise ValueError(
            "torch.nn.LSTM does not run under CPU bfloat16 autocast on this machine (oneDNN has no bfloat16 "
            "LSTM for this CPU); use --dtype float32, --model lltm, or a CUDA device"
        )
    for folder in (args.out, args.ckpt):
        if folder:
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as exc:
                raise ValueError(f"cannot create {folder}: {exc.strerror}") from None


def _agree(ctx: ddp.Context, check) -> None:
    """Runs check() on every rank; when it raises on any, every rank raises that rank's
    ValueError (so no rank goes on to wait for the others in a collective)."""
    error = None
    try:
        check()
    except ValueError as e:
        error = str(e)
    errors = [e for e in ctx.gather(error) if e is not None]
    if errors:
        raise ValueError(errors[0])


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
    rank, world, _ = ddp.world_from_env()
    for line in _validate(args, world):
        if rank == 0:
            print(f"lltm train: warning: {line}", file=sys.stderr)
    if args.threads:
        torch.set_num_threads(args.threads)
    task = make_task(
        args.task,
        seed=args.seed,
        batch=args.batch,
        seq_len=args.seq_len,
        eval_batches=args.eval_batches,
        copy_len=args.copy_len or DEFAULT_COPY_LEN,
        text=args.text,
    )
    kinds = list(KINDS) if args.compare else [args.model or "lltm"]
    ctx = ddp.setup(
        args.device,
        collective_timeout=args.collective_timeout or DEFAULT_TIMEOUT,
        ddp=ddp.DDPOptions(args.bucket_cap_mb, args.gradient_as_bucket_view, args.static_graph),
    )
    try:
        _agree(ctx, lambda: _check(args, ctx.device, kinds))
        base = ModelConfig(
            kind="lltm",
            n_in=task.n_in,
            n_out=task.n_out,
            hidden=args.hidden,
            layers=args.layers,
            embed=args.embed or DEFAULT_EMBED,
            tokens=task.tokens,
            readout=task.readout,
            cell=args.cell,
        )
        lstm_hidden = matched_hidden(base, "lstm") if args.match_params else args.hidden
        opts = Options(
            steps=args.steps,
            lr=args.lr,
            clip=args.clip,
            dropout=args.dropout,
            seed=args.seed,
            backend=args.backend or "auto",
            bf16=args.dtype == "bfloat16",
            compile=args.compile or "",
            log_every=args.log_every,
            eval_every=args.eval_every,
            ckpt_every=args.ckpt_every or DEFAULT_CKPT_EVERY,
            keep=DEFAULT_KEEP if args.keep is None else args.keep,
            progress=not args.quiet,
            warmup_steps=args.warmup_steps,
            optimizer=args.optimizer,
            accumulate=args.accumulate,
            scaling_probe=DEFAULT_PROBE if args.scaling_probe is None else args.scaling_probe,
            override=args.override,
        )
        mode = "must" if args.resume else "auto" if args.auto_resume else ""
        # Every model's checkpoint is found and checked before any of them trains.
        plans = []
        for kind in kinds:
            hidden = lstm_hidden if kind == "lstm" else args.hidden
            cfg = ModelConfig(**{**base.as_dict(), "kind": kind, "hidden": hidden})
            ckpt_dir = None
            if args.ckpt:
                ckpt_dir = os.path.join(args.ckpt, kind) if args.compare else args.ckpt
            resume = find_resume(opts, ctx, run_config(opts, cfg, task), ckpt_dir, mode, kind)
            if resume is not None and int(resume.state["step"]) == args.steps:
                if ctx.is_main:
                    print(f"lltm train: {kind}: {resume.path} is at step {args.steps} = --steps: nothing to train")
                continue
            plans.append((kind, cfg, ckpt_dir, resume))
        results: list[Result] = []
        for kind, cfg, ckpt_dir, resume in plans:
            metrics = os.path.join(args.out, f"{kind}.jsonl")
            results.append(train_model(opts, ctx, task, cfg, metrics, ckpt_dir, resume))
        if ctx.is_main and results:
            _report(args, ctx, task, results)
    finally:
        ddp.teardown(ctx)
    return 0


def _report(args: argparse.Namespace, ctx: ddp.Context, task, results: list[Result]) -> None:
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
                "optimizer": args.optimizer,
                "accumulate": args.accumulate,
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
        print(f'{metrics}; no loss curves: they need matplotlib (pip install "lltm[plot]"; --no-plot: do not ask)')
    else:
        runs = {f"{r.kind} h={r.hidden} ({r.params:,} params)": r.metrics for r in results}
        png = plot_runs(
            runs,
            os.path.join(args.out, "loss.png"),
            title=f"{args.task}: batch {task.batch}, seq {task.seq_len}, {ctx.world} rank(s)",
            ylabel=task.loss_name,
        )
        print(f"{metrics}; curves: {png}")
