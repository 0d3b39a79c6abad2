"""nn.Module front ends: LLTMCell (one step) and LLTM (layers over a sequence)."""

from __future__ import annotations

import math
import warnings
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from lltm import functional
from lltm._checks import check_size, unpack_state

__all__ = ["LLTMCell", "LLTM"]

State = tuple[Tensor, Tensor]


def _check_backend_name(backend: str) -> str:
    from lltm._backends import NAMES, unknown_backend

    if backend != "auto" and backend not in NAMES:
        raise ValueError(unknown_backend(backend))
    return backend


def _sizes(op: str, input_size, state_size, input_features, hidden_size) -> tuple[int, int]:
    """The two sizes, each given once: input_size or the tutorial's
    input_features, state_size or nn.LSTM's hidden_size."""
    sizes = []
    for name, value, alias, alias_value in (
        ("input_size", input_size, "input_features", input_features),
        ("state_size", state_size, "hidden_size", hidden_size),
    ):
        if value is not None and alias_value is not None:
            raise TypeError(f"{op}: got both {name} and {alias} (the same size: give one)")
        if value is None and alias_value is None:
            raise TypeError(f"{op}: missing {name} (or its keyword alias {alias})")
        sizes.append(value if value is not None else alias_value)
    check_size(op, "input_size", sizes[0], 0)
    check_size(op, "state_size", sizes[1], 1)
    return sizes[0], sizes[1]


class _Sizes:
    """The other names of the sizes, read-only: input_features (the
    tutorial's LLTM) and hidden_size (nn.LSTM's)."""

    input_size: int
    state_size: int

    @property
    def input_features(self) -> int:
        return self.input_size

    @property
    def hidden_size(self) -> int:
        return self.state_size


def _bias_from_extension_cpp(module, state_dict, prefix, *args) -> None:
    """extension-cpp's LLTM keeps its bias as (1, 3S): load it as (3S,)."""
    bias = state_dict.get(prefix + "bias")
    if isinstance(bias, Tensor) and bias.dim() == 2 and bias.shape[0] == 1:
        state_dict[prefix + "bias"] = bias.reshape(bias.shape[1])


class LLTMCell(_Sizes, nn.Module):
    """One LLTM step as a module, parameter-compatible with the tutorial's LLTM.

    LLTMCell(input_size, state_size): the keywords input_features (the
    tutorial's word) and hidden_size (nn.LSTMCell's) name the same sizes.
    Parameters: ``weights`` (3 * state_size, state_size + input_size) and
    ``bias`` (3 * state_size,) (None when bias=False), initialised uniformly in
    ±1/sqrt(state_size); a state_dict of the tutorial's module loads as is.

    forward(input (B, I), state=None | (h (B, S), c (B, S))) -> (new_h, new_cell)
    A missing state is zeros.
    """

    def __init__(
        self,
        input_size: Optional[int] = None,
        state_size: Optional[int] = None,
        *,
        bias: bool = True,
        backend: str = "auto",
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
        input_features: Optional[int] = None,
        hidden_size: Optional[int] = None,
    ) -> None:
        super().__init__()
        input_size, state_size = _sizes("lltm.LLTMCell", input_size, state_size, input_features, hidden_size)
        factory = {"device": device, "dtype": dtype}
        self.input_size = input_size
        self.state_size = state_size
        self.backend = _check_backend_name(backend)
        self.weights = nn.Parameter(torch.empty(3 * state_size, state_size + input_size, **factory))
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
        return f"{self.input_size}, {self.state_size}, bias={self.bias is not None}, backend={self.backend!r}"


