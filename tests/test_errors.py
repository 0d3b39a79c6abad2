"""Bad input gets a clear error that names the argument and the fix, on every
backend; never a crash or silent garbage."""

from __future__ import annotations

import pytest
import torch

import lltm
from lltm import _extension, functional

from ._helpers import backend_params, make_inputs

B, I, S = 4, 3, 5


def _args(device="cpu", **kw):
    return list(make_inputs(B, I, S, device=device, requires_grad=False, **kw))


BAD = {
    # name: (argument index, replacement, exception, message regex)
    "input_1d": (0, torch.randn(I), ValueError, r"expected input to be a 2-D tensor \(batch, input_features\), but got a 1-D tensor of shape \[3\]"),
    "wrong_features": (0, torch.randn(B, I + 2), ValueError, r"expected input with 3 input features \(weights.size\(1\) - state_size = 8 - 5\), but got input of shape \[4, 5\]"),
    "weights_not_3s": (1, torch.randn(14, S + I), ValueError, r"expected weights.size\(0\) to be 3 \* state_size, but got 14"),
    "bias_shape": (2, torch.randn(3 * S + 1), ValueError, r"expected bias of shape \(3 \* state_size,\) = \[15\], but got \[16\]"),
    "old_h_batch": (3, torch.randn(B + 1, S), ValueError, r"expected old_h of shape \(batch, state_size\) = \[4, 5\], but got \[5, 5\]"),
    "old_cell_state": (4, torch.randn(B, S + 1), ValueError, r"expected old_cell of shape \(batch, state_size\) = \[4, 5\], but got \[4, 6\]"),
    "old_cell_3d": (4, torch.randn(1, B, S), ValueError, r"expected old_cell to be a 2-D tensor \(batch, state_size\), but got a 3-D tensor"),
    "dtype_mix": (1, torch.randn(3 * S, S + I, dtype=torch.float64), TypeError, r"expected weights to have dtype Float like input, but got Double \(cast all arguments to one dtype\)"),
    "int_input": (0, torch.ones(B, I, dtype=torch.int64), TypeError, r"expected input of a floating dtype \(float32, float64, float16 or bfloat16\), but got Long"),
}


@pytest.mark.parametrize("device,backend", backend_params(devices=["cpu"]))
@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_argument_message(device, backend, case):
    index, bad, exc, pattern = BAD[case]
    args = _args(device)
    args[index] = bad.to(device)
    with pytest.raises(exc, match=pattern):
        functional.lltm_cell(*args, backend=backend)


@pytest.mark.parametrize("device,backend", backend_params(devices=["cpu"]))
def test_device_mix_message(device, backend):
    """A tensor on another device (meta stands in for a second device when no
    GPU is present; the CUDA suite covers cuda vs cpu)."""
    args = _args(device)
    args[3] = args[3].to("meta")
    with pytest.raises(RuntimeError, match=r"expected old_h on device (meta|cpu) like input, but got (cpu|meta) \(move all arguments to one device\)"):
        functional.lltm_cell(*args, backend=backend)


def test_unknown_backend():
    with pytest.raises(ValueError, match=r"unknown backend 'triton'; choose 'auto' or one of 'python', 'aten', 'fused' \(available on cpu: 'python'"):
        functional.lltm_cell(*_args(), backend="triton")
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        lltm.LLTMCell(3, 4, backend="cuda")


def test_unavailable_backend_names_available_ones():
    """fused has kernels for CPU and CUDA only; meta tensors stand in for any other device."""
    with pytest.raises(RuntimeError, match=r"backend 'fused' is not available on meta; available: python, aten "
                       r"\(the fused kernels are built for CPU and CUDA devices only\)"):
        functional.lltm_cell(*_args("meta"), backend="fused")


def test_module_input_rank():
    with pytest.raises(ValueError, match=r"lltm.LLTM: expected input to be a 3-D tensor \(seq_len, batch, input_size\), but got shape \[4, 3\]"):
        lltm.LLTM(3, 5)(torch.randn(4, 3))
    with pytest.raises(ValueError, match=r"\(batch, seq_len, input_size\)"):
        lltm.LLTM(3, 5, batch_first=True)(torch.randn(4, 3))


def test_module_state_shape():
    model = lltm.LLTM(3, 5, num_layers=2)
    x = torch.randn(4, 2, 3)
    h0 = torch.zeros(1, 2, 5)
    with pytest.raises(ValueError, match=r"expected h0 of shape \(num_layers, batch, state_size\) = \[2, 2, 5\], but got \[1, 2, 5\]"):
        model(x, (h0, torch.zeros(2, 2, 5)))


def test_module_bad_hyperparameters():
    with pytest.raises(ValueError, match="num_layers must be at least 1"):
        lltm.LLTM(3, 5, num_layers=0)
    with pytest.raises(ValueError, match=r"dropout must be a probability in \[0, 1\]"):
        lltm.LLTM(3, 5, dropout=1.5)


def test_sequence_input_rank():
    x, W, b, h, c = _args()
    with pytest.raises(ValueError, match=r"expected input to be a 3-D tensor \(seq_len, batch, input_features\), but got \[4, 3\]"):
        functional.lltm(x, W, b, h, c)


def test_missing_extension_says_how_to_build(monkeypatch):
    """When neither the prebuilt extension nor a JIT build is possible, asking
    for a compiled backend says how to build it; python still works."""
    monkeypatch.setattr(_extension, "_mode", None)
    monkeypatch.setattr(_extension, "_error", None)
    monkeypatch.setenv("LLTM_JIT", "1")

    def no_compiler():
        raise OSError("no C++ compiler found")

    monkeypatch.setattr(_extension, "_load_jit", no_compiler)
    monkeypatch.setattr(lltm._backends, "_cache", {})
    with pytest.raises(RuntimeError, match=r"compiled extension is not available \(no C\+\+ compiler found\); build it ahead of time with `pip install --no-build-isolation \.`"):
        functional.lltm_cell(*_args(), backend="aten")
    assert lltm.backends("cpu") == {"python": True, "aten": False, "fused": False}
    h, c = functional.lltm_cell(*_args(), backend="auto")  # falls back to python
    assert h.shape == (B, S)
