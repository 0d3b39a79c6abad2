"""lltm: the LLTM recurrent cell as a PyTorch extension.

    import lltm
    cell = lltm.LLTMCell(32, 128)            # backend="auto"
    h, c = cell(x)                            # x: (batch, 32)
    layer = lltm.LLTM(32, 128, num_layers=2)
    out, (h_n, c_n) = layer(seq)              # seq: (T, batch, 32)
    lltm.backends("cuda")                     # {"python": True, "aten": True, "fused": True}

Backends: "python" (pure PyTorch), "aten" (C++ with ATen ops) and "fused"
(hand-written kernels), the last two as torch.ops.lltm custom operators.
"""

from lltm import _extension, cells, functional
from lltm._backends import backends
from lltm.modules import GRU, LLTM, LSTM, GRUCell, LLTMCell, LSTMCell
from lltm.precision import fp32_mode, fp32_precision, get_fp32_precision, set_fp32_precision

__version__ = "0.1.0"
__all__ = [
    "LLTM",
    "LLTMCell",
    "LSTM",
    "GRU",
    "LSTMCell",
    "GRUCell",
    "backends",
    "cells",
    "functional",
    "fp32_mode",
    "fp32_precision",
    "get_fp32_precision",
    "set_fp32_precision",
    "__version__",
]

_extension.preload_prebuilt()
