"""Custom autograd Functions: gradients, double backward and the ctx rules each one shows."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck, gradgradcheck

from lltm.extending import (
    CubeFunction,
    CubeFunctionNaive,
    InplaceReLUFunction,
    LinearFunction,
    MulConstant,
    SigmoidFunction,
    SoftplusFunction,
    SoftsignFunction,
    SortFunction,
    cube,
    linear,
    mul_constant,
)

f64 = torch.float64


def rand(*shape, requires_grad=True):
    return torch.randn(*shape, dtype=f64, requires_grad=requires_grad)


def away_from_zero(*shape):
    # Kinks at 0 (relu, |x|) would break finite differences.
    x = torch.rand(*shape, dtype=f64) + 0.1
    sign = torch.where(torch.rand(*shape) < 0.5, -1.0, 1.0).to(f64)
    return (x * sign).requires_grad_()


# name -> (function, inputs factory)
GRADCHECK_CASES = {
    "linear-bias": (LinearFunction.apply, lambda: (rand(5, 4), rand(3, 4), rand(3))),
    "linear-no-bias": (LinearFunction.apply, lambda: (rand(5, 4), rand(3, 4), None)),
    "linear-3d-input": (linear, lambda: (rand(2, 5, 4), rand(3, 4), rand(3))),
    "mul-constant": (lambda x: MulConstant.apply(x, 3.5), lambda: (rand(4, 3),)),
    "cube": (cube, lambda: (rand(6),)),
    "cube-both-outputs": (CubeFunction.apply, lambda: (rand(6),)),
    "cube-naive": (CubeFunctionNaive.apply, lambda: (rand(6),)),
    "sigmoid": (SigmoidFunction.apply, lambda: (rand(3, 4),)),
    "softplus-once-differentiable": (SoftplusFunction.apply, lambda: (rand(3, 4),)),
    # gradcheck's inputs are leaves: modify a copy in place.
    "inplace-relu": (lambda x: InplaceReLUFunction.apply(x.clone()), lambda: (away_from_zero(3, 4),)),
    "sort-values": (lambda x: SortFunction.apply(x, 1)[0], lambda: (rand(3, 5),)),
    "sort-descending-dim0": (lambda x: SortFunction.apply(x, 0, True)[0], lambda: (rand(4, 3),)),
    "softsign-setup-context": (SoftsignFunction.apply, lambda: (away_from_zero(3, 4),)),
}


@pytest.mark.parametrize("case", list(GRADCHECK_CASES), ids=list(GRADCHECK_CASES))
def test_gradcheck_float64(case):
    fn, make_inputs = GRADCHECK_CASES[case]
    assert gradcheck(fn, make_inputs())


GRADGRADCHECK_CASES = ["linear-bias", "linear-no-bias", "linear-3d-input", "cube", "cube-both-outputs", "sigmoid"]


@pytest.mark.parametrize("case", GRADGRADCHECK_CASES, ids=GRADGRADCHECK_CASES)
def test_gradgradcheck_float64(case):
    fn, make_inputs = GRADCHECK_CASES[case]
    assert gradgradcheck(fn, make_inputs())


# ---------------------------------------------------------------------------
# Linear
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_linear_matches_functional_linear(with_bias):
    x, w = rand(5, 4), rand(3, 4)
    b = rand(3) if with_bias else None
    ours = linear(x, w, bias=b)
    ref = F.linear(x, w, b)
    torch.testing.assert_close(ours, ref)
    grad = torch.randn_like(ref)
    leaves = [x, w] + ([b] if with_bias else [])
    torch.testing.assert_close(torch.autograd.grad(ours, leaves, grad), torch.autograd.grad(ref, leaves, grad))


def test_linear_default_bias_is_none():
    x, w = rand(2, 4), rand(3, 4)
    torch.testing.assert_close(linear(x, w), x @ w.t())


def test_linear_backward_computes_only_needed_grads():
    x, w, b = rand(5, 4), rand(3, 4), rand(3)
    grad_out = torch.randn(5, 3, dtype=f64)
    ctx = SimpleNamespace(saved_tensors=(x, w, b), needs_input_grad=(True, False, False))
    grad_x, grad_w, grad_b = LinearFunction.backward(ctx, grad_out)
    torch.testing.assert_close(grad_x, grad_out @ w)
    assert grad_w is None and grad_b is None
    ctx.needs_input_grad = (False, True, True)
    grad_x, grad_w, grad_b = LinearFunction.backward(ctx, grad_out)
    assert grad_x is None
    torch.testing.assert_close(grad_w, grad_out.t() @ x)
    torch.testing.assert_close(grad_b, grad_out.sum(0))


def test_linear_frozen_weight_gets_no_grad():
    x, w = rand(5, 4), rand(3, 4, requires_grad=False)
    linear(x, w).sum().backward()
    assert w.grad is None
    torch.testing.assert_close(x.grad, torch.ones(5, 3, dtype=f64) @ w)


@pytest.mark.parametrize(
    "x_shape, w_shape, b_shape, match",
    [
        ((5, 4), (3, 5), None, r"input must have shape \(\*, in_features=5\)"),
        ((5, 4), (3, 4, 1), None, r"weight must be 2-D"),
        ((5, 4), (3, 4), (4,), r"bias must have shape \(out_features,\) = \(3,\)"),
    ],
    ids=["in-features-mismatch", "weight-3d", "bias-wrong-size"],
)
def test_linear_bad_shapes_raise(x_shape, w_shape, b_shape, match):
    b = torch.randn(b_shape) if b_shape else None
    with pytest.raises(ValueError, match=match):
        linear(torch.randn(x_shape), torch.randn(w_shape), b)


# ---------------------------------------------------------------------------
# MulConstant
# ---------------------------------------------------------------------------


class _DropGrad(torch.autograd.Function):
    """Identity whose backward sends no gradient (None) upstream."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return None


