"""lltm called the way extension-cpp's LLTM tests call their operator: float64,
batch 3, 17 input features, state 5, bias of shape (1, 3 * state_size).

Outputs and every gradient against the reference (the bias gradient in the
caller's (1, 3S) shape), gradcheck, and a state_dict of extension-cpp's LLTM
module (bias (1, 3S)) loaded into lltm.LLTMCell.
"""

from __future__ import annotations

import pytest
import torch

import lltm
from lltm import functional
from lltm.reference import lltm_cell_reference

from ._helpers import backend_params

BATCH, FEATURES, STATE = 3, 17, 5


def _tutorial_args(device: str, seed: int = 0) -> list[torch.Tensor]:
    """Fresh random arguments in extension-cpp's test layout (float64, bias (1, 3S))."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        t = torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1
        return t.to(device).requires_grad_()

    x = rand(BATCH, FEATURES)
    W = rand(3 * STATE, FEATURES + STATE)
    b = rand(1, 3 * STATE)
    h = rand(BATCH, STATE)
    c = rand(BATCH, STATE)
    return [x, W, b, h, c]


@pytest.mark.parametrize("device,backend", backend_params())
def test_bias_1x3s_matches_reference(device, backend):
    args = _tutorial_args(device)
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(BATCH, STATE, generator=gen, dtype=torch.float64).to(device) for _ in range(2)]
    out = functional.lltm_cell(*args, backend=backend)
    got = torch.autograd.grad(out, args, grads)
    ref_args = [a.detach().cpu().requires_grad_() for a in args]
    ref_out = lltm_cell_reference(*ref_args[:2], ref_args[2].view(-1), *ref_args[3:])
    want = torch.autograd.grad(ref_out, ref_args, [g.cpu() for g in grads])
    for o, r in zip(out, ref_out):
        torch.testing.assert_close(o.cpu(), r, rtol=1e-10, atol=1e-10)
    assert got[2].shape == (1, 3 * STATE), "the bias gradient keeps the caller's shape"
    for name, g, r in zip(("input", "weights", "bias", "old_h", "old_cell"), got, want):
        torch.testing.assert_close(g.cpu(), r, rtol=1e-10, atol=1e-10, msg=lambda m, name=name: f"grad_{name}: {m}")


@pytest.mark.parametrize("device,backend", backend_params())
def test_bias_1x3s_gradcheck(device, backend):
    args = tuple(_tutorial_args(device, seed=2))
    assert torch.autograd.gradcheck(lambda *a: functional.lltm_cell(*a, backend=backend), args)


@pytest.mark.parametrize("device,backend", backend_params())
def test_sequence_bias_1x3s(device, backend):
    """functional.lltm takes the same bias layout, gradient in the same shape."""
    T = 4
    x, W, b, h, c = _tutorial_args(device, seed=3)
    seq = torch.randn(T, BATCH, FEATURES, dtype=torch.float64, device=device, requires_grad=True)
    out, (h_n, c_n) = functional.lltm(seq, W, b, h, c, backend=backend)
    flat = b.detach().view(-1).requires_grad_()
    ref, (ref_h, ref_c) = functional.lltm(seq, W, flat, h, c, backend="python")
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    (grad_b,) = torch.autograd.grad(out.sum() + c_n.sum(), b)
    (want,) = torch.autograd.grad(ref.sum() + ref_c.sum(), flat)
    assert grad_b.shape == (1, 3 * STATE)
    torch.testing.assert_close(grad_b.view(-1), want, rtol=1e-10, atol=1e-10)


def test_state_dict_of_extension_cpp_module_loads():
    """extension-cpp's LLTM module: parameters `weights` (3S, I + S) and
    `bias` (1, 3S); its state_dict loads into LLTMCell, results unchanged."""
    torch.manual_seed(4)
    theirs = {"weights": torch.randn(3 * STATE, FEATURES + STATE), "bias": torch.randn(1, 3 * STATE)}
    cell = lltm.LLTMCell(FEATURES, STATE, backend="python")
    cell.load_state_dict(theirs)
    assert cell.bias.shape == (3 * STATE,)
    torch.testing.assert_close(cell.bias.detach(), theirs["bias"].view(-1))
    x, h, c = torch.randn(BATCH, FEATURES), torch.randn(BATCH, STATE), torch.randn(BATCH, STATE)
    with torch.no_grad():
        got = cell(x, (h, c))
    want = lltm_cell_reference(x, theirs["weights"], theirs["bias"].view(-1), h, c)
    torch.testing.assert_close(got, want)
    cell.load_state_dict(cell.state_dict())  # its own (3S,) layout still loads
