"""The LLTM with a forget gate, as a cell of lltm.cells.define (docs/cells.md)."""

import torch
import torch.nn.functional as F

import lltm

# Gates (i, f, z, o); states (h, c):
#   i = sigmoid(z_i), f = sigmoid(z_f), z = elu(z_z), o = sigmoid(z_o)
#   c' = f c + i z,  h' = o tanh(c')
FORWARD = """
const T i = M::sigmoid(zx[0] + zh[0]);
const T f = M::sigmoid(zx[1] + zh[1]);
const T z = M::elu(zx[2] + zh[2]);
const T o = M::sigmoid(zx[3] + zh[3]);
next[1] = M::fma(f, s[1], i * z);
next[0] = o * M::tanh(next[1]);
saved[0] = i;
saved[1] = f;
saved[2] = z;
saved[3] = o;
"""

# c' from c and the saved gates, rounded exactly as FORWARD rounds it
RECOMPUTE = """
next[1] = M::fma(saved[1], s[1], saved[0] * saved[2]);
"""

BACKWARD = """
const T one(1.0);
const T i = saved[0], f = saved[1], z = saved[2], o = saved[3];
const T k = M::tanh(next[1]);
const T dc = dnext[1] + dnext[0] * o * (one - k * k);
dzx[0] = dc * z * i * (one - i);
dzx[1] = dc * s[1] * f * (one - f);
dzx[2] = dc * i * M::where_gt(z, T(0.0), one, z + one);  // elu'(x): 1 for x > 0, else elu(x) + 1
dzx[3] = dnext[0] * k * o * (one - o);
ds[0] = T(0.0);  // h reaches h' only through the gates
ds[1] = dc * f;
"""


def reference(zx, zh, state):
    h, c = state
    i = torch.sigmoid(zx[0] + zh[0])
    f = torch.sigmoid(zx[1] + zh[1])
    z = F.elu(zx[2] + zh[2])
    o = torch.sigmoid(zx[3] + zh[3])
    c = f * c + i * z
    return o * torch.tanh(c), c


def define():
    return lltm.cells.define(
        "forget_lltm",
        gates=4,
        states=("h", "c"),
        saved=4,
        forward=FORWARD,
        recompute=RECOMPUTE,
        backward=BACKWARD,
        reference=reference,
        reads_old=("c",),
        reads_new=("c",),
        gate_names=("i", "f", "z", "o"),
    )
