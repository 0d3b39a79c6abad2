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

The other cells of the seam (lltm.cells) have their step here too, with
torch's weight layout (weight_ih (G S, I), weight_hh (G S, S), gate-major)
and one signature, step(input, state, weight_ih, weight_hh, bias_ih, bias_hh)
-> the next state (a tuple, h first); rnn_reference runs any of them over a
sequence.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

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
    return lltm_gates_reference(F.linear(X, weights, bias), old_cell)


def lltm_gates_reference(gates: Tensor, old_cell: Tensor) -> tuple[Tensor, Tensor]:
    """The step's pointwise part, from its pre-activations on.

    gates: (B, 3S) = X @ weights.T + bias; old_cell: (B, S). Returns (new_h, new_cell), each (B, S).
    """
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


States = tuple[Tensor, ...]


def lstm_cell_reference(
    input: Tensor,
    state: Sequence[Tensor],
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Optional[Tensor],
    bias_hh: Optional[Tensor],
) -> States:
    """One step of torch.nn.LSTM's cell, gates (i, f, g, o).

    input: (B, I); state: (h, c), each (B, S); weight_ih: (4S, I);
    weight_hh: (4S, S); biases: (4S,) or None. Returns (h', c'):
    c' = f c + i g, h' = o tanh(c').
    """
    h, c = state
    z = F.linear(input, weight_ih, bias_ih) + F.linear(h, weight_hh, bias_hh)
    i, f, g, o = z.chunk(4, dim=1)
    new_c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(new_c), new_c


def gru_cell_reference(
    input: Tensor,
    state: Sequence[Tensor],
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Optional[Tensor],
    bias_hh: Optional[Tensor],
) -> States:
    """One step of torch.nn.GRU's cell, gates (r, z, n).

    input: (B, I); state: (h,) (B, S); weight_ih: (3S, I); weight_hh: (3S, S);
    biases: (3S,) or None. Returns (h',): n = tanh(x W_in + b_in + r (h W_hn
    + b_hn)), h' = (1 - z) n + z h.
    """
    (h,) = state
    x_r, x_z, x_n = F.linear(input, weight_ih, bias_ih).chunk(3, dim=1)
    h_r, h_z, h_n = F.linear(h, weight_hh, bias_hh).chunk(3, dim=1)
    r = torch.sigmoid(x_r + h_r)
    z = torch.sigmoid(x_z + h_z)
    n = torch.tanh(x_n + r * h_n)
    return ((1 - z) * n + z * h,)


def rnn_reference(
    step: Callable[..., States],
    input: Tensor,
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Optional[Tensor],
    bias_hh: Optional[Tensor],
    state: Sequence[Tensor],
    lengths: Optional[Tensor] = None,
) -> tuple[Tensor, States]:
    """One layer of a seam cell over a sequence, time-major, one `step` at a time.

    input: (T, B, I); state: the initial states, each (B, S), h first;
    lengths: (B,) int64 or None. Row b takes steps t < lengths[b]: its output
    is 0 after them and its states stay. Returns (output (T, B, S), final
    states).
    """
    state = tuple(state)
    outputs = []
    for t in range(input.shape[0]):
        new = step(input[t], state, weight_ih, weight_hh, bias_ih, bias_hh)
        if lengths is None:
            state = tuple(new)
            outputs.append(new[0])
        else:
            inside = (lengths > t).unsqueeze(1)
            state = tuple(torch.where(inside, n, s) for n, s in zip(new, state))
            outputs.append(torch.where(inside, new[0], torch.zeros_like(new[0])))
    if not outputs:
        return input.new_empty((0, state[0].shape[0], state[0].shape[1])), state
    return torch.stack(outputs), state
