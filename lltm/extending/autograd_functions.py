"""Custom ``torch.autograd.Function`` examples, one per technique.

A custom Function is the tool for an operation whose backward autograd
cannot derive by itself, or should not: the forward calls code autograd does
not see (NumPy, a C++/CUDA kernel), or a hand-written backward saves less
memory or time than the recorded graph would (kernel fusion).

When *not* to write one: if the operation can be written with PyTorch ops,
write a plain Python function and let autograd record it; if it holds
trainable state, write an ``nn.Module`` (see :mod:`lltm.extending.modules`);
if you only want to look at or change a gradient, register a hook.

Each class below shows one rule of the PyTorch "Extending PyTorch" notes:

==============================  ==============================================
``LinearFunction``              save inputs, use ``ctx.needs_input_grad``,
                                return ``None`` for an absent optional bias
``MulConstant``                 a non-tensor argument; ``set_materialize_grads
                                (False)`` and a ``None`` ``grad_output``
``CubeFunction``                an intermediate returned as an output so that
                                double backward is correct
``CubeFunctionNaive``           the wrong way (kept as a counter-example)
``SigmoidFunction``             save the output instead of the input
``SoftplusFunction``            ``@once_differentiable``: double backward
                                raises instead of returning wrong numbers
``InplaceReLUFunction``         an in-place forward with ``ctx.mark_dirty``
``SortFunction``                an integer output marked non-differentiable
``SoftsignFunction``            separate ``forward`` + ``setup_context``
                                (PyTorch >= 2.0) and ``torch.func.vmap``
==============================  ==============================================
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

__all__ = [
    "LinearFunction",
    "linear",
    "MulConstant",
    "mul_constant",
    "CubeFunction",
    "CubeFunctionNaive",
    "cube",
    "SigmoidFunction",
    "SoftplusFunction",
    "InplaceReLUFunction",
    "SortFunction",
    "SoftsignFunction",
]


# ---------------------------------------------------------------------------
# Linear ("DNN" layer of the notes)
# ---------------------------------------------------------------------------


class LinearFunction(torch.autograd.Function):
    """``output = input @ weight.T + bias`` with a hand-written backward.

    Shapes::

        input:  (*, in_features)
        weight: (out_features, in_features)
        bias:   (out_features,) or None
        output: (*, out_features)

    Backward computes only the gradients autograd asks for
    (``ctx.needs_input_grad``) and returns ``None`` for the rest. Only inputs
    are saved and backward is written with differentiable PyTorch ops, so the
    Function is twice differentiable (gradgradcheck passes).
    """

    @staticmethod
    def forward(ctx: FunctionCtx, input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        _check_linear_args(input, weight, bias)
        output = input.matmul(weight.t())
        if bias is not None:
            output.add_(bias)  # output is a fresh tensor: adding in place saves a buffer
        ctx.save_for_backward(input, weight, bias)
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output.matmul(weight)
        # Leading dimensions of input are batch dimensions: fold them into one.
        grad_output_2d = grad_output.reshape(-1, weight.shape[0])
        if ctx.needs_input_grad[1]:
            grad_weight = grad_output_2d.t().matmul(input.reshape(-1, weight.shape[1]))
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = grad_output_2d.sum(0)
        return grad_input, grad_weight, grad_bias


def _check_linear_args(input: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    if weight.dim() != 2:
        raise ValueError(f"linear: weight must be 2-D (out_features, in_features), got shape {tuple(weight.shape)}")
    if input.dim() < 1 or input.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"linear: input must have shape (*, in_features={weight.shape[1]}) to match weight "
            f"{tuple(weight.shape)}, got shape {tuple(input.shape)}"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(
            f"linear: bias must have shape (out_features,) = ({weight.shape[0]},), got {tuple(bias.shape)}"
        )


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """Functional form of :class:`LinearFunction` with an optional bias.

    ``Function.apply`` takes positional arguments only; this wrapper adds the
    default and keyword arguments users expect (``linear(x, w, bias=b)``).
    Unlike a wrapper that substitutes a zero bias, it passes ``None`` so no
    bias gradient is computed at all.

    input: (*, in_features), weight: (out_features, in_features),
    bias: (out_features,) or None -> (*, out_features)
    """
    return LinearFunction.apply(input, weight, bias)


# ---------------------------------------------------------------------------
# MulConstant: non-tensor argument, set_materialize_grads(False)
# ---------------------------------------------------------------------------


class MulConstant(torch.autograd.Function):
    """``output = tensor * constant`` for a Python number ``constant``.

    The constant is a non-tensor argument: it is stored on ``ctx`` (not with
    ``save_for_backward``) and its gradient is ``None``. The gradient does not
    depend on any tensor, so the Function turns off grad materialisation:
    when no gradient reaches the output, backward receives ``None`` instead
    of a freshly allocated tensor of zeros, and must handle it.
    """

    @staticmethod
    def forward(ctx: Any, tensor: Tensor, constant: float) -> Tensor:
        ctx.set_materialize_grads(False)
        ctx.constant = constant
        return tensor * constant

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor | None) -> tuple[Tensor | None, None]:
        if grad_output is None:  # nothing flowed into the output: no work, no allocation
            return None, None
        return grad_output * ctx.constant, None


def mul_constant(tensor: Tensor, constant: float) -> Tensor:
    """``tensor * constant`` through :class:`MulConstant`. tensor: any shape."""
    if isinstance(constant, Tensor):
        raise TypeError("mul_constant: constant must be a Python number, not a Tensor")
    return MulConstant.apply(tensor, constant)


# ---------------------------------------------------------------------------
# Cube: intermediates needed in backward
# ---------------------------------------------------------------------------


class CubeFunction(torch.autograd.Function):
    """``x ** 3`` that also returns its derivative ``3 x ** 2`` as an output.

    Backward needs ``dx = 3 x**2``, computed in forward. Returning it as an
    output (and saving it as an output) lets autograd record how it depends
    on ``x``, so differentiating backward itself (double backward) sees
    ``d(dx)/dx = 6 x``. Use :func:`cube` for the single-output view.

    x: any shape -> (x ** 3, 3 * x ** 2), both the shape of x
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> tuple[Tensor, Tensor]:
        dx = 3 * x**2
        result = x**3
        ctx.save_for_backward(x, dx)
        return result, dx

    @staticmethod
    def backward(ctx: Any, grad_result: Tensor, grad_dx: Tensor) -> Tensor:
        x, dx = ctx.saved_tensors
        # result depends on x through dx; dx depends on x through 6 x.
        return grad_result * dx + grad_dx * 6 * x


