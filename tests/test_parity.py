"""Every backend against the float64 reference: forward outputs and all five
gradients, over device x backend x dtype x shape."""

from __future__ import annotations

import pytest
import torch

from lltm import functional
from lltm.reference import lltm_cell_reference

from ._helpers import assert_matches, backend_params, leaves, make_inputs

# (batch, input_features, state_size): tutorial size, batch 1, odd sizes,
# batch 0 and a state size that is not a multiple of a vector width.
SHAPES = [(16, 32, 128), (1, 5, 3), (7, 13, 33), (0, 4, 6), (3, 1, 1)]


def _run(fn, args, grad_h, grad_cell):
    new_h, new_cell = fn(*args)
    wanted = [a for a in leaves(args) if a.requires_grad]
    grads = torch.autograd.grad((new_h, new_cell), wanted, (grad_h, grad_cell), allow_unused=False)
    return (new_h, new_cell), grads


def _reference(args, grad_h, grad_cell):
    ref_args = [None if a is None else a.detach().double().cpu().requires_grad_() for a in args]
    return _run(lltm_cell_reference, ref_args, grad_h.double().cpu(), grad_cell.double().cpu())


def _assert_close(got, want, what, contiguous=False):
    """The suite's one rule (tests/_helpers.assert_matches), compared on the
    CPU in float64 whatever device either side is on."""
    got = list(got)
    # The compiled ops promise contiguous outputs on every device.
    for i, g in enumerate(got):
        assert not contiguous or g.is_contiguous(), f"{what}[{i}] is not contiguous"
    assert_matches(got, list(want), got[0].dtype, names=[f"{what}[{i}]" for i in range(len(got))])


@pytest.mark.parametrize("device,backend", backend_params())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_matches_reference(device, backend, dtype, shape, bias):
    args = make_inputs(*shape, device=device, dtype=dtype, seed=hash(shape) % 1000, bias=bias)
    B, _, S = shape
    gen = torch.Generator().manual_seed(1)
    grad_h = torch.randn(B, S, generator=gen).to(device, dtype)
    grad_cell = torch.randn(B, S, generator=gen).to(device, dtype)
    out, grads = _run(lambda *a: functional.lltm_cell(*a, backend=backend), args, grad_h, grad_cell)
    ref_out, ref_grads = _reference(args, grad_h, grad_cell)
    _assert_close(out, ref_out, "outputs", contiguous=True)
    _assert_close(grads, ref_grads, "grads", contiguous=backend != "python")
    assert out[0].dtype == dtype and out[0].device.type == device


@pytest.mark.parametrize("device,backend", backend_params())
def test_non_contiguous_inputs(device, backend):
    """Transposed weights, column-sliced input and state, a strided bias."""
    B, I, S = 6, 9, 10
    x, W, b, h, c = make_inputs(B, I, S, device=device, dtype=torch.float64, requires_grad=False)
    wide = torch.randn(B, 2 * I, dtype=torch.float64, device=device)
    x_nc = wide[:, ::2].requires_grad_()  # (B, I), column stride 2
    W_nc = W.t().contiguous().t().requires_grad_()  # same values, column-major
    b_nc = torch.randn(2 * 3 * S, dtype=torch.float64, device=device)[::2].requires_grad_()
    h_nc = torch.randn(S, B, dtype=torch.float64, device=device).t().requires_grad_()
    c_nc = torch.randn(B, S + 3, dtype=torch.float64, device=device)[:, 3:].requires_grad_()
    args = (x_nc, W_nc, b_nc, h_nc, c_nc)
    assert not any(a.is_contiguous() for a in args)
    g = (torch.randn(B, S, dtype=torch.float64, device=device), torch.randn(B, S, dtype=torch.float64, device=device))
    out, grads = _run(lambda *a: functional.lltm_cell(*a, backend=backend), args, *g)
    ref_out, ref_grads = _reference(args, *g)
    _assert_close(out, ref_out, "outputs")
    _assert_close(grads, ref_grads, "grads")


