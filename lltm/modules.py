"""nn.Module front ends.

LLTMCell (one step) and LLTM (layers over a sequence), with the tutorial's
parameters; LSTM, GRU, LSTMCell and GRUCell, drop-ins for torch.nn's with
torch's signatures, parameter names, shapes and init, on lltm's kernels.

What a layer of any cell does besides its cell (layers, directions,
PackedSequence, batch_first, unbatched input, dropout, the initial states)
lives once, in _Layers; each layer class says only how one direction of one
layer runs and how its states are passed in and out.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from lltm import cells, functional
from lltm._checks import check_size, unpack_state
from lltm.export.torchscript import not_scriptable

__all__ = ["LLTMCell", "LLTM", "LSTM", "GRU", "LSTMCell", "GRUCell"]

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


def _flag(op: str, name: str, value: Any) -> bool:
    """A bool argument: True/False (or 0/1), nothing else."""
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{op}: {name} must be a bool, got {value!r}")


def _layer_options(op: str, num_layers: Any, dropout: Any) -> tuple[int, float]:
    if isinstance(num_layers, bool) or not isinstance(num_layers, int):
        raise TypeError(f"{op}: num_layers must be an int, got {num_layers!r}")
    if num_layers < 1:
        raise ValueError(f"{op}: num_layers must be at least 1, got {num_layers}")
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real):
        raise TypeError(f"{op}: dropout must be a float probability in [0, 1], got {dropout!r}")
    if not 0.0 <= dropout <= 1.0:
        raise ValueError(f"{op}: dropout must be a probability in [0, 1], got {dropout}")
    if dropout > 0 and num_layers == 1:
        warnings.warn(
            f"{op}: dropout adds dropout after all but the last layer, so a non-zero dropout "
            f"expects num_layers greater than 1, but got dropout={dropout} and num_layers={num_layers}",
            stacklevel=3,
        )
    return num_layers, float(dropout)


def _check_input_tensor(op: str, input: Any, layout: str) -> None:
    if not isinstance(input, Tensor):
        raise TypeError(
            f"{op}: expected input to be a torch.Tensor {layout}, but got {type(input).__name__} "
            "(convert it with torch.as_tensor)"
        )


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

    forward(input (B, I) or (I,), state=None | (h, c) each (B, S) or (S,))
    -> (new_h, new_cell). A missing state is zeros.
    """

    # torch.jit.script: a clear error naming what to use instead (lltm/export/torchscript.py)
    __prepare_scriptable__ = not_scriptable

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
        op = "lltm.LLTMCell"
        input_size, state_size = _sizes(op, input_size, state_size, input_features, hidden_size)
        factory = {"device": device, "dtype": dtype}
        self.input_size = input_size
        self.state_size = state_size
        self.backend = _check_backend_name(backend)
        self.weights = nn.Parameter(torch.empty(3 * state_size, state_size + input_size, **factory))
        if _flag(op, "bias", bias):
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
        _check_input_tensor("lltm.LLTMCell", input, "(batch, input_size)")
        unbatched = input.dim() == 1
        if unbatched:
            input = input.unsqueeze(0)
        if state is None:
            zeros = input.new_zeros((input.shape[0], self.state_size))
            state = (zeros, zeros)
        old_h, old_cell = unpack_state("lltm.LLTMCell", state, "(batch, state_size)")
        if unbatched:
            old_h, old_cell = (s.unsqueeze(0) if isinstance(s, Tensor) else s for s in (old_h, old_cell))
        h, c = functional.lltm_cell(input, self.weights, self.bias, old_h, old_cell, backend=self.backend)
        return (h.squeeze(0), c.squeeze(0)) if unbatched else (h, c)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.state_size}, bias={self.bias is not None}, backend={self.backend!r}"


