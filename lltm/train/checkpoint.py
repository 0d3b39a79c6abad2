"""Checkpoints of `lltm train`: atomic writes, the last k kept, a clear error on a mismatch.

A checkpoint is DIR/ckpt-<step:08d>.pt holding the step, the model and
optimizer state dicts, every rank's RNG states, the training time so far and
the configuration the model's shapes depend on. It is written to a temporary
file in DIR, flushed to disk, then renamed over the final name (os.replace is
atomic on POSIX), so a process killed mid-save leaves the previous checkpoints
as they were and at worst a stray temporary file, which loading ignores and the
next save removes.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import warnings
from typing import Any

import torch

__all__ = [
    "CheckpointMismatch",
    "NoCheckpoint",
    "check_config",
    "differences",
    "list_checkpoints",
    "load_latest",
    "load_newest",
    "put_aside",
    "rng_state",
    "save",
    "set_rng",
]

_NAME = re.compile(r"^ckpt-(\d{8})\.pt$")
_TMP = re.compile(r"^\.ckpt-\d{8}\.pt\.tmp\.\d+$")


class CheckpointMismatch(ValueError):
    """The checkpoint was written for another model or task than this run builds."""


class NoCheckpoint(ValueError):
    """Resuming was asked for, but no checkpoint of the directory can be loaded."""


def path_for(directory: str, step: int) -> str:
    return os.path.join(directory, f"ckpt-{step:08d}.pt")


def list_checkpoints(directory: str) -> list[tuple[int, str]]:
    """(step, path) of every complete checkpoint in directory, oldest first."""
    if not os.path.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        m = _NAME.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(directory, name)))
    return sorted(found)


def _fsync_dir(directory: str) -> None:
    # Makes the rename itself durable; some filesystems cannot open a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save(directory: str, step: int, state: dict[str, Any], keep: int) -> str:
    """Write state as the checkpoint of `step`, atomically; then keep only the
    newest `keep` checkpoints (keep <= 0 keeps all) and drop stray temporary files."""
    os.makedirs(directory, exist_ok=True)
    final = path_for(directory, step)
    tmp = os.path.join(directory, f".{os.path.basename(final)}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_dir(directory)
    for name in os.listdir(directory):
        if _TMP.match(name):
            os.remove(os.path.join(directory, name))
    if keep > 0:
        for _, old in list_checkpoints(directory)[:-keep]:
            os.remove(old)
    return final


def _load(path: str) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


# what torch.load raises on a truncated or otherwise damaged file
_DAMAGED = (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError)


def load_newest(directory: str) -> tuple[str, dict[str, Any], list[str]] | None:
    """(path, state, damaged) of the newest checkpoint in directory that loads, where
    damaged lists the newer ones that did not (each reported with a warning); None
    when the directory holds no checkpoint. Raises NoCheckpoint when it holds some
    but none loads (they are left as they are)."""
    found = list_checkpoints(directory)
    if not found:
        return None
    damaged, reasons = [], []
    for _, path in reversed(found):
        try:
            state = _load(path)
        except _DAMAGED as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            warnings.warn(f"lltm train: skipping unreadable checkpoint {path}: {reason}", stacklevel=2)
            damaged.append(path)
            reasons.append(f"{os.path.basename(path)}: {reason}")
            continue
        return path, state, damaged
    raise NoCheckpoint(
        f"lltm train: none of the {len(found)} checkpoint(s) in {directory} can be loaded ("
        + "; ".join(reasons)
        + "); they were left as they are. Move them away to start from step 0, or use another --ckpt directory."
    )


def load_latest(directory: str) -> tuple[str, dict[str, Any]] | None:
    """(path, state) of the newest checkpoint in directory that loads, or None
    when there is none. One that fails to load (damaged outside this program)
    is reported and the one before it is tried; NoCheckpoint when none loads."""
    loaded = load_newest(directory)
    return None if loaded is None else loaded[:2]


def put_aside(paths: list[str]) -> list[str]:
    """Rename damaged checkpoints to <name>.damaged: kept for a look, but no longer
    loaded, counted by --keep or deleted by the rotation. Returns the new names."""
    moved = []
    for path in paths:
        target = path + ".damaged"
        try:
            os.replace(path, target)
        except OSError:
            continue
        moved.append(target)
    return moved


def differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """'key: checkpoint X, this run Y' for each key whose values differ (a key the
    checkpoint does not record is not compared)."""
    return [
        f"{k}: checkpoint {saved[k]!r}, this run {current.get(k)!r}"
        for k in sorted(saved)
        if k in current and saved[k] != current[k]
    ]


def check_config(path: str, saved: dict[str, Any], current: dict[str, Any]) -> None:
    """Raise CheckpointMismatch naming every key where the checkpoint and this run differ."""
    keys = sorted(set(saved) | set(current))
    diffs = [
        f"{k}: checkpoint {saved.get(k)!r}, this run {current.get(k)!r}" for k in keys if saved.get(k) != current.get(k)
    ]
    if diffs:
        raise CheckpointMismatch(
            f"lltm train: checkpoint {path} was written for another model or task ("
            + "; ".join(diffs)
            + "). Pass the options it was trained with, or use another --ckpt directory."
        )


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's RNG states: torch CPU, the device's CUDA generator, Python's random."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "python": random.getstate(),
    }


def set_rng(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)
    random.setstate(state["python"])
