"""Fake (meta) kernels of the lltm operators, for torch.compile and export.

Every backend returns the same shapes and (contiguous) strides on every
device, so one fake kernel per schema serves all of them.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from lltm._checks import check_cell_args

BACKENDS_WITH_OPS = ("aten", "fused")


def _forward_fake(op: str):
    def fake(
        input: Tensor, weights: Tensor, bias: Optional[Tensor], old_h: Tensor, old_cell: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        batch, _, state = check_cell_args(op, input, weights, bias, old_h, old_cell)
        new_h = input.new_empty((batch, state))
        new_cell = input.new_empty((batch, state))
        gates = input.new_empty((batch, 3 * state))
        return new_h, new_cell, gates

    return fake


def _backward_fake(
    grad_h: Tensor,
    grad_cell: Tensor,
    new_cell: Tensor,
    gates: Tensor,
    input: Tensor,
    weights: Tensor,
    old_h: Tensor,
    output_mask: list[bool],
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    shapes = (input.shape, weights.shape, (weights.shape[0],), old_h.shape, new_cell.shape)
    # An output not asked for is an empty (0,) placeholder.
    return tuple(input.new_empty(shape if asked else (0,)) for shape, asked in zip(shapes, output_mask))


for _backend in BACKENDS_WITH_OPS:
    torch.library.register_fake(f"lltm::{_backend}_cell_forward")(
        _forward_fake(f"lltm::{_backend}_cell_forward")
    )
    torch.library.register_fake(f"lltm::{_backend}_cell_backward")(_backward_fake)