class _Layers(_Sizes, nn.Module):
    """Stacked recurrent layers over a sequence, with torch.nn.LSTM's conventions, for any cell.

    input: (T, B, I), (B, T, I) when batch_first, (T, I) unbatched, or a
    PackedSequence; states: one (num_layers * D, B, S) tensor per cell
    state ((num_layers * D, S) unbatched), D = 2 when bidirectional. The
    output holds the last layer's h at every step, the directions
    concatenated; each state's final value per layer and direction (for a
    PackedSequence, at each sequence's own last step). Dropout (training
    only) applies to the outputs of every layer but the last. Each layer and
    direction is one call of `_direction` (one operator call over the whole
    sequence on the compiled backends).
    """

    _op: str  # the class's name in messages, e.g. "lltm.LLTM"
    _cell: cells.Cell
    _state_layout = "(num_layers * num_directions, batch, hidden_size)"
    # torch.jit.script: a clear error naming what to use instead (lltm/export/torchscript.py)
    __prepare_scriptable__ = not_scriptable

    def _init_layers(
        self,
        input_size: int,
        state_size: int,
        num_layers: Any,
        bias: Any,
        batch_first: Any,
        dropout: Any,
        bidirectional: Any,
        backend: str,
    ) -> None:
        self.input_size = input_size
        self.state_size = state_size
        self.num_layers, self.dropout = _layer_options(self._op, num_layers, dropout)
        self.bias = _flag(self._op, "bias", bias)
        self.batch_first = _flag(self._op, "batch_first", batch_first)
        self.bidirectional = _flag(self._op, "bidirectional", bidirectional)
        self.backend = _check_backend_name(backend)

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    def _layer_inputs(self, k: int) -> int:
        return self.input_size if k == 0 else self.num_directions * self.state_size

    @staticmethod
    def _suffixes(directions: int) -> tuple[str, ...]:
        return ("", "_reverse")[:directions]

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.state_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def flatten_parameters(self) -> None:
        """torch.nn.LSTM's cuDNN weight-packing call: nothing to do here (every layer's operator reads
        its parameters where they are), kept so code written for nn.LSTM runs unchanged."""

    def _direction(
        self, k: int, suffix: str, x: Tensor, state: tuple[Tensor, ...], lengths: Optional[Tensor]
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One direction of layer k over the time-major x: (output (T, B, S), final states)."""
        raise NotImplementedError

    def _run(
        self, input: Union[Tensor, PackedSequence], states: Optional[tuple[Optional[Tensor], ...]]
    ) -> tuple[Union[Tensor, PackedSequence], tuple[Tensor, ...], bool]:
        """The layers over `input` from the initial `states` (None: zeros; else one tensor per cell
        state, as the caller passed them): (output, final states, unbatched)."""
        packed = isinstance(input, PackedSequence)
        lengths: Optional[Tensor] = None
        unbatched = False
        if packed:
            # Time-major padded batch in the packed (length-sorted) row order;
            # lengths stay on the CPU (the operators take them from there without a sync).
            x, lengths, mask = _unpack(input)
        else:
            layout = "(batch, seq_len, input_size)" if self.batch_first else "(seq_len, batch, input_size)"
            _check_input_tensor(self._op, input, layout)
            if input.dim() not in (2, 3):
                raise ValueError(
                    f"{self._op}: expected input to be a 3-D tensor {layout}, a 2-D tensor (seq_len, input_size) "
                    f"(unbatched) or a PackedSequence, but got {list(input.shape)}"
                )
            unbatched = input.dim() == 2
            if unbatched:
                x = input.unsqueeze(1)
            else:
                x = input.transpose(0, 1) if self.batch_first else input
        if x.shape[2] != self.input_size:
            shape = list(input.shape) if isinstance(input, Tensor) else list(x.shape)
            raise ValueError(
                f"{self._op}: expected input with input_size = {self.input_size} features, "
                f"but got {x.shape[2]} (input of shape {shape})"
            )
        batch = x.shape[1]
        D = self.num_directions
        # Each layer's and direction's initial states: slices of the caller's, or one zero (B, S)
        # tensor that every layer and state reads (no slicing: host time counts at small sizes).
        zero, init = None, ()
        if states is None:
            zero = x.new_zeros(batch, self.state_size)
        else:
            init = self._initial_states(states, batch, unbatched)
            if packed and input.sorted_indices is not None:
                init = tuple(s.index_select(1, input.sorted_indices) for s in init)
        reverse_index = None
        if D == 2:
            on_device = None if lengths is None else lengths.to(x.device)
            reverse_index = _reverse_index(x.shape[0], on_device, x.device)
        finals: list[list[Tensor]] = [[] for _ in self._cell.states]
        for k in range(self.num_layers):
            if k > 0 and self.dropout > 0.0 and self.training:
                x = F.dropout(x, self.dropout, training=True)
            outputs = []
            for d, suffix in enumerate(self._suffixes(D)):
                x_d = x if d == 0 else _reverse_time(x, reverse_index)
                layer_init = (zero,) * len(finals) if zero is not None else tuple(s[k * D + d] for s in init)
                out, final = self._direction(k, suffix, x_d, layer_init, lengths)
                outputs.append(out if d == 0 else _reverse_time(out, reverse_index))
                for lst, f in zip(finals, final):
                    lst.append(f)
            x = outputs[0] if D == 1 else torch.cat(outputs, dim=2)
        # one layer and direction: a view of the operator's final states, no copy
        final_states = tuple(f[0].unsqueeze(0) if len(f) == 1 else torch.stack(f) for f in finals)
        if packed:
            if input.unsorted_indices is not None:
                final_states = tuple(s.index_select(1, input.unsorted_indices) for s in final_states)
            output = PackedSequence(x[mask], input.batch_sizes, input.sorted_indices, input.unsorted_indices)
            return output, final_states, False
        if unbatched:
            return x.squeeze(1), tuple(s.squeeze(1) for s in final_states), True
        return (x.transpose(0, 1) if self.batch_first else x), final_states, False

    def _initial_states(self, states: tuple[Any, ...], batch: int, unbatched: bool) -> tuple[Tensor, ...]:
        """The caller's initial states, checked, as (num_layers * D, B, S) tensors."""
        expected = (self.num_layers * self.num_directions, batch, self.state_size)
        layout = self._state_layout
        want = expected[:1] + expected[2:] if unbatched else expected
        if unbatched:
            layout = layout.replace("batch, ", "")
        out = []
        for name, t in zip(self._state_names(), states):
            if not isinstance(t, Tensor):
                raise ValueError(f"{self._op}: expected {name} to be a tensor {layout}, but got {type(t).__name__}")
            if tuple(t.shape) != want:
                raise ValueError(
                    f"{self._op}: expected {name} of shape {layout} = {list(want)}, but got {list(t.shape)}"
                )
            out.append(t.unsqueeze(1) if unbatched else t)
        return tuple(out)

    def _state_names(self) -> tuple[str, ...]:
        return tuple(f"{s}0" for s in self._cell.states)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.state_size}, num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s + f", backend={self.backend!r}"


