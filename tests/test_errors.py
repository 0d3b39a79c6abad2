"""Bad input gets a clear error that names the argument and the fix, on every
backend; never a crash or silent garbage."""

from __future__ import annotations

import os
import subprocess
import sys

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
    "input_1d": (
        0,
        torch.randn(I),
        ValueError,
        r"expected input to be a 2-D tensor \(batch, input_features\), but got a 1-D tensor of shape \[3\]",
    ),
    "wrong_features": (
        0,
        torch.randn(B, I + 2),
        ValueError,
        r"expected input with 3 input features \(weights.size\(1\) - state_size = 8 - 5\), but got input of shape \[4, 5\]",
    ),
    "weights_too_narrow": (
        1,
        torch.randn(3 * S, S - 1),
        ValueError,
        r"expected weights of shape \(3 \* state_size, state_size \+ input_features\) with state_size = 5, but got \[15, 4\]",
    ),
    "bias_2d": (
        2,
        torch.randn(2, 3 * S),
        ValueError,
        r"expected bias of shape \(3 \* state_size,\) or \(1, 3 \* state_size\), but got \[2, 15\]",
    ),
    "input_list": (
        0,
        [[0.0] * I] * B,
        TypeError,
        r"expected input to be a torch.Tensor \(batch, input_features\), but got list \(convert it with torch.as_tensor\)",
    ),
    "weights_ndarray": (1, "ndarray", TypeError, r"expected weights to be a torch.Tensor .*, but got ndarray"),
    "old_h_coo": (
        3,
        "coo",
        TypeError,
        r"expected old_h to be a dense \(strided\) tensor, but got layout torch.sparse_coo \(call .to_dense\(\)\)",
    ),
    "weights_csr": (
        1,
        "csr",
        TypeError,
        r"expected weights to be a dense \(strided\) tensor, but got layout torch.sparse_csr",
    ),
    "weights_not_3s": (
        1,
        torch.randn(14, S + I),
        ValueError,
        r"expected weights.size\(0\) to be 3 \* state_size, but got 14",
    ),
    "bias_shape": (
        2,
        torch.randn(3 * S + 1),
        ValueError,
        r"expected bias of shape \(3 \* state_size,\) = \[15\], but got \[16\]",
    ),
    "old_h_batch": (
        3,
        torch.randn(B + 1, S),
        ValueError,
        r"expected old_h of shape \(batch, state_size\) = \[4, 5\], but got \[5, 5\]",
    ),
    "old_cell_state": (
        4,
        torch.randn(B, S + 1),
        ValueError,
        r"expected old_cell of shape \(batch, state_size\) = \[4, 5\], but got \[4, 6\]",
    ),
    "old_cell_3d": (
        4,
        torch.randn(1, B, S),
        ValueError,
        r"expected old_cell to be a 2-D tensor \(batch, state_size\), but got a 3-D tensor",
    ),
    "dtype_mix": (
        1,
        torch.randn(3 * S, S + I, dtype=torch.float64),
        TypeError,
        r"expected weights to have dtype Float like input, but got Double \(cast all arguments to one dtype\)",
    ),
    "int_input": (
        0,
        torch.ones(B, I, dtype=torch.int64),
        TypeError,
        r"expected input of a floating dtype \(float32, float64, float16 or bfloat16\), but got Long",
    ),
}


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
@pytest.mark.parametrize("device,backend", backend_params(devices=["cpu"]))
@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_argument_message(device, backend, case):
    index, bad, exc, pattern = BAD[case]
    args = _args(device)
    if bad == "ndarray":
        bad = pytest.importorskip("numpy").asarray(args[index].cpu())
    elif bad in ("coo", "csr"):
        bad = args[index].to_sparse() if bad == "coo" else args[index].to_sparse_csr()
    elif isinstance(bad, torch.Tensor):
        bad = bad.to(device)
    args[index] = bad
    with pytest.raises(exc, match=pattern):
        functional.lltm_cell(*args, backend=backend)


@pytest.mark.parametrize("device,backend", backend_params(devices=["cpu"]))
def test_device_mix_message(device, backend):
    """A tensor on another device (meta stands in for a second device when no
    GPU is present; the CUDA suite covers cuda vs cpu)."""
    args = _args(device)
    args[3] = args[3].to("meta")
    with pytest.raises(
        RuntimeError,
        match=r"expected old_h on device (meta|cpu) like input, but got (cpu|meta) \(move all arguments to one device\)",
    ):
        functional.lltm_cell(*args, backend=backend)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