@pytest.mark.parametrize("device,backend", backend_params())
def test_only_new_h_used(device, backend):
    """new_cell unused: its gradient is undefined and must count as zero."""
    args = make_inputs(4, 5, 6, device=device, dtype=torch.float64)
    new_h, _ = functional.lltm_cell(*args, backend=backend)
    grads = torch.autograd.grad(new_h.sum(), args)
    ref_args = [a.detach().clone().requires_grad_() for a in args]
    ref_h, _ = lltm_cell_reference(*ref_args)
    ref_grads = torch.autograd.grad(ref_h.sum(), ref_args)
    _assert_close(grads, ref_grads, "grads")


@pytest.mark.parametrize("device,backend", backend_params())
def test_partial_requires_grad(device, backend):
    """Only the parameters need gradients (the usual first step of a
    sequence): input and state get none, the parameter gradients are right."""
    x, W, b, h, c = make_inputs(5, 4, 3, device=device, dtype=torch.float64)
    x, h, c = (t.detach() for t in (x, h, c))
    new_h, new_cell = functional.lltm_cell(x, W, b, h, c, backend=backend)
    gW, gb = torch.autograd.grad((new_h.sum() + 2 * new_cell.sum()), (W, b))
    Wr, br = W.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    rh, rc = lltm_cell_reference(x, Wr, br, h, c)
    rW, rb = torch.autograd.grad(rh.sum() + 2 * rc.sum(), (Wr, br))
    _assert_close((gW, gb), (rW, rb), "grads")


@pytest.mark.parametrize("device,backend", backend_params())
def test_sequence_matches_cell_loop(device, backend):
    """functional.lltm over T steps equals T reference steps, and T = 0
    returns the initial state."""
    T, B, I, S = 5, 3, 4, 6
    x, W, b, h0, c0 = make_inputs(B, I, S, device=device, dtype=torch.float64)
    seq = torch.randn(T, B, I, dtype=torch.float64, device=device, requires_grad=True)
    out, (h_n, c_n) = functional.lltm(seq, W, b, h0, c0, backend=backend)
    h, c = h0, c0
    ref = []
    for t in range(T):
        h, c = lltm_cell_reference(seq[t], W, b, h, c)
        ref.append(h)
    _assert_close((out, h_n, c_n), (torch.stack(ref), h, c), "sequence")
    empty, (h_e, c_e) = functional.lltm(seq[:0], W, b, h0, c0, backend=backend)
    assert empty.shape == (0, B, S) and torch.equal(h_e, h0) and torch.equal(c_e, c0)


@pytest.mark.parametrize("device,backend", backend_params())
@pytest.mark.parametrize("which", ["input", "weights", "bias", "old_h", "old_cell", "input+old_h"])
def test_one_argument_needs_grad(device, backend, which):
    """Backward computes only what autograd asks for (the compiled ops skip
    the other GEMMs); each gradient asked for alone equals the reference's."""
    names = ["input", "weights", "bias", "old_h", "old_cell"]
    B, I, S = 6, 5, 7
    args = make_inputs(B, I, S, device=device, dtype=torch.float64, requires_grad=False)
    wanted = which.split("+")
    args = [a.requires_grad_() if n in wanted else a for n, a in zip(names, args)]
    gen = torch.Generator().manual_seed(2)
    grad_h = torch.randn(B, S, generator=gen, dtype=torch.float64).to(device)
    grad_cell = torch.randn(B, S, generator=gen, dtype=torch.float64).to(device)
    out, grads = _run(lambda *a: functional.lltm_cell(*a, backend=backend), args, grad_h, grad_cell)
    ref_args = [a.detach().cpu().requires_grad_(a.requires_grad) for a in args]
    ref_out, ref_grads = _run(lltm_cell_reference, ref_args, grad_h.cpu(), grad_cell.cpu())
    assert len(grads) == len(wanted)
    _assert_close(out, ref_out, "outputs")
    _assert_close(grads, ref_grads, f"grad of {which}")