class LLTM(_Layers):
    """Stacked LLTM layers over a sequence, with nn.LSTM's conventions.

    LLTM(input_size, state_size, num_layers=1, bias=True, batch_first=False,
    dropout=0.0, bidirectional=False): nn.LSTM's positional order; the
    keywords hidden_size (nn.LSTM's word) and input_features (the
    tutorial's) name the same sizes.

    input: (T, B, I), or (B, T, I) when batch_first, (T, I) unbatched, or a
    PackedSequence; state: None (zeros) or (h0, c0), each (num_layers * D, B, S)
    ((num_layers * D, S) unbatched) with D = 2 when bidirectional, else 1.
    Returns (output, (h_n, c_n)): output (T, B, D * S) (or (B, T, D * S),
    (T, D * S), or a PackedSequence like the input) holds the last layer's h
    at every step, the directions concatenated; h_n, c_n (num_layers * D, B, S)
    hold each layer's and direction's final state (for a PackedSequence, at
    each sequence's own last step). Dropout (training only) applies to the
    outputs of every layer but the last.

    Layer k owns ``weights_l{k}`` (3S, S + I_k) and ``bias_l{k}`` (3S,), and
    when bidirectional ``weights_l{k}_reverse`` and ``bias_l{k}_reverse``,
    with I_0 = input_size and I_k = D * S after. Each layer and direction is
    one operator call over the whole sequence (backend "aten" or "fused"):
    one autograd node whatever T.
    """

    _op = "lltm.LLTM"
    _cell = cells.LLTM
    _state_layout = "(num_layers * num_directions, batch, state_size)"

    def __init__(
        self,
        input_size: Optional[int] = None,
        state_size: Optional[int] = None,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        *,
        backend: str = "auto",
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
        input_features: Optional[int] = None,
        hidden_size: Optional[int] = None,
    ) -> None:
        super().__init__()
        input_size, state_size = _sizes(self._op, input_size, state_size, input_features, hidden_size)
        self._init_layers(input_size, state_size, num_layers, bias, batch_first, dropout, bidirectional, backend)
        factory = {"device": device, "dtype": dtype}
        for k in range(self.num_layers):
            for suffix in self._suffixes(self.num_directions):
                self.register_parameter(
                    f"weights_l{k}{suffix}",
                    nn.Parameter(torch.empty(3 * state_size, state_size + self._layer_inputs(k), **factory)),
                )
                self.register_parameter(
                    f"bias_l{k}{suffix}", nn.Parameter(torch.empty(3 * state_size, **factory)) if self.bias else None
                )
        self.reset_parameters()

    def _direction(self, k, suffix, x, state, lengths):
        out, (h, c) = functional.lltm(
            x,
            getattr(self, f"weights_l{k}{suffix}"),
            getattr(self, f"bias_l{k}{suffix}"),
            state[0],
            state[1],
            lengths=lengths,
            backend=self.backend,
        )
        return out, (h, c)

    def forward(
        self, input: Union[Tensor, PackedSequence], state: Optional[State] = None
    ) -> tuple[Union[Tensor, PackedSequence], State]:
        states = None
        if state is not None:
            states = unpack_state(self._op, state, "(num_layers * num_directions, batch, state_size)")
        output, (h_n, c_n), _ = self._run(input, states)
        return output, (h_n, c_n)


