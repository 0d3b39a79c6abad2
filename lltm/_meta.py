"""Fake (meta) kernels of the lltm operators, for torch.compile and export,
and their vmap rules (lltm/_functorch.py), for torch.func.

Every backend returns the same shapes and (contiguous) strides on every
device, so one fake kernel per operator family serves all backends; the
backends are those the extension declares (lltm::_compiled_backends).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from lltm import _functorch
from lltm._checks import check_cell_args, check_seq_args


def _cell_forward_fake(op: str) -> Callable:
    def fake(
        input: Tensor, weights: Tensor, bias: Optional[Tensor], old_h: Tensor, old_cell: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        batch, _, state = check_cell_args(op, input, weights, bias, old_h, old_cell)
        new_h = input.new_empty((batch, state))
        new_cell = input.new_empty((batch, state))
        gates = input.new_empty((batch, 3 * state))
        return new_h, new_cell, gates

    return fake


def _placeholders(like: Tensor, shapes, output_mask) -> tuple[Tensor, ...]:
    # An output not asked for is an empty (0,) placeholder.
    return tuple(like.new_empty(shape if asked else (0,)) for shape, asked in zip(shapes, output_mask))


def _cell_backward_fake(op: str) -> Callable:
    def fake(
        grad_h: Tensor,
        grad_cell: Tensor,
        new_cell: Tensor,
        gates: Tensor,
        input: Tensor,
        weights: Tensor,
        old_h: Tensor,
        output_mask: list[bool],
    ) -> tuple[Tensor, ...]:
        shapes = (input.shape, weights.shape, (weights.shape[0],), old_h.shape, new_cell.shape)
        return _placeholders(input, shapes, output_mask)

    return fake


def _seq_forward_fake(op: str) -> Callable:
    def fake(
        input: Tensor,
        weights: Tensor,
        bias: Optional[Tensor],
        h0: Tensor,
        c0: Tensor,
        lengths: Optional[Tensor],
    ) -> tuple[Tensor, ...]:
        steps, batch, _, state = check_seq_args(op, input, weights, bias, h0, c0, lengths)
        output = input.new_empty((steps, batch, state))
        h_n = input.new_empty((batch, state))
        c_n = input.new_empty((batch, state))
        gates = input.new_empty((steps, batch, 3 * state))
        return output, h_n, c_n, gates

    return fake


def _seq_backward_fake(op: str) -> Callable:
    def fake(
        grad_output: Optional[Tensor],
        grad_h_n: Optional[Tensor],
        grad_c_n: Optional[Tensor],
        input: Tensor,
        weights: Tensor,
        h0: Tensor,
        c0: Tensor,
        output: Tensor,
        gates: Tensor,
        lengths: Optional[Tensor],
        output_mask: list[bool],
    ) -> tuple[Tensor, ...]:
        shapes = (input.shape, weights.shape, (weights.shape[0],), h0.shape, h0.shape)
        return _placeholders(input, shapes, output_mask)

    return fake


# operator family ("<backend>_" + key) -> fake kernel factory (takes the op name)
FAKES = {
    "cell_forward": _cell_forward_fake,
    "cell_backward": _cell_backward_fake,
    "seq_forward": _seq_forward_fake,
    "seq_backward": _seq_backward_fake,
}

COMPILED_BACKENDS: tuple[str, ...] = tuple(torch.ops.lltm._compiled_backends())

for _backend in COMPILED_BACKENDS:
    for _family, _factory in FAKES.items():
        _op = f"lltm::{_backend}_{_family}"
        torch.library.register_fake(_op)(_factory(_op))

# vmap rules of each forward/backward pair, and the autograd Function used
# under torch.func transforms (lltm/_functorch.py)
_functorch.register_all(COMPILED_BACKENDS)

# The seam's cells (lltm.cells): their operators' fake kernels and autograd.
from lltm import _seam, cells  # noqa: E402

cells.check_compiled(torch.ops.lltm._compiled_cells())
_seam.register(COMPILED_BACKENDS)
