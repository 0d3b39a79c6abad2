"""The coupled input-forget gate LSTM (CIFG; Greff et al., "LSTM: A Search
Space Odyssey", 2017) as a cell of lltm.cells.define.

The forget gate is tied to the input gate, f = 1 - i: three gates instead of
the LSTM's four, the same two states:

    i = sigmoid(z_i), g = tanh(z_g), o = sigmoid(z_o)     z = x W + b_i + h U + b_h
    c' = (1 - i) c + i g
    h' = o tanh(c')

Three gates is not a multiple of a vector's width: the kernels take any
count. The cell state is rebuilt for backward from the saved gates (a
recompute body, rounded as the forward rounds it) instead of being saved.

    python examples/cells/cifg_lstm.py
"""

from __future__ import annotations

import torch

import lltm

FORWARD = """
const T i = M::sigmoid(zx[0] + zh[0]);
const T g = M::tanh(zx[1] + zh[1]);
const T o = M::sigmoid(zx[2] + zh[2]);
next[1] = M::fma(T(1.0) - i, s[1], i * g);  // c' = (1 - i) c + i g
next[0] = o * M::tanh(next[1]);
saved[0] = i;
saved[1] = g;
saved[2] = o;
"""

RECOMPUTE = """
next[1] = M::fma(T(1.0) - saved[0], s[1], saved[0] * saved[1]);  // as forward rounds it
"""

BACKWARD = """
const T one(1.0);
const T i = saved[0], g = saved[1], o = saved[2];
const T k = M::tanh(next[1]);
const T dc = dnext[1] + dnext[0] * o * (one - k * k);
dzx[0] = dc * (g - s[1]) * i * (one - i);
dzx[1] = dc * i * (one - g * g);
dzx[2] = dnext[0] * k * o * (one - o);
ds[0] = T(0.0);          // h reaches h' only through the gates
ds[1] = dc * (one - i);  // d c' / d c
"""


def reference(zx, zh, state):
    h, c = state
    i = torch.sigmoid(zx[0] + zh[0])
    g = torch.tanh(zx[1] + zh[1])
    o = torch.sigmoid(zx[2] + zh[2])
    c = (1 - i) * c + i * g
    return o * torch.tanh(c), c


def define(**kwargs) -> lltm.cells.UserCell:
    """The CIFG LSTM cell (kwargs go to lltm.cells.define)."""
    return lltm.cells.define(
        "cifg",
        gates=3,
        states=("h", "c"),
        saved=3,
        forward=FORWARD,
        recompute=RECOMPUTE,
        backward=BACKWARD,
        reference=reference,
        reads_old=("c",),
        reads_new=("c",),
        gate_names=("i", "g", "o"),
        **kwargs,
    )


def main() -> None:
    cifg = define()
    report = lltm.cells.check(cifg)
    print(report)
    report.raise_for_failure()
    torch.manual_seed(0)
    layer = cifg.Layer(8, 32, batch_first=True, bidirectional=True)
    head = torch.nn.Linear(64, 1)
    opt = torch.optim.Adam([*layer.parameters(), *head.parameters()], lr=1e-2)
    x = torch.randn(64, 20, 8)
    y = x[..., :1].cumsum(1).flip(1)  # needs both directions
    for step in range(60):
        out, (h_n, c_n) = layer(x)
        loss = torch.nn.functional.mse_loss(head(out), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0 or step == 59:
            print(f"step {step:3d}  loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