class _TorchLayers(_Layers):
    """A drop-in for torch.nn.LSTM / GRU: torch's parameters
    weight_ih_l{k}{suffix} (G S, I_k), weight_hh_l{k}{suffix} (G S, S),
    bias_ih_l{k}{suffix}, bias_hh_l{k}{suffix} (G S,), initialised uniformly in
    ±1/sqrt(hidden_size), so state_dicts load both ways."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
        *,
        backend: str = "auto",
    ) -> None:
        """torch.nn.GRU's constructor (LSTM adds proj_size)."""
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self._make(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, backend, factory)

    def _make(self, input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, backend, factory):
        check_size(self._op, "input_size", input_size, 0)
        check_size(self._op, "hidden_size", hidden_size, 1)
        self._init_layers(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, backend)
        rows = self._cell.gates * hidden_size
        for k in range(self.num_layers):
            for suffix in self._suffixes(self.num_directions):
                self.register_parameter(
                    f"weight_ih_l{k}{suffix}", nn.Parameter(torch.empty(rows, self._layer_inputs(k), **factory))
                )
                self.register_parameter(
                    f"weight_hh_l{k}{suffix}", nn.Parameter(torch.empty(rows, hidden_size, **factory))
                )
                for name in ("bias_ih", "bias_hh"):
                    self.register_parameter(
                        f"{name}_l{k}{suffix}", nn.Parameter(torch.empty(rows, **factory)) if self.bias else None
                    )
        self.reset_parameters()

    def _direction(self, k, suffix, x, state, lengths):
        p = f"_l{k}{suffix}"
        return functional.rnn(
            self._cell.name,
            x,
            getattr(self, "weight_ih" + p),
            getattr(self, "weight_hh" + p),
            getattr(self, "bias_ih" + p),
            getattr(self, "bias_hh" + p),
            state,
            lengths=lengths,
            backend=self.backend,
        )

    @property
    def all_weights(self) -> list[list[nn.Parameter]]:
        """torch.nn.RNNBase's per-layer parameter lists."""
        names = ("weight_ih", "weight_hh") + (("bias_ih", "bias_hh") if self.bias else ())
        return [
            [getattr(self, f"{n}_l{k}{s}") for n in names]
            for k in range(self.num_layers)
            for s in self._suffixes(self.num_directions)
        ]


