"""LLTMCell and LLTM: parameters, init, state handling, nn.LSTM conventions
and compatibility with the tutorial's LLTM module."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lltm
from lltm import functional

from ._helpers import backend_params


class TutorialLLTM(nn.Module):
    """The tutorial's parameter layout (names, shapes, init), written here to
    produce state_dicts the way users of the tutorial have them."""

    def __init__(self, input_features, state_size):
        super().__init__()
        self.input_features = input_features
        self.state_size = state_size
        self.weights = nn.Parameter(torch.empty(3 * state_size, input_features + state_size))
        self.bias = nn.Parameter(torch.empty(3 * state_size))
        stdv = 1.0 / math.sqrt(state_size)
        for p in self.parameters():
            p.data.uniform_(-stdv, stdv)

    def forward(self, input, state):
        old_h, old_cell = state
        gates = F.linear(torch.cat([old_h, input], dim=1), self.weights, self.bias).chunk(3, dim=1)
        new_cell = old_cell + F.elu(gates[2]) * torch.sigmoid(gates[0])
        return torch.tanh(new_cell) * torch.sigmoid(gates[1]), new_cell


@pytest.mark.parametrize("device,backend", backend_params())
def test_tutorial_state_dict_loads_and_matches(device, backend):
    tutorial = TutorialLLTM(32, 128).to(device)
    cell = lltm.LLTMCell(32, 128, backend=backend, device=device)
    cell.load_state_dict(tutorial.state_dict())  # strict: same names and shapes
    x, h, c = (torch.randn(16, n, device=device) for n in (32, 128, 128))
    got = cell(x, (h, c))
    want = tutorial(x, (h, c))
    if backend == "python":
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    else:
        torch.testing.assert_close(got, want)
    assert set(cell.state_dict()) == {"weights", "bias"}


def test_cell_parameters_and_init():
    cell = lltm.LLTMCell(7, 5)
    assert cell.weights.shape == (15, 12) and cell.bias.shape == (15,)
    bound = 1 / math.sqrt(5)
    for p in cell.parameters():
        assert p.abs().max() <= bound
        assert p.std() > bound / 4  # actually random, not constant
    no_bias = lltm.LLTMCell(7, 5, bias=False)
    assert no_bias.bias is None and [n for n, _ in no_bias.named_parameters()] == ["weights"]
    assert "7, 5, bias=False" in repr(no_bias)


def test_cell_factory_kwargs():
    cell = lltm.LLTMCell(3, 4, dtype=torch.float64, device="cpu")
    assert cell.weights.dtype == torch.float64 and cell.bias.device.type == "cpu"


@pytest.mark.parametrize("device,backend", backend_params())
def test_cell_state_none_is_zeros(device, backend):
    cell = lltm.LLTMCell(3, 4, backend=backend, device=device, dtype=torch.float64)
    x = torch.randn(2, 3, device=device, dtype=torch.float64)
    zeros = torch.zeros(2, 4, device=device, dtype=torch.float64)
    torch.testing.assert_close(cell(x), cell(x, (zeros, zeros)))


def _lltm_reference_stack(model, x, h0, c0):
    """Layer by layer with the reference cell (no dropout)."""
    outs = x
    h_n, c_n = [], []
    for k in range(model.num_layers):
        out, (h, c) = functional.lltm(
            outs, getattr(model, f"weights_l{k}"), getattr(model, f"bias_l{k}"), h0[k], c0[k], backend="python"
        )
        outs = out
        h_n.append(h)
        c_n.append(c)
    return outs, (torch.stack(h_n), torch.stack(c_n))


@pytest.mark.parametrize("device,backend", backend_params())
@pytest.mark.parametrize("batch_first", [False, True], ids=["time_major", "batch_first"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_lltm_layers_match_reference(device, backend, batch_first, bias):
    T, B, I, S, L = 4, 3, 5, 6, 3
    model = lltm.LLTM(
        I, S, num_layers=L, bias=bias, batch_first=batch_first, backend=backend, device=device, dtype=torch.float64
    )
    x = torch.randn(T, B, I, device=device, dtype=torch.float64)
    h0 = torch.randn(L, B, S, device=device, dtype=torch.float64)
    c0 = torch.randn(L, B, S, device=device, dtype=torch.float64)
    inp = x.transpose(0, 1).contiguous() if batch_first else x
    out, (h_n, c_n) = model(inp, (h0, c0))
    ref_out, (ref_h, ref_c) = _lltm_reference_stack(model, x, h0, c0)
    if batch_first:
        ref_out = ref_out.transpose(0, 1)
    assert out.shape == ((B, T, S) if batch_first else (T, B, S))
    assert h_n.shape == c_n.shape == (L, B, S)
    torch.testing.assert_close((out, h_n, c_n), (ref_out, ref_h, ref_c))
    # state=None is zeros, like nn.LSTM
    zeros = torch.zeros(L, B, S, device=device, dtype=torch.float64)
    torch.testing.assert_close(model(inp), model(inp, (zeros, zeros)))


def test_lltm_parameter_names_and_shapes():
    model = lltm.LLTM(5, 6, num_layers=2)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert shapes == {"weights_l0": (18, 11), "bias_l0": (18,), "weights_l1": (18, 12), "bias_l1": (18,)}


def test_lltm_dropout_between_layers_only_in_training():
    torch.manual_seed(0)
    model = lltm.LLTM(4, 5, num_layers=2, dropout=0.5, backend="python", dtype=torch.float64)
    x = torch.randn(3, 2, 4, dtype=torch.float64)
    model.train()
    a, _ = model(x)
    b, _ = model(x)
    assert not torch.equal(a, b)  # dropout is active between the layers
    model.eval()
    c, _ = model(x)
    d, _ = model(x)
    assert torch.equal(c, d)
    no_drop = lltm.LLTM(4, 5, num_layers=2, backend="python", dtype=torch.float64)
    no_drop.load_state_dict(model.state_dict())
    torch.testing.assert_close(c, no_drop(x)[0])
    # one layer: nothing between layers, so dropout changes nothing
    with pytest.warns(UserWarning, match="expects num_layers greater than 1"):
        single = lltm.LLTM(4, 5, num_layers=1, dropout=0.5, backend="python", dtype=torch.float64).train()
    assert torch.equal(single(x)[0], single(x)[0])


@pytest.mark.parametrize("device,backend", backend_params())
def test_lltm_trains(device, backend):
    """A few optimiser steps reduce a regression loss: gradients flow through
    every layer and time step."""
    torch.manual_seed(0)
    model = lltm.LLTM(3, 8, num_layers=2, backend=backend, device=device)
    head = nn.Linear(8, 1, device=device)
    opt = torch.optim.Adam(list(model.parameters()) + list(head.parameters()), lr=0.03)
    x = torch.randn(6, 16, 3, device=device)
    y = x.sum(dim=(0, 2)).unsqueeze(1).tanh()
    losses = []
    for _ in range(30):
        out, _ = model(x)
        loss = F.mse_loss(head(out[-1]), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("module", [lltm.LLTMCell, lltm.LLTM])
def test_one_vocabulary_for_the_sizes(module):
    """Both modules take input_size first (positional use unchanged), accept the tutorial's input_features
    and nn.LSTM's hidden_size as keywords, and build the same parameters whichever names are used."""
    torch.manual_seed(0)
    positional = module(7, 5).state_dict()
    for kwargs in (
        {"input_size": 7, "state_size": 5},
        {"input_features": 7, "state_size": 5},
        {"input_size": 7, "hidden_size": 5},
        {"input_features": 7, "hidden_size": 5},
    ):
        torch.manual_seed(0)
        m = module(**kwargs)
        state = m.state_dict()
        assert list(state) == list(positional)
        assert all(torch.equal(state[k], positional[k]) for k in state)
        assert (m.input_size, m.state_size, m.input_features, m.hidden_size) == (7, 5, 7, 5)
    name = f"lltm.{module.__name__}"
    with pytest.raises(TypeError, match=rf"{name}: got both input_size and input_features"):
        module(7, 5, input_features=7)
    with pytest.raises(TypeError, match=rf"{name}: got both state_size and hidden_size"):
        module(7, state_size=5, hidden_size=5)
    with pytest.raises(TypeError, match=rf"{name}: missing state_size \(or its keyword alias hidden_size\)"):
        module(7)


def test_layer_num_layers_stays_third():
    layer = lltm.LLTM(3, 4, 2)
    assert layer.num_layers == 2 and "weights_l1" in layer.state_dict()
