"""Measure what autograd keeps alive for backward.

:func:`saved_tensors_report` runs a forward pass under
``torch.autograd.graph.saved_tensors_hooks`` and adds up the storages of all
tensors saved for backward, each storage counted once (several saved views
of one buffer cost one buffer). It is exact and deterministic, and works on
any device, which makes it a better test of a memory optimisation than
timing-dependent allocator statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["SavedTensorsReport", "saved_tensors_report"]


@dataclass(frozen=True)
class SavedTensorsReport:
    """Bytes saved for backward during one forward pass.

    total_bytes: all distinct storages saved.
    activation_bytes: the same, leaving out storages of the ``exclude``
        tensors (typically parameters and buffers, which exist anyway).
    count: number of save events (a storage saved twice counts twice here).
    output: what the forward function returned.
    """

    total_bytes: int
    activation_bytes: int
    count: int
    output: Any


def _storage_key(t: Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def saved_tensors_report(fn: Callable[[], Any], exclude: Iterable[Tensor] = ()) -> SavedTensorsReport:
    """Run ``fn()`` and report the bytes of the tensors autograd saved for backward.

    Storages of tensors in ``exclude`` (e.g. ``module.parameters()``) count
    in ``total_bytes`` but not in ``activation_bytes``. The tensors are
    saved as usual (the hooks only look), so the returned output can still
    be backpropagated.
    """
    excluded = {_storage_key(t) for t in exclude}
    storages: dict[tuple[str, int], int] = {}
    count = 0

    def pack(t: Tensor) -> Tensor:
        nonlocal count
        count += 1
        storages[_storage_key(t)] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        output = fn()
    total = sum(storages.values())
    activation = sum(n for key, n in storages.items() if key not in excluded)
    return SavedTensorsReport(total_bytes=total, activation_bytes=activation, count=count, output=output)
