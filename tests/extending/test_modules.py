"""DnnLayer: an nn.Module on LinearFunction, interchangeable with nn.Linear."""

import math

import pytest
import torch
from torch import nn

from lltm.extending import DnnLayer, LinearFunction


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("shape", [(7, 5), (2, 3, 5)], ids=["2d-input", "3d-input"])
def test_equal_to_nn_linear_with_same_parameters(bias, shape):
    ours = DnnLayer(5, 4, bias=bias).double()
    ref = nn.Linear(5, 4, bias=bias).double()
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    y, y_ref = ours(x), ref(x)
    torch.testing.assert_close(y, y_ref)
    grad = torch.randn_like(y)
    (y * grad).sum().backward()
    (y_ref * grad).sum().backward()
    for (name, p), p_ref in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, msg=name)


def test_forward_goes_through_linear_function():
    y = DnnLayer(3, 2)(torch.randn(4, 3))
    assert type(y.grad_fn).__name__ == f"{LinearFunction.__name__}Backward"


def test_no_bias_is_registered_as_none():
    layer = DnnLayer(3, 2, bias=False)
    assert layer.bias is None
    assert "bias" in layer._parameters  # registered, so code that inspects it sees a consistent layer
    assert list(layer.state_dict()) == ["weight"]
    assert [n for n, _ in layer.named_parameters()] == ["weight"]


def test_parameter_shapes_and_state_dict_keys():
    layer = DnnLayer(6, 3)
    assert layer.weight.shape == (3, 6) and layer.bias.shape == (3,)
    assert list(layer.state_dict()) == list(nn.Linear(6, 3).state_dict())


def test_init_like_nn_linear():
    layer = DnnLayer(100, 50)
    bound = 1 / math.sqrt(100)
    assert layer.weight.abs().max() <= bound and layer.bias.abs().max() <= bound
    # Not degenerate: spread over most of the interval.
    assert layer.weight.abs().max() > 0.9 * bound


def test_extra_repr():
    assert repr(DnnLayer(3, 2, bias=False)) == "DnnLayer(in_features=3, out_features=2, bias=False)"


def test_device_and_dtype_arguments():
    layer = DnnLayer(3, 2, device="cpu", dtype=torch.float64)
    assert layer.weight.dtype == torch.float64 and layer.bias.device.type == "cpu"


@pytest.mark.parametrize("bad", [0, -1, 2.5, True], ids=["zero", "negative", "float", "bool"])
def test_bad_sizes_raise(bad):
    with pytest.raises(ValueError, match="in_features must be a positive int"):
        DnnLayer(bad, 2)


def test_wrong_input_features_raise():
    with pytest.raises(ValueError, match=r"input must have shape \(\*, in_features=3\)"):
        DnnLayer(3, 2)(torch.randn(4, 5))
