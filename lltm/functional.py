"""Functional interface: one LLTM step and one LLTM layer over a sequence.

`backend` picks the implementation (see lltm.backends()): "python" is the
pure-PyTorch reference, "aten" and "fused" call the custom operators
torch.ops.lltm.<backend>_cell_forward (one step) and
torch.ops.lltm.<backend>_seq_forward (a whole layer: the time loop runs
inside the operator, one autograd node whatever T), whose autograd formulas
are the matching <backend>_*_backward operators.

Output dtype, one rule for every backend: outside torch.autocast the outputs
have the arguments' dtype (which must be one); inside an autocast region for
the input's device, the float32 / float16 / bfloat16 arguments are cast to
the autocast dtype (float64 ones are left alone, as autocast does) and the
outputs come back in it, like nn.Linear and nn.LSTM under autocast.

torch.func: vmap, grad, vjp and jacrev (per-sample gradients through
torch.func.functional_call included) work with every backend; under those
transforms the compiled backends run through the Python autograd Function of
lltm/_functorch.py, over the same operators. Forward-mode AD (jvp, jacfwd,
hessian) and gradients of gradients need backend="python".
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from lltm import _backends, _extension, _functorch, cells
from lltm._checks import bias_vector, check_cell_args, check_rnn_args, check_seq_args, check_tensors, lengths_arg
from lltm.reference import lltm_cell_reference, lltm_reference, rnn_reference

__all__ = ["lltm_cell", "lltm", "rnn", "lstm", "gru"]


_FORWARD_OPS: dict = {}  # (backend name, family) -> OpOverload, looked up once


def _forward_op(name: str, family: str = "cell"):
    """torch.ops.lltm.<name>_<family>_forward (family: "cell", "seq", or a seam cell's "<cell>_seq")."""
    if torch.compiler.is_compiling():
        # No cache writes while tracing: dynamo would guard on the dict.
        return getattr(torch.ops.lltm, f"{name}_{family}_forward").default
    op = _FORWARD_OPS.get((name, family))
    if op is None:
        _extension.load()
        op = _FORWARD_OPS[(name, family)] = getattr(torch.ops.lltm, f"{name}_{family}_forward").default
    return op


def _call(op_name: str, name: str, family: str, *args: Optional[Tensor]) -> tuple[Tensor, ...]:
    """The compiled forward operator of (backend `name`, `family`), through
    its C++ autograd; under a torch.func transform (which refuses C++
    autograd Functions) through the Python autograd Function over the same
    operators (lltm/_functorch.py)."""
    if torch.compiler.is_compiling() or not _functorch.active():
        return _forward_op(name, family)(*args)
    _extension.load()  # the operators, their fake kernels and vmap rules (lltm/_meta.py)
    _functorch.check_transforms(op_name, name)
    # The operators' autocast rule casts below autograd; the Function saves
    # what it is given, so it must be given the cast arguments.
    return _functorch.apply(family, name, *autocast_args(args[0].device.type, *args))


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The dtype an autocast region enabled for `device_type` runs the LLTM in, or None."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def autocast_args(device_type: str, *args: Optional[Tensor]) -> tuple[Optional[Tensor], ...]:
    """The arguments as the compiled operators' autocast rule casts them
    (lltm/csrc/autocast.h): inside an autocast region for `device_type`,
    float32 / float16 / bfloat16 tensors on that device in the autocast
    dtype; float64, integer tensors and None as they are. The python
    backend runs on them, so its outputs have the dtype the compiled
    backends return."""
    dtype = autocast_dtype(device_type)
    if dtype is None:
        return args
    return tuple(
        a.to(dtype)
        if isinstance(a, Tensor) and a.is_floating_point() and a.dtype != torch.float64 and a.device.type == device_type
        else a
        for a in args
    )


def lltm_cell(
    input: Tensor,
    weights: Tensor,
    bias: Optional[Tensor],
    old_h: Tensor,
    old_cell: Tensor,
    *,
    backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    """One LLTM step.

    input: (B, I); weights: (3S, S + I); bias: (3S,), (1, 3S) (extension-cpp's
    layout; its gradient keeps that shape) or None; old_h, old_cell: (B, S).
    Returns (new_h, new_cell), each (B, S).
    """
    op = "lltm.functional.lltm_cell"
    check_tensors(op, input=input, weights=weights, bias=bias, old_h=old_h, old_cell=old_cell)
    bias = bias_vector(op, bias)
    name = _backends.resolve(backend, input.device.type)
    if name == "python":
        input, weights, bias, old_h, old_cell = autocast_args(input.device.type, input, weights, bias, old_h, old_cell)
        check_cell_args("lltm.functional.lltm_cell", input, weights, bias, old_h, old_cell)
        return lltm_cell_reference(input, weights, bias, old_h, old_cell)
    new_h, new_cell, _ = _call(op, name, "cell", input, weights, bias, old_h, old_cell)
    return new_h, new_cell


def lltm(
    input: Tensor,
    weights: Tensor,
    bias: Optional[Tensor],
    h0: Tensor,
    c0: Tensor,
    *,
    lengths: Optional[Tensor] = None,
    backend: str = "auto",
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One LLTM layer over a sequence, time-major.

    input: (T, B, I); weights: (3S, S + I); bias: (3S,), (1, 3S) or None;
    h0, c0: (B, S); lengths: (B,) integer tensor or None: row b takes only
    its first lengths[b] steps (its output is 0 after them and h_n, c_n are
    its state after its last step), as in a PackedSequence.
    Returns (output (T, B, S), (h_n (B, S), c_n (B, S))).

    lengths: any integer dtype but bool, on the CPU or on the input's
    device; each value in [0, T], else ValueError naming the entry. The
    values are checked on every backend, except where they cannot be read:
    while torch.compile or torch.export trace the call, and inside a CUDA
    graph capture. Lengths on a GPU cost one synchronisation for that check:
    pass them on the CPU (as pack_padded_sequence asks) to avoid it. The
    operators torch.ops.lltm.<backend>_seq_forward called directly take
    int64 lengths on the input's device and check the values on the CPU
    only (a GPU operator never reads them on the host).

    The compiled backends run the whole layer as one operator (one autograd
    node, any T); "python" loops over the reference step.
    """
    op_name = "lltm.functional.lltm"
    check_tensors(op_name, input=input, weights=weights, bias=bias, h0=h0, c0=c0)
    bias = bias_vector(op_name, bias)
    if not isinstance(input, Tensor) or input.dim() != 3:
        shape = list(input.shape) if isinstance(input, Tensor) else type(input).__name__
        raise ValueError(
            f"{op_name}: expected input to be a 3-D tensor (seq_len, batch, input_features), but got {shape}"
        )
    lengths = lengths_arg(op_name, lengths, input)
    name = _backends.resolve(backend, input.device.type, "seq")
    if name == "python":
        input, weights, bias, h0, c0 = autocast_args(input.device.type, input, weights, bias, h0, c0)
        check_seq_args(op_name, input, weights, bias, h0, c0, lengths)
        return lltm_reference(input, weights, bias, h0, c0, lengths)
    output, h_n, c_n, _ = _call(op_name, name, "seq", input, weights, bias, h0, c0, lengths)
    return output, (h_n, c_n)


def rnn(
    cell: str,
    input: Tensor,
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Optional[Tensor],
    bias_hh: Optional[Tensor],
    state: Sequence[Tensor],
    *,
    lengths: Optional[Tensor] = None,
    backend: str = "auto",
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """One layer of a seam cell (lltm.cells: "lstm", "gru", or a cell of lltm.cells.define) over a
    sequence, time-major.

    input: (T, B, I); weight_ih: (G S, I); weight_hh: (G S, S); bias_ih,
    bias_hh: (G S,) or None (torch's layout, G the cell's gates); state: the
    cell's initial states, each (B, S), h first ((h0, c0) for "lstm", (h0,)
    for "gru"); lengths: (B,) integer tensor or None, as for lltm().
    Returns (output (T, B, S), final states).

    The compiled backends run the layer as one operator
    (torch.ops.lltm.<backend>_<cell>_seq_forward, one autograd node, any T);
    "python" loops over the cell's reference step.
    """
    spec = cells.get(cell)
    op_name = f"lltm.functional.rnn({cell!r})"
    check_tensors(op_name, input=input, weight_ih=weight_ih, weight_hh=weight_hh)
    if input.dim() != 3:
        raise ValueError(
            f"{op_name}: expected input to be a 3-D tensor (seq_len, batch, input_size), but got {list(input.shape)}"
        )
    lengths = lengths_arg(op_name, lengths, input)
    state = tuple(state) if isinstance(state, (tuple, list)) else state
    name = _backends.resolve(backend, input.device.type, spec.op_family())
    if name != "python" and _functorch.active():
        raise RuntimeError(
            f"{op_name}: torch.func transforms (grad, vjp, vmap, ...) over the {name!r} backend's {cell} "
            "operators are not supported yet; use backend='python' for them (LLTM's operators support them)"
        )
    if name == "python":
        check_rnn_args(op_name, spec, input, weight_ih, weight_hh, bias_ih, bias_hh, state, lengths)
        return rnn_reference(spec.reference, input, weight_ih, weight_hh, bias_ih, bias_hh, state, lengths)
    output, state_n, _ = _forward_op(name, spec.op_family())(
        input, weight_ih, weight_hh, bias_ih, bias_hh, list(state), lengths
    )
    return output, tuple(state_n)


def lstm(
    input: Tensor,
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Optional[Tensor],
    bias_hh: Optional[Tensor],
    h0: Tensor,
    c0: Tensor,
    *,
    lengths: Optional[Tensor] = None,
    backend: str = "auto",
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One torch.nn.LSTM layer (gates i, f, g, o) over a sequence, time-major: rnn("lstm", ...).

    input: (T, B, I); weight_ih: (4S, I); weight_hh: (4S, S); biases: (4S,) or None;
    h0, c0: (B, S). Returns (output (T, B, S), (h_n, c_n))."""
    return rnn("lstm", input, weight_ih, weight_hh, bias_ih, bias_hh, (h0, c0), lengths=lengths, backend=backend)


def gru(
    input: Tensor,
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Optional[Tensor],
    bias_hh: Optional[Tensor],
    h0: Tensor,
    *,
    lengths: Optional[Tensor] = None,
    backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    """One torch.nn.GRU layer (gates r, z, n) over a sequence, time-major: rnn("gru", ...).

    input: (T, B, I); weight_ih: (3S, I); weight_hh: (3S, S); biases: (3S,) or None;
    h0: (B, S). Returns (output (T, B, S), h_n)."""
    output, (h_n,) = rnn("gru", input, weight_ih, weight_hh, bias_ih, bias_hh, (h0,), lengths=lengths, backend=backend)
    return output, h_n