class LLTM(_Sizes, nn.Module):
    """Stacked LLTM layers over a sequence, with nn.LSTM's conventions.

    LLTM(input_size, state_size, num_layers=1): the keywords hidden_size
    (nn.LSTM's word) and input_features (the tutorial's) name the same sizes.

    input: (T, B, I), or (B, T, I) when batch_first, or a PackedSequence;
    state: None (zeros) or (h0, c0), each (num_layers * D, B, S) with D = 2
    when bidirectional, else 1. Returns (output, (h_n, c_n)): output
    (T, B, D * S) (or (B, T, D * S), or a PackedSequence like the input)
    holds the last layer's h at every step, the directions concatenated;
    h_n, c_n (num_layers * D, B, S) hold each layer's and direction's final
    state (for a PackedSequence, at each sequence's own last step). Dropout
    (training only) applies to the outputs of every layer but the last.

    Layer k owns ``weights_l{k}`` (3S, S + I_k) and ``bias_l{k}`` (3S,), and
    when bidirectional ``weights_l{k}_reverse`` and ``bias_l{k}_reverse``,
    with I_0 = input_size and I_k = D * S after. Each layer and direction is
    one operator call over the whole sequence (backend "aten" or "fused"):
    one autograd node whatever T.
    """

    def __init__(
        self,
        input_size: Optional[int] = None,
        state_size: Optional[int] = None,
        num_layers: int = 1,
        *,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        backend: str = "auto",
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
        input_features: Optional[int] = None,
        hidden_size: Optional[int] = None,
    ) -> None:
        super().__init__()
        input_size, state_size = _sizes("lltm.LLTM", input_size, state_size, input_features, hidden_size)
        if num_layers < 1:
            raise ValueError(f"lltm.LLTM: num_layers must be at least 1, got {num_layers}")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"lltm.LLTM: dropout must be a probability in [0, 1], got {dropout}")
        if dropout > 0 and num_layers == 1:
            warnings.warn(
                "lltm.LLTM: dropout adds dropout after all but the last layer, so a non-zero dropout "
                f"expects num_layers greater than 1, but got dropout={dropout} and num_layers={num_layers}",
                stacklevel=2,
            )
        factory = {"device": device, "dtype": dtype}
        self.input_size = input_size
        self.state_size = state_size
        self.num_layers = num_layers
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bool(bidirectional)
        self.backend = _check_backend_name(backend)
        directions = 2 if self.bidirectional else 1
        for k in range(num_layers):
            features = input_size if k == 0 else directions * state_size
            for suffix in ("", "_reverse")[:directions]:
                self.register_parameter(
                    f"weights_l{k}{suffix}",
                    nn.Parameter(torch.empty(3 * state_size, state_size + features, **factory)),
                )
                self.register_parameter(
                    f"bias_l{k}{suffix}", nn.Parameter(torch.empty(3 * state_size, **factory)) if bias else None
                )
        self.reset_parameters()

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.state_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def forward(
        self, input: Union[Tensor, PackedSequence], state: Optional[State] = None
    ) -> tuple[Union[Tensor, PackedSequence], State]:
        packed = isinstance(input, PackedSequence)
        lengths: Optional[Tensor] = None
        if packed:
            # Time-major padded batch in the packed (length-sorted) row order.
            x, lengths, mask = _unpack(input)
        else:
            if not isinstance(input, Tensor) or input.dim() != 3:
                layout = "(batch, seq_len, input_size)" if self.batch_first else "(seq_len, batch, input_size)"
                got = list(input.shape) if isinstance(input, Tensor) else type(input).__name__
                raise ValueError(
                    f"lltm.LLTM: expected input to be a 3-D tensor {layout} or a PackedSequence, but got {got}"
                )
            x = input.transpose(0, 1) if self.batch_first else input
        if x.shape[2] != self.input_size:
            raise ValueError(
                f"lltm.LLTM: expected input with input_size = {self.input_size} features, "
                f"but got {x.shape[2]} (input of shape {list(x.shape)})"
            )
        batch = x.shape[1]
        D = self.num_directions
        h0, c0 = self._initial_state(state, x, batch)
        if packed and input.sorted_indices is not None:
            h0 = h0.index_select(1, input.sorted_indices)
            c0 = c0.index_select(1, input.sorted_indices)
        reverse_index = _reverse_index(x.shape[0], lengths, x.device) if D == 2 else None
        h_n, c_n = [], []
        for k in range(self.num_layers):
            if k > 0 and self.dropout > 0.0 and self.training:
                x = F.dropout(x, self.dropout, training=True)
            outputs = []
            for d, suffix in enumerate(("", "_reverse")[:D]):
                x_d = x if d == 0 else _reverse_time(x, reverse_index)
                out, (h, c) = functional.lltm(
                    x_d,
                    getattr(self, f"weights_l{k}{suffix}"),
                    getattr(self, f"bias_l{k}{suffix}"),
                    h0[k * D + d],
                    c0[k * D + d],
                    lengths=lengths,
                    backend=self.backend,
                )
                outputs.append(out if d == 0 else _reverse_time(out, reverse_index))
                h_n.append(h)
                c_n.append(c)
            x = outputs[0] if D == 1 else torch.cat(outputs, dim=2)
        h_n_t, c_n_t = torch.stack(h_n), torch.stack(c_n)
        if packed:
            if input.unsorted_indices is not None:
                h_n_t = h_n_t.index_select(1, input.unsorted_indices)
                c_n_t = c_n_t.index_select(1, input.unsorted_indices)
            output = PackedSequence(x[mask], input.batch_sizes, input.sorted_indices, input.unsorted_indices)
            return output, (h_n_t, c_n_t)
        output = x.transpose(0, 1) if self.batch_first else x
        return output, (h_n_t, c_n_t)

    def _initial_state(self, state: Optional[State], x: Tensor, batch: int) -> State:
        expected = (self.num_layers * self.num_directions, batch, self.state_size)
        layout = "(num_layers * num_directions, batch, state_size)"
        if state is None:
            zeros = x.new_zeros(expected)
            return zeros, zeros
        h0, c0 = unpack_state("lltm.LLTM", state, layout)
        for t, name in ((h0, "h0"), (c0, "c0")):
            if not isinstance(t, Tensor):
                raise ValueError(f"lltm.LLTM: expected {name} to be a tensor {layout}, but got {type(t).__name__}")
            if tuple(t.shape) != expected:
                raise ValueError(
                    f"lltm.LLTM: expected {name} of shape {layout} = {list(expected)}, but got {list(t.shape)}"
                )
        return h0, c0

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.state_size}, num_layers={self.num_layers}"
        if getattr(self, "bias_l0") is None:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s + f", backend={self.backend!r}"


