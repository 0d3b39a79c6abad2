"""The training loop of `lltm train`: one model, from scratch or from its last checkpoint."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor, nn

from lltm.train import checkpoint
from lltm.train.ddp import Context
from lltm.train.model import ModelConfig, SequenceModel, count_parameters
from lltm.train.tasks import Stats, Task, shard

__all__ = ["Options", "Result", "build", "evaluate", "train_model", "train_step"]


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
    compile: str = ""  # torch.compile mode ("default", "reduce-overhead", ...); "": eager
    log_every: int = 10
    eval_every: int = 50
    ckpt_every: int = 100
    keep: int = 3
    resume: bool = False
    progress: bool = True
    warmup_steps: int = 5  # this process's first steps, timed apart (compilation, first-call costs)


@dataclass
class Result:
    """What one run ended with. Speeds count this process's own steps and
    training time only; the first `warmup_steps` of them (compilation,
    first-call allocations and kernel choices) are timed apart, and
    steps_per_s / tokens_per_s are those of the steps after them (None when
    there were none)."""

    kind: str
    hidden: int
    params: int
    steps: int
    train_loss: float
    eval_loss: float
    eval_acc: float
    steps_per_s: Optional[float]
    tokens_per_s: Optional[float]
    warmup_steps: int
    warmup_s: float
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


class _Clock:
    """Training time only: laps end where the device has finished (after a
    sync or a value read back), and the clock stops while evaluating and
    saving. The first `warmup` steps of this process are timed apart."""

    def __init__(self, ctx: Context, warmup: int, train_time: float) -> None:
        self.ctx, self.warmup = ctx, warmup
        self.train_time = train_time  # of the whole run, resumed runs included
        self.own = self.window = self.warmup_s = 0.0
        self.steps = self.window_steps = 0
        self.mark = time.perf_counter()

    def lap(self) -> None:
        now = time.perf_counter()
        for key in ("own", "window", "train_time"):
            setattr(self, key, getattr(self, key) + now - self.mark)
        self.mark = now

    def pause(self) -> None:
        _sync(self.ctx)
        self.lap()

    def resume(self) -> None:
        self.mark = time.perf_counter()

    def step_done(self) -> bool:
        """Counts a step; True when it ends the warm-up (the time so far is then its time)."""
        self.steps += 1
        self.window_steps += 1
        if self.steps != self.warmup:
            return False
        self.pause()
        self.warmup_s = self.own
        return True

    def end_window(self) -> float:
        """Seconds of the steps since the last call (the caller read a value back)."""
        self.lap()
        span = max(self.window, 1e-9)
        self.window, self.window_steps = 0.0, 0
        return span

    def summary(self) -> tuple[Optional[float], int, float]:
        """(steady-state steps per second or None, warm-up steps, warm-up seconds)."""
        if self.steps <= self.warmup:  # the run ended within its warm-up
            return None, self.steps, self.own
        return (self.steps - self.warmup) / max(self.own - self.warmup_s, 1e-9), self.warmup, self.warmup_s


def build(opts: Options, ctx: Context, cfg: ModelConfig) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(opts.seed)  # the same initial weights on every rank and in every rerun
    model = SequenceModel(cfg, dropout=opts.dropout, backend=opts.backend).to(ctx.device)
    return model, torch.optim.Adam(model.parameters(), lr=opts.lr)


def _restore(
    opts: Options,
    ctx: Context,
    cfg: ModelConfig,
    config: dict,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    ckpt_dir: Optional[str],
) -> tuple[int, float, Optional[int]]:
    """Loads the newest checkpoint when resuming. Returns (start step, training
    time so far, the step resumed at or None)."""
    _seed_rank(opts.seed, 0, ctx.rank)
    existing = checkpoint.list_checkpoints(ckpt_dir) if ckpt_dir else []
    if existing and not opts.resume:
        raise FileExistsError(
            f"lltm train: {ckpt_dir} already holds checkpoints (up to step {existing[-1][0]}); "
            "pass --resume to continue that run, or choose another --ckpt directory"
        )
    if not (opts.resume and ckpt_dir):
        return 0, 0.0, None
    loaded = checkpoint.load_latest(ckpt_dir)
    if loaded is None:
        if ctx.is_main:
            print(f"lltm train: no checkpoint in {ckpt_dir}; starting from step 0")
        return 0, 0.0, None
    path, state = loaded
    checkpoint.check_config(
        path, {**state["config"]["model"], **state["config"]["task"]}, {**config["model"], **config["task"]}
    )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = int(state["step"])
    rngs = state["rng"]
    if len(rngs) == ctx.world:
        checkpoint.set_rng(rngs[ctx.rank], ctx.device)
    else:
        # Another rank count: the data stream is the same (a function of the step), but
        # dropout masks cannot be, so each rank starts a fresh stream from the step.
        _seed_rank(opts.seed, start, ctx.rank)
    if ctx.is_main:
        print(f"lltm train: resumed {cfg.kind} from {path} (step {start}, {len(rngs)} rank(s) then, {ctx.world} now)")
    return start, float(state["train_time"]), start


def train_step(
    net: nn.Module,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    task: Task,
    ctx: Context,
    opts: Options,
    step: int,
) -> Tensor:
    """One optimisation step on this rank's shard of the step's batch; returns the loss (not read back)."""
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
    return loss.detach()


class _Run:
    """One model's training after set-up: what each step reports, evaluates and saves."""

    def __init__(
        self,
        opts: Options,
        ctx: Context,
        task: Task,
        cfg: ModelConfig,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        config: dict,
        metrics: _Metrics,
        clock: _Clock,
        ckpt_dir: Optional[str],
        start: int,
    ) -> None:
        self.opts, self.ctx, self.task, self.cfg = opts, ctx, task, cfg
        self.model, self.optimizer, self.config = model, optimizer, config
        self.metrics, self.clock, self.ckpt_dir = metrics, clock, ckpt_dir
        self.loss_sum: Optional[Tensor] = None
        self.train_loss = self.eval_loss = self.eval_acc = float("nan")
        from tqdm.auto import tqdm

        self.bar = tqdm(
            total=opts.steps,
            initial=start,
            desc=f"{cfg.kind} h={cfg.hidden}",
            unit="step",
            disable=not (ctx.is_main and opts.progress),
            dynamic_ncols=True,
        )

    def after_step(self, done: int, loss: Tensor) -> None:
        self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss
        self.bar.update(1)
        clock = self.clock
        if clock.step_done():
            self.metrics.write(
                {"kind": "warmup", "step": done, "steps": clock.steps, "seconds": round(clock.warmup_s, 4)}
            )
            clock.resume()
        last = done == self.opts.steps
        if done % self.opts.log_every == 0 or last:
            self._log(done)
        do_eval = done % self.opts.eval_every == 0 or last
        do_ckpt = self.ckpt_dir is not None and (done % self.opts.ckpt_every == 0 or last)
        if do_eval or do_ckpt:
            clock.pause()
            if do_eval and self.ctx.is_main:
                self._evaluate(done)
            if do_ckpt:
                self._save(done)
            clock.resume()

    def _log(self, done: int) -> None:
        steps = self.clock.window_steps
        self.train_loss = self.ctx.mean(self.loss_sum / steps).item()  # waits for the device
        span = self.clock.end_window()
        tokens = self.task.tokens_per_batch()
        row = {
            "kind": "train",
            "step": done,
            "loss": self.train_loss,
            "time": round(self.clock.train_time, 4),
            "steps_per_s": steps / span,
            "tokens_per_s": steps * tokens / span,
        }
        self.metrics.write(row)
        self.bar.set_postfix(loss=f"{self.train_loss:.4f}", tok_s=f"{row['tokens_per_s']:.0f}")
        self.loss_sum = None

    def _evaluate(self, done: Optional[int] = None) -> None:
        res = evaluate(self.model, self.task, self.ctx, self.opts.bf16)
        self.eval_loss, self.eval_acc = res["loss"], res["acc"]
        if done is not None:
            self.metrics.write({"kind": "eval", "step": done, "time": round(self.clock.train_time, 4), **res})
            self.bar.write(f"{self.cfg.kind} step {done}: held-out loss {self.eval_loss:.4f}, acc {self.eval_acc:.4f}")

    def _save(self, step: int) -> None:
        rngs = self.ctx.gather(checkpoint.rng_state(self.ctx.device))  # collective: every rank takes part
        if self.ctx.is_main:
            state = {
                "step": step,
                "config": self.config,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "rng": rngs,
                "train_time": self.clock.train_time,
                "world": self.ctx.world,
            }
            checkpoint.save(self.ckpt_dir, step, state, self.opts.keep)

    def finish(self, params: int, metrics_path: str) -> Result:
        self.bar.close()
        if self.clock.steps == 0 and self.ctx.is_main:  # resumed at or past --steps: where the checkpoint stands
            self._evaluate()
        self.ctx.barrier()  # rank 0 may still be evaluating or writing
        rate, warmup_steps, warmup_s = self.clock.summary()
        return Result(
            kind=self.cfg.kind,
            hidden=self.cfg.hidden,
            params=params,
            steps=self.opts.steps,
            train_loss=self.train_loss,
            eval_loss=self.eval_loss,
            eval_acc=self.eval_acc,
            steps_per_s=rate,
            tokens_per_s=None if rate is None else rate * self.task.tokens_per_batch(),
            warmup_steps=warmup_steps,
            warmup_s=warmup_s,
            metrics=metrics_path,
        )


