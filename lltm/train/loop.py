"""The training loop of `lltm train`: one model, from scratch or from its last checkpoint."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor, nn

from lltm.train import checkpoint
from lltm.train.ddp import Context
from lltm.train.model import ModelConfig, SequenceModel, count_parameters
from lltm.train.tasks import Stats, Task, shard

__all__ = [
    "OPTIMIZERS",
    "Options",
    "Result",
    "Resume",
    "build",
    "evaluate",
    "find_resume",
    "run_config",
    "train_model",
    "train_step",
]

OPTIMIZERS = ("adam", "sgd")
# Training options a resumed run must share with its checkpoint unless --override says otherwise
# (the optimizer cannot change: its state is of one kind).
OVERRIDABLE = ("seed", "lr", "batch", "seq_len", "clip", "dropout")


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
    progress: bool = True
    warmup_steps: int = 5  # this process's first steps, timed apart (compilation, first-call costs)
    optimizer: str = "adam"  # "adam" or "sgd" (plain, no momentum)
    accumulate: int = 1  # micro-batches per rank and step; the first ones under DDP's no_sync
    scaling_probe: int = 0  # with several ranks: steps of one process alone, timed after training
    override: bool = False  # a resumed run may change OVERRIDABLE options


@dataclass
class Resume:
    """The checkpoint a run continues from (read by rank 0, the same on every rank)."""

    path: str
    state: dict
    changed: list = field(default_factory=list)  # "lr: checkpoint 0.003, this run 0.001", with --override


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
    per_rank_tokens_per_s: Optional[list] = None  # each rank's own rows, steady state (several ranks)
    scaling: Optional[dict] = None  # what the scaling probe saw (several ranks, --scaling-probe)


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


def make_optimizer(kind: str, params, lr: float) -> torch.optim.Optimizer:
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr)
    raise ValueError(f"lltm train: unknown --optimizer {kind!r}; choose one of {', '.join(OPTIMIZERS)}")


def build(opts: Options, ctx: Context, cfg: ModelConfig) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(opts.seed)  # the same initial weights on every rank and in every rerun
    model = SequenceModel(cfg, dropout=opts.dropout, backend=opts.backend).to(ctx.device)
    return model, make_optimizer(opts.optimizer, model.parameters(), opts.lr)


def run_config(opts: Options, cfg: ModelConfig, task: Task) -> dict:
    """What a checkpoint records of the run: the model's shapes, the task, and the training options
    a resumed run must share with it (OVERRIDABLE ones may differ with --override)."""
    return {
        "model": cfg.as_dict(),
        "task": task.describe(),
        "train": {
            "optimizer": opts.optimizer,
            "seed": opts.seed,
            "lr": opts.lr,
            "batch": task.batch,
            "seq_len": task.seq_len,
            "clip": opts.clip,
            "dropout": opts.dropout,
        },
    }


def find_resume(
    opts: Options, ctx: Context, config: dict, ckpt_dir: Optional[str], mode: str, kind: str
) -> Optional[Resume]:
    """The checkpoint to continue from, decided before any training.

    mode "" (a fresh run): a directory holding checkpoints is refused. "must"
    (--resume): the newest checkpoint that loads, an error when none does.
    "auto" (--auto-resume): the same, but a directory without checkpoints
    starts at step 0. Rank 0 reads the checkpoint and sends it to the other
    ranks, so they need no access to the directory; every rank gets the same
    answer or the same error. Damaged newer checkpoints are renamed
    <name>.damaged (kept, but no longer loaded, counted or rotated away)."""
    if not ckpt_dir:
        return None
    answer: Any = None
    if ctx.is_main:
        try:
            answer = _read_resume(opts, config, ckpt_dir, mode, kind)
        except (ValueError, FileExistsError) as e:  # the message says what to change
            answer = ("error", str(e))
        except Exception as e:  # anything else: every rank stops, not only this one
            answer = ("failed", f"{type(e).__name__}: {e}")
    answer = ctx.broadcast(answer)
    if isinstance(answer, tuple):
        raise (ValueError if answer[0] == "error" else RuntimeError)(answer[1])
    return answer


def _read_resume(opts: Options, config: dict, ckpt_dir: str, mode: str, kind: str) -> Optional[Resume]:
    existing = checkpoint.list_checkpoints(ckpt_dir)
    if not mode:
        if existing:
            raise FileExistsError(
                f"lltm train: {ckpt_dir} already holds checkpoints (up to step {existing[-1][0]}); "
                "pass --resume to continue that run, or choose another --ckpt directory"
            )
        return None
    loaded = checkpoint.load_newest(ckpt_dir)  # NoCheckpoint when there are some but none loads
    if loaded is None:
        if mode == "auto":
            return None
        raise checkpoint.NoCheckpoint(
            f"lltm train: --resume: no checkpoint in {ckpt_dir} (--auto-resume starts at step 0 when there is none)"
        )
    path, state, damaged = loaded
    saved = state["config"]
    # checkpoints written before the model had a cell are LLTM's
    saved_model = {"cell": "lltm", **saved["model"]}
    checkpoint.check_config(path, {**saved_model, **saved["task"]}, {**config["model"], **config["task"]})
    train_saved = saved.get("train", {})  # checkpoints written before these were recorded: not compared
    hard = checkpoint.differences({k: v for k, v in train_saved.items() if k not in OVERRIDABLE}, config["train"])
    if hard:
        raise checkpoint.CheckpointMismatch(
            f"lltm train: checkpoint {path} was trained with another optimizer ({'; '.join(hard)}); "
            "pass the options it was trained with, or use another --ckpt directory"
        )
    soft = checkpoint.differences({k: v for k, v in train_saved.items() if k in OVERRIDABLE}, config["train"])
    if soft and not opts.override:
        raise checkpoint.CheckpointMismatch(
            f"lltm train: checkpoint {path} was trained with other options ({'; '.join(soft)}); pass the options "
            "it was trained with, or --override to continue with these from its step"
        )
    step = int(state["step"])
    if opts.steps < step:
        raise ValueError(
            f"lltm train: --steps {opts.steps} is below the step of {path} ({step}): nothing to train; "
            f"pass --steps above {step} to train on from it"
        )
    if damaged:
        moved = checkpoint.put_aside(damaged)
        print(f"lltm train: {kind}: newer checkpoint(s) that do not load renamed to {', '.join(moved)}")
    return Resume(path=path, state=state, changed=soft)


def _restore(
    opts: Options,
    ctx: Context,
    cfg: ModelConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    resume: Optional[Resume],
) -> tuple[int, float, Optional[int]]:
    """Loads the checkpoint to resume from, if any. Returns (start step, training
    time so far, the step resumed at or None)."""
    _seed_rank(opts.seed, 0, ctx.rank)
    if resume is None:
        return 0, 0.0, None
    state = resume.state
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    for group in optimizer.param_groups:  # the checkpoint's lr, or this run's with --override
        group["lr"] = opts.lr
    start = int(state["step"])
    rngs = state["rng"]
    if len(rngs) == ctx.world and not any(c.startswith("seed:") for c in resume.changed):
        checkpoint.set_rng(rngs[ctx.rank], ctx.device)
    else:
        # Another rank count (or seed): the data stream is the same function of the step, but
        # dropout masks cannot be, so each rank starts a fresh stream from the step.
        _seed_rank(opts.seed, start, ctx.rank)
    if ctx.is_main:
        print(
            f"lltm train: resumed {cfg.kind} from {resume.path} (step {start}, {len(rngs)} rank(s) then, "
            f"{ctx.world} now)" + (f"; --override: {'; '.join(resume.changed)}" if resume.changed else "")
        )
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
    return step_on(net, model, optimizer, task, ctx, opts, shard(x, ctx.rank, ctx.world), shard(y, ctx.rank, ctx.world))


def step_on(
    net: nn.Module,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    task: Task,
    ctx: Context,
    opts: Options,
    x: Tensor,
    y: Tensor,
) -> Tensor:
    """One optimisation step on the rows x, y (this rank's, on the CPU); returns the loss.

    With opts.accumulate = k the rows are cut into k contiguous micro-batches, each
    backpropagated with its loss over k; under DDP the first k - 1 run in no_sync (their
    gradients accumulate locally) and the last one's backward all-reduces the sum. So N
    ranks with k = 1 compute exactly what one process with k = N computes (each micro-batch
    is a rank's shard, and scaling by a power of two is exact), up to the order in which the
    all-reduce adds the ranks' gradients: with 2 ranks there is only one."""
    k = opts.accumulate
    optimizer.zero_grad(set_to_none=True)
    ddp_net = getattr(net, "_orig_mod", net)  # torch.compile's wrapper keeps the DDP module here
    losses = []
    for i, (xi, yi) in enumerate(zip(x.chunk(k), y.chunk(k))):
        sync = contextlib.nullcontext() if i == k - 1 else Context.no_sync(ddp_net)
        with sync:
            with _autocast(ctx, opts.bf16):
                out = net(xi.to(ctx.device, non_blocking=True))
            loss = task.loss(out, yi.to(ctx.device, non_blocking=True))
            (loss / k if k > 1 else loss).backward()
        losses.append(loss.detach())
    if opts.clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), opts.clip)
    optimizer.step()
    return losses[0] if k == 1 else torch.stack(losses).mean()


