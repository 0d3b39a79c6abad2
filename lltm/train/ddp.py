"""Process group set-up for `torchrun --nproc_per_node N -m lltm train ...`.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; without them (or with
WORLD_SIZE=1) training runs in this one process. gloo serves CPU runs, NCCL
CUDA runs (one GPU per process: cuda:LOCAL_RANK).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["Context", "setup", "teardown"]


@dataclass
class Context:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes checkpoints, metrics and plots."""
        return self.rank == 0

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

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def wrap(self, model: nn.Module) -> nn.Module:
        """DistributedDataParallel around model when there are several ranks."""
        if not self.distributed:
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)


def setup(device: str) -> Context:
    """Join the process group torchrun describes (if any) and pick this rank's device.

    device: "cpu", "cuda", "cuda:K" or "auto" (CUDA when available)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("lltm train: --device cuda, but this torch sees no CUDA device; use --device cpu")
        if world > 1:
            # One GPU per process; an explicit index would put every rank on the same GPU.
            dev = torch.device("cuda", local_rank)
        elif dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
    elif dev.type != "cpu":
        raise ValueError(f"lltm train: --device must be cpu, cuda, cuda:K or auto, got {device!r}")
    if world > 1 and not dist.is_initialized():
        if dev.type == "cuda":
            # device_id binds the communicator to this rank's GPU (barriers then need no guess).
            dist.init_process_group(backend="nccl", device_id=dev)
        else:
            dist.init_process_group(backend="gloo")
    return Context(rank=rank, world=world, local_rank=local_rank, device=dev)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
