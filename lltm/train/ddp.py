"""Process groups for `torchrun ... -m lltm train ...`: set-up, DDP options, a watchdog.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; without them (or with
WORLD_SIZE=1) training runs in this one process. gloo serves CPU runs, NCCL
CUDA runs (one GPU per process: cuda:LOCAL_RANK).

A rank that stops making progress (it hangs, or it waits in a collective for a
rank that hangs) is ended by the watchdog after `--collective-timeout` seconds
with one line saying where it stood; the process group's own timeout is set a
little longer, as a backstop for a watchdog thread that could not run.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["Context", "DDPOptions", "Watchdog", "fix_bucket_layout", "setup", "teardown", "world_from_env"]

# The process group's timeout is the watchdog's plus this: the watchdog speaks first.
BACKSTOP_S = 30.0
WATCHDOG_EXIT = 3  # the exit status of a rank the watchdog ended


@dataclass(frozen=True)
class DDPOptions:
    """DistributedDataParallel's options that move the gradient all-reduce (docs/training.md)."""

    bucket_cap_mb: Optional[float] = None  # None: torch's default (25 MB)
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    # The buckets laid out once, at construction, in the parameters' order (see Context.wrap).
    # False: DDP's own behaviour, a layout rebuilt after the first step from the order in which
    # the gradients arrived.
    fixed_buckets: bool = True

    def kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "gradient_as_bucket_view": self.gradient_as_bucket_view,
            "static_graph": self.static_graph,
        }
        if self.bucket_cap_mb is not None:
            kw["bucket_cap_mb"] = self.bucket_cap_mb
        return kw


class Watchdog:
    """Ends this process when no progress was reported for `timeout` seconds.

    The training loop calls beat(what) after each step, evaluation and save. A
    rank blocked in a collective (waiting for a rank that hangs) or hanging
    itself stops beating; the watchdog then writes one line to stderr naming
    the rank, host, the last thing done and the timeout, and exits the process
    with status WATCHDOG_EXIT, which makes torchrun end (or restart) the job
    instead of leaving it stalled."""

    def __init__(self, timeout: float, rank: int, *, poll: Optional[float] = None) -> None:
        self.timeout, self.rank = float(timeout), rank
        self.poll = poll if poll is not None else min(1.0, self.timeout / 10)
        self._last = time.monotonic()
        self._what = "the process group was set up"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="lltm-train-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def beat(self, what: str) -> None:
        self._last, self._what = time.monotonic(), what

    def stop(self) -> None:
        self._stop.set()

    def message(self, idle: float) -> str:
        return (
            f"lltm train: rank {self.rank} on {socket.gethostname()}: no progress for {idle:.0f} s "
            f"(--collective-timeout {self.timeout:g}) since {self._what}: a collective is waiting for a "
            "rank that hung or died (or this rank hangs); ending this rank so that the job ends"
        )

    def _watch(self) -> None:
        while not self._stop.wait(self.poll):
            idle = time.monotonic() - self._last
            if idle > self.timeout:
                print(self.message(idle), file=sys.stderr, flush=True)
                os._exit(WATCHDOG_EXIT)


