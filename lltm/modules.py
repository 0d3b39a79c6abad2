"""nn.Module front ends: LLTMCell (one step) and LLTM (layers over a sequence)."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lltm import functional
from lltm._checks import check_size, unpack_state

__all__ = ["LLTMCell", "LLTM"]

State = tuple[Tensor, Tensor]


def _check_backend_name(backend: str) -> str:
    from lltm._backends import NAMES, unknown_backend

    if backend != "auto" and backend not in NAMES:
        raise ValueError(unknown_backend(backend))
    return backend


def _bias_from_extension_cpp(module, state_dict, prefix, *args) -> None:
    """extension-cpp's LLTM keeps its bias as (1, 3S): load it as (3S,)."""
    bias = state_dict.get(prefix + "bias")
    if isinstance(bias, Tensor) and bias.dim() == 2 and bias.shape[0] == 1:
        state_dict[prefix + "bias"] = bias.reshape(bias.shape[1])


class LLTMCell(nn.Module):
    """One LLTM step as a module, parameter-compatible with the tutorial's LLTM.

    Parameters: ``weights`` (3 * state_size, state_size + input_features) and
    ``bias`` (3 * state_size,) (None when bias=False), initialised uniformly in
    ±1/sqrt(state_size); a state_dict of the tutorial's module loads as is.

    forward(input (B, I), state=None | (h (B, S), c (B, S))) -> (new_h, new_cell)
    A missing state is zeros.
    """

    def __init__(
        self,
        input_features: int,
        state_size: int,
        *,
        bias: bool = True,
        backend: str = "auto",
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        check_size("lltm.LLTMCell", "input_features", input_features, 0)
        check_size("lltm.LLTMCell", "state_size", state_size, 1)
        factory = {"device": device, "dtype": dtype}
        self.input_features = input_features
        self.state_size = state_size
        self.backend = _check_backend_name(backend)
        self.weights = nn.Parameter(torch.empty(3 * state_size, state_size + input_features, **factory))
        if bias:
            self.bias = nn.Parameter(torch.empty(3 * state_size, **factory))
        else:
            self.register_parameter("bias", None)
        self.register_load_state_dict_pre_hook(_bias_from_extension_cpp)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.state_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def forward(self, input: Tensor, state: Optional[State] = None) -> State:
        if state is None:
            zeros = input.new_zeros((input.shape[0], self.state_size))
            state = (zeros, zeros)
        old_h, old_cell = unpack_state("lltm.LLTMCell", state, "(batch, state_size)")
        return functional.lltm_cell(input, self.weights, self.bias, old_h, old_cell, backend=self.backend)

    def extra_repr(self) -> str:
        return (
            f"{self.input_features}, {self.state_size}, bias={self.bias is not None}, backend={self.backend!r}"
        )


class LLTM(nn.Module):
    """Stacked LLTM layers over a sequence, with nn.LSTM's conventions.

    input: (T, B, I), or (B, T, I) when batch_first; state: None (zeros) or
    (h0, c0), each (num_layers, B, S). Returns (output, (h_n, c_n)) with output
    (T, B, S) (or (B, T, S)) holding the last layer's h at every step and h_n,
    c_n (num_layers, B, S). Dropout (training only) applies to the outputs of
    every layer but the last. Layer k owns ``weights_l{k}`` (3S, S + I_k) and
    ``bias_l{k}`` (3S,), with I_0 = input_size and I_k = state_size after.
    """

    def __init__(
        self,
        input_size: int,
        state_size: int,
        num_layers: int = 1,
        *,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        backend: str = "auto",
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        check_size("lltm.LLTM", "input_size", input_size, 0)
        check_size("lltm.LLTM", "state_size", state_size, 1)
        if num_layers < 1:
            raise ValueError(f"lltm.LLTM: num_layers must be at least 1, got {num_layers}")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"lltm.LLTM: dropout must be a probability in [0, 1], got {dropout}")
        factory = {"device": device, "dtype": dtype}
        self.input_size = input_size
        self.state_size = state_size
        self.num_layers = num_layers
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.backend = _check_backend_name(backend)
        for k in range(num_layers):
            features = input_size if k == 0 else state_size
            self.register_parameter(
                f"weights_l{k}", nn.Parameter(torch.empty(3 * state_size, state_size + features, **factory))
            )
            self.register_parameter(
                f"bias_l{k}", nn.Parameter(torch.empty(3 * state_size, **factory)) if bias else None
            )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.state_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def forward(self, input: Tensor, state: Optional[State] = None) -> tuple[Tensor, State]:
        if input.dim() != 3:
            layout = "(batch, seq_len, input_size)" if self.batch_first else "(seq_len, batch, input_size)"
            raise ValueError(
                f"lltm.LLTM: expected input to be a 3-D tensor {layout}, but got shape {list(input.shape)}"
            )
        x = input.transpose(0, 1) if self.batch_first else input
        batch = x.shape[1]
        expected = (self.num_layers, batch, self.state_size)
        if state is None:
            h0 = c0 = x.new_zeros(expected)
        else:
            h0, c0 = unpack_state("lltm.LLTM", state, "(num_layers, batch, state_size)")
            for t, name in ((h0, "h0"), (c0, "c0")):
                if tuple(t.shape) != expected:
                    raise ValueError(
                        f"lltm.LLTM: expected {name} of shape (num_layers, batch, state_size) = "
                        f"{list(expected)}, but got {list(t.shape)}"
                    )
        h_n, c_n = [], []
        for k in range(self.num_layers):
            if k > 0 and self.dropout > 0.0 and self.training:
                x = F.dropout(x, self.dropout, training=True)
            x, (h, c) = functional.lltm(
                x, getattr(self, f"weights_l{k}"), getattr(self, f"bias_l{k}"), h0[k], c0[k], backend=self.backend
            )
            h_n.append(h)
            c_n.append(c)
        output = x.transpose(0, 1) if self.batch_first else x
        return output, (torch.stack(h_n), torch.stack(c_n))

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.state_size}, num_layers={self.num_layers}"
        if getattr(self, "bias_l0") is None:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        return s + f", backend={self.backend!r}"