def test_mul_constant_forward_and_grad():
    x = rand(4, 3)
    y = mul_constant(x, 2.5)
    torch.testing.assert_close(y, x * 2.5)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.5))


def test_mul_constant_backward_receives_none_when_grads_not_materialized():
    calls = []
    original = MulConstant.backward

    def spy(ctx, grad_output):
        calls.append(grad_output)
        return original(ctx, grad_output)

    x = rand(4)
    MulConstant.backward = staticmethod(spy)
    try:
        _DropGrad.apply(MulConstant.apply(x, 3.0)).sum().backward()
    finally:
        MulConstant.backward = staticmethod(original)
    assert calls == [None]  # not a materialised tensor of zeros
    assert x.grad is None


def test_mul_constant_rejects_tensor_constant():
    with pytest.raises(TypeError, match="constant must be a Python number"):
        mul_constant(torch.ones(2), torch.tensor(2.0))


# ---------------------------------------------------------------------------
# Cube and its naive counter-example
# ---------------------------------------------------------------------------


def test_cube_second_derivative_is_6x():
    x = rand(5)
    (g,) = torch.autograd.grad(cube(x).sum(), x, create_graph=True)
    torch.testing.assert_close(g, 3 * x**2)
    (gg,) = torch.autograd.grad(g.sum(), x)
    torch.testing.assert_close(gg, 6 * x)


def test_naive_cube_first_derivative_right_second_wrong():
    x = rand(5)
    (g,) = torch.autograd.grad(CubeFunctionNaive.apply(x).sum(), x, create_graph=True)
    torch.testing.assert_close(g, 3 * x**2)
    if not g.requires_grad:  # saved intermediate has no history: second derivative is zero
        gg = torch.zeros_like(x)
    else:
        (gg,) = torch.autograd.grad(g.sum(), x, allow_unused=True)
        gg = torch.zeros_like(x) if gg is None else gg
    assert not torch.allclose(gg, 6 * x)


