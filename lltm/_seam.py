"""Fake kernels and autograd formulas of the seam's operators,
lltm::<backend>_<cell>_seq_forward / _seq_backward (lltm/csrc/rnn.h), for
every compiled backend and every cell of lltm.cells.SEAM_OPS: written once,
with the cell as a parameter. (LLTM's own operators keep theirs: _meta.py and
csrc/autograd_*.cpp.)

Autograd: forward saves the input, weights, initial states, output and the
cell's saved values; backward is the matching _seq_backward operator, asked
only for the gradients autograd needs. Its gradients are not differentiable
again (double backward raises an error that names backend="python"). The
compiled library registers this formula in C++ (csrc/autograd_rnn.h), which
costs less host time per call; the Python one here serves an operator that
has none.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from lltm import cells
from lltm._checks import check_rnn_args


def op_name(backend: str, cell: cells.Cell, what: str) -> str:
    return f"lltm::{backend}_{cell.name}_seq_{what}"


def _forward_fake(op: str, cell: cells.Cell):
    def fake(
        input: Tensor,
        weight_ih: Tensor,
        weight_hh: Tensor,
        bias_ih: Optional[Tensor],
        bias_hh: Optional[Tensor],
        state: list[Tensor],
        lengths: Optional[Tensor],
    ) -> tuple[Tensor, list[Tensor], Tensor]:
        steps, batch, _, hidden = check_rnn_args(
            op, cell, input, weight_ih, weight_hh, bias_ih, bias_hh, state, lengths
        )
        output = input.new_empty((steps, batch, hidden))
        state_n = [input.new_empty((batch, hidden)) for _ in state]
        return output, state_n, input.new_empty((steps, batch, cell.saved * hidden))

    return fake


def _backward_fake(op: str, cell: cells.Cell):
    def fake(
        grad_output: Optional[Tensor],
        grad_state_n: list[Optional[Tensor]],
        input: Tensor,
        weight_ih: Tensor,
        weight_hh: Tensor,
        state: list[Tensor],
        output: Tensor,
        saved: Tensor,
        lengths: Optional[Tensor],
        output_mask: list[bool],
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, list[Tensor]]:
        rows = (weight_hh.shape[0],)
        shapes = (input.shape, weight_ih.shape, weight_hh.shape, rows, rows)
        # an output not asked for is an empty (0,) placeholder; state gradients an empty list
        grads = tuple(input.new_empty(s if asked else (0,)) for s, asked in zip(shapes, output_mask))
        states = [input.new_empty(s.shape) for s in state] if output_mask[5] else []
        return (*grads, states)

    return fake


def _setup_context(ctx, inputs, output) -> None:
    input, weight_ih, weight_hh, bias_ih, bias_hh, state, lengths = inputs
    out, _, saved = output
    ctx.save_for_backward(input, weight_ih, weight_hh, out, saved, lengths, *state)
    ctx.has_bias = (bias_ih is not None, bias_hh is not None)
    ctx.mark_non_differentiable(saved)
    # undefined output gradients (a loss on the output alone) stay None: the op skips their terms
    ctx.set_materialize_grads(False)


def _autograd_backward(backend: str, cell: cells.Cell):
    backward_op = getattr(torch.ops.lltm, f"{backend}_{cell.name}_seq_backward").default

    def backward(ctx, grad_output, grad_state_n, _grad_saved):
        input, weight_ih, weight_hh, output, saved, lengths, *state = ctx.saved_tensors
        needs = ctx.needs_input_grad
        mask = [
            needs[0],
            needs[1],
            needs[2],
            ctx.has_bias[0] and needs[3],
            ctx.has_bias[1] and needs[4],
            bool(needs[5]),
        ]
        grad_state_n = list(grad_state_n) if grad_state_n is not None else [None] * len(state)
        with torch.no_grad():
            gi, gwi, gwh, gbi, gbh, gs = backward_op(
                grad_output, grad_state_n, input, weight_ih, weight_hh, state, output, saved, lengths, mask
            )
        grads = [g if m else None for g, m in zip((gi, gwi, gwh, gbi, gbh), mask)] + (list(gs) if mask[5] else [])
        if torch.is_grad_enabled():  # create_graph=True
            grads = _once_differentiable(grads, backend)
        return (*grads[:5], grads[5:] if mask[5] else None, None)

    return backward


def _once_differentiable(grads: list[Optional[Tensor]], backend: str) -> list[Optional[Tensor]]:
    """The gradients under create_graph=True: usable, and differentiating them raises an error that
    says so and names the backend that can (python), like the LLTM operators' C++ autograd."""
    msg = (
        f"lltm: backend {backend!r} does not support double backward (differentiating its gradients, "
        "e.g. create_graph=True then backward again, or a Hessian); use backend='python' for that"
    )
    present = [g.detach().requires_grad_() for g in grads if g is not None]
    out = torch._C._functions.DelayedError(msg, len(present))(*present) if present else ()
    wrapped = iter((out,) if isinstance(out, Tensor) else out)
    return [next(wrapped) if g is not None else None for g in grads]


def register_cell(cell: cells.Cell, backends: tuple[str, ...]) -> None:
    """Fake kernels and autograd of `cell`'s operators for `backends`."""
    for backend in backends:
        forward = op_name(backend, cell, "forward")
        torch.library.register_fake(forward)(_forward_fake(forward, cell))
        backward = op_name(backend, cell, "backward")
        torch.library.register_fake(backward)(_backward_fake(backward, cell))
        if not torch._C._dispatch_has_kernel_for_dispatch_key(forward, "Autograd"):
            torch.library.register_autograd(forward, _autograd_backward(backend, cell), setup_context=_setup_context)


def register(backends: tuple[str, ...]) -> None:
    """Fake kernels and autograd of every built-in seam operator of `backends` (the compiled ones)."""
    for cell in cells.SEAM_OPS:
        register_cell(cell, backends)