class LSTM(_TorchLayers):
    """torch.nn.LSTM on lltm's kernels: the same constructor (positional order included), parameters,
    init, inputs and outputs, plus backend= ("auto", "python", "aten", "fused").

    LSTM(input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
         bidirectional=False, proj_size=0, device=None, dtype=None, *, backend="auto")
    forward(input, hx=None | (h_0, c_0)) -> (output, (h_n, c_n)), shapes as torch.nn.LSTM's.
    proj_size other than 0 is not supported (a clear error).
    """

    _op = "lltm.LSTM"
    _cell = cells.LSTM

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
        *,
        backend: str = "auto",
    ) -> None:
        if proj_size != 0:
            raise ValueError(
                f"{self._op}: proj_size={proj_size} is not supported (LSTM with projections); use torch.nn.LSTM "
                "for it, or a Linear layer on the output"
            )
        super().__init__(
            input_size,
            hidden_size,
            num_layers,
            bias,
            batch_first,
            dropout,
            bidirectional,
            device,
            dtype,
            backend=backend,
        )
        self.proj_size = 0

    def forward(
        self, input: Union[Tensor, PackedSequence], hx: Optional[State] = None
    ) -> tuple[Union[Tensor, PackedSequence], State]:
        states = None
        if hx is not None:
            states = unpack_state(self._op, hx, self._state_layout)
        output, (h_n, c_n), _ = self._run(input, states)
        return output, (h_n, c_n)


class GRU(_TorchLayers):
    """torch.nn.GRU on lltm's kernels: the same constructor (positional order included), parameters,
    init, inputs and outputs, plus backend= ("auto", "python", "aten", "fused").

    GRU(input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
        bidirectional=False, device=None, dtype=None, *, backend="auto")
    forward(input, hx=None | h_0) -> (output, h_n), shapes as torch.nn.GRU's.
    """

    _op = "lltm.GRU"
    _cell = cells.GRU

    def forward(
        self, input: Union[Tensor, PackedSequence], hx: Optional[Tensor] = None
    ) -> tuple[Union[Tensor, PackedSequence], Tensor]:
        output, (h_n,), _ = self._run(input, None if hx is None else (hx,))
        return output, h_n