@dataclass
class Context:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    ddp: DDPOptions = field(default_factory=DDPOptions)
    watchdog: Optional[Watchdog] = None

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes checkpoints, metrics and plots."""
        return self.rank == 0

    def beat(self, what: str) -> None:
        """Progress, for the watchdog (nothing in one process)."""
        if self.watchdog is not None:
            self.watchdog.beat(what)

    def mean(self, t: Tensor) -> Tensor:
        """The mean of a tensor over ranks (the tensor itself on one rank)."""
        if not self.distributed:
            return t
        t = t.detach().clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t / self.world

    def gather(self, obj: Any) -> list:
        """Every rank's obj, in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        out: list = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's obj, on every rank (others pass anything)."""
        if not self.distributed:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def wrap(self, model: nn.Module) -> nn.Module:
        """DistributedDataParallel around model when there are several ranks."""
        if not self.distributed:
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        net = DistributedDataParallel(model, device_ids=ids, **self.ddp.kwargs())
        if self.ddp.fixed_buckets:
            fix_bucket_layout(net)
        return net

    @staticmethod
    def no_sync(net: nn.Module):
        """net.no_sync() for a DDP module (gradients accumulate locally, no all-reduce), else nothing."""
        return net.no_sync() if hasattr(net, "no_sync") else contextlib.nullcontext()


def fix_bucket_layout(net: nn.Module) -> None:
    """Lay out DDP's gradient buckets now, for the whole run, in the parameters' order.

    DDP rebuilds its buckets once, after the first step, in the order the gradients arrived
    in that step's backward. A run resumed from a checkpoint takes its first step with the
    initial layout, where the straight run had the rebuilt one: each gradient element sits at
    another offset of its bucket, a ring all-reduce adds the ranks' values for it in another
    order, and with more than 2 ranks the sums differ in the last bit (2 ranks add a + b either
    way). With the layout fixed before the first step, a fresh and a resumed run reduce
    alike, step for step, and resume bit-identically. This is the pair of calls DDP's own Join
    hook makes (push every parameter for the rebuild, then rebuild); every rank makes it
    here, at the same point, since the rebuild agrees on the layout through a collective.
    The order costs no overlap worth having here: one recurrent layer's gradients all arrive
    at the end of its backward.
    """
    reducer = getattr(net, "reducer", None)
    push = getattr(reducer, "_push_all_rebuilt_params", None)
    rebuild = getattr(reducer, "_rebuild_buckets", None)
    if push is None or rebuild is None:  # a torch without them: DDP's own layout
        return
    push()
    rebuild()


def world_from_env() -> tuple[int, int, int]:
    """(rank, world size, local rank) as torchrun describes them; (0, 1, 0) outside torchrun."""
    return (
        int(os.environ.get("RANK", "0")),
        int(os.environ.get("WORLD_SIZE", "1")),
        int(os.environ.get("LOCAL_RANK", "0")),
    )


def _restart_safe_store(rank: int, world: int, timeout: datetime.timedelta) -> dict[str, Any]:
    """init_process_group's store arguments that survive `torchrun --max-restarts`.

    torchrun (torch 2.5 and later) lends its rendezvous store to the workers and keeps it
    across restarts, with no prefix per attempt: the process group of a restarted worker then
    reads the addresses (gloo) or NCCL id the previous attempt's workers left there and waits
    for them forever (pytorch/pytorch#135712; seen here as gloo connecting to the dead ranks).
    When every rank runs under one torchrun (one host), the restart count is the same on all
    of them, so a store prefixed with it keeps each attempt apart. With several hosts the
    count is each host's own, so nothing is changed; rank 0 warns when restarts are allowed:
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in torchrun's environment gives every attempt a store
    of its own."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    if int(os.environ.get("LOCAL_WORLD_SIZE", world)) != world:
        if rank == 0 and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0:
            print(
                "lltm train: warning: torchrun keeps its store across restarts, so a restarted process group on "
                "several hosts can wait for the previous attempt's ranks; set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
                "for torchrun on every host (docs/training.md)",
                file=sys.stderr,
            )
        return {}
    store = dist.TCPStore(
        host_name=os.environ["MASTER_ADDR"],
        port=int(os.environ["MASTER_PORT"]),
        world_size=world,
        is_master=False,
        timeout=timeout,
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return {"store": dist.PrefixStore(f"lltm/attempt-{attempt}/", store), "rank": rank, "world_size": world}


def setup(device: str, *, collective_timeout: float = 600.0, ddp: Optional[DDPOptions] = None) -> Context:
    """Join the process group torchrun describes (if any), pick this rank's device and,
    with several ranks, start the watchdog.

    device: "cpu", "cuda", "cuda:K" or "auto" (CUDA when available)."""
    rank, world, local_rank = world_from_env()
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("lltm train: --device cuda, but this torch sees no CUDA device; use --device cpu")
        if world > 1:
            dev = torch.device("cuda", local_rank)  # one GPU per process
        elif dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
    elif dev.type != "cpu":
        raise ValueError(f"lltm train: --device must be cpu, cuda, cuda:K or auto, got {device!r}")
    watchdog = None
    if world > 1:
        timeout = datetime.timedelta(seconds=collective_timeout + BACKSTOP_S)
        if not dist.is_initialized():
            kw: dict[str, Any] = {"timeout": timeout, **_restart_safe_store(rank, world, timeout)}
            if dev.type == "cuda":
                # device_id binds the communicator to this rank's GPU (barriers then need no guess).
                dist.init_process_group(backend="nccl", device_id=dev, **kw)
            else:
                dist.init_process_group(backend="gloo", **kw)
        watchdog = Watchdog(collective_timeout, rank).start()
    return Context(
        rank=rank, world=world, local_rank=local_rank, device=dev, ddp=ddp or DDPOptions(), watchdog=watchdog
    )


def teardown(ctx: Optional[Context] = None) -> None:
    if ctx is not None and ctx.watchdog is not None:
        ctx.watchdog.stop()
    if dist.is_initialized():
        dist.destroy_process_group()