def test_naive_cube_fails_gradgradcheck():
    assert not gradgradcheck(CubeFunctionNaive.apply, (rand(5),), raise_exception=False)


# ---------------------------------------------------------------------------
# Sigmoid, once_differentiable
# ---------------------------------------------------------------------------


def test_sigmoid_matches_and_saves_its_output():
    x = rand(3, 4)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = SigmoidFunction.apply(x)
    torch.testing.assert_close(y, torch.sigmoid(x))
    assert len(saved) == 1 and saved[0].data_ptr() == y.data_ptr()


def test_once_differentiable_double_backward_raises():
    x = rand(4)
    y = SoftplusFunction.apply(x)
    torch.testing.assert_close(y, F.softplus(x))
    # Loss y**2: the gradient reaching backward depends on x, so it requires grad.
    (g,) = torch.autograd.grad((y * y).sum(), x, create_graph=True)
    torch.testing.assert_close(g, 2 * y * torch.sigmoid(x))
    with pytest.raises(RuntimeError, match="differentiate twice a function that was marked with @once_differentiable"):
        g.sum().backward()


def test_once_differentiable_never_passes_gradgradcheck():
    assert not gradgradcheck(SoftplusFunction.apply, (rand(4),), raise_exception=False)


# ---------------------------------------------------------------------------
# mark_dirty, mark_non_differentiable
# ---------------------------------------------------------------------------


def test_inplace_relu_modifies_and_returns_its_input():
    base = rand(6)
    x = base * 1  # non-leaf: may be modified in place
    version = x._version
    y = InplaceReLUFunction.apply(x)
    assert y is x and x._version > version
    torch.testing.assert_close(y, base.clamp(min=0))
    assert y.grad_fn is not None and "InplaceReLUFunction" in type(y.grad_fn).__name__
    y.sum().backward()
    torch.testing.assert_close(base.grad, (base > 0).to(f64))


def test_inplace_relu_on_leaf_requiring_grad_raises():
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        InplaceReLUFunction.apply(rand(3))


def test_inplace_relu_invalidates_earlier_saved_value():
    base = rand(4)
    x = base * 1
    squared = x * x  # saves x for backward
    InplaceReLUFunction.apply(x)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        squared.sum().backward()


def test_sort_indices_are_non_differentiable_integers():
    x = rand(3, 5)
    values, indices = SortFunction.apply(x, 1)
    ref_values, ref_indices = torch.sort(x, dim=1)
    torch.testing.assert_close(values, ref_values)
    assert torch.equal(indices, ref_indices)
    assert indices.dtype == torch.int64 and not indices.requires_grad
    assert values.requires_grad
    grad = torch.randn_like(values)
    (gx,) = torch.autograd.grad(values, x, grad)
    (gref,) = torch.autograd.grad(ref_values, x, grad)
    torch.testing.assert_close(gx, gref)


# ---------------------------------------------------------------------------
# separate forward + setup_context, vmap
# ---------------------------------------------------------------------------


def test_softsign_matches_functional():
    x = rand(10)
    torch.testing.assert_close(SoftsignFunction.apply(x), F.softsign(x))


def test_softsign_vmap_matches_loop():
    batch = torch.randn(6, 4, dtype=f64)
    batched = torch.func.vmap(SoftsignFunction.apply)(batch)
    looped = torch.stack([SoftsignFunction.apply(row) for row in batch])
    torch.testing.assert_close(batched, looped)


def test_softsign_per_sample_grad_with_vmap_and_grad():
    batch = torch.randn(6, 4, dtype=f64)
    per_sample = torch.func.vmap(torch.func.grad(lambda x: SoftsignFunction.apply(x).sum()))(batch)
    torch.testing.assert_close(per_sample, 1 / (1 + batch.abs()) ** 2)


def test_combined_forward_function_refuses_vmap():
    # Control: the combined forward(ctx, ...) form cannot be vmapped.
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.vmap(SigmoidFunction.apply)(torch.randn(3, 2))
