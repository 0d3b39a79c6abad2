"""The LLTM layer's nn.LSTM features: bidirectional layers and
PackedSequence input, against running every sequence alone with the
per-step reference (forward and gradients), on every backend."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pack_sequence, pad_packed_sequence

import lltm
from lltm.reference import lltm_reference

from ._helpers import backend_params


def reference_layer(model: lltm.LLTM, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor):
    """The model's math for ONE sequence (T, 1, I), written out with the
    reference step: each layer forward then (on the reversed sequence)
    backward, directions concatenated."""
    D = model.num_directions
    h_n, c_n = [], []
    for k in range(model.num_layers):
        outs = []
        for d, suffix in enumerate(("", "_reverse")[:D]):
            W = getattr(model, f"weights_l{k}{suffix}")
            b = getattr(model, f"bias_l{k}{suffix}")
            xin = x if d == 0 else x.flip(0)
            out, (h, c) = lltm_reference(xin, W, b, h0[k * D + d], c0[k * D + d])
            outs.append(out if d == 0 else out.flip(0))
            h_n.append(h)
            c_n.append(c)
        x = torch.cat(outs, dim=2)
    return x, torch.stack(h_n), torch.stack(c_n)


def _model(backend, device, **kw):
    torch.manual_seed(0)
    return lltm.LLTM(3, 5, backend=backend, device=device, dtype=torch.float64, **kw)


@pytest.mark.parametrize("device,backend", backend_params())
@pytest.mark.parametrize("layers", [1, 2])
def test_bidirectional_matches_reference(device, backend, layers):
    model = _model(backend, device, num_layers=layers, bidirectional=True)
    T, B = 6, 3
    x = torch.randn(T, B, 3, dtype=torch.float64, device=device, requires_grad=True)
    h0 = torch.randn(2 * layers, B, 5, dtype=torch.float64, device=device, requires_grad=True)
    c0 = torch.randn(2 * layers, B, 5, dtype=torch.float64, device=device, requires_grad=True)
    out, (h_n, c_n) = model(x, (h0, c0))
    assert out.shape == (T, B, 10) and h_n.shape == (2 * layers, B, 5)
    for b in range(B):
        ref = reference_layer(model, x[:, b : b + 1], h0[:, b : b + 1], c0[:, b : b + 1])
        torch.testing.assert_close((out[:, b : b + 1], h_n[:, b : b + 1], c_n[:, b : b + 1]), ref)
    params = list(model.parameters())
    loss = out.pow(2).sum() + h_n.sum() + 2 * c_n.sum()
    grads = torch.autograd.grad(loss, [x, h0, c0] + params)
    ref_loss = 0
    for b in range(B):
        r_out, r_h, r_c = reference_layer(model, x[:, b : b + 1], h0[:, b : b + 1], c0[:, b : b + 1])
        ref_loss = ref_loss + r_out.pow(2).sum() + r_h.sum() + 2 * r_c.sum()
    ref_grads = torch.autograd.grad(ref_loss, [x, h0, c0] + params)
    torch.testing.assert_close(grads, ref_grads)


@pytest.mark.parametrize("device,backend", backend_params())
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("enforce_sorted", [False, True], ids=["unsorted", "sorted"])
def test_packed_sequence_matches_each_sequence_alone(device, backend, bidirectional, enforce_sorted):
    """PackedSequence in, PackedSequence out (same batch_sizes and index
    permutations); every sequence's outputs, final state and gradients equal
    those of running it alone at its own length."""
    model = _model(backend, device, num_layers=2, bidirectional=bidirectional)
    D = model.num_directions
    lengths = [6, 4, 4, 1] if enforce_sorted else [3, 6, 1, 4]
    seqs = [torch.randn(n, 3, dtype=torch.float64, device=device, requires_grad=True) for n in lengths]
    B = len(seqs)
    h0 = torch.randn(2 * D, B, 5, dtype=torch.float64, device=device, requires_grad=True)
    c0 = torch.randn(2 * D, B, 5, dtype=torch.float64, device=device)
    packed = pack_sequence(seqs, enforce_sorted=enforce_sorted)
    out, (h_n, c_n) = model(packed, (h0, c0))
    assert isinstance(out, torch.nn.utils.rnn.PackedSequence)
    assert torch.equal(out.batch_sizes, packed.batch_sizes)
    assert (out.sorted_indices is None) == (packed.sorted_indices is None)
    padded, out_lengths = pad_packed_sequence(out)
    assert out_lengths.tolist() == lengths
    loss = padded.pow(2).sum() + h_n.sum() + 3 * c_n.sum()
    grads = torch.autograd.grad(loss, seqs + [h0] + list(model.parameters()))
    ref_loss = 0
    for b, seq in enumerate(seqs):
        r_out, r_h, r_c = reference_layer(model, seq.unsqueeze(1), h0[:, b : b + 1], c0[:, b : b + 1])
        torch.testing.assert_close(padded[: lengths[b], b : b + 1], r_out)
        assert (padded[lengths[b] :, b] == 0).all()
        torch.testing.assert_close((h_n[:, b : b + 1], c_n[:, b : b + 1]), (r_h, r_c))
        ref_loss = ref_loss + r_out.pow(2).sum() + r_h.sum() + 3 * r_c.sum()
    ref_grads = torch.autograd.grad(ref_loss, seqs + [h0] + list(model.parameters()))
    torch.testing.assert_close(grads, ref_grads)


@pytest.mark.parametrize("device,backend", backend_params())
def test_packed_batch_first_padded_input(device, backend):
    """pack_padded_sequence of a batch-first tensor: same results as the
    time-major packing of the same data."""
    model = _model(backend, device)
    x = torch.randn(4, 7, 3, dtype=torch.float64, device=device)
    lengths = torch.tensor([7, 2, 5, 3])
    a, (ha, ca) = model(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
    b, (hb, cb) = model(pack_padded_sequence(x.transpose(0, 1), lengths, enforce_sorted=False))
    torch.testing.assert_close((a.data, ha, ca), (b.data, hb, cb))


def test_parameter_names_like_nn_lstm():
    model = lltm.LLTM(3, 5, num_layers=2, bidirectional=True)
    assert [n for n, _ in model.named_parameters()] == [
        "weights_l0", "bias_l0", "weights_l0_reverse", "bias_l0_reverse",
        "weights_l1", "bias_l1", "weights_l1_reverse", "bias_l1_reverse",
    ]  # fmt: skip
    assert model.weights_l1.shape == (15, 5 + 10)
    assert "bidirectional=True" in repr(model)


def test_dropout_with_one_layer_warns_like_nn_lstm():
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        lltm.LLTM(3, 5, num_layers=1, dropout=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lltm.LLTM(3, 5, num_layers=2, dropout=0.5)


@pytest.mark.parametrize(
    "state, message",
    [
        (lambda: torch.zeros(1, 2, 5), r"expected state to be None or a tuple \(h, c\) of two tensors.*but got Tensor"),
        (lambda: (torch.zeros(1, 2, 5),), r"expected state to be None or a tuple \(h, c\).*tuple of length 1"),
        (
            lambda: (torch.zeros(2, 2, 5), torch.zeros(1, 2, 5)),
            r"expected h0 of shape .* = \[1, 2, 5\], but got \[2, 2, 5\]",
        ),
    ],
    ids=["tensor", "1-tuple", "h0-shape"],
)
def test_bad_state_is_a_clear_error(state, message):
    with pytest.raises(ValueError, match=message):
        lltm.LLTM(3, 5)(torch.randn(4, 2, 3), state())


def test_bad_sizes_are_clear_errors():
    with pytest.raises(ValueError, match="state_size must be an integer of at least 1"):
        lltm.LLTM(3, 0)
    with pytest.raises(ValueError, match=r"expected input with input_size = 3 features, but got 4"):
        lltm.LLTM(3, 5)(torch.randn(4, 2, 4))


def test_nn_lstm_positional_order_unbatched_input_and_flatten_parameters():
    """lltm.LLTM takes nn.LSTM's positional arguments (input_size, hidden_size, num_layers, bias,
    batch_first, dropout, bidirectional), 2-D unbatched input like nn.LSTM, and flatten_parameters()."""
    m = lltm.LLTM(10, 20, 2, False, True, 0.1, True)
    assert (m.num_layers, m.bias, m.batch_first, m.dropout, m.bidirectional) == (2, False, True, 0.1, True)
    assert m.bias_l0 is None
    m.eval().flatten_parameters()
    x = torch.randn(7, 10)
    out, (h, c) = m(x)
    batched, (hb, cb) = m(x.unsqueeze(0))  # batch_first: (1, T, I)
    assert out.shape == (7, 40) and h.shape == c.shape == (4, 20)
    torch.testing.assert_close(out, batched[0])
    torch.testing.assert_close((h, c), (hb[:, 0], cb[:, 0]))
    out2, _ = m(x, (h, c))  # unbatched states (num_layers * D, S)
    assert out2.shape == (7, 40)