@pytest.mark.parametrize("backend", ["aten", "fused"])
def test_op_rejects_sparse_and_wrong_width_directly(backend):
    """The operators check too (called without lltm.functional): sparse CSR
    weights no longer pass forward to fail in backward."""
    if not lltm.backends("cpu")[backend]:
        pytest.skip(f"{backend} not available on cpu")
    op = getattr(torch.ops.lltm, f"{backend}_cell_forward")
    x, W, b, h, c = _args()
    with pytest.raises(TypeError, match=r"expected weights to be a dense \(strided\) tensor, but got layout Sparse"):
        op(x, W.to_sparse_csr(), b, h, c)
    with pytest.raises(ValueError, match=r"expected input with 3 input features"):
        op(torch.randn(B, I + 1), W, b, h, c)


def test_tutorial_backend_names_are_translated():
    with pytest.raises(ValueError, match=r"unknown backend 'cpp'.*The tutorial's 'cpp' backend is lltm's 'aten'"):
        functional.lltm_cell(*_args(), backend="cpp")
    with pytest.raises(ValueError, match=r"The tutorial's 'cuda' backend is lltm's 'fused'"):
        lltm.LLTMCell(3, 4, backend="cuda")
    with pytest.raises(ValueError, match=r"The tutorial's 'py' backend is lltm's 'python'"):
        lltm.LLTM(3, 4, backend="py")


@pytest.mark.parametrize("state", ["tensor", "1-tuple", "3-tuple"])
def test_module_state_not_a_pair(state):
    h = torch.zeros(2, 5)
    bad = {"tensor": h, "1-tuple": (h,), "3-tuple": (h, h, h)}[state]
    got = {"tensor": "Tensor", "1-tuple": "tuple of length 1", "3-tuple": "tuple of length 3"}[state]
    with pytest.raises(
        ValueError,
        match=rf"lltm.LLTMCell: expected state to be None or a tuple \(h, c\) of two tensors \(batch, state_size\), but got {got}$",
    ):
        lltm.LLTMCell(3, 5)(torch.randn(2, 3), bad)
    with pytest.raises(ValueError, match=rf"lltm.LLTM: expected state to be None or a tuple \(h, c\).*but got {got}$"):
        lltm.LLTM(3, 5)(torch.randn(4, 2, 3), bad)


