"""The LLTM cell in pure PyTorch: the reference every backend is checked
against, the "python" backend, and the fallback when nothing is compiled.

One step (S = state_size, I = input_features; column order matters):

    X              = cat([old_h, input], dim=1)          # (B, S + I)
    gates          = X @ weights.T + bias                # (B, 3S)
    input_gate     = sigmoid(gates[:, 0:S])
    output_gate    = sigmoid(gates[:, S:2S])
    candidate_cell = elu(gates[:, 2S:3S], alpha=1)
    new_cell       = old_cell + candidate_cell * input_gate
    new_h          = tanh(new_cell) * output_gate

A layer runs the step over time (lltm_reference); autograd derives the
backward pass of both.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor


def lltm_cell_reference(
    input: Tensor,
    weights: Tensor,
    bias: Optional[Tensor],
    old_h: Tensor,
    old_cell: Tensor,
) -> tuple[Tensor, Tensor]:
    """One LLTM step.

    input: (B, I); weights: (3S, S + I); bias: (3S,) or None;
    old_h, old_cell: (B, S). Returns (new_h, new_cell), each (B, S).
    """
    X = torch.cat([old_h, input], dim=1)
    gates = F.linear(X, weights, bias)
    input_gate, output_gate, candidate = gates.chunk(3, dim=1)
    new_cell = old_cell + F.elu(candidate) * torch.sigmoid(input_gate)
    new_h = torch.tanh(new_cell) * torch.sigmoid(output_gate)
    return new_h, new_cell


def lltm_reference(
    input: Tensor,
    weights: Tensor,
    bias: Optional[Tensor],
    h0: Tensor,
    c0: Tensor,
    lengths: Optional[Tensor] = None,
    cell: Callable[..., tuple[Tensor, Tensor]] = lltm_cell_reference,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One LLTM layer over a sequence, time-major, one step at a time.

    input: (T, B, I); weights: (3S, S + I); bias: (3S,) or None;
    h0, c0: (B, S); lengths: (B,) int64 or None (every row has T steps).
    Row b takes steps t < lengths[b]: its output is 0 after them and its
    state stays. Returns (output (T, B, S), (h_n (B, S), c_n (B, S))).
    `cell` computes one step (default: lltm_cell_reference).
    """
    h, c = h0, c0
    outputs = []
    for t in range(input.shape[0]):
        new_h, new_c = cell(input[t], weights, bias, h, c)
        if lengths is None:
            h, c = new_h, new_c
            outputs.append(new_h)
        else:
            inside = (lengths > t).unsqueeze(1)
            h = torch.where(inside, new_h, h)
            c = torch.where(inside, new_c, c)
            outputs.append(torch.where(inside, new_h, torch.zeros_like(new_h)))
    if not outputs:
        return input.new_empty((0, h0.shape[0], h0.shape[1])), (h0, c0)
    return torch.stack(outputs), (h, c)
