"""Conv2d followed by BatchNorm2d, fused into one autograd Function to save memory.

In training, ``nn.Conv2d`` saves its input for backward and ``nn.BatchNorm2d``
saves *its* input, the convolution output. For large activations these two
copies dominate memory. :class:`FusedConvBN2dFunction` saves only the
convolution input and weight (plus two numbers per channel) and recomputes
the convolution in backward: about half the saved activation memory, at the
price of one extra convolution forward per training step.

This is a training optimisation for memory, not speed. It pays when
activation memory limits the batch size; when it does not, the extra
convolution only costs time. Peak memory may not drop as much as saved
memory, since backward briefly holds the recomputed output. For inference,
fold the BatchNorm into the convolution instead (what :class:`FusedConvBN2d`
does in eval mode).

Numerics follow ``nn.Conv2d(bias=False)`` + ``nn.BatchNorm2d``:

* normalisation uses the batch mean and the *biased* batch variance, with
  ``eps`` inside the square root: ``(y - mean) / sqrt(var + eps)``;
* ``running_var`` is updated with the *unbiased* batch variance
  (``var * M / (M - 1)``, ``M = N * H_out * W_out``), ``running_mean`` with
  the batch mean, as ``(1 - momentum) * running + momentum * batch``;
  ``momentum=None`` gives the cumulative average over
  ``num_batches_tracked`` batches;
* eval mode uses the running statistics.

Shapes: input (N, C_in, H, W); conv weight (C_out, C_in / groups, kH, kW);
BatchNorm weight, bias, running_mean, running_var (C_out,);
output (N, C_out, H_out, W_out).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

__all__ = [
    "Conv2dFunction",
    "BatchNorm2dFunction",
    "FusedConvBN2dFunction",
    "fused_conv_bn2d",
    "FusedConvBN2d",
]

_IntOrPair = Union[int, Sequence[int]]
_CHANNEL_DIMS = (0, 2, 3)  # reduce over everything but the channel


def _pair(value: _IntOrPair, name: str, minimum: int) -> tuple[int, int]:
    if isinstance(value, str):
        raise ValueError(f"{name} must be an int or a pair of ints, got the string {value!r}")
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in pair):
        raise ValueError(f"{name} must be an int >= {minimum} or a pair of them, got {value!r}")
    return pair  # type: ignore[return-value]


def _per_channel(t: Tensor) -> Tensor:
    """(C,) -> (1, C, 1, 1), to broadcast against (N, C, H, W)."""
    return t.view(1, -1, 1, 1)


def _conv2d_backward(
    grad_output: Tensor,
    input: Tensor,
    weight: Tensor,
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    groups: int,
    output_mask: tuple[bool, bool, bool],
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Gradients of conv2d w.r.t. (input, weight, bias), only those in output_mask.

    One call to ATen's convolution backward, which picks the same kernels
    (oneDNN, cuDNN) as autograd uses for ``F.conv2d``.
    """
    if not any(output_mask):
        return None, None, None
    grad_input, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
        grad_output,
        input,
        weight,
        [weight.shape[0]] if output_mask[2] else None,
        list(stride),
        list(padding),
        list(dilation),
        False,  # transposed
        [0, 0],  # output_padding
        groups,
        list(output_mask),
    )
    return (
        grad_input if output_mask[0] else None,
        grad_weight if output_mask[1] else None,
        grad_bias if output_mask[2] else None,
    )


def _check_conv_args(input: Tensor, weight: Tensor, groups: int, where: str) -> None:
    if input.dim() != 4:
        raise ValueError(f"{where}: input must be 4-D (N, C, H, W), got shape {tuple(input.shape)}")
    if weight.dim() != 4:
        raise ValueError(
            f"{where}: conv weight must be 4-D (C_out, C_in / groups, kH, kW), got shape {tuple(weight.shape)}"
        )
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{where}: groups must be a positive int, got {groups!r}")
    if input.shape[1] != weight.shape[1] * groups:
        raise ValueError(
            f"{where}: input has {input.shape[1]} channels but conv weight {tuple(weight.shape)} with "
            f"groups={groups} expects {weight.shape[1] * groups}"
        )
    if weight.shape[0] % groups:
        raise ValueError(f"{where}: out_channels ({weight.shape[0]}) must be divisible by groups ({groups})")


# ---------------------------------------------------------------------------
# Conv2d
# ---------------------------------------------------------------------------


