"""Argument checks of the cell, in Python.

Used by the pure-PyTorch backend and the fake kernels, so every backend (and
torch.compile's tracing) rejects bad input with the same message and exception
type as the C++ checks in csrc/checks.cpp: ValueError for shapes, TypeError for
dtypes, RuntimeError for a device mix.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

_INPUT = "(batch, input_features)"
_WEIGHTS = "(3 * state_size, state_size + input_features)"
_STATE = "(batch, state_size)"


def _shape(t: Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _tensor(op: str, t: Any, name: str, layout: str) -> None:
    """A dense torch.Tensor: lists, arrays and sparse tensors are refused alike
    on every backend (TypeError), before any backend sees them."""
    if not isinstance(t, Tensor):
        raise TypeError(
            f"{op}: expected {name} to be a torch.Tensor {layout}, but got {type(t).__name__} "
            "(convert it with torch.as_tensor)"
        )
    if t.layout != torch.strided:
        raise TypeError(
            f"{op}: expected {name} to be a dense (strided) tensor, but got layout {t.layout} (call .to_dense())"
        )


def _rank(op: str, t: Optional[Tensor], name: str, rank: int, layout: str) -> None:
    _tensor(op, t, name, layout)
    if t.dim() != rank:
        raise ValueError(
            f"{op}: expected {name} to be a {rank}-D tensor {layout}, but got a {t.dim()}-D tensor of shape {_shape(t)}"
        )


def _sizes(op: str, t: Tensor, name: str, expected: tuple, layout: str) -> None:
    if tuple(t.shape) != tuple(expected):
        want = "[" + ", ".join(str(s) for s in expected) + "]"
        raise ValueError(f"{op}: expected {name} of shape {layout} = {want}, but got {_shape(t)}")


def _like(op: str, t: Tensor, name: str, ref: Tensor) -> None:
    if t.dtype != ref.dtype:
        raise TypeError(
            f"{op}: expected {name} to have dtype {_dtype(ref.dtype)} like input, "
            f"but got {_dtype(t.dtype)} (cast all arguments to one dtype)"
        )
    if t.device != ref.device:
        raise RuntimeError(
            f"{op}: expected {name} on device {ref.device} like input, "
            f"but got {t.device} (move all arguments to one device)"
        )


def _dtype(dtype: torch.dtype) -> str:
    # Same spelling as c10's ScalarType names in the C++ messages.
    return {
        torch.float32: "Float",
        torch.float64: "Double",
        torch.float16: "Half",
        torch.bfloat16: "BFloat16",
        torch.int64: "Long",
        torch.int32: "Int",
        torch.int16: "Short",
        torch.int8: "Char",
        torch.uint8: "Byte",
        torch.bool: "Bool",
        torch.complex64: "ComplexFloat",
        torch.complex128: "ComplexDouble",
    }.get(dtype, str(dtype).replace("torch.", ""))


def _weights(op: str, weights: Tensor, input: Tensor, input_name: str = "input") -> int:
    """Checks weights (3S, S + I) against an input whose last dimension is I;
    returns S. A width mismatch is reported against the input, naming the
    feature count the weights expect."""
    _rank(op, weights, "weights", 2, _WEIGHTS)
    if weights.shape[0] % 3 != 0:
        raise ValueError(
            f"{op}: expected weights.size(0) to be 3 * state_size, but got {weights.shape[0]} (not a multiple of 3)"
        )
    state = weights.shape[0] // 3
    if weights.shape[1] < state:
        raise ValueError(
            f"{op}: expected weights of shape {_WEIGHTS} with state_size = {state}, but got {_shape(weights)}"
        )
    if weights.shape[1] != state + input.shape[-1]:
        raise ValueError(
            f"{op}: expected {input_name} with {weights.shape[1] - state} input features "
            f"(weights.size(1) - state_size = {weights.shape[1]} - {state}), "
            f"but got {input_name} of shape {_shape(input)}"
        )
    _like(op, weights, "weights", input)
    return state


def _dtype_of_input(op: str, input: Tensor) -> None:
    if input.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"{op}: expected input of a floating dtype (float32, float64, float16 "
            f"or bfloat16), but got {_dtype(input.dtype)}"
        )


def _bias(op: str, bias: Optional[Tensor], state: int, input: Tensor) -> None:
    if bias is not None:
        _rank(op, bias, "bias", 1, "(3 * state_size,)")
        _sizes(op, bias, "bias", (3 * state,), "(3 * state_size,)")
        _like(op, bias, "bias", input)


def _state(op: str, t: Tensor, name: str, batch: int, state: int, input: Tensor) -> None:
    _rank(op, t, name, 2, _STATE)
    _sizes(op, t, name, (batch, state), _STATE)
    _like(op, t, name, input)


def check_cell_args(
    op: str,
    input: Tensor,
    weights: Tensor,
    bias: Optional[Tensor],
    old_h: Tensor,
    old_cell: Tensor,
) -> tuple[int, int, int]:
    """Validates a cell's arguments; returns (batch, input_features, state_size)."""
    _rank(op, input, "input", 2, _INPUT)
    _dtype_of_input(op, input)
    state = _weights(op, weights, input)
    batch, features = input.shape
    _bias(op, bias, state, input)
    _state(op, old_h, "old_h", batch, state, input)
    _state(op, old_cell, "old_cell", batch, state, input)
    return batch, features, state