def _unpack(packed: PackedSequence) -> tuple[Tensor, Tensor, Tensor]:
    """A PackedSequence as (padded (T, B, F) in its length-sorted row order,
    lengths (B,) int64 on the data's device, mask (T, B) of the valid steps),
    with one scatter (no loop over sequences or steps)."""
    data, batch_sizes = packed.data, packed.batch_sizes
    steps, batch = batch_sizes.numel(), int(batch_sizes[0]) if batch_sizes.numel() else 0
    lengths = (batch_sizes.unsqueeze(0) > torch.arange(batch).unsqueeze(1)).sum(1)
    lengths = lengths.to(device=data.device, dtype=torch.int64)
    mask = torch.arange(steps, device=data.device).unsqueeze(1) < lengths.unsqueeze(0)
    padded = data.new_zeros((steps, batch, data.shape[1]))
    padded[mask] = data  # the packed layout is the time-major order of the valid steps
    return padded, lengths, mask


def _reverse_index(steps: int, lengths: Optional[Tensor], device: torch.device) -> Optional[Tensor]:
    """(T, B) gather index that reverses each row within its own length (and
    leaves the padding in place), or None: reverse all T steps."""
    if lengths is None:
        return None
    t = torch.arange(steps, device=device).unsqueeze(1)
    return torch.where(t < lengths.unsqueeze(0), lengths.unsqueeze(0) - 1 - t, t)


def _reverse_time(x: Tensor, index: Optional[Tensor]) -> Tensor:
    """x (T, B, F) with each row's steps in reverse order; its own inverse."""
    if index is None:
        return x.flip(0)
    return x.gather(0, index.unsqueeze(2).expand(-1, -1, x.shape[2]))