@pytest.mark.parametrize("module", [lltm.LLTMCell, lltm.LLTM])
def test_module_bad_sizes(module):
    with pytest.raises(ValueError, match=r"state_size must be an integer of at least 1, got 0"):
        module(32, 0)
    with pytest.raises(ValueError, match=r"must be an integer of at least 0, got -1"):
        module(-1, 4)
    with pytest.raises(ValueError, match=r"state_size must be an integer of at least 1, got 2.5"):
        module(3, 2.5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a torch that cannot use CUDA")
def test_no_backend_on_an_unusable_device():
    assert lltm.backends("cuda") == {"python": False, "aten": False, "fused": False}


def test_unknown_backend():
    with pytest.raises(
        ValueError,
        match=r"unknown backend 'triton'; choose 'auto' or one of 'python', 'aten', 'fused' \(available on cpu: 'python'",
    ):
        functional.lltm_cell(*_args(), backend="triton")
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        lltm.LLTMCell(3, 4, backend="cuda")


def test_unavailable_backend_names_available_ones():
    """fused has kernels for CPU and CUDA only; meta tensors stand in for any other device."""
    with pytest.raises(
        RuntimeError,
        match=r"backend 'fused' is not available on meta; available: python, aten "
        r"\(its kernels are built for cpu and cuda devices only\)",
    ):
        functional.lltm_cell(*_args("meta"), backend="fused")


def test_module_input_rank():
    """3-D batched and 2-D unbatched input (nn.LSTM's conventions); anything else is a clear error."""
    with pytest.raises(
        ValueError,
        match=r"lltm.LLTM: expected input to be a 3-D tensor \(seq_len, batch, input_size\), a 2-D tensor \(seq_len, input_size\) \(unbatched\) or a PackedSequence, but got \[4\]",
    ):
        lltm.LLTM(3, 5)(torch.randn(4))
    with pytest.raises(ValueError, match=r"\(batch, seq_len, input_size\)"):
        lltm.LLTM(3, 5, batch_first=True)(torch.randn(1, 4, 3, 2))
    with pytest.raises(TypeError, match=r"lltm.LLTM: expected input to be a torch.Tensor .* but got list"):
        lltm.LLTM(3, 5)([[1.0, 2.0, 3.0]])


def test_module_state_shape():
    model = lltm.LLTM(3, 5, num_layers=2)
    x = torch.randn(4, 2, 3)
    h0 = torch.zeros(1, 2, 5)
    with pytest.raises(
        ValueError,
        match=r"expected h0 of shape \(num_layers \* num_directions, batch, state_size\) = \[2, 2, 5\], but got \[1, 2, 5\]",
    ):
        model(x, (h0, torch.zeros(2, 2, 5)))


def test_module_bad_hyperparameters():
    with pytest.raises(ValueError, match="num_layers must be at least 1"):
        lltm.LLTM(3, 5, num_layers=0)
    with pytest.raises(ValueError, match=r"dropout must be a probability in \[0, 1\]"):
        lltm.LLTM(3, 5, dropout=1.5)


def test_sequence_input_rank():
    x, W, b, h, c = _args()
    with pytest.raises(
        ValueError, match=r"expected input to be a 3-D tensor \(seq_len, batch, input_features\), but got \[4, 3\]"
    ):
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
    with pytest.raises(
        RuntimeError,
        match=r"compiled extension is not available \(no C\+\+ compiler found\); build it ahead of time with `pip install --no-build-isolation \.`",
    ):
        functional.lltm_cell(*_args(), backend="aten")
    assert lltm.backends("cpu") == {"python": True, "aten": False, "fused": False}
    h, c = functional.lltm_cell(*_args(), backend="auto")  # falls back to python
    assert h.shape == (B, S)


def test_cell_define_before_a_jit_build_loads_says_how_to_build():
    """lltm.cells.define(build=...) loads the extension first: with LLTM_JIT=1 `import lltm` loads
    nothing, and a build that cannot run (here a bad LLTM_JIT_OPT) is the extension's error saying
    how to build it, not a missing-operator AttributeError."""
    code = (
        "import torch, lltm\n"
        "try:\n"
        "    lltm.cells.define('no_extension', gates=1, states=('h',), forward='next[0] = zx[0];',\n"
        "                      backward='dzx[0] = dnext[0];', reference=lambda zx, zh, s: (zx[0],), build='cpu')\n"
        "except RuntimeError as exc:\n"
        "    print('RuntimeError:', exc)\n"
    )
    env = dict(os.environ, LLTM_JIT="1", LLTM_JIT_OPT="max")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RuntimeError: lltm: the compiled extension is not available (LLTM_JIT_OPT='max'" in proc.stdout
    assert "build it ahead of time" in proc.stdout


def test_bad_jit_opt_level_says_which_variable(monkeypatch):
    """A just-in-time build asked for with an optimisation level that is not one of 0-3 stops before
    compiling, with the variable's name in the error."""
    monkeypatch.setattr(_extension, "_mode", None)
    monkeypatch.setattr(_extension, "_error", None)
    monkeypatch.setenv("LLTM_JIT", "1")
    monkeypatch.setenv("LLTM_JIT_OPT", "max")

    def must_not_compile(self):
        raise AssertionError("compiled with a bad LLTM_JIT_OPT")

    monkeypatch.setattr(_extension._JitBuild, "compile_and_load", must_not_compile)
    monkeypatch.setattr(lltm._backends, "_cache", {})
    with pytest.raises(RuntimeError, match=r"not available \(LLTM_JIT_OPT='max': .* one of 0, 1, 2, 3\)"):
        functional.lltm_cell(*_args(), backend="aten")


@pytest.mark.parametrize(
    "make,error,message",
    [
        (lambda: lltm.LLTM(3, 5, 2.0), TypeError, r"lltm.LLTM: num_layers must be an int, got 2.0"),
        (lambda: lltm.LLTM(3, 5, "2"), TypeError, r"lltm.LLTM: num_layers must be an int, got '2'"),
        (
            lambda: lltm.LLTM(3, 5, 2, dropout=True),
            TypeError,
            r"dropout must be a float probability in \[0, 1\], got True",
        ),
        (lambda: lltm.LLTM(3, 5, batch_first="yes"), TypeError, r"lltm.LLTM: batch_first must be a bool, got 'yes'"),
        (lambda: lltm.LLTMCell(3, 5, bias=None), TypeError, r"lltm.LLTMCell: bias must be a bool, got None"),
    ],
)
def test_module_constructor_arguments_are_one_clear_line(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_module_inputs_that_are_not_tensors_and_the_callers_shape():
    """A list or an array into a module is a TypeError (as the README says), and a shape error names
    the shape the caller passed (batch_first: not the transposed one)."""
    import numpy as np

    for bad in ([[0.0, 1.0, 2.0]], np.zeros((2, 3), dtype=np.float32)):
        with pytest.raises(TypeError, match=r"lltm.LLTMCell: expected input to be a torch.Tensor"):
            lltm.LLTMCell(3, 5)(bad)
        with pytest.raises(TypeError, match=r"lltm.LLTM: expected input to be a torch.Tensor"):
            lltm.LLTM(3, 5)(bad)
    with pytest.raises(ValueError, match=r"input_size = 3 features, but got 2 \(input of shape \[4, 6, 2\]\)"):
        lltm.LLTM(3, 5, batch_first=True)(torch.randn(4, 6, 2))
