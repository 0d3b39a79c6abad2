"""The minimal gated unit (Zhou et al., 2016) as a cell of lltm.cells.define.

One forget gate f does the work of the GRU's two: the candidate reads the
recurrent product through f (as torch's GRU applies its reset gate, after the
product), and f mixes the old state with the candidate:

    f  = sigmoid(x W_f + b_if + h U_f + b_hf)
    n  = tanh(x W_n + b_in + f (h U_n + b_hn))
    h' = (1 - f) h + f n

Two gates, one state; the candidate needs h U_n apart from x W_n, so the cell
is `split`. Run this file to check the cell and train a layer of it briefly:

    python examples/cells/mgu.py
"""

from __future__ import annotations

import torch

import lltm

FORWARD = """
const T f = M::sigmoid(zx[0] + zh[0]);
const T n = M::tanh(zx[1] + f * zh[1]);
next[0] = s[0] + f * (n - s[0]);  // (1 - f) h + f n
saved[0] = f;
saved[1] = n;
saved[2] = zh[1];
"""

BACKWARD = """
const T one(1.0);
const T f = saved[0], n = saved[1], hn = saved[2];
const T dh = dnext[0];
const T dn = dh * f * (one - n * n);                     // through n = tanh(.)
const T df = (dh * (n - s[0]) + dn * hn) * f * (one - f);  // f mixes, and gates h U_n
dzx[0] = df;
dzh[0] = df;
dzx[1] = dn;
dzh[1] = dn * f;          // h U_n enters as f (h U_n)
ds[0] = dh * (one - f);   // h' = (1 - f) h + ...
"""


def reference(zx, zh, state):
    (h,) = state
    f = torch.sigmoid(zx[0] + zh[0])
    n = torch.tanh(zx[1] + f * zh[1])
    return (h + f * (n - h),)


def define(**kwargs) -> lltm.cells.UserCell:
    """The MGU cell (kwargs go to lltm.cells.define, e.g. build=False)."""
    return lltm.cells.define(
        "mgu",
        gates=2,
        states=("h",),
        saved=3,
        split=True,
        forward=FORWARD,
        backward=BACKWARD,
        reference=reference,
        gate_names=("f", "n"),
        **kwargs,
    )


def main() -> None:
    mgu = define()
    report = lltm.cells.check(mgu)
    print(report)
    report.raise_for_failure()
    torch.manual_seed(0)
    layer = mgu.Layer(8, 32, num_layers=2, batch_first=True)
    head = torch.nn.Linear(32, 1)
    opt = torch.optim.Adam([*layer.parameters(), *head.parameters()], lr=1e-2)
    # predict the running mean of the first feature
    x = torch.randn(64, 20, 8)
    y = x[..., :1].cumsum(1) / torch.arange(1, 21).view(1, 20, 1)
    for step in range(60):
        out, _ = layer(x)
        loss = torch.nn.functional.mse_loss(head(out), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0 or step == 59:
            print(f"step {step:3d}  loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
