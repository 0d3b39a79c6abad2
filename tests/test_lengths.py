"""`lengths` of a layer: integer dtype, on the CPU or the input's device,
0 <= lengths[b] <= T, else an error naming the bad entry, on every backend:
the Python entry point (lltm.functional.lltm, hence lltm.LLTM), the python
backend, and the operators torch.ops.lltm.<backend>_seq_forward / _backward
called directly (these check the values on the CPU, where reading them is free)."""

from __future__ import annotations

import pytest
import torch

import lltm
from lltm import functional
from tests._helpers import COMPILED, HAS_CUDA, backend_params

T, B, I, S = 5, 3, 4, 6
BAD_VALUES = {
    "negative": ([5, -1, 2], 1, -1),
    "past_T": ([5, 2, 7], 2, 7),
    "beyond_int32": ([2**32 + 1, 2, 3], 0, 2**32 + 1),
}


def _args(device="cpu", dtype=torch.float64):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(T, B, I, generator=gen, dtype=dtype) - 0.5
    W = (torch.rand(3 * S, S + I, generator=gen, dtype=dtype) - 0.5) * S**-0.5
    b = torch.rand(3 * S, generator=gen, dtype=dtype) - 0.5
    h0 = torch.rand(B, S, generator=gen, dtype=dtype) - 0.5
    c0 = torch.rand(B, S, generator=gen, dtype=dtype) - 0.5
    return [t.to(device) for t in (x, W, b, h0, c0)]


def _message(row, value, steps=T):
    return rf"expected 0 <= lengths\[b\] <= seq_len = {steps} for every row b, but got lengths\[{row}\] = {value}"


@pytest.mark.parametrize("device,backend", backend_params(devices=["cpu"]))
@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_out_of_range_value_named(device, backend, case):
    values, row, value = BAD_VALUES[case]
    with pytest.raises(ValueError, match=_message(row, value)):
        functional.lltm(*_args(device), lengths=torch.tensor(values), backend=backend)


@pytest.mark.parametrize("device,backend", backend_params(devices=["cpu"]))
def test_bool_lengths_refused(device, backend):
    with pytest.raises(TypeError, match=r"expected lengths to be an integer tensor .* but got dtype Bool"):
        functional.lltm(*_args(device), lengths=torch.tensor([True, False, True]), backend=backend)


@pytest.mark.parametrize("device,backend", backend_params(devices=["cpu"]))
@pytest.mark.parametrize("bad", [[5.0, 2.0, 3.0], [5, 2, 3]], ids=["float_tensor", "list"])
def test_not_an_integer_tensor(device, backend, bad):
    lengths = torch.tensor(bad) if isinstance(bad[0], float) else bad
    with pytest.raises(TypeError, match="expected lengths to be"):
        functional.lltm(*_args(device), lengths=lengths, backend=backend)


@pytest.mark.parametrize("device,backend", backend_params(devices=["cpu"]))
def test_lengths_on_another_device_refused(device, backend):
    with pytest.raises(RuntimeError, match=r"expected lengths on the CPU or on device cpu like input, but got meta"):
        functional.lltm(*_args(device), lengths=torch.tensor([5, 2, 3], device="meta"), backend=backend)


@pytest.mark.parametrize("device,backend", backend_params(devices=["cpu"]))
@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8, torch.int64], ids=str)
def test_any_integer_dtype_same_result(device, backend, dtype):
    args = _args(device)
    expected = functional.lltm(*args, lengths=torch.tensor([5, 0, 3]), backend="python")
    got = functional.lltm(*args, lengths=torch.tensor([5, 0, 3], dtype=dtype), backend=backend)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("device,backend", backend_params(devices=["cpu"]))
def test_bounds_are_valid(device, backend):
    """0 and T are lengths (an empty row keeps h0, c0; a full row runs every step)."""
    args = _args(device)
    out, (h_n, c_n) = functional.lltm(*args, lengths=torch.tensor([0, T, 1]), backend=backend)
    torch.testing.assert_close(h_n[0], args[3][0])
    assert out[:, 0].abs().max() == 0