class Conv2dFunction(torch.autograd.Function):
    """2-D convolution (like ``F.conv2d``) with its backward written out.

    Arguments: input (N, C_in, H, W), weight (C_out, C_in / groups, kH, kW),
    bias (C_out,) or None, stride, padding, dilation (int or pair), groups.
    Saves input and weight. Once differentiable.
    """

    @staticmethod
    def forward(
        ctx: Any,
        input: Tensor,
        weight: Tensor,
        bias: Tensor | None = None,
        stride: _IntOrPair = 1,
        padding: _IntOrPair = 0,
        dilation: _IntOrPair = 1,
        groups: int = 1,
    ) -> Tensor:
        _check_conv_args(input, weight, groups, "Conv2dFunction")
        ctx.conv = (_pair(stride, "stride", 1), _pair(padding, "padding", 0), _pair(dilation, "dilation", 1), groups)
        ctx.has_bias = bias is not None
        ctx.save_for_backward(input, weight)
        return F.conv2d(input, weight, bias, *ctx.conv)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        input, weight = ctx.saved_tensors
        mask = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2])
        grads = _conv2d_backward(grad_output, input, weight, *ctx.conv, output_mask=mask)
        return (*grads, None, None, None, None)


# ---------------------------------------------------------------------------
# BatchNorm2d (training statistics)
# ---------------------------------------------------------------------------


def _batch_stats(y: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor, int]:
    """Per-channel batch mean, biased variance, invstd = 1 / sqrt(var + eps), and count M."""
    count = y.numel() // y.shape[1]
    if count <= 1:
        raise ValueError(
            f"BatchNorm2d in training needs more than 1 value per channel, got input of shape {tuple(y.shape)}"
        )
    var, mean = torch.var_mean(y, dim=_CHANNEL_DIMS, correction=0)
    invstd = torch.rsqrt(var + eps)
    return mean, var, invstd, count


def _update_running_stats(
    running_mean: Tensor | None,
    running_var: Tensor | None,
    mean: Tensor,
    var: Tensor,
    count: int,
    momentum: float,
) -> None:
    # nn.BatchNorm2d: running = (1 - momentum) * running + momentum * batch, unbiased var.
    if running_mean is not None:
        running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
    if running_var is not None:
        unbiased = var * (count / (count - 1))
        running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)