class CubeFunctionNaive(torch.autograd.Function):
    """Counter-example: ``x ** 3`` whose double backward is silently wrong.

    It saves the intermediate ``3 x**2`` with ``save_for_backward`` although
    the tensor is neither an input nor an output. Autograd then treats it as
    a constant when backward is differentiated, so the second derivative
    comes out as 0 instead of ``6 x``. First-order gradients are right
    (gradcheck passes); gradgradcheck fails. Kept to document the pitfall;
    use :class:`CubeFunction`.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        dx = 3 * x**2
        ctx.save_for_backward(dx)
        return x**3

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> Tensor:
        (dx,) = ctx.saved_tensors
        return grad_output * dx


def cube(x: Tensor) -> Tensor:
    """``x ** 3`` through :class:`CubeFunction` (twice differentiable). x: any shape."""
    return CubeFunction.apply(x)[0]


# ---------------------------------------------------------------------------
# Sigmoid: save the output
# ---------------------------------------------------------------------------


class SigmoidFunction(torch.autograd.Function):
    """``sigmoid(x)``; backward uses the saved output: ``s' = s (1 - s)``.

    Saving the output rather than the input avoids recomputing the
    exponential in backward. Because the saved tensor is an output, double
    backward is correct too.

    x: any shape -> same shape
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        output = torch.sigmoid(x)
        ctx.save_for_backward(output)
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> Tensor:
        (output,) = ctx.saved_tensors
        return grad_output * output * (1 - output)


# ---------------------------------------------------------------------------
# once_differentiable
# ---------------------------------------------------------------------------