def compile_in_process() -> None:
    """Inductor compiles in this process, not in its pool of worker processes,
    unless TORCHINDUCTOR_COMPILE_THREADS says otherwise. The pool stays alive
    after compiling and its workers take cores from the training step's own
    threads: on a 16-core H100 machine (charlm, hidden 256, batch 64, seq 128)
    the compiled step ran at 121 steps/s with the pool and 316 without (eager
    339), and the compilation itself took 6.8 s with it and 1.6 s without."""
    if "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = 1


def train_model(
    opts: Options,
    ctx: Context,
    task: Task,
    cfg: ModelConfig,
    metrics_path: str,
    ckpt_dir: Optional[str],
) -> Result:
    """Train one model for opts.steps global steps (counting the steps of the
    checkpoint it resumes from) and return how it ended."""
    model, optimizer = build(opts, ctx, cfg)
    config = {"model": cfg.as_dict(), "task": task.describe()}
    start, train_time, resumed_at = _restore(opts, ctx, cfg, config, model, optimizer, ckpt_dir)
    net = ctx.wrap(model)
    if opts.compile:
        compile_in_process()
        net = torch.compile(net, mode=None if opts.compile == "default" else opts.compile)
    metrics = _Metrics(metrics_path, ctx.is_main, resumed_at)
    params = count_parameters(cfg)
    metrics.write(
        {
            "kind": "config",
            "step": start,
            "world": ctx.world,
            "params": params,
            "device": str(ctx.device),
            "bf16": opts.bf16,
            "compile": opts.compile or False,
            "lr": opts.lr,
            "batch": task.batch,
            "seq_len": task.seq_len,
            "torch": torch.__version__,
            "model": cfg.kind,
            "warmup_steps": opts.warmup_steps,
            **{k: v for k, v in config["model"].items() if k != "kind"},
            **config["task"],
        }
    )
    clock = _Clock(ctx, opts.warmup_steps, train_time)
    run = _Run(opts, ctx, task, cfg, model, optimizer, config, metrics, clock, ckpt_dir, start)
    model.train()
    run.clock.resume()
    for step in range(start, opts.steps):
        run.after_step(step + 1, train_step(net, model, optimizer, task, ctx, opts, step))
    return run.finish(params, metrics_path)