def _normalize_(y: Tensor, mean: Tensor, invstd: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    """In place: y <- (y - mean) * invstd * weight + bias. Returns y.

    Computed as ``y * alpha + beta`` with per-channel ``alpha = invstd * weight``
    and ``beta = bias - mean * alpha``: one pass over y, the form
    nn.BatchNorm2d's CPU kernel uses too.
    """
    alpha = invstd if weight is None else invstd * weight
    beta = -mean * alpha
    if bias is not None:
        beta = beta + bias
    return torch.addcmul(_per_channel(beta), y, _per_channel(alpha), out=y)


def _channel_dot(a: Tensor, b: Tensor) -> Tensor:
    """Per-channel ``sum(a * b)`` over (N, H, W) of two (N, C, H, W) tensors, shape (C,).

    As N * C dot products of length H * W (a batched matmul on views), so no
    (N, C, H, W) product is materialised, unlike ``(a * b).sum((0, 2, 3))``.
    """
    n, c = a.shape[:2]
    return torch.matmul(a.reshape(n, c, 1, -1), b.reshape(n, c, -1, 1)).sum(0).view(c)


def _batch_norm_backward_(
    grad_out: Tensor,
    centered: Tensor,
    invstd: Tensor,
    weight: Tensor | None,
    needs_weight_grad: bool,
    needs_bias_grad: bool,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """BatchNorm backward from the centred input ``centered = y - mean``; overwrites it.

    With g = grad_out, xhat = centered * invstd, M values per channel and
    k = weight * invstd:
        d bias   = sum(g)
        d weight = sum(g * xhat)
        d y      = k * (g - sum(g) / M - xhat * sum(g * xhat) / M)
                 = centered * c1 + g * k + c0,
    with per-channel c1 = -k * invstd * sum(g * xhat) / M and c0 = -k * sum(g) / M.
    Returns (d y, d weight, d bias); d y lives in centered's buffer.
    """
    count = centered.numel() // centered.shape[1]
    sum_g = grad_out.sum(_CHANNEL_DIMS)
    sum_g_xhat = _channel_dot(grad_out, centered) * invstd
    k = invstd if weight is None else invstd * weight
    c1 = k * invstd * sum_g_xhat / -count
    c0 = k * sum_g / -count
    grad_y = torch.addcmul(_per_channel(c0), centered, _per_channel(c1), out=centered)
    grad_y.addcmul_(grad_out, _per_channel(k))
    return grad_y, (sum_g_xhat if needs_weight_grad else None), (sum_g if needs_bias_grad else None)


class BatchNorm2dFunction(torch.autograd.Function):
    """BatchNorm2d in training mode (batch statistics) with its backward written out.

    Arguments: input (N, C, H, W), weight (C,) or None, bias (C,) or None,
    running_mean (C,) or None, running_var (C,) or None (updated in place
    when given), momentum (float), eps (float, inside the square root).
    Saves input, weight and the per-channel mean and invstd. Once
    differentiable.
    """

    @staticmethod
    def forward(
        ctx: Any,
        input: Tensor,
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        running_mean: Tensor | None = None,
        running_var: Tensor | None = None,
        momentum: float = 0.1,
        eps: float = 1e-5,
    ) -> Tensor:
        if input.dim() != 4:
            raise ValueError(f"BatchNorm2dFunction: input must be 4-D (N, C, H, W), got shape {tuple(input.shape)}")
        mean, var, invstd, count = _batch_stats(input, eps)
        _update_running_stats(running_mean, running_var, mean, var, count, momentum)
        ctx.save_for_backward(input, weight, mean, invstd)
        return _normalize_(input.clone(), mean, invstd, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        input, weight, mean, invstd = ctx.saved_tensors
        grad_input, grad_weight, grad_bias = _batch_norm_backward_(
            grad_out, input - _per_channel(mean), invstd, weight, ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        )
        return grad_input, grad_weight, grad_bias, None, None, None, None


# ---------------------------------------------------------------------------
# Fused Conv2d + BatchNorm2d
# ---------------------------------------------------------------------------


class FusedConvBN2dFunction(torch.autograd.Function):
    """``batch_norm(conv2d(input, conv_weight))`` in training mode, saving only the conv input.

    Arguments (positional, as ``Function.apply`` requires): input
    (N, C_in, H, W), conv_weight (C_out, C_in / groups, kH, kW), bn_weight
    (C_out,) or None, bn_bias (C_out,) or None, running_mean (C_out,) or
    None, running_var (C_out,) or None, momentum, eps, stride, padding,
    dilation, groups.

    Saved for backward: input, conv_weight, bn_weight and the per-channel
    mean and invstd -- not the (N, C_out, H_out, W_out) convolution output,
    which backward recomputes. Forward normalises the convolution output in
    place, so it allocates one activation-sized buffer, the result.
    """

    @staticmethod
    def forward(
        ctx: Any,
        input: Tensor,
        conv_weight: Tensor,
        bn_weight: Tensor | None,
        bn_bias: Tensor | None,
        running_mean: Tensor | None,
        running_var: Tensor | None,
        momentum: float,
        eps: float,
        stride: _IntOrPair = 1,
        padding: _IntOrPair = 0,
        dilation: _IntOrPair = 1,
        groups: int = 1,
    ) -> Tensor:
        _check_conv_args(input, conv_weight, groups, "FusedConvBN2dFunction")
        conv = (_pair(stride, "stride", 1), _pair(padding, "padding", 0), _pair(dilation, "dilation", 1), groups)
        y = F.conv2d(input, conv_weight, None, *conv)
        mean, var, invstd, count = _batch_stats(y, eps)
        _update_running_stats(running_mean, running_var, mean, var, count, momentum)
        ctx.conv = conv
        ctx.save_for_backward(input, conv_weight, bn_weight, mean, invstd)
        return _normalize_(y, mean, invstd, bn_weight, bn_bias)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        input, conv_weight, bn_weight, mean, invstd = ctx.saved_tensors
        needs = ctx.needs_input_grad
        # Recompute the convolution output and centre it in place.
        centered = F.conv2d(input, conv_weight, None, *ctx.conv).sub_(_per_channel(mean))
        grad_y, grad_bn_weight, grad_bn_bias = _batch_norm_backward_(
            grad_out, centered, invstd, bn_weight, needs[2], needs[3]
        )
        grad_input, grad_conv_weight, _ = _conv2d_backward(
            grad_y, input, conv_weight, *ctx.conv, output_mask=(needs[0], needs[1], False)
        )
        return (grad_input, grad_conv_weight, grad_bn_weight, grad_bn_bias) + (None,) * 8


def fused_conv_bn2d(
    input: Tensor,
    conv_weight: Tensor,
    bn_weight: Tensor | None = None,
    bn_bias: Tensor | None = None,
    running_mean: Tensor | None = None,
    running_var: Tensor | None = None,
    *,
    training: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
    stride: _IntOrPair = 1,
    padding: _IntOrPair = 0,
    dilation: _IntOrPair = 1,
    groups: int = 1,
) -> Tensor:
    """Functional ``batch_norm(conv2d(input, conv_weight), ...)`` (no conv bias).

    training=True: batch statistics through :class:`FusedConvBN2dFunction`;
    running_mean / running_var, if given, are updated in place.
    training=False: running statistics, required; the BatchNorm is folded
    into the convolution (``conv2d(x, w * s) + (bias - mean * s)``, with
    ``s = weight / sqrt(running_var + eps)``) and autograd differentiates
    it, so input, conv weight and BatchNorm parameters all get gradients.

    input: (N, C_in, H, W) -> (N, C_out, H_out, W_out)
    """
    if training:
        return FusedConvBN2dFunction.apply(
            input, conv_weight, bn_weight, bn_bias, running_mean, running_var,
            momentum, eps, stride, padding, dilation, groups,
        )  # fmt: skip
    if running_mean is None or running_var is None:
        raise ValueError("fused_conv_bn2d: training=False needs running_mean and running_var")
    _check_conv_args(input, conv_weight, groups, "fused_conv_bn2d")
    scale = torch.rsqrt(running_var + eps)
    if bn_weight is not None:
        scale = scale * bn_weight
    shift = -running_mean * scale
    if bn_bias is not None:
        shift = shift + bn_bias
    folded = conv_weight * scale.view(-1, 1, 1, 1)
    return F.conv2d(
        input, folded, shift, _pair(stride, "stride", 1), _pair(padding, "padding", 0),
        _pair(dilation, "dilation", 1), groups,
    )  # fmt: skip


class FusedConvBN2d(nn.Module):
    """``nn.Conv2d(bias=False)`` followed by ``nn.BatchNorm2d``, as one memory-saving layer.

    Arguments match the two modules it replaces: in_channels, out_channels,
    kernel_size, stride, padding, dilation, groups (int or pair; padding
    mode "zeros" only) of the convolution; eps, momentum, affine,
    track_running_stats of the BatchNorm. The convolution has no bias: in
    training the BatchNorm subtracts the batch mean, which cancels it.

    Parameters: conv_weight (C_out, C_in / groups, kH, kW); bn_weight,
    bn_bias (C_out,) or None if ``affine=False``. Buffers: running_mean,
    running_var (C_out,), num_batches_tracked (), or None if
    ``track_running_stats=False``.

    Training mode: batch statistics via :class:`FusedConvBN2dFunction` and
    running statistics updated. Eval mode: running statistics, BatchNorm
    folded into the convolution (batch statistics if not tracking).

    Shapes: input (N, in_channels, H, W) -> (N, out_channels, H_out, W_out).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: _IntOrPair,
        stride: _IntOrPair = 1,
        padding: _IntOrPair = 0,
        dilation: _IntOrPair = 1,
        groups: int = 1,
        *,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels), ("groups", groups)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"FusedConvBN2d: {name} must be a positive int, got {value!r}")
        if in_channels % groups:
            raise ValueError(f"FusedConvBN2d: in_channels ({in_channels}) must be divisible by groups ({groups})")
        if out_channels % groups:
            raise ValueError(f"FusedConvBN2d: out_channels ({out_channels}) must be divisible by groups ({groups})")
        if not eps > 0:
            raise ValueError(f"FusedConvBN2d: eps must be > 0, got {eps!r}")
        if momentum is not None and not 0.0 <= momentum <= 1.0:
            raise ValueError(f"FusedConvBN2d: momentum must be in [0, 1] or None, got {momentum!r}")
        factory = {"device": device, "dtype": dtype}
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size, "FusedConvBN2d: kernel_size", 1)
        self.stride = _pair(stride, "FusedConvBN2d: stride", 1)
        self.padding = _pair(padding, "FusedConvBN2d: padding", 0)
        self.dilation = _pair(dilation, "FusedConvBN2d: dilation", 1)
        self.groups = groups
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats

        self.conv_weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, *self.kernel_size, **factory))
        if affine:
            self.bn_weight = nn.Parameter(torch.empty(out_channels, **factory))
            self.bn_bias = nn.Parameter(torch.empty(out_channels, **factory))
        else:
            self.register_parameter("bn_weight", None)
            self.register_parameter("bn_bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(out_channels, **factory))
            self.register_buffer("running_var", torch.ones(out_channels, **factory))
            self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long, device=device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        """Initialise like nn.Conv2d (kaiming uniform) and nn.BatchNorm2d (ones, zeros)."""
        nn.init.kaiming_uniform_(self.conv_weight, a=math.sqrt(5))
        if self.affine:
            nn.init.ones_(self.bn_weight)
            nn.init.zeros_(self.bn_bias)
        self.reset_running_stats()

    @classmethod
    def from_modules(cls, conv: nn.Conv2d, bn: nn.BatchNorm2d) -> FusedConvBN2d:
        """A FusedConvBN2d with copies of the parameters and buffers of ``conv`` and ``bn``."""
        if not isinstance(conv, nn.Conv2d) or not isinstance(bn, nn.BatchNorm2d):
            raise TypeError("FusedConvBN2d.from_modules expects an nn.Conv2d and an nn.BatchNorm2d")
        if conv.bias is not None:
            raise ValueError(
                "FusedConvBN2d.from_modules: conv.bias must be None (create the Conv2d with bias=False); "
                "BatchNorm2d subtracts the batch mean, which cancels a conv bias in training"
            )
        if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            raise ValueError(
                "FusedConvBN2d.from_modules: only numeric padding with padding_mode='zeros' is supported, "
                f"got padding={conv.padding!r}, padding_mode={conv.padding_mode!r}"
            )
        if bn.num_features != conv.out_channels:
            raise ValueError(
                f"FusedConvBN2d.from_modules: bn.num_features ({bn.num_features}) != conv.out_channels "
                f"({conv.out_channels})"
            )
        w = conv.weight
        fused = cls(
            conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, conv.dilation,
            conv.groups, eps=bn.eps, momentum=bn.momentum, affine=bn.affine,
            track_running_stats=bn.track_running_stats, device=w.device, dtype=w.dtype,
        )  # fmt: skip
        with torch.no_grad():
            fused.conv_weight.copy_(w)
            if bn.affine:
                fused.bn_weight.copy_(bn.weight)
                fused.bn_bias.copy_(bn.bias)
            if bn.track_running_stats:
                fused.running_mean.copy_(bn.running_mean)
                fused.running_var.copy_(bn.running_var)
                fused.num_batches_tracked.copy_(bn.num_batches_tracked)
        fused.train(conv.training)
        return fused

    def forward(self, input: Tensor) -> Tensor:
        """input: (N, in_channels, H, W) -> (N, out_channels, H_out, W_out)."""
        if input.dim() != 4:
            raise ValueError(
                f"FusedConvBN2d: expected 4-D input (N, C, H, W), got {input.dim()}-D input of shape "
                f"{tuple(input.shape)}"
            )
        if input.shape[1] != self.in_channels:
            raise ValueError(
                f"FusedConvBN2d: expected input with {self.in_channels} channels (dim 1), got shape "
                f"{tuple(input.shape)}"
            )
        # Same rules as nn.BatchNorm2d.forward.
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                momentum = 1.0 / float(self.num_batches_tracked)
        use_batch_stats = self.training or not self.track_running_stats
        # Running stats are updated only in training; in eval they are read.
        update_stats = self.training and self.track_running_stats
        return fused_conv_bn2d(
            input,
            self.conv_weight,
            self.bn_weight,
            self.bn_bias,
            self.running_mean if update_stats or not use_batch_stats else None,
            self.running_var if update_stats or not use_batch_stats else None,
            training=use_batch_stats,
            momentum=momentum,
            eps=self.eps,
            stride=self.stride,
            padding=self.padding,
            dilation=self.dilation,
            groups=self.groups,
        )

    def extra_repr(self) -> str:
        s = (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, dilation={self.dilation}"
        )
        if self.groups != 1:
            s += f", groups={self.groups}"
        return s + (
            f", eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"track_running_stats={self.track_running_stats}"
        )