class SoftplusFunction(torch.autograd.Function):
    """``softplus(x) = log(1 + exp(x))`` whose backward is declared once-differentiable.

    ``@once_differentiable`` runs backward with grad mode off. When the
    incoming gradient requires grad (``create_graph=True`` on a loss that
    depends on the output non-linearly), the returned gradient is attached
    to an error node: backpropagating through it raises ``RuntimeError:
    trying to differentiate twice a function that was marked with
    @once_differentiable``. Use it when backward is not built from
    differentiable PyTorch ops (a C++ kernel, NumPy, in-place tricks).

    It guards ``.backward()``; it does not make the gradient depend on the
    saved input, so ``torch.autograd.grad(g, x)`` reports ``x`` as unused and
    gradgradcheck fails instead of passing -- never a silently accepted
    second derivative, unlike :class:`CubeFunctionNaive`.

    x: any shape -> same shape
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return torch.nn.functional.softplus(x)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return grad_output * torch.sigmoid(x)  # d softplus(x) / dx = sigmoid(x)


# ---------------------------------------------------------------------------
# mark_dirty: in-place forward
# ---------------------------------------------------------------------------


class InplaceReLUFunction(torch.autograd.Function):
    """In-place ``x.clamp_(min=0)``: modifies and returns its input.

    ``ctx.mark_dirty(x)`` tells autograd that the input was changed in place,
    so the returned tensor (the same object) gets this Function as its
    history, and autograd's version counter refuses to use the old values
    elsewhere. As with built-in in-place ops, a leaf that requires grad
    cannot be passed (autograd raises). Saving the *modified* tensor is
    enough for backward: ``relu(x) > 0`` exactly where ``x > 0``.

    x: any shape, modified in place and returned
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        x.clamp_(min=0)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> Tensor:
        (output,) = ctx.saved_tensors
        return grad_output * (output > 0).to(grad_output.dtype)


# ---------------------------------------------------------------------------
# mark_non_differentiable: integer output
# ---------------------------------------------------------------------------


class SortFunction(torch.autograd.Function):
    """``torch.sort`` along ``dim``: returns ``(values, indices)``.

    ``indices`` is an integer tensor: it has no gradient, so forward marks it
    with ``ctx.mark_non_differentiable`` (it comes back with
    ``requires_grad=False``) and backward ignores the gradient slot it gets
    for it. Backward scatters the values' gradient back to where each value
    came from.

    x: any shape; dim: int; descending: bool -> values (shape of x, dtype of x),
    indices (shape of x, int64)
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
        values, indices = torch.sort(x, dim=dim, descending=descending)
        ctx.mark_non_differentiable(indices)
        ctx.save_for_backward(indices)
        ctx.dim = dim
        return values, indices

    @staticmethod
    def backward(ctx: Any, grad_values: Tensor, _grad_indices: Tensor | None) -> tuple[Tensor, None, None]:
        (indices,) = ctx.saved_tensors
        grad_x = torch.zeros_like(grad_values).scatter(ctx.dim, indices, grad_values)
        return grad_x, None, None


# ---------------------------------------------------------------------------
# separate forward() + setup_context(), vmap
# ---------------------------------------------------------------------------


class SoftsignFunction(torch.autograd.Function):
    """``softsign(x) = x / (1 + |x|)`` in the separate ``forward`` /
    ``setup_context`` form (PyTorch >= 2.0).

    ``forward`` takes no ``ctx`` and only computes; ``setup_context`` saves
    what backward needs. This is how built-in operators are structured, and
    it is what ``torch.func`` transforms require. ``generate_vmap_rule =
    True`` lets ``torch.func.vmap`` batch the Function by running forward and
    backward on batched tensors (valid because both are written with
    PyTorch ops only); a hand-written ``vmap`` staticmethod is the
    alternative when they are not.

    x: any shape -> same shape
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor) -> Tensor:
        return x / (1 + x.abs())

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor], output: Tensor) -> None:
        (x,) = inputs
        ctx.save_for_backward(x)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return grad_output / (1 + x.abs()) ** 2  # d softsign / dx = 1 / (1 + |x|)^2
