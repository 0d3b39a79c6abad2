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

Autograd derives the backward pass.
"""

from __future__ import annotations

from typing import Optional

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