def check_seq_args(
    op: str,
    input: Tensor,
    weights: Tensor,
    bias: Optional[Tensor],
    h0: Tensor,
    c0: Tensor,
    lengths: Optional[Tensor] = None,
) -> tuple[int, int, int, int]:
    """Validates a layer's arguments (time-major input (T, B, I));
    returns (seq_len, batch, input_features, state_size)."""
    _rank(op, input, "input", 3, "(seq_len, batch, input_features)")
    _dtype_of_input(op, input)
    state = _weights(op, weights, input)
    steps, batch, features = input.shape
    _bias(op, bias, state, input)
    _state(op, h0, "h0", batch, state, input)
    _state(op, c0, "c0", batch, state, input)
    if lengths is not None:
        _rank(op, lengths, "lengths", 1, "(batch,)")
        _sizes(op, lengths, "lengths", (batch,), "(batch,)")
        if lengths.dtype != torch.int64:
            raise TypeError(
                f"{op}: expected lengths of dtype Long (int64), but got {_dtype(lengths.dtype)} "
                "(convert it with lengths.to(torch.int64))"
            )
        if lengths.device != input.device:
            raise RuntimeError(
                f"{op}: expected lengths on device {input.device} like input, "
                f"but got {lengths.device} (move all arguments to one device)"
            )
    return steps, batch, features, state


def lengths_arg(op: str, lengths: Any, input: Tensor) -> Optional[Tensor]:
    """`lengths` of a layer call, as a user passes it: None, or a (batch,)
    tensor of an integer dtype (not bool) on the CPU or on the input's device,
    each value in [0, seq_len]. Returns it as the operators take it: int64 on
    the input's device.

    The values are checked wherever they can be read: always on the CPU (free),
    on a GPU at the cost of one synchronisation (pass lengths on the CPU, as
    torch.nn.utils.rnn.pack_padded_sequence asks, to avoid it); not while
    torch.compile or torch.export trace (the values are data-dependent there)
    nor while a CUDA graph is being captured (reading them would break the
    capture).
    """
    if lengths is None:
        return None
    _tensor(op, lengths, "lengths", "(batch,)")
    if lengths.dtype == torch.bool or lengths.is_floating_point() or lengths.is_complex():
        raise TypeError(
            f"{op}: expected lengths to be an integer tensor of shape (batch,), but got dtype {_dtype(lengths.dtype)}"
            + (" (a mask is not lengths: mask.sum(0) gives them)" if lengths.dtype == torch.bool else "")
        )
    if lengths.device.type != "cpu" and lengths.device != input.device:
        raise RuntimeError(
            f"{op}: expected lengths on the CPU or on device {input.device} like input, "
            f"but got {lengths.device} (move lengths to the CPU)"
        )
    _rank(op, lengths, "lengths", 1, "(batch,)")
    _sizes(op, lengths, "lengths", (input.shape[1],), "(batch,)")
    check_length_values(op, lengths, input.shape[0])
    return lengths.to(device=input.device, dtype=torch.int64)


def _readable(t: Tensor) -> Optional[Tensor]:
    """The plain tensor under functorch's wrappers (vmap, grad) whose values
    can be read now, or None where reading them is impossible (tracing by
    torch.compile / torch.export, fake or meta tensors) or would break a
    CUDA graph capture."""
    if torch.compiler.is_compiling() or getattr(torch.compiler, "is_exporting", lambda: False)():
        return None
    functorch = torch._C._functorch
    while functorch.is_functorch_wrapped_tensor(t):
        t = functorch.get_unwrapped(t)
    if type(t) not in (Tensor, torch.nn.Parameter) or t.device.type == "meta":
        return None  # FakeTensor, FunctionalTensor, ... : no values
    if t.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    return t


def check_length_values(op: str, lengths: Tensor, steps: int) -> None:
    """0 <= lengths[b] <= seq_len for every row b, where the values can be
    read (see lengths_arg); the same message as the C++ operators' check."""
    values = _readable(lengths)
    if values is None or values.numel() == 0:
        return
    low, high = torch.aminmax(values)
    low, high = torch.stack([low, high]).tolist()  # one synchronisation on a GPU
    if low >= 0 and high <= steps:
        return
    flat = values.flatten()
    bad = int(((flat < 0) | (flat > steps)).nonzero()[0])
    # Under vmap the unwrapped lengths carry the vmapped dimension too: name the value only.
    where = f"lengths[{bad}]" if values.dim() == 1 else "an entry of lengths"
    raise ValueError(
        f"{op}: expected 0 <= lengths[b] <= seq_len = {steps} for every row b, but got {where} = {int(flat[bad])}"
    )


