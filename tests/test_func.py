"""torch.func over every backend (CPU, float64): per-sample gradients
(vmap(grad) through torch.func.functional_call) equal a loop over the
samples; grad, vjp and jacrev equal backend="python"'s; the transforms the
compiled operators cannot serve raise an error that names backend="python"."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.func import functional_call, grad, jacrev, vjp, vmap

import lltm
from lltm import _functorch, functional
from tests._helpers import COMPILED, backend_params

T, N, I, S = 4, 5, 3, 6
DT = torch.float64
BACKENDS = backend_params(devices=["cpu"])


def _params(module):
    return {k: v.detach() for k, v in module.named_parameters()}


def _per_sample_loop(module, params, xs, loss):
    """Per-sample gradients the plain way: one forward and backward per sample."""
    out = {k: [] for k in params}
    for k in range(xs.shape[0]):
        p = {name: v.clone().requires_grad_(True) for name, v in params.items()}
        grads = torch.autograd.grad(loss(p, xs[k]), list(p.values()))
        for name, g in zip(p, grads):
            out[name].append(g)
    return {k: torch.stack(v) for k, v in out.items()}


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_per_sample_gradients_layer(device, backend):
    torch.manual_seed(0)
    model = lltm.LLTM(I, S, num_layers=2, backend=backend, dtype=DT)
    xs = torch.randn(N, T, I, dtype=DT)
    targets = torch.randn(N, T, S, dtype=DT)

    def loss(params, x, target=None):
        out, (h_n, c_n) = functional_call(model, params, (x.unsqueeze(1),))
        return ((out.squeeze(1) - target) ** 2).sum() + c_n.sin().sum()

    params = _params(model)
    got = vmap(grad(loss), in_dims=(None, 0, 0))(params, xs, targets)
    expected = _per_sample_loop(model, params, torch.arange(N), lambda p, i: loss(p, xs[i], targets[i]))
    assert got.keys() == expected.keys()
    for name in got:
        torch.testing.assert_close(got[name], expected[name], msg=name)


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_per_sample_gradients_cell(device, backend):
    torch.manual_seed(0)
    cell = lltm.LLTMCell(I, S, backend=backend, dtype=DT)
    xs = torch.randn(N, I, dtype=DT)

    def loss(params, x):
        h, c = functional_call(cell, params, (x.unsqueeze(0),))
        h, c = functional_call(cell, params, (x.unsqueeze(0), (h, c)))  # two steps
        return h.sum() + (c**2).sum()

    params = _params(cell)
    got = vmap(grad(loss), in_dims=(None, 0))(params, xs)
    expected = _per_sample_loop(cell, params, xs, loss)
    for name in got:
        torch.testing.assert_close(got[name], expected[name], msg=name)


def _seq_args(seed=0, B=3):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.rand(*shape, generator=gen, dtype=DT) * 2 - 1) * scale

    return rand(T, B, I), rand(3 * S, S + I, scale=S**-0.5 * 2), rand(3 * S), rand(B, S), rand(B, S)


LENGTHS = torch.tensor([4, 0, 2])


def _layer(backend, lengths=LENGTHS):
    def f(x, W, b, h0, c0):
        out, (h_n, c_n) = functional.lltm(x, W, b, h0, c0, lengths=lengths, backend=backend)
        return out, h_n, c_n

    return f


def _cell(backend):
    def f(x, W, b, h, c):
        return functional.lltm_cell(x[0], W, b, h, c, backend=backend)

    return f


@pytest.mark.parametrize("device,backend", backend_params(devices=["cpu"], backends=COMPILED))
@pytest.mark.parametrize("make", [_layer, _cell], ids=["layer", "cell"])
def test_grad_vjp_jacrev_match_python(device, backend, make):
    args = _seq_args()
    f, ref = make(backend), make("python")
    argnums = (0, 1, 2, 3, 4)

    def scalar(fn):
        return lambda *a: sum((o * o.cos()).sum() for o in fn(*a))

    for got, expected in zip(grad(scalar(f), argnums)(*args), grad(scalar(ref), argnums)(*args)):
        torch.testing.assert_close(got, expected)

    out, pull = vjp(f, *args)
    out_ref, pull_ref = vjp(ref, *args)
    cotangents = tuple(torch.randn_like(o) for o in out)
    for got, expected in zip(out + pull(cotangents), out_ref + pull_ref(cotangents)):
        torch.testing.assert_close(got, expected)

    for got, expected in zip(jacrev(f, argnums=(0, 1))(*args), jacrev(ref, argnums=(0, 1))(*args)):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("device,backend", backend_params(devices=["cpu"], backends=COMPILED))
def test_vmap_forward_and_input_gradients(device, backend):
    """vmap alone (the vmapped batch folded into the operator's batch) and
    vmap over a gradient that needs no weight gradient (the backward folded
    too) equal backend="python"."""
    args = _seq_args()
    xs = torch.randn(N, T, 3, I, dtype=DT)
    f, ref = _layer(backend), _layer("python")
    in_dims = (0, None, None, None, None)
    for got, expected in zip(vmap(f, in_dims)(xs, *args[1:]), vmap(ref, in_dims)(xs, *args[1:])):
        torch.testing.assert_close(got, expected)

    def loss(fn):
        return lambda x, h0: sum(o.pow(2).sum() for o in fn(x, args[1], args[2], h0, args[4]))

    h0s = torch.randn(N, 3, S, dtype=DT)
    got = vmap(grad(loss(f), argnums=(0, 1)))(xs, h0s)
    expected = vmap(grad(loss(ref), argnums=(0, 1)))(xs, h0s)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("device,backend", backend_params(devices=["cpu"], backends=COMPILED))
def test_vmap_over_weights(device, backend):
    """An ensemble (vmapped weights): one operator call per member, same result as python."""
    x, W, b, h0, c0 = _seq_args()
    Ws = torch.stack([W, W * 0.5, -W])
    f, ref = _layer(backend), _layer("python")
    in_dims = (None, 0, None, None, None)
    for got, expected in zip(vmap(f, in_dims)(x, Ws, b, h0, c0), vmap(ref, in_dims)(x, Ws, b, h0, c0)):
        torch.testing.assert_close(got, expected)


def test_vmap_rule_folds_when_weights_are_shared():
    """The generic rule: a vmapped batch becomes one operator call when the
    shared arguments are not vmapped, else one call per entry."""
    calls = []

    def op(x, w):  # x: (T, B, F), batch dim 1; w: (F,), shared by the batch
        calls.append(tuple(x.shape))
        return (x * w,)

    rule = _functorch.vmap_rule(op, (1, None), (1,))
    info = SimpleNamespace(batch_size=N)
    x, w = torch.randn(N, 4, 2, 3), torch.randn(3)  # x vmapped on its dim 0: (N, T=4, B=2, F=3)
    (out,), dims = rule(info, (0, None), x, w)
    assert calls == [(4, N * 2, 3)] and dims == (1,)  # one call, batch N * B
    torch.testing.assert_close(out, (x * w).movedim(0, 1))

    calls.clear()
    ws = torch.randn(N, 3)  # the shared argument vmapped: one call per entry
    (out,), dims = rule(info, (0, 0), x, ws)
    assert calls == [(4, 2, 3)] * N and dims == (0,)
    torch.testing.assert_close(out, x * ws[:, None, None, :])


@pytest.mark.parametrize("backend", COMPILED)
def test_unsupported_transforms_name_python(backend):
    args = _seq_args()
    f = _layer(backend)

    def scalar(x):
        return f(x, *args[1:])[0].sum()

    with pytest.raises(RuntimeError, match=r"has no forward-mode derivative .* use backend='python'"):
        torch.func.jacfwd(lambda x: f(x, *args[1:])[0])(args[0])
    with pytest.raises(RuntimeError, match=r"does not support a gradient of a gradient .* use backend='python'"):
        grad(lambda x: grad(scalar)(x).sum())(args[0])
    # python supports both
    small = [a[:, :1] if a.dim() == 3 else a[:1] if a.dim() == 2 and a.shape[1] == S else a for a in args]
    hessian = torch.func.hessian(lambda x: _layer("python", None)(x, *small[1:])[0].sum())(small[0])
    assert hessian.shape == small[0].shape * 2


@pytest.mark.parametrize("backend", COMPILED)
def test_outside_transforms_the_cpp_autograd_runs(backend):
    """Without a transform, the C++ autograd node (one per layer) is used, as before."""
    x, W, b, h0, c0 = (a.requires_grad_(True) for a in _seq_args())
    out, _ = functional.lltm(x, W, b, h0, c0, backend=backend)
    assert "Python" not in type(out.grad_fn).__name__ and "CppFunction" in type(out.grad_fn).__name__


@pytest.mark.parametrize("backend", COMPILED)
def test_operators_called_directly_under_vmap(backend):
    """The vmap rules are registered on the operators themselves (lltm/_meta.py), so
    torch.vmap over torch.ops.lltm.<backend>_seq_forward works too."""
    x, W, b, h0, c0 = _seq_args()
    xs = torch.randn(N, *x.shape, dtype=DT)
    op = getattr(torch.ops.lltm, f"{backend}_seq_forward")
    got = torch.vmap(op, in_dims=(0, None, None, None, None, None))(xs, W, b, h0, c0, LENGTHS)
    for k in range(N):
        for g, e in zip(got, op(xs[k], W, b, h0, c0, LENGTHS)):
            torch.testing.assert_close(g[k], e)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", COMPILED)
def test_per_sample_gradients_cuda(backend):
    torch.manual_seed(0)
    model = lltm.LLTM(I, S, backend=backend, device="cuda", dtype=DT)
    xs = torch.randn(N, T, I, device="cuda", dtype=DT)

    def loss(params, x):
        out, _ = functional_call(model, params, (x.unsqueeze(1),))
        return out.pow(2).sum()

    params = _params(model)
    got = vmap(grad(loss), in_dims=(None, 0))(params, xs)
    expected = _per_sample_loop(model, params, xs, loss)
    for name in got:
        torch.testing.assert_close(got[name], expected[name], msg=name)