class _TorchCell(nn.Module):
    """One step of a seam cell as torch.nn.LSTMCell / GRUCell: parameters weight_ih (G S, I),
    weight_hh (G S, S), bias_ih, bias_hh (G S,). On the compiled backends a step is the cell's
    sequence operator over one step."""

    _op: str
    _cell: cells.Cell
    __prepare_scriptable__ = not_scriptable

    def __init__(self, input_size, hidden_size, bias, device, dtype, backend) -> None:
        super().__init__()
        check_size(self._op, "input_size", input_size, 0)
        check_size(self._op, "hidden_size", hidden_size, 1)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = _flag(self._op, "bias", bias)
        self.backend = _check_backend_name(backend)
        factory = {"device": device, "dtype": dtype}
        rows = self._cell.gates * hidden_size
        self.weight_ih = nn.Parameter(torch.empty(rows, input_size, **factory))
        self.weight_hh = nn.Parameter(torch.empty(rows, hidden_size, **factory))
        if self.bias:
            self.bias_ih = nn.Parameter(torch.empty(rows, **factory))
            self.bias_hh = nn.Parameter(torch.empty(rows, **factory))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def _step(self, input: Tensor, states: Optional[tuple[Any, ...]]) -> tuple[Tensor, ...]:
        _check_input_tensor(self._op, input, "(batch, input_size)")
        if input.dim() not in (1, 2):
            raise ValueError(
                f"{self._op}: expected input to be a 2-D tensor (batch, input_size) or a 1-D tensor "
                f"(input_size,), but got {list(input.shape)}"
            )
        unbatched = input.dim() == 1
        x = input.unsqueeze(0) if unbatched else input
        if states is None:
            zeros = x.new_zeros((x.shape[0], self.hidden_size))
            states = tuple(zeros for _ in self._cell.states)
        else:
            for name, s in zip(self._cell.states, states):
                if not isinstance(s, Tensor):
                    raise ValueError(f"{self._op}: expected {name} to be a tensor, but got {type(s).__name__}")
            states = tuple(s.unsqueeze(0) if unbatched else s for s in states)
        _, new = functional.rnn(
            self._cell.name,
            x.unsqueeze(0),
            self.weight_ih,
            self.weight_hh,
            self.bias_ih,
            self.bias_hh,
            states,
            backend=self.backend,
        )
        return tuple(s.squeeze(0) for s in new) if unbatched else new

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if not self.bias:
            s += ", bias=False"
        return s + f", backend={self.backend!r}"


class LSTMCell(_TorchCell):
    """torch.nn.LSTMCell on lltm's kernels: LSTMCell(input_size, hidden_size, bias=True, device=None,
    dtype=None, *, backend="auto"); forward(input (B, I) or (I,), hx=None | (h, c)) -> (h', c')."""

    _op = "lltm.LSTMCell"
    _cell = cells.LSTM

    def __init__(
        self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None, *, backend="auto"
    ):
        super().__init__(input_size, hidden_size, bias, device, dtype, backend)

    def forward(self, input: Tensor, hx: Optional[State] = None) -> State:
        states = None if hx is None else unpack_state(self._op, hx, "(batch, hidden_size)")
        h, c = self._step(input, states)
        return h, c


class GRUCell(_TorchCell):
    """torch.nn.GRUCell on lltm's kernels: GRUCell(input_size, hidden_size, bias=True, device=None,
    dtype=None, *, backend="auto"); forward(input (B, I) or (I,), hx=None | h) -> h'."""

    _op = "lltm.GRUCell"
    _cell = cells.GRU

    def __init__(
        self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None, *, backend="auto"
    ):
        super().__init__(input_size, hidden_size, bias, device, dtype, backend)

    def forward(self, input: Tensor, hx: Optional[Tensor] = None) -> Tensor:
        (h,) = self._step(input, None if hx is None else (hx,))
        return h


def _states_arg(op: str, cell: cells.Cell, hx: Any, layout: str) -> Optional[tuple[Any, ...]]:
    """hx as a layer or cell of `cell` takes it: None, one tensor (one state, as torch.nn.GRU), or a
    tuple of one tensor per state, h first (as torch.nn.LSTM's (h, c))."""
    if hx is None:
        return None
    names = ", ".join(cell.states)
    if cell.num_states == 1:
        if isinstance(hx, Tensor):
            return (hx,)
        raise ValueError(f"{op}: expected hx to be None or a tensor {layout}, but got {type(hx).__name__}")
    if isinstance(hx, Tensor) or not isinstance(hx, (tuple, list)) or len(hx) != cell.num_states:
        got = type(hx).__name__ + (f" of length {len(hx)}" if isinstance(hx, (tuple, list)) else "")
        raise ValueError(
            f"{op}: expected hx to be None or a tuple ({names}) of {cell.num_states} tensors {layout}, but got {got}"
        )
    return tuple(hx)