def bias_vector(op: str, bias: Optional[Tensor]) -> Optional[Tensor]:
    """bias (3S,) as is; (1, 3S) (extension-cpp's layout) as a (3S,) view, so
    autograd hands its gradient back in the caller's (1, 3S) shape."""
    if bias is None:
        return None
    _tensor(op, bias, "bias", "(3 * state_size,)")
    if bias.dim() == 2 and bias.shape[0] == 1:
        return bias.reshape(bias.shape[1])
    if bias.dim() != 1:
        raise ValueError(
            f"{op}: expected bias of shape (3 * state_size,) or (1, 3 * state_size), but got {_shape(bias)}"
        )
    return bias


def check_tensors(op: str, **args: Any) -> None:
    """Every argument a dense tensor (bias may be None); see _tensor."""
    for name, t in args.items():
        if not (name == "bias" and t is None):
            _tensor(op, t, name, _LAYOUTS.get(name, ""))


_LAYOUTS = {
    "input": _INPUT,
    "weights": _WEIGHTS,
    "bias": "(3 * state_size,)",
    "old_h": _STATE,
    "old_cell": _STATE,
    "h0": _STATE,
    "c0": _STATE,
}


def unpack_state(op: str, state: Any, shape: str) -> tuple[Tensor, Tensor]:
    """state = (h, c): anything else (one tensor, a 1-tuple) is a clear error
    instead of Python's 'too many values to unpack'."""
    if isinstance(state, Tensor) or not isinstance(state, (tuple, list)) or len(state) != 2:
        got = type(state).__name__ + (f" of length {len(state)}" if isinstance(state, (tuple, list)) else "")
        raise ValueError(f"{op}: expected state to be None or a tuple (h, c) of two tensors {shape}, but got {got}")
    return state[0], state[1]


def check_size(op: str, name: str, value: Any, minimum: int) -> None:
    """A module size (state_size, input_features, ...): an integer >= minimum."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{op}: {name} must be an integer of at least {minimum}, got {value!r}")


def _rnn_lengths(op: str, lengths: Optional[Tensor], batch: int, input: Tensor) -> None:
    if lengths is not None:
        _rank(op, lengths, "lengths", 1, "(batch,)")
        _sizes(op, lengths, "lengths", (batch,), "(batch,)")
        if lengths.dtype != torch.int64:
            raise TypeError(f"{op}: expected lengths of dtype Long (int64), but got {_dtype(lengths.dtype)}")
        if lengths.device != input.device:
            raise RuntimeError(
                f"{op}: expected lengths on device {input.device} like input, "
                f"but got {lengths.device} (move all arguments to one device)"
            )


def check_rnn_args(
    op: str,
    cell: Any,
    input: Tensor,
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Optional[Tensor],
    bias_hh: Optional[Tensor],
    state: Any,
    lengths: Optional[Tensor] = None,
) -> tuple[int, int, int, int]:
    """Validates one layer of a seam cell (lltm.cells.Cell; time-major input (T, B, I), torch's
    weight layout), as csrc/checks.cpp's check_rnn_forward_args does; returns (T, B, I, hidden_size)."""
    _rank(op, input, "input", 3, "(seq_len, batch, input_size)")
    _dtype_of_input(op, input)
    rows = f"{cell.gates} * hidden_size"
    _rank(op, weight_hh, "weight_hh", 2, f"({rows}, hidden_size)")
    if weight_hh.shape[0] != cell.gates * weight_hh.shape[1]:
        raise ValueError(
            f"{op}: expected weight_hh of shape ({rows}, hidden_size) ({cell.name} has {cell.gates} gates), "
            f"but got {_shape(weight_hh)}"
        )
    _like(op, weight_hh, "weight_hh", input)
    _rank(op, weight_ih, "weight_ih", 2, f"({rows}, input_size)")
    if weight_ih.shape[0] != weight_hh.shape[0]:
        raise ValueError(
            f"{op}: expected weight_ih of shape ({rows}, input_size) with {weight_hh.shape[0]} rows like "
            f"weight_hh, but got {_shape(weight_ih)}"
        )
    if weight_ih.shape[1] != input.shape[-1]:
        raise ValueError(
            f"{op}: expected input with {weight_ih.shape[1]} input features (weight_ih.size(1)), "
            f"but got input of shape {_shape(input)}"
        )
    _like(op, weight_ih, "weight_ih", input)
    steps, batch, features = input.shape
    hidden = weight_hh.shape[1]
    for name, b in (("bias_ih", bias_ih), ("bias_hh", bias_hh)):
        if b is not None:
            _rank(op, b, name, 1, f"({rows},)")
            _sizes(op, b, name, (cell.gates * hidden,), f"({rows},)")
            _like(op, b, name, input)
    if isinstance(state, Tensor) or not isinstance(state, (tuple, list)) or len(state) != cell.num_states:
        got = type(state).__name__ + (f" of length {len(state)}" if isinstance(state, (tuple, list)) else "")
        raise ValueError(f"{op}: expected state to hold {cell.num_states} tensor(s) ({cell.name}'s states), got {got}")
    for k, s in enumerate(state):
        _state(op, s, f"state[{k}]", batch, hidden, input)
    _rnn_lengths(op, lengths, batch, input)
    return steps, batch, features, hidden
