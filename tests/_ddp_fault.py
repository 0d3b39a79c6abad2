"""torchrun entry point of the fault tests: `lltm train ARGS` with faults injected.

    torchrun ... tests/_ddp_fault.py train --ckpt ... (LLTM_TEST_FAULTS="kill:1:6:0,savekill:0:6:1")

LLTM_TEST_FAULTS is a comma-separated list of kind:rank:step[:attempt], where
attempt is torchrun's restart count (TORCHELASTIC_RESTART_COUNT; default 0):
  kill      the rank SIGKILLs itself as its step `step` (1-based) begins
  savekill  the rank (rank 0: the one that writes) SIGKILLs itself halfway
            through writing the checkpoint of step `step`: half of the file
            reaches the disk (flushed, fsynced), then the process dies
  hang      the rank sleeps for an hour as its step `step` begins (the
            others then wait for it in the gradient all-reduce)
"""

from __future__ import annotations

import io
import os
import signal
import sys
import time

import torch

from lltm import cli
from lltm.train import loop


def _faults() -> list[tuple[str, int, int]]:
    rank = int(os.environ.get("RANK", "0"))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    out = []
    for item in filter(None, os.environ.get("LLTM_TEST_FAULTS", "").split(",")):
        kind, r, step, *rest = item.split(":")
        if int(r) == rank and int(rest[0] if rest else 0) == attempt:
            out.append((kind, int(step)))
    return out


def _install() -> None:
    faults = _faults()
    real_step, real_save = loop.train_step, torch.save

    def train_step(net, model, optimizer, task, ctx, opts, step):
        for kind, at in faults:
            if step + 1 == at and kind == "kill":
                print(f"fault: rank {ctx.rank} killed at step {at}", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if step + 1 == at and kind == "hang":
                print(f"fault: rank {ctx.rank} hangs at step {at}", file=sys.stderr, flush=True)
                time.sleep(3600)
        return real_step(net, model, optimizer, task, ctx, opts, step)

    def save(obj, f, *a, **k):
        if isinstance(obj, dict) and ("savekill", obj.get("step")) in faults:
            buf = io.BytesIO()
            real_save(obj, buf)
            f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
            f.flush()
            os.fsync(f.fileno())
            print(f"fault: killed halfway through the checkpoint of step {obj['step']}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return real_save(obj, f, *a, **k)

    loop.train_step = train_step
    torch.save = save


if __name__ == "__main__":
    _install()
    sys.exit(cli.main(sys.argv[1:]))
