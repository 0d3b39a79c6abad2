"""The training loop of `lltm train`: one model, from scratch or from its last checkpoint."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lltm.train import checkpoint
from lltm.train.ddp import Context
from lltm.train.model import ModelConfig, SequenceModel, count_parameters
from lltm.train.tasks import Stats, Task, shard

__all__ = ["Options", "Result", "evaluate", "train_model"]


@dataclass
class Options:
    """The loop's settings (the command line's, minus what builds the task and model)."""

    steps: int = 200
    lr: float = 3e-3
    clip: float = 1.0
    dropout: float = 0.0
    seed: int = 0
    backend: str = "auto"
    bf16: bool = False
    compile: bool = False
    log_every: int = 10
    eval_every: int = 50
    ckpt_every: int = 100
    keep: int = 3
    resume: bool = False
    progress: bool = True


@dataclass
class Result:
    """What one run ended with; speeds count this process's steps and training time only."""

    kind: str
    hidden: int
    params: int
    steps: int
    train_loss: float
    eval_loss: float
    eval_acc: float
    steps_per_s: float
    tokens_per_s: float
    metrics: str


def _seed_for(*parts: Any) -> int:
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def _seed_rank(seed: int, step: int, rank: int) -> None:
    # Each rank's own stream (dropout masks differ between shards), a function of where the run starts.
    s = _seed_for(seed, "rank", step, rank)
    torch.manual_seed(s)
    random.seed(s)


def _autocast(ctx: Context, bf16: bool):
    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast(device_type=ctx.device.type, dtype=torch.bfloat16)


def evaluate(model: nn.Module, task: Task, ctx: Context, bf16: bool) -> dict[str, float]:
    """Mean loss and accuracy over the task's held-out batches (dropout off)."""
    was_training = model.training
    model.eval()
    stats = Stats()
    with torch.no_grad(), _autocast(ctx, bf16):
        for x, y in task.held_out():
            loss, correct, count = task.score(model(x.to(ctx.device)), y.to(ctx.device))
            stats.add(loss, correct, count)
    model.train(was_training)
    return stats.result()


class _Metrics:
    """JSON lines, written by rank 0 only. A resumed run keeps the rows up to the
    checkpoint's step (a run killed after its last checkpoint redoes those steps)."""

    def __init__(self, path: str, enabled: bool, resumed_at: int | None) -> None:
        self.path, self.enabled = path, enabled
        if not enabled:
            return
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        kept = []
        if resumed_at is not None and os.path.exists(path):
            with open(path) as f:
                kept = [line for line in f if line.strip() and json.loads(line).get("step", 0) <= resumed_at]
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.writelines(kept)
        os.replace(tmp, path)

    def write(self, row: dict[str, Any]) -> None:
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")


def _sync(ctx: Context) -> None:
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)


