"""One output dtype rule for every backend (lltm/functional.py): outside
autocast the outputs have the arguments' dtype; inside torch.autocast for
the input's device the float32 / float16 / bfloat16 arguments run in the
autocast dtype and the outputs come back in it; float64 is left alone."""

from __future__ import annotations

import pytest
import torch

import lltm
from lltm import functional
from tests._helpers import backend_params, rel_err

BACKENDS = backend_params(devices=["cpu"])
T, B, I, S = 4, 3, 5, 8


def _args(dtype=torch.float32, grad=False):
    gen = torch.Generator().manual_seed(0)

    def rand(*shape, scale=1.0):
        t = (torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1) * scale
        return t.to(dtype).requires_grad_(grad)

    return rand(T, B, I), rand(3 * S, S + I, scale=S**-0.5), rand(3 * S), rand(B, S), rand(B, S)


def _cell(args, backend):
    x, W, b, h, c = args
    return functional.lltm_cell(x[0], W, b, h, c, backend=backend)


def _layer(args, backend):
    out, (h_n, c_n) = functional.lltm(*args, lengths=torch.tensor([4, 1, 2]), backend=backend)
    return out, h_n, c_n


@pytest.mark.parametrize("device,backend", BACKENDS)
@pytest.mark.parametrize("run", [_cell, _layer], ids=["cell", "layer"])
def test_outputs_in_autocast_dtype(device, backend, run):
    args = _args(grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outs = run(args, backend)
    assert [o.dtype for o in outs] == [torch.bfloat16] * len(outs)
    sum(o.float().sum() for o in outs).backward()
    # float32 leaves get float32 gradients (autograd through the cast)
    assert [a.grad.dtype for a in args if a.grad is not None] == [torch.float32] * 5
    expected = run([a.detach().double() for a in args], "python")
    for o, e in zip(outs, expected):
        assert rel_err(o, e) <= 2e-2


@pytest.mark.parametrize("device,backend", BACKENDS)
@pytest.mark.parametrize("run", [_cell, _layer], ids=["cell", "layer"])
def test_bfloat16_activations_with_float32_weights(device, backend, run):
    """The activations of a layer run under autocast (bfloat16) into an
    LLTM with float32 parameters: every backend takes them."""
    x, W, b, h, c = _args()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outs = run([x.bfloat16(), W, b, h, c], backend)
    assert {o.dtype for o in outs} == {torch.bfloat16}


@pytest.mark.parametrize("device,backend", BACKENDS)
@pytest.mark.parametrize("run", [_cell, _layer], ids=["cell", "layer"])
def test_float64_left_alone(device, backend, run):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outs = run(_args(torch.float64), backend)
    assert {o.dtype for o in outs} == {torch.float64}


@pytest.mark.parametrize("device,backend", BACKENDS)
@pytest.mark.parametrize("run", [_cell, _layer], ids=["cell", "layer"])
def test_outside_autocast_arguments_dtype(device, backend, run):
    outs = run(_args(torch.float32), backend)
    assert {o.dtype for o in outs} == {torch.float32}


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_autocast_for_another_device_changes_nothing(device, backend):
    with torch.autocast("cuda", dtype=torch.float16, enabled=torch.cuda.is_available()):
        outs = _layer(_args(), backend)
    assert {o.dtype for o in outs} == {torch.float32}


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_modules_follow_the_rule(device, backend):
    torch.manual_seed(0)
    layer = lltm.LLTM(I, S, num_layers=2, backend=backend)
    cell = lltm.LLTMCell(I, S, backend=backend)
    x = torch.randn(T, B, I)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, (h_n, c_n) = layer(x)
        h, c = cell(x[0])
    assert {t.dtype for t in (out, h_n, c_n, h, c)} == {torch.bfloat16}


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_rule_holds_under_vmap(device, backend):
    """Under torch.func transforms the compiled backends run through a Python
    autograd Function: the same rule."""
    args = _args()
    xs = torch.stack([args[0], -args[0]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = torch.vmap(lambda x: _layer([x, *args[1:]], backend)[0])(xs)
    assert out.dtype == torch.bfloat16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("device,backend", backend_params(devices=["cuda"]))
@pytest.mark.parametrize("run", [_cell, _layer], ids=["cell", "layer"])
def test_outputs_in_autocast_dtype_cuda(device, backend, run, dtype):
    args = [a.cuda() for a in _args()]
    with torch.autocast("cuda", dtype=dtype):
        outs = run(args, backend)
    assert {o.dtype for o in outs} == {dtype}
