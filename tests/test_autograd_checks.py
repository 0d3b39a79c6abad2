"""float64 gradcheck of every backend and torch.library.opcheck of every op."""

from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

from lltm import functional

from ._helpers import COMPILED, DEVICES, backend_params, make_inputs


@pytest.mark.parametrize("device,backend", backend_params())
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_gradcheck(device, backend, bias):
    args = make_inputs(3, 4, 5, device=device, dtype=torch.float64, bias=bias)
    if not bias:
        x, W, _, h, c = args
        assert torch.autograd.gradcheck(
            lambda x, W, h, c: functional.lltm_cell(x, W, None, h, c, backend=backend), (x, W, h, c)
        )
    else:
        assert torch.autograd.gradcheck(lambda *a: functional.lltm_cell(*a, backend=backend), args)


def _forward_op(backend):
    return getattr(torch.ops.lltm, f"{backend}_cell_forward").default


def _backward_op(backend):
    return getattr(torch.ops.lltm, f"{backend}_cell_backward").default


OPCHECK_SHAPES = [(4, 3, 5), (0, 2, 3), (1, 1, 1)]


@pytest.mark.parametrize("device,backend", backend_params(backends=COMPILED))
@pytest.mark.parametrize("shape", OPCHECK_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_opcheck_forward(device, backend, shape, bias, dtype):
    args = make_inputs(*shape, device=device, dtype=dtype, bias=bias)
    opcheck(_forward_op(backend), args)


@pytest.mark.parametrize("device,backend", backend_params(backends=COMPILED))
@pytest.mark.parametrize("shape", OPCHECK_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize(
    "mask",
    [[True] * 5, [False, True, True, False, True], [True, False, False, True, False]],
    ids=["all", "params", "inputs"],
)
def test_opcheck_backward(device, backend, shape, mask):
    x, W, b, h, c = make_inputs(*shape, device=device, dtype=torch.float64, requires_grad=False)
    new_h, new_cell, gates = _forward_op(backend)(x, W, b, h, c)
    B, _, S = shape
    gh, gc = (
        torch.randn(B, S, dtype=torch.float64, device=device),
        torch.randn(B, S, dtype=torch.float64, device=device),
    )
    opcheck(_backward_op(backend), (gh, gc, new_cell, gates, x, W, h, mask))
    out = _backward_op(backend)(gh, gc, new_cell, gates, x, W, h, mask)
    for t, asked in zip(out, mask):
        assert (t.numel() == 0 and t.shape == (0,)) or asked


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", COMPILED)
def test_ops_have_same_output_layout_as_fake(device, backend):
    """The fake kernel's shapes and strides are those of the real one."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = make_inputs(5, 3, 4, device=device, requires_grad=False)
    if not __import__("lltm").backends(device)[backend]:
        pytest.skip(f"{backend} not available on {device}")
    real = _forward_op(backend)(*args)
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) for a in args]
        fake = _forward_op(backend)(*fake_args)
    for r, f in zip(real, fake):
        assert r.shape == f.shape and r.stride() == f.stride() and r.dtype == f.dtype
