"""Fused Conv2d + BatchNorm2d: gradients, parity with nn.Conv2d + nn.BatchNorm2d, saved memory."""

import pytest
import torch
from torch import nn
from torch.autograd import gradcheck

from lltm.extending import (
    BatchNorm2dFunction,
    Conv2dFunction,
    FusedConvBN2d,
    FusedConvBN2dFunction,
    fused_conv_bn2d,
    saved_tensors_report,
)

f64 = torch.float64


def rand(*shape, dtype=f64, requires_grad=True):
    return torch.randn(*shape, dtype=dtype, requires_grad=requires_grad)


# ---------------------------------------------------------------------------
# gradcheck of the three Functions
# ---------------------------------------------------------------------------

# (stride, padding, dilation, groups)
CONV_CONFIGS = {
    "plain": (1, 0, 1, 1),
    "stride2-pad1": (2, 1, 1, 1),
    "dilation2-pad2": (1, 2, 2, 1),
    "groups2-asym": ((2, 1), (1, 0), (1, 2), 2),
}


@pytest.mark.parametrize("config", list(CONV_CONFIGS), ids=list(CONV_CONFIGS))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_conv2d_function_gradcheck(config, bias):
    stride, padding, dilation, groups = CONV_CONFIGS[config]
    x, w = rand(2, 4, 7, 6), rand(6, 4 // groups, 3, 3)
    b = rand(6) if bias else None
    assert gradcheck(lambda x, w, b: Conv2dFunction.apply(x, w, b, stride, padding, dilation, groups), (x, w, b))


def test_conv2d_function_matches_f_conv2d():
    x, w, b = rand(2, 3, 8, 8), rand(5, 3, 3, 3), rand(5)
    torch.testing.assert_close(Conv2dFunction.apply(x, w, b, 2, 1), nn.functional.conv2d(x, w, b, 2, 1))


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no-affine"])
def test_batch_norm2d_function_gradcheck(affine):
    x = rand(4, 3, 3, 5)
    w, b = (rand(3), rand(3)) if affine else (None, None)
    assert gradcheck(lambda x, w, b: BatchNorm2dFunction.apply(x, w, b, None, None, 0.1, 1e-5), (x, w, b))


@pytest.mark.parametrize("config", list(CONV_CONFIGS), ids=list(CONV_CONFIGS))
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no-affine"])
def test_fused_function_gradcheck(config, affine):
    stride, padding, dilation, groups = CONV_CONFIGS[config]
    x, w = rand(3, 4, 7, 6), rand(6, 4 // groups, 3, 3)
    g, b = (rand(6), rand(6)) if affine else (None, None)

    def fn(x, w, g, b):
        return FusedConvBN2dFunction.apply(x, w, g, b, None, None, 0.1, 1e-5, stride, padding, dilation, groups)

    assert gradcheck(fn, (x, w, g, b))


def test_fused_function_eval_path_gradcheck():
    x, w, g, b = rand(2, 3, 5, 5), rand(4, 3, 3, 3), rand(4), rand(4)
    mean, var = torch.randn(4, dtype=f64), torch.rand(4, dtype=f64) + 0.5

    def fn(x, w, g, b):
        return fused_conv_bn2d(x, w, g, b, mean, var, training=False, padding=1)

    assert gradcheck(fn, (x, w, g, b))


# ---------------------------------------------------------------------------
# parity with nn.Conv2d + nn.BatchNorm2d
# ---------------------------------------------------------------------------


def make_pair(in_ch, out_ch, k, *, dtype, stride=1, padding=0, dilation=1, groups=1, **bn_kwargs):
    conv = nn.Conv2d(in_ch, out_ch, k, stride, padding, dilation, groups, bias=False, dtype=dtype)
    bn = nn.BatchNorm2d(out_ch, dtype=dtype, **bn_kwargs)
    if bn.affine:  # move away from the (1, 0) init so the affine part is exercised
        with torch.no_grad():
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    return conv, bn, FusedConvBN2d.from_modules(conv, bn)


def grads_of(out, params, grad):
    return torch.autograd.grad(out, params, grad)


TOL = {torch.float32: {"atol": 2e-5, "rtol": 1e-4}, torch.float64: {"atol": 1e-10, "rtol": 1e-9}}

PARITY_CASES = {
    "k3-pad1": dict(k=3, padding=1),
    "k3-stride2-dil2-pad2": dict(k=3, stride=2, padding=2, dilation=2),
    "k1-groups2": dict(k=1, groups=2),
    "no-affine": dict(k=3, padding=1, affine=False),
    "momentum-none": dict(k=3, momentum=None),
    "momentum-0.3-eps-1e-3": dict(k=3, momentum=0.3, eps=1e-3),
    "no-running-stats": dict(k=3, padding=1, track_running_stats=False),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", list(PARITY_CASES), ids=list(PARITY_CASES))
def test_training_parity_forward_grads_running_stats(case, dtype):
    conv, bn, fused = make_pair(4, 6, dtype=dtype, **PARITY_CASES[case])
    tol = TOL[dtype]
    for _ in range(3):  # several steps: running statistics accumulate
        x = torch.randn(5, 4, 9, 8, dtype=dtype, requires_grad=True)
        ref, out = bn(conv(x)), fused(x)
        torch.testing.assert_close(out, ref, **tol)
        grad = torch.randn_like(ref)
        ref_params = [x, conv.weight] + ([bn.weight, bn.bias] if bn.affine else [])
        our_params = [x, fused.conv_weight] + ([fused.bn_weight, fused.bn_bias] if fused.affine else [])
        for ours, theirs in zip(grads_of(out, our_params, grad), grads_of(ref, ref_params, grad)):
            torch.testing.assert_close(ours, theirs, **tol)
    if bn.track_running_stats:
        torch.testing.assert_close(fused.running_mean, bn.running_mean, **tol)
        torch.testing.assert_close(fused.running_var, bn.running_var, **tol)
        assert fused.num_batches_tracked.item() == bn.num_batches_tracked.item() == 3
    else:
        assert fused.running_mean is None and fused.num_batches_tracked is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", ["k3-pad1", "k3-stride2-dil2-pad2", "no-affine", "no-running-stats"])
def test_eval_parity_forward_and_grads(case, dtype):
    conv, bn, fused = make_pair(4, 6, dtype=dtype, **PARITY_CASES[case])
    for _ in range(2):  # a few training steps so the running stats are not the init values
        x = torch.randn(5, 4, 9, 8, dtype=dtype)
        bn(conv(x)), fused(x)
    conv.eval(), bn.eval(), fused.eval()
    tol = TOL[dtype]
    x = torch.randn(3, 4, 9, 8, dtype=dtype, requires_grad=True)
    ref, out = bn(conv(x)), fused(x)
    torch.testing.assert_close(out, ref, **tol)
    grad = torch.randn_like(ref)
    ref_params = [x, conv.weight] + ([bn.weight, bn.bias] if bn.affine else [])
    our_params = [x, fused.conv_weight] + ([fused.bn_weight, fused.bn_bias] if fused.affine else [])
    for ours, theirs in zip(grads_of(out, our_params, grad), grads_of(ref, ref_params, grad)):
        torch.testing.assert_close(ours, theirs, **tol)
    if bn.track_running_stats:  # eval reads the running statistics, never updates them
        before = fused.running_mean.clone(), fused.running_var.clone(), fused.num_batches_tracked.clone()
        fused(x)
        assert all(torch.equal(a, b) for a, b in zip(before, (fused.running_mean, fused.running_var,
                                                                fused.num_batches_tracked)))  # fmt: skip


def test_channels_last_input_and_expanded_grad():
    conv, bn, fused = make_pair(4, 6, dtype=f64, k=3, padding=1)
    x = torch.randn(3, 4, 7, 7, dtype=f64).to(memory_format=torch.channels_last).requires_grad_()
    ref, out = bn(conv(x)), fused(x)
    torch.testing.assert_close(out, ref, **TOL[f64])
    # .sum() backward hands the layer an expanded (stride-0) gradient.
    torch.testing.assert_close(
        grads_of(out.sum(), [x, fused.conv_weight, fused.bn_weight], None),
        grads_of(ref.sum(), [x, conv.weight, bn.weight], None),
        **TOL[f64],
    )


def test_eps_is_inside_the_square_root_with_biased_variance():
    # A large eps makes the two conventions far apart: (y - mean) / sqrt(var_biased + eps) is
    # nn.BatchNorm2d's; (y - mean) / (sqrt(var_unbiased) + eps) is the one to avoid.
    eps = 0.5
    x, w = torch.randn(4, 3, 5, 5, dtype=f64), torch.randn(2, 3, 3, 3, dtype=f64)
    y = nn.functional.conv2d(x, w)
    mean = y.mean((0, 2, 3), keepdim=True)
    inside = (y - mean) / torch.sqrt(y.var((0, 2, 3), unbiased=False, keepdim=True) + eps)
    outside = (y - mean) / (torch.sqrt(y.var((0, 2, 3), unbiased=True, keepdim=True)) + eps)
    out = fused_conv_bn2d(x, w, eps=eps)
    torch.testing.assert_close(out, inside)
    assert not torch.allclose(out, outside, atol=1e-3)
    bn = nn.BatchNorm2d(2, eps=eps, affine=False, dtype=f64)
    torch.testing.assert_close(out, bn(y))


def test_running_var_uses_unbiased_variance():
    x, w = torch.randn(2, 3, 4, 4, dtype=f64), torch.randn(2, 3, 3, 3, dtype=f64)
    rm, rv = torch.zeros(2, dtype=f64), torch.ones(2, dtype=f64)
    fused_conv_bn2d(x, w, running_mean=rm, running_var=rv, momentum=1.0)  # momentum 1: stats = batch stats
    y = nn.functional.conv2d(x, w)
    torch.testing.assert_close(rm, y.mean((0, 2, 3)))
    torch.testing.assert_close(rv, y.var((0, 2, 3), unbiased=True))


def test_state_dict_round_trip_and_repr():
    fused = FusedConvBN2d(4, 6, 3, stride=2, padding=1, groups=2, momentum=None)
    fused(torch.randn(2, 4, 6, 6))
    other = FusedConvBN2d(4, 6, 3, stride=2, padding=1, groups=2, momentum=None)
    other.load_state_dict(fused.state_dict())
    assert set(fused.state_dict()) == {
        "conv_weight", "bn_weight", "bn_bias", "running_mean", "running_var", "num_batches_tracked"
    }  # fmt: skip
    fused.eval(), other.eval()
    x = torch.randn(2, 4, 6, 6)
    torch.testing.assert_close(fused(x), other(x))
    assert repr(fused) == (
        "FusedConvBN2d(4, 6, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), dilation=(1, 1), groups=2, "
        "eps=1e-05, momentum=None, affine=True, track_running_stats=True)"
    )


# ---------------------------------------------------------------------------
# memory saved for backward
# ---------------------------------------------------------------------------


def saved_reports(batch, channels, size):
    """Saved-for-backward reports of (unfused pair, fused module) on one fp32 input."""
    conv, bn, fused = make_pair(channels, channels, 3, dtype=torch.float32, padding=1)
    x = torch.randn(batch, channels, size, size)
    unfused = saved_tensors_report(lambda: bn(conv(x)), exclude=[*conv.parameters(), *bn.parameters(), *bn.buffers()])
    fused_report = saved_tensors_report(lambda: fused(x), exclude=[*fused.parameters(), *fused.buffers()])
    return x, unfused, fused_report


def test_fused_saves_at_least_30_percent_less_at_benchmark_size():
    # The configuration: batch 64, 64 -> 64 channels, 3x3, 56x56, fp32.
    x, unfused, fused = saved_reports(64, 64, 56)
    activation = x.numel() * x.element_size()
    per_channel = 4096  # both also save per-channel mean and invstd: 2 x 64 floats
    # Unfused keeps the conv input and the conv output (BatchNorm's input); fused only the conv input.
    assert 2 * activation <= unfused.activation_bytes < 2 * activation + per_channel
    assert activation <= fused.activation_bytes < activation + per_channel
    assert fused.total_bytes <= 0.7 * unfused.total_bytes
    assert 1 - fused.total_bytes / unfused.total_bytes > 0.49


def test_fused_saves_only_input_weight_and_per_channel_stats():
    fused = FusedConvBN2d(3, 5, 3, padding=1)
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fused(x)
    assert sorted(shapes) == sorted([(2, 3, 6, 6), (5, 3, 3, 3), (5,), (5,), (5,)])
    assert tuple(out.shape) not in shapes  # the conv output is recomputed, not saved
    out.sum().backward()  # and backward still works after saving so little
    assert x.grad is not None


# ---------------------------------------------------------------------------
# bad inputs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: FusedConvBN2d(4, 6, 3, groups=3), r"in_channels \(4\) must be divisible by groups \(3\)"),
        (lambda: FusedConvBN2d(4, 6, 3, groups=4), r"out_channels \(6\) must be divisible by groups \(4\)"),
        (lambda: FusedConvBN2d(4, 6, 3, padding="same"), r"padding must be an int or a pair of ints, got the string"),
        (lambda: FusedConvBN2d(4, 6, 3, stride=0), r"stride must be an int >= 1"),
        (lambda: FusedConvBN2d(4, 6, (3, 3, 3)), r"kernel_size must be an int >= 1 or a pair"),
        (lambda: FusedConvBN2d(4, 6, 3, momentum=2.0), r"momentum must be in \[0, 1\] or None"),
        (lambda: FusedConvBN2d(4, 6, 3, eps=0.0), r"eps must be > 0"),
        (lambda: FusedConvBN2d(0, 6, 3), r"in_channels must be a positive int"),
    ],
    ids=["groups-in", "groups-out", "string-padding", "stride-0", "kernel-3d", "momentum", "eps", "in-channels"],
)
def test_bad_constructor_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_wrong_input_dim_and_channels():
    fused = FusedConvBN2d(4, 6, 3)
    with pytest.raises(ValueError, match=r"expected 4-D input \(N, C, H, W\), got 3-D input of shape \(4, 8, 8\)"):
        fused(torch.randn(4, 8, 8))
    with pytest.raises(ValueError, match=r"expected input with 4 channels \(dim 1\), got shape \(2, 3, 8, 8\)"):
        fused(torch.randn(2, 3, 8, 8))


def test_one_value_per_channel_in_training_raises():
    with pytest.raises(ValueError, match="needs more than 1 value per channel"):
        FusedConvBN2d(2, 3, 3)(torch.randn(1, 2, 3, 3))  # output (1, 3, 1, 1)


def test_functional_eval_needs_running_stats():
    with pytest.raises(ValueError, match="training=False needs running_mean and running_var"):
        fused_conv_bn2d(torch.randn(2, 3, 4, 4), torch.randn(2, 3, 3, 3), training=False)


def test_function_rejects_mismatched_weight():
    match = r"input has 3 channels but conv weight \(2, 4, 3, 3\) with groups=1 expects 4"
    with pytest.raises(ValueError, match=match):
        fused_conv_bn2d(torch.randn(2, 3, 5, 5), torch.randn(2, 4, 3, 3))


@pytest.mark.parametrize(
    "conv, match",
    [
        (nn.Conv2d(3, 4, 3, bias=True), r"conv.bias must be None \(create the Conv2d with bias=False\)"),
        (nn.Conv2d(3, 4, 3, padding="same", bias=False), r"only numeric padding with padding_mode='zeros'"),
        (nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect", bias=False), r"padding_mode='reflect'"),
        (nn.Conv2d(3, 5, 3, bias=False), r"bn.num_features \(4\) != conv.out_channels \(5\)"),
    ],
    ids=["conv-bias", "padding-same", "padding-reflect", "channel-mismatch"],
)
def test_from_modules_rejects_what_it_cannot_fuse(conv, match):
    with pytest.raises(ValueError, match=match):
        FusedConvBN2d.from_modules(conv, nn.BatchNorm2d(4))