class _UserLayers(_TorchLayers):
    """Layers of a cell of lltm.cells.define, with torch.nn.LSTM's conventions: the constructor
    (input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False, device=None, dtype=None, *, backend="auto"), torch's parameter names and
    init; forward(input, hx=None) -> (output, h_n) for a cell of one state (as torch.nn.GRU), else
    (output, (h_n, ...)), one tensor (num_layers * D, B, S) per state."""

    def forward(self, input: Union[Tensor, PackedSequence], hx: Any = None) -> tuple[Any, Any]:
        output, finals, _ = self._run(input, _states_arg(self._op, self._cell, hx, self._state_layout))
        return output, (finals[0] if self._cell.num_states == 1 else finals)

    def __reduce_ex__(self, protocol):  # pickled by the cell's name: the loader defines the cell again
        return (_user_module, (self._cell.name, "Layer"), self.__getstate__())


class _UserCell(_TorchCell):
    """One step of a cell of lltm.cells.define, with torch.nn.LSTMCell's conventions:
    (input_size, hidden_size, bias=True, device=None, dtype=None, *, backend="auto");
    forward(input (B, I) or (I,), hx=None) -> h' for a cell of one state, else (h', ...)."""

    def __init__(
        self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None, *, backend="auto"
    ):
        super().__init__(input_size, hidden_size, bias, device, dtype, backend)

    def forward(self, input: Tensor, hx: Any = None) -> Any:
        new = self._step(input, _states_arg(self._op, self._cell, hx, "(batch, hidden_size)"))
        return new[0] if self._cell.num_states == 1 else tuple(new)

    def __reduce_ex__(self, protocol):
        return (_user_module, (self._cell.name, "Cell"), self.__getstate__())


_USER_CLASSES: dict[tuple[str, str], type] = {}


def _user_class(cell: cells.Cell, kind: str) -> type:
    key = (cell.name, kind)
    cls = _USER_CLASSES.get(key)
    if cls is None or cls._cell is not cell:
        base = _UserLayers if kind == "Layer" else _UserCell
        cls = type(kind, (base,), {"_op": f"lltm.cells.get({cell.name!r}).{kind}", "_cell": cell})
        cls.__qualname__ = f"{kind}[{cell.name}]"
        _USER_CLASSES[key] = cls
    return cls


def layer_class(cell: cells.Cell) -> type:
    """The layer module class of a cell of lltm.cells.define (cell.Layer)."""
    return _user_class(cell, "Layer")


def cell_class(cell: cells.Cell) -> type:
    """The one-step module class of a cell of lltm.cells.define (cell.Cell)."""
    return _user_class(cell, "Cell")


def _user_module(name: str, kind: str) -> nn.Module:
    """Unpickling: an empty module of the class of cell `name` (defined again in this process)."""
    cls = _user_class(cells.get(name), kind)
    return cls.__new__(cls)


def _unpack(packed: PackedSequence) -> tuple[Tensor, Tensor, Tensor]:
    """A PackedSequence as (padded (T, B, F) in its length-sorted row order,
    lengths (B,) int64 on the CPU, mask (T, B) of the valid steps on the data's device),
    with one scatter (no loop over sequences or steps). The batch size comes
    from the shape of sorted_indices where there is one (a size, not a value:
    torch.compile traces it without reading data), else batch_sizes[0]."""
    data, batch_sizes = packed.data, packed.batch_sizes
    steps = batch_sizes.numel()
    if packed.sorted_indices is not None:
        batch = packed.sorted_indices.numel()
    else:
        batch = int(batch_sizes[0]) if steps else 0
    lengths = (batch_sizes.unsqueeze(0) > torch.arange(batch).unsqueeze(1)).sum(1).to(torch.int64)
    mask = torch.arange(steps, device=data.device).unsqueeze(1) < lengths.to(data.device).unsqueeze(0)
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