@pytest.mark.parametrize("backend", COMPILED)
@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_operator_called_directly_checks_cpu_values(backend, case):
    """The C++ check: the CPU operators read the values (free there)."""
    values, row, value = BAD_VALUES[case]
    x, W, b, h0, c0 = _args()
    lengths = torch.tensor(values)
    forward = getattr(torch.ops.lltm, f"{backend}_seq_forward")
    with pytest.raises(ValueError, match=rf"lltm::{backend}_seq_forward: " + _message(row, value)):
        forward(x, W, b, h0, c0, lengths)
    # The backward operator checks them as well.
    output, h_n, c_n, gates = forward(x, W, b, h0, c0, torch.tensor([5, 2, 3]))
    backward = getattr(torch.ops.lltm, f"{backend}_seq_backward")
    with pytest.raises(ValueError, match=_message(row, value)):
        backward(output, None, None, x, W, h0, c0, output, gates, lengths, [True] * 5)


@pytest.mark.parametrize("backend", COMPILED)
def test_operator_called_directly_dtype(backend):
    x, W, b, h0, c0 = _args()
    forward = getattr(torch.ops.lltm, f"{backend}_seq_forward")
    with pytest.raises(TypeError, match=r"expected lengths of dtype Long \(int64\), but got Bool"):
        forward(x, W, b, h0, c0, torch.tensor([True, False, True]))
    with pytest.raises(TypeError, match=r"but got Int \(convert it with lengths.to\(torch.int64\)\)"):
        forward(x, W, b, h0, c0, torch.tensor([5, 2, 3], dtype=torch.int32))


@pytest.mark.parametrize("device,backend", backend_params(devices=["cpu"]))
def test_module_packed_sequence_unchanged(device, backend):
    """lltm.LLTM hands the lengths of a PackedSequence to lltm.functional.lltm: still accepted."""
    torch.manual_seed(0)
    model = lltm.LLTM(I, S, backend=backend, bidirectional=True, dtype=torch.float64)
    seqs = [torch.randn(n, I, dtype=torch.float64) for n in (5, 1, 3)]
    packed = torch.nn.utils.rnn.pack_sequence(seqs, enforce_sorted=False)
    out, (h_n, _) = model(packed)
    for k, s in enumerate(seqs):  # each sequence alone gives the same final state
        _, (h_k, _) = model(s.unsqueeze(1))
        torch.testing.assert_close(h_n[:, k], h_k[:, 0])


@pytest.mark.parametrize("backend", COMPILED)
def test_compiled_graph_checks_values_at_run_time(backend):
    """torch.compile traces no value check (data-dependent; fullgraph holds),
    and the CPU operator still refuses bad values when the graph runs."""
    if not lltm._backends.is_available(backend, "cpu", "seq"):
        pytest.skip(f"{backend} has no sequence operators on cpu")

    def f(x, W, b, h0, c0, lengths):
        return functional.lltm(x, W, b, h0, c0, lengths=lengths, backend=backend)[0]

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    args = _args()
    torch.testing.assert_close(compiled(*args, torch.tensor([5, 2, 3])), f(*args, torch.tensor([5, 2, 3])))
    with pytest.raises(ValueError, match=_message(2, 7)):
        compiled(*args, torch.tensor([5, 2, 7]))


@pytest.mark.parametrize("device,backend", backend_params(devices=["cpu"]))
def test_vmapped_lengths_checked(device, backend):
    args = _args(device)
    lengths = torch.tensor([[5, 2, 3], [1, 9, 0]])

    def f(lengths):
        return functional.lltm(*args, lengths=lengths, backend=backend)[0]

    with pytest.raises(ValueError, match=r"but got an entry of lengths = 9"):
        torch.vmap(f)(lengths)


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("backend", COMPILED)
def test_cuda_lengths_checked_by_the_entry_point(backend):
    args = _args("cuda", torch.float32)
    for lengths in (torch.tensor([5, 2, 7]), torch.tensor([5, 2, 7], device="cuda")):
        with pytest.raises(ValueError, match=_message(2, 7)):
            functional.lltm(*args, lengths=lengths, backend=backend)


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("backend", COMPILED)
def test_cuda_graph_capture_does_not_read_lengths(backend):
    """Inside a CUDA graph capture the values are not read (it would break the capture)."""
    args = _args("cuda", torch.float32)
    lengths = torch.tensor([5, 2, 3], device="cuda")
    expected, _ = functional.lltm(*args, lengths=lengths, backend=backend)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the capture
        functional.lltm(*args, lengths=lengths, backend=backend)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _ = functional.lltm(*args, lengths=lengths, backend=backend)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected)