def _rng_states(device: torch.device) -> tuple:
    return torch.get_rng_state(), random.getstate(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng_states(states: tuple, device: torch.device) -> None:
    torch.set_rng_state(states[0])
    random.setstate(states[1])
    if states[2] is not None:
        torch.cuda.set_rng_state(states[2], device)


def _alone(model: nn.Module, task: Task, ctx: Context, opts: Options, rows: int, steps: int) -> Optional[float]:
    """Steps per second of this process alone training a copy of model on the first `rows` rows
    of each global batch (no DDP, no all-reduce): a one-process baseline of the scaling probe.
    None when the rows do not fit on the device."""
    probe = copy.deepcopy(model)
    optimizer = make_optimizer(opts.optimizer, probe.parameters(), opts.lr)
    alone = Context(rank=0, world=1, local_rank=ctx.local_rank, device=ctx.device)
    warm = 2
    try:
        for i in range(warm + steps):
            if i == warm:
                _sync(ctx)
                t0 = time.perf_counter()
            x, y = task.train_batch(i)
            step_on(probe, probe, optimizer, task, alone, opts, x[:rows], y[:rows])
            ctx.beat(f"scaling probe step {i + 1}")
        _sync(ctx)
        return steps / max(time.perf_counter() - t0, 1e-9)
    except torch.OutOfMemoryError:
        return None
    finally:
        del probe, optimizer
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()


def scaling_probe(model: nn.Module, task: Task, ctx: Context, opts: Options, global_rate: float) -> dict:
    """Rank 0 alone (the others wait) trains a copy of the model on one rank's rows and on the
    whole global batch for opts.scaling_probe steps; with the run's global steps/s this gives
    the weak-scaling efficiency (N ranks against N times one process on a rank's rows) and the
    strong-scaling speed-up (against one process on the global batch). The run's weights,
    optimizer and random streams are not touched."""
    result: dict = {}
    if ctx.is_main:
        rngs = _rng_states(ctx.device)
        was_training = model.training
        model.train()
        rows = task.batch // ctx.world
        seq = task.seq_len
        rank_rate = _alone(model, task, ctx, opts, rows, opts.scaling_probe)
        whole_rate = _alone(model, task, ctx, opts, task.batch, opts.scaling_probe)
        model.train(was_training)
        _set_rng_states(rngs, ctx.device)
        run_tokens = global_rate * task.batch * seq
        result = {"world": ctx.world, "probe_steps": opts.scaling_probe, "tokens_per_s": run_tokens}
        if rank_rate is not None:
            alone = rank_rate * rows * seq
            result.update(
                one_rank_rows=rows, one_rank_tokens_per_s=alone, weak_efficiency=run_tokens / (ctx.world * alone)
            )
        if whole_rate is not None:
            whole = whole_rate * task.batch * seq
            speedup = run_tokens / whole
            result.update(
                one_process_batch=task.batch,
                one_process_tokens_per_s=whole,
                speedup=speedup,
                strong_efficiency=speedup / ctx.world,
            )
    ctx.beat("waiting for rank 0's scaling probe")
    result = ctx.broadcast(result)
    ctx.beat("the scaling probe")
    return result


def describe_scaling(s: dict, per_rank: list, rows: int) -> str:
    """The lines `lltm train` prints after a run on several ranks."""
    ranks = ", ".join(f"rank {r} {t:,.0f}" for r, t in enumerate(per_rank))
    lines = [f"per-rank throughput (steady state, tokens/s, {rows} rows each): {ranks}; all ranks {sum(per_rank):,.0f}"]
    if s:
        parts = []
        if "weak_efficiency" in s:
            parts.append(
                f"one process alone on a rank's {s['one_rank_rows']} rows: {s['one_rank_tokens_per_s']:,.0f} tokens/s, "
                f"weak-scaling efficiency {s['weak_efficiency']:.2f}"
            )
        else:
            parts.append("one process on a rank's rows: did not fit")
        if "speedup" in s:
            parts.append(
                f"one process on the global batch of {s['one_process_batch']}: {s['one_process_tokens_per_s']:,.0f} "
                f"tokens/s, speed-up {s['speedup']:.2f}x (strong-scaling efficiency {s['strong_efficiency']:.2f})"
            )
        else:
            parts.append("one process on the global batch: did not fit")
        lines.append(
            f"scaling seen ({s['world']} ranks, {s['tokens_per_s']:,.0f} tokens/s; rank 0 alone for "
            f"{s['probe_steps']} steps each): " + "; ".join(parts)
        )
    return "\n".join(lines)


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
            desc=f"{cfg.label} h={cfg.hidden}",
            unit="step",
            disable=not (ctx.is_main and opts.progress),
            dynamic_ncols=True,
        )

    def after_step(self, done: int, loss: Tensor) -> None:
        self.ctx.beat(f"step {done}")
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
                self.ctx.beat(f"the evaluation at step {done}")
            if do_ckpt:
                self._save(done)
                self.ctx.beat(f"the checkpoint of step {done}")
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
            self.bar.write(f"{self.cfg.label} step {done}: held-out loss {self.eval_loss:.4f}, acc {self.eval_acc:.4f}")

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
                "accumulate": self.opts.accumulate,
            }
            checkpoint.save(self.ckpt_dir, step, state, self.opts.keep)

    def finish(self, params: int, metrics_path: str) -> Result:
        self.bar.close()
        if self.clock.steps == 0 and self.ctx.is_main:  # resumed at --steps: where the checkpoint stands
            self._evaluate()
        self.ctx.barrier()  # rank 0 may still be evaluating or writing
        self.ctx.beat("the end of training")
        rate, warmup_steps, warmup_s = self.clock.summary()
        per_rank = scaling = None
        if self.ctx.distributed:
            rows = self.task.batch // self.ctx.world
            per_rank = self.ctx.gather(None if rate is None else rate * rows * self.task.seq_len)
            if rate is not None and None not in per_rank:
                if self.opts.scaling_probe > 0:
                    scaling = scaling_probe(self.model, self.task, self.ctx, self.opts, rate)
                if self.ctx.is_main:
                    print(describe_scaling(scaling or {}, per_rank, rows))
                    self.metrics.write(
                        {"kind": "scaling", "step": self.opts.steps, "per_rank": per_rank, **(scaling or {})}
                    )
        return Result(
            kind=self.cfg.label,
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
            per_rank_tokens_per_s=per_rank,
            scaling=scaling,
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
    resume: Optional[Resume] = None,
) -> Result:
    """Train one model for opts.steps global steps (counting the steps of the
    checkpoint `resume` it continues from, see find_resume) and return how it ended."""
    model, optimizer = build(opts, ctx, cfg)
    config = run_config(opts, cfg, task)
    start, train_time, resumed_at = _restore(opts, ctx, cfg, model, optimizer, resume)
    ctx.beat("the model was built")
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
            "optimizer": opts.optimizer,
            "batch": task.batch,
            "accumulate": opts.accumulate,
            "seq_len": task.seq_len,
            "torch": torch.__version__,
            "model": cfg.kind,
            "warmup_steps": opts.warmup_steps,
            **({"ddp": ctx.ddp.kwargs()} if ctx.distributed else {}),
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
