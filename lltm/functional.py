"""Functional interface: one LLTM step and one LLTM layer over a sequence.

`backend` picks the implementation (see lltm.backends()): "python" is the
pure-PyTorch reference, "aten" and "fused" call the custom operators
torch.ops.lltm.<backend>_cell_forward, whose autograd formula is the
matching <backend>_cell_backward operator.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from lltm import _backends, _extension
from lltm._checks import bias_vector, check_cell_args, check_tensors
from lltm.reference import lltm_cell_reference

__all__ = ["lltm_cell", "lltm"]


_FORWARD_OPS: dict = {}  # backend name -> OpOverload, looked up once


def _forward_op(name: str):
    op = _FORWARD_OPS.get(name)
    if op is None:
        _extension.load()
        op = _FORWARD_OPS[name] = getattr(torch.ops.lltm, f"{name}_cell_forward").default
    return op


def lltm_cell(
    input: Tensor,
    weights: Tensor,
    bias: Optional[Tensor],
    old_h: Tensor,
    old_cell: Tensor,
    *,
    backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    """One LLTM step.

    input: (B, I); weights: (3S, S + I); bias: (3S,), (1, 3S) (extension-cpp's
    layout; its gradient keeps that shape) or None; old_h, old_cell: (B, S).
    Returns (new_h, new_cell), each (B, S).
    """
    op = "lltm.functional.lltm_cell"
    check_tensors(op, input=input, weights=weights, bias=bias, old_h=old_h, old_cell=old_cell)
    bias = bias_vector(op, bias)
    name = _backends.resolve(backend, input.device.type)
    if name == "python":
        check_cell_args("lltm.functional.lltm_cell", input, weights, bias, old_h, old_cell)
        return lltm_cell_reference(input, weights, bias, old_h, old_cell)
    new_h, new_cell, _ = _forward_op(name)(input, weights, bias, old_h, old_cell)
    return new_h, new_cell


def lltm(
    input: Tensor,
    weights: Tensor,
    bias: Optional[Tensor],
    h0: Tensor,
    c0: Tensor,
    *,
    backend: str = "auto",
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One LLTM layer over a sequence, time-major.

    input: (T, B, I); weights: (3S, S + I); bias: (3S,), (1, 3S) or None;
    h0, c0: (B, S). Returns (output (T, B, S), (h_n (B, S), c_n (B, S))).
    """
    check_tensors("lltm.functional.lltm", input=input, weights=weights, bias=bias, h0=h0, c0=c0)
    bias = bias_vector("lltm.functional.lltm", bias)
    if not isinstance(input, Tensor) or input.dim() != 3:
        shape = list(input.shape) if isinstance(input, Tensor) else type(input).__name__
        raise ValueError(
            f"lltm.functional.lltm: expected input to be a 3-D tensor (seq_len, batch, input_features), but got {shape}"
        )
    h, c = h0, c0
    outputs = []
    for x in input.unbind(0):
        h, c = lltm_cell(x, weights, bias, h, c, backend=backend)
        outputs.append(h)
    if not outputs:  # T == 0: state passes through, after the same checks
        check_cell_args("lltm.functional.lltm", input.new_empty(input.shape[1:]), weights, bias, h0, c0)
        return input.new_empty((0, h0.shape[0], h0.shape[1])), (h0, c0)
    return torch.stack(outputs), (h, c)