def train_model(
    opts: Options,
    ctx: Context,
    task: Task,
    cfg: ModelConfig,
    metrics_path: str,
    ckpt_dir: str | None,
) -> Result:
    """Train one model for opts.steps global steps (counting the steps of the
    checkpoint it resumes from) and return how it ended."""
    torch.manual_seed(opts.seed)  # the same initial weights on every rank and in every rerun
    model = SequenceModel(cfg, dropout=opts.dropout, backend=opts.backend).to(ctx.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=opts.lr)
    config = {"model": cfg.as_dict(), "task": task.describe()}
    start, train_time, resumed_at = 0, 0.0, None
    _seed_rank(opts.seed, 0, ctx.rank)

    existing = checkpoint.list_checkpoints(ckpt_dir) if ckpt_dir else []
    if existing and not opts.resume:
        raise FileExistsError(
            f"lltm train: {ckpt_dir} already holds checkpoints (up to step {existing[-1][0]}); "
            "pass --resume to continue that run, or choose another --ckpt directory"
        )
    if opts.resume and ckpt_dir:
        loaded = checkpoint.load_latest(ckpt_dir)
        if loaded is None:
            if ctx.is_main:
                print(f"lltm train: no checkpoint in {ckpt_dir}; starting from step 0")
        else:
            path, state = loaded
            checkpoint.check_config(path, {**state["config"]["model"], **state["config"]["task"]},
                                    {**config["model"], **config["task"]})
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start = resumed_at = int(state["step"])
            train_time = float(state["train_time"])
            rngs = state["rng"]
            if len(rngs) == ctx.world:
                checkpoint.set_rng(rngs[ctx.rank], ctx.device)
            else:
                # Another rank count: the data stream is the same (a function of the step), but
                # dropout masks cannot be, so each rank starts a fresh stream from the step.
                _seed_rank(opts.seed, start, ctx.rank)
            if ctx.is_main:
                print(f"lltm train: resumed {cfg.kind} from {path} (step {start}, {len(rngs)} rank(s) then, "
                      f"{ctx.world} now)")

    net = ctx.wrap(model)
    if opts.compile:
        net = torch.compile(net)
    metrics = _Metrics(metrics_path, ctx.is_main, resumed_at)
    params = count_parameters(cfg)
    metrics.write({"kind": "config", "step": start, "world": ctx.world, "params": params, "device": str(ctx.device),
                   "bf16": opts.bf16, "compile": opts.compile, "lr": opts.lr, "batch": task.batch,
                   "seq_len": task.seq_len, "torch": torch.__version__, "model": cfg.kind,
                   **{k: v for k, v in config["model"].items() if k != "kind"}, **config["task"]})

    def save(step: int) -> None:
        rngs = ctx.gather(checkpoint.rng_state(ctx.device))  # collective: every rank takes part
        if ctx.is_main:
            state = {"step": step, "config": config, "model": model.state_dict(),
                     "optimizer": optimizer.state_dict(), "rng": rngs, "train_time": train_time, "world": ctx.world}
            checkpoint.save(ckpt_dir, step, state, opts.keep)

    from tqdm.auto import tqdm

    bar = tqdm(total=opts.steps, initial=start, desc=f"{cfg.kind} h={cfg.hidden}", unit="step",
               disable=not (ctx.is_main and opts.progress), dynamic_ncols=True)
    tokens = task.tokens_per_batch()
    loss_sum, window_steps, own_steps = None, 0, 0
    train_loss = eval_loss = eval_acc = float("nan")
    clock = {"mark": time.perf_counter(), "own": 0.0, "window": 0.0}

    def lap() -> None:
        # Training time only: the clock is read after the device has finished, and stops
        # while evaluating and saving.
        nonlocal train_time
        now = time.perf_counter()
        for key in ("own", "window"):
            clock[key] += now - clock["mark"]
        train_time += now - clock["mark"]
        clock["mark"] = now

    model.train()
    for step in range(start, opts.steps):
        x, y = task.train_batch(step)
        x = shard(x, ctx.rank, ctx.world).to(ctx.device, non_blocking=True)
        y = shard(y, ctx.rank, ctx.world).to(ctx.device, non_blocking=True)
        with _autocast(ctx, opts.bf16):
            out = net(x)
        loss = task.loss(out, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if opts.clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), opts.clip)
        optimizer.step()
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        window_steps += 1
        own_steps += 1
        done = step + 1
        bar.update(1)
        last = done == opts.steps
        if done % opts.log_every == 0 or last:
            train_loss = ctx.mean(loss_sum / window_steps).item()  # waits for the device
            lap()
            span = max(clock["window"], 1e-9)
            row = {"kind": "train", "step": done, "loss": train_loss, "time": round(train_time, 4),
                   "steps_per_s": window_steps / span, "tokens_per_s": window_steps * tokens / span}
            metrics.write(row)
            bar.set_postfix(loss=f"{train_loss:.4f}", tok_s=f"{row['tokens_per_s']:.0f}")
            loss_sum, window_steps, clock["window"] = None, 0, 0.0
        do_eval = done % opts.eval_every == 0 or last
        do_ckpt = ckpt_dir is not None and (done % opts.ckpt_every == 0 or last)
        if do_eval or do_ckpt:
            _sync(ctx)
            lap()
            if do_eval and ctx.is_main:
                res = evaluate(model, task, ctx, opts.bf16)
                eval_loss, eval_acc = res["loss"], res["acc"]
                metrics.write({"kind": "eval", "step": done, "time": round(train_time, 4), **res})
                bar.write(f"{cfg.kind} step {done}: held-out loss {eval_loss:.4f}, acc {eval_acc:.4f}")
            if do_ckpt:
                save(done)
            clock["mark"] = time.perf_counter()
    bar.close()
    if own_steps == 0 and ctx.is_main:  # resumed at or past --steps: report where the checkpoint stands
        res = evaluate(model, task, ctx, opts.bf16)
        eval_loss, eval_acc = res["loss"], res["acc"]
    ctx.barrier()  # rank 0 may still be evaluating or writing
    return Result(kind=cfg.kind, hidden=cfg.hidden, params=params, steps=opts.steps, train_loss=train_loss,
                  eval_loss=eval_loss, eval_acc=eval_acc, steps_per_s=own_steps / max(clock["own"], 1e-9),
                  tokens_per_s=own_steps * tokens / max(clock["own"], 1e-9), metrics=metrics_path)
