"""The sequence operators (one layer over T steps in one operator) against
the per-step float64 reference: forward, every gradient, variable lengths,
gradcheck, opcheck, torch.compile with a dynamic T, and bad input."""

from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

import lltm
from lltm import functional
from lltm.reference import lltm_reference

from ._helpers import COMPILED, DEVICES, backend_params

NAMES = ("input", "weights", "bias", "h0", "c0")


def make_seq(T, B, I, S, *, device="cpu", dtype=torch.float64, seed=0, bias=True, requires_grad=True):
    """Fresh random layer arguments (input, weights, bias, h0, c0), uniform in
    [-1, 1) (weights scaled like the module's init, times 2 so that every
    gate regime is exercised)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        t = (torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1) * scale
        return t.to(device=device, dtype=dtype).requires_grad_(requires_grad)

    x = rand(T, B, I)
    W = rand(3 * S, S + I, scale=max(S, 1) ** -0.5 * 2)
    b = rand(3 * S) if bias else None
    return x, W, b, rand(B, S), rand(B, S)


def _loss_grads(run, args, outs_grads, wanted):
    out, (h_n, c_n) = run(*args)
    terms = [(t * g).sum() for t, g in zip((out, h_n, c_n), outs_grads) if g is not None]
    grads = torch.autograd.grad(sum(terms), [args[NAMES.index(n)] for n in wanted], allow_unused=True)
    return (out, h_n, c_n), grads


def _check(backend, args, *, lengths=None, loss_on=("output", "h_n", "c_n"), wanted=NAMES, tol=1e-10, seed=1):
    """Outputs and the gradients of `wanted` under a random linear loss on
    `loss_on` equal the float64 reference's, compared on the CPU."""
    x = args[0]
    T, B, _ = x.shape
    S = args[3].shape[1]
    gen = torch.Generator().manual_seed(seed)
    shapes = {"output": (T, B, S), "h_n": (B, S), "c_n": (B, S)}
    outs_grads = [
        torch.randn(shapes[k], generator=gen, dtype=torch.float64) if k in loss_on else None
        for k in ("output", "h_n", "c_n")
    ]
    wanted = [n for n in wanted if args[NAMES.index(n)] is not None]

    def ours(*a):
        return functional.lltm(*a, lengths=lengths, backend=backend)

    dev_grads = [None if g is None else g.to(x.device, x.dtype) for g in outs_grads]
    got_out, got_grads = _loss_grads(ours, args, dev_grads, wanted)
    ref_args = [None if a is None else a.detach().double().cpu().requires_grad_() for a in args]
    ref_len = None if lengths is None else lengths.cpu()
    want_out, want_grads = _loss_grads(lambda *a: lltm_reference(*a, lengths=ref_len), ref_args, outs_grads, wanted)
    for what, got, want in (("outputs", got_out, want_out), ("grads", got_grads, want_grads)):
        for name, g, w in zip(wanted if what == "grads" else ("output", "h_n", "c_n"), got, want):
            if w is None:  # unused by the reference (T = 0): ours must be zeros
                w = torch.zeros_like(args[NAMES.index(name)].detach().double().cpu())
                if g is None and backend == "python":  # the reference itself
                    continue
            assert g is not None, f"{what} {name}: missing"
            assert g.shape == w.shape, f"{what} {name}: shape {tuple(g.shape)} != {tuple(w.shape)}"
            torch.testing.assert_close(
                g.detach().double().cpu(), w, rtol=tol, atol=tol, msg=lambda m: f"{what} {name}: {m}"
            )
    return got_out


# (T, B, I, S): small, one step, batch 0, a state not a multiple of any
# vector width, a long sequence.
SHAPES = [(5, 3, 4, 6), (1, 2, 3, 5), (7, 4, 5, 17), (7, 0, 3, 4), (3, 1, 1, 1)]


@pytest.mark.parametrize("device,backend", backend_params())
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_matches_reference(device, backend, shape, bias):
    args = make_seq(*shape, device=device, bias=bias, seed=sum(shape))
    out = _check(backend, args)[0]
    assert out.is_contiguous() or backend == "python"


@pytest.mark.parametrize("device,backend", backend_params())
@pytest.mark.parametrize("dtype", [torch.float32], ids=["float32"])
def test_float32_matches_reference(device, backend, dtype):
    _check(backend, make_seq(9, 4, 6, 10, device=device, dtype=dtype), tol=2e-5)


@pytest.mark.parametrize("device,backend", backend_params())
@pytest.mark.parametrize("loss_on", ["output", "h_n", "c_n"])
def test_loss_on_one_output(device, backend, loss_on):
    """The other two output gradients are undefined and count as zero."""
    _check(backend, make_seq(6, 3, 4, 5, device=device), loss_on=(loss_on,))


@pytest.mark.parametrize("device,backend", backend_params())
@pytest.mark.parametrize("which", NAMES)
def test_one_argument_needs_grad(device, backend, which):
    args = make_seq(5, 3, 4, 5, device=device, requires_grad=False)
    args = [a.requires_grad_() if n == which else a for n, a in zip(NAMES, args)]
    _check(backend, args, wanted=(which,))


@pytest.mark.parametrize("device,backend", backend_params())
def test_zero_steps_passes_the_state(device, backend):
    x, W, b, h0, c0 = make_seq(0, 3, 4, 5, device=device)
    out, (h_n, c_n) = functional.lltm(x, W, b, h0, c0, backend=backend)
    assert out.shape == (0, 3, 5)
    assert torch.equal(h_n, h0) and torch.equal(c_n, c0)
    _check(backend, (x, W, b, h0, c0))


@pytest.mark.parametrize("device,backend", backend_params(backends=COMPILED))
def test_long_sequence(device, backend):
    """T = 1000: no drift between the fused loop and the reference."""
    _check(backend, make_seq(1000, 2, 3, 4, device=device), tol=1e-9)


@pytest.mark.parametrize("device,backend", backend_params())
@pytest.mark.parametrize(
    "lengths", [[7, 0, 3, 5], [1, 1, 1, 1], [7, 7, 7, 7], [2, 7, 7, 4]], ids=["mixed", "ones", "full", "unsorted"]
)
def test_variable_lengths(device, backend, lengths):
    """Rows past their length keep their state and output 0, forward and
    backward, as running each row alone at its own length."""
    args = make_seq(7, 4, 3, 5, device=device)
    lengths = torch.tensor(lengths, device=device)
    out, h_n, c_n = (t.detach() for t in _check(backend, args, lengths=lengths))
    x, W, b, h0, c0 = (None if a is None else a.detach() for a in args)
    for row, n in enumerate(lengths.tolist()):
        alone, (h, c) = lltm_reference(x[:n, row : row + 1], W, b, h0[row : row + 1], c0[row : row + 1])
        torch.testing.assert_close(out[:n, row : row + 1], alone)
        torch.testing.assert_close((h_n[row : row + 1], c_n[row : row + 1]), (h, c))
        assert (out[n:, row] == 0).all()


@pytest.mark.parametrize("device,backend", backend_params())
def test_non_contiguous_inputs(device, backend):
    """Time-major view of a batch-first tensor, transposed weights, strided
    bias and state."""
    T, B, I, S = 5, 4, 3, 6
    x, W, b, h0, c0 = make_seq(T, B, I, S, device=device, requires_grad=False)
    x_nc = x.transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()
    W_nc = W.t().contiguous().t().requires_grad_()
    b_nc = torch.stack([b, b], 1)[:, 0].requires_grad_()
    h_nc = h0.t().contiguous().t().requires_grad_()
    c_nc = torch.cat([c0, c0], 1)[:, S:].requires_grad_()
    args = (x_nc, W_nc, b_nc, h_nc, c_nc)
    assert not any(a.is_contiguous() for a in args)
    _check(backend, args)


@pytest.mark.parametrize("device,backend", backend_params(backends=COMPILED))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("lengths", [None, [3, 1, 0]], ids=["full", "lengths"])
def test_gradcheck(device, backend, bias, lengths):
    x, W, b, h0, c0 = make_seq(3, 3, 2, 4, device=device, bias=bias)
    lens = None if lengths is None else torch.tensor(lengths, device=device)

    def fn(x, W, h0, c0, *b):
        out, (h_n, c_n) = functional.lltm(x, W, b[0] if b else None, h0, c0, lengths=lens, backend=backend)
        return out, h_n, c_n

    args = (x, W, h0, c0) + ((b,) if bias else ())
    assert torch.autograd.gradcheck(fn, args)


def _seq_op(backend, direction):
    return getattr(torch.ops.lltm, f"{backend}_seq_{direction}").default


OPCHECK_SHAPES = [(4, 3, 2, 5), (0, 2, 3, 4), (3, 0, 2, 3), (1, 1, 1, 1)]


@pytest.mark.parametrize("device,backend", backend_params(backends=COMPILED))
@pytest.mark.parametrize("shape", OPCHECK_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("variant", ["bias", "nobias", "lengths"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_opcheck_forward(device, backend, shape, variant, dtype):
    if not lltm._backends.is_available(backend, device, "seq"):
        pytest.skip(f"{backend} has no sequence operators on {device}")
    x, W, b, h0, c0 = make_seq(*shape, device=device, dtype=dtype, bias=variant != "nobias")
    B = shape[1]
    lengths = torch.arange(B, device=device) % (shape[0] + 1) if variant == "lengths" else None
    opcheck(_seq_op(backend, "forward"), (x, W, b, h0, c0, lengths))


@pytest.mark.parametrize("device,backend", backend_params(backends=COMPILED))
@pytest.mark.parametrize("shape", OPCHECK_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("grads", ["all", "output", "state"])
@pytest.mark.parametrize(
    "mask",
    [[True] * 5, [False, True, True, False, False], [True, False, False, True, True]],
    ids=["all", "params", "inputs"],
)
def test_opcheck_backward(device, backend, shape, grads, mask):
    if not lltm._backends.is_available(backend, device, "seq"):
        pytest.skip(f"{backend} has no sequence operators on {device}")
    T, B, _, S = shape
    x, W, b, h0, c0 = make_seq(*shape, device=device, requires_grad=False)
    lengths = torch.arange(B, device=device) % (T + 1) if grads == "state" else None
    out, _, _, gates = _seq_op(backend, "forward")(x, W, b, h0, c0, lengths)

    def rand(*s):
        return torch.randn(*s, dtype=torch.float64, device=device)

    g_out = rand(T, B, S) if grads in ("all", "output") else None
    g_h = rand(B, S) if grads in ("all", "state") else None
    g_c = rand(B, S) if grads in ("all", "state") else None
    args = (g_out, g_h, g_c, x, W, h0, c0, out, gates, lengths, mask)
    opcheck(_seq_op(backend, "backward"), args)
    for t, asked in zip(_seq_op(backend, "backward")(*args), mask):
        assert asked or t.shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", COMPILED)
def test_layout_matches_fake(device, backend):
    """Shapes and strides of the real outputs are those of the fake kernel."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not lltm._backends.is_available(backend, device, "seq"):
        pytest.skip(f"{backend} has no sequence operators on {device}")
    args = make_seq(4, 3, 2, 5, device=device, requires_grad=False) + (None,)
    real = _seq_op(backend, "forward")(*args)
    with FakeTensorMode() as mode:
        fake = _seq_op(backend, "forward")(*[None if a is None else mode.from_tensor(a) for a in args])
    for r, f in zip(real, fake):
        assert r.shape == f.shape and r.stride() == f.stride() and r.dtype == f.dtype


@pytest.mark.parametrize("device,backend", backend_params(backends=COMPILED))
def test_saves_no_cell_states(device, backend):
    """Backward recomputes the cell states from c0 and the gates: a layer
    saves input, weights, h0, c0, output and gates, nothing of (T, B, S)
    besides the output."""
    if not lltm._backends.is_available(backend, device, "seq"):
        pytest.skip(f"{backend} has no sequence operators on {device}")
    T, B, I, S = 6, 3, 4, 5
    args = make_seq(T, B, I, S, device=device)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out, _ = functional.lltm(*args, backend=backend)
    shapes = sorted(tuple(t.shape) for t in saved)
    assert shapes == sorted([(T, B, I), (3 * S, S + I), (B, S), (B, S), (T, B, S), (T, B, 3 * S)]), shapes
    assert any(t is out or t.data_ptr() == out.data_ptr() for t in saved)


@pytest.mark.parametrize("device,backend", backend_params(backends=COMPILED))
def test_one_autograd_node_per_layer(device, backend):
    """Whatever T, a layer's output hangs off one lltm node, whose inputs
    are the parameters and the state, not T per-step nodes."""
    if not lltm._backends.is_available(backend, device, "seq"):
        pytest.skip(f"{backend} has no sequence operators on {device}")
    model = lltm.LLTM(3, 4, num_layers=2, backend=backend, device=device)
    for T in (1, 50):
        out, (h_n, c_n) = model(torch.randn(T, 2, 3, device=device))
        nodes, stack = set(), [out.grad_fn, h_n.grad_fn, c_n.grad_fn]
        while stack:
            fn = stack.pop()
            if fn is None or fn in nodes:
                continue
            nodes.add(fn)
            stack.extend(f for f, _ in fn.next_functions)
        lltm_nodes = [n for n in nodes if "SeqFunction" in n.name()]
        assert len(lltm_nodes) == 2, sorted(n.name() for n in nodes)
        assert len(nodes) < 20  # a handful of stack/select/accumulate nodes, not O(T)


@pytest.mark.parametrize("device,backend", backend_params())
def test_compile_dynamic_length_one_graph(device, backend):
    """compile(dynamic=True) of an LLTM model: one graph serves every
    sequence length (no recompilation per T), results equal eager."""
    from torch._dynamo.testing import CompileCounterWithBackend

    if backend == "python":
        pytest.skip("the python backend loops over T in Python: one graph per length by design")
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    model = lltm.LLTM(3, 4, num_layers=2, backend=backend, device=device, dtype=torch.float64)
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    frames = None
    for T in (2, 5, 9, 13, 20, 31, 40, 64, 100, 7):
        x = torch.randn(T, 3, 3, device=device, dtype=torch.float64, requires_grad=True)
        out, (h_n, c_n) = compiled(x)
        ref, (rh, rc) = model(x)
        torch.testing.assert_close((out, h_n, c_n), (ref, rh, rc))
        gx = torch.autograd.grad(out.sum() + c_n.sum(), x)[0]
        rx = torch.autograd.grad(ref.sum() + rc.sum(), x)[0]
        torch.testing.assert_close(gx, rx)
        frames = counter.frame_count if frames is None else frames
    assert counter.frame_count == frames, "recompiled for a new sequence length"
    graph = "\n".join(str(g.graph) for g in counter.graphs)
    assert f"lltm.{backend}_seq_forward" in graph


SEQ_BAD = {
    # name: (argument index, replacement, exception, message regex)
    "input_2d": (
        0,
        torch.randn(3, 4),
        ValueError,
        r"expected input to be a 3-D tensor \(seq_len, batch, input_features\)",
    ),
    "wrong_features": (0, torch.randn(5, 3, 6), ValueError, r"expected input with 4 input features"),
    "h0_batch": (
        3,
        torch.randn(2, 5),
        ValueError,
        r"expected h0 of shape \(batch, state_size\) = \[3, 5\], but got \[2, 5\]",
    ),
    "c0_state": (
        4,
        torch.randn(3, 6),
        ValueError,
        r"expected c0 of shape \(batch, state_size\) = \[3, 5\], but got \[3, 6\]",
    ),
    "dtype_mix": (
        1,
        torch.randn(15, 9, dtype=torch.float32),
        TypeError,
        r"expected weights to have dtype Double like input, but got Float",
    ),
}


@pytest.mark.parametrize("device,backend", backend_params(devices=["cpu"]))
@pytest.mark.parametrize("case", list(SEQ_BAD), ids=list(SEQ_BAD))
def test_bad_argument_message(device, backend, case):
    index, bad, exc, pattern = SEQ_BAD[case]
    args = list(make_seq(5, 3, 4, 5, device=device, requires_grad=False))
    args[index] = bad.to(device=device, dtype=bad.dtype if case == "dtype_mix" else torch.float64)
    with pytest.raises(exc, match=pattern):
        functional.lltm(*args, backend=backend)


@pytest.mark.parametrize("device,backend", backend_params(devices=["cpu"]))
def test_bad_lengths(device, backend):
    args = make_seq(5, 3, 4, 5, device=device, requires_grad=False)
    with pytest.raises(ValueError, match=r"expected lengths of shape \(batch,\) = \[3\], but got \[2\]"):
        functional.lltm(*args, lengths=torch.tensor([1, 2]), backend=backend)
    with pytest.raises(TypeError, match="expected lengths to be an integer tensor"):
        functional.lltm(*args, lengths=torch.tensor([1.0, 2.0, 3.0]), backend=backend)


@pytest.mark.parametrize("device,backend", backend_params(devices=["cpu"]))
def test_device_mix_message(device, backend):
    args = list(make_seq(4, 3, 2, 5, device=device, requires_grad=False))
    args[3] = args[3].to("meta")
    with pytest.raises(RuntimeError, match=r"expected h0 on device (meta|cpu) like input, but got (cpu|meta)"):
        functional.lltm(*args, backend=backend)


@pytest.mark.parametrize("device,backend", backend_params(backends=COMPILED))
def test_double_backward_is_a_clear_error(device, backend):
    """Gradients taken with create_graph=True can be used, but differentiating
    them again raises an lltm error that points to backend='python'."""
    x, W, b, h0, c0 = make_seq(3, 2, 3, 4, device=device)
    out, _ = functional.lltm(x, W, b, h0, c0, backend=backend)
    (gW,) = torch.autograd.grad(out.sum(), W, create_graph=True)
    ref_out, _ = lltm_reference(x, W, b, h0, c0)
    (rW,) = torch.autograd.grad(ref_out.sum(), W)
    torch.testing.assert_close(gW.detach(), rW)
    with pytest.raises(RuntimeError, match=rf"backend '{backend}' does not support double backward.*backend='python'"):
        gW.sum().backward()
    cell_args = [x[0], W, b, h0, c0]
    new_h, _ = functional.lltm_cell(*cell_args, backend=backend)
    (gx,) = torch.autograd.grad(new_h.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="does not support double backward"):
        gx.sum().backward()


# ---------------------------------------------------------------- CUDA only

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _rel_err(a, ref):
    a, ref = a.detach().double().cpu(), ref.detach().double().cpu()
    return ((a - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _outputs_and_grads(fn, args, lengths=None, seed=3):
    """(output, h_n, c_n, grad of every argument that requires one) under a fixed random loss."""
    gen = torch.Generator().manual_seed(seed)
    out, (h_n, c_n) = fn(*args, lengths=lengths)
    weights = [torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.device, t.dtype) for t in (out, h_n, c_n)]
    loss = sum((t * w).float().sum() for t, w in zip((out, h_n, c_n), weights))
    leaves = [a for a in args if a is not None and a.requires_grad]
    return (out, h_n, c_n) + torch.autograd.grad(loss, leaves)


def _python_trajectory(x, W, b, h0, c0, lengths):
    """The python backend's forward in x's dtype, replayed with its own ops: (output, activated gates),
    gates 0 past a row's length, as the sequence operators save them."""
    h, c, outs, gates = h0, c0, [], []
    S = h0.shape[1]
    for t in range(x.shape[0]):
        pre = torch.nn.functional.linear(torch.cat([h, x[t]], dim=1), W, b)
        g = torch.cat(
            [torch.sigmoid(pre[:, :S]), torch.sigmoid(pre[:, S : 2 * S]), torch.nn.functional.elu(pre[:, 2 * S :])],
            dim=1,
        )
        new_h, new_c = lltm.reference.lltm_cell_reference(x[t], W, b, h, c)
        inside = (lengths > t).unsqueeze(1)
        h, c = torch.where(inside, new_h, h), torch.where(inside, new_c, c)
        outs.append(torch.where(inside, new_h, torch.zeros_like(new_h)))
        gates.append(torch.where(inside, g, torch.zeros_like(g)))
    return torch.stack(outs), torch.stack(gates)


def _backward64(trajectory, args, lengths, out_grads):
    """The float64 backward along a float32 forward's trajectory (the exact gradients of the steps that
    forward took, whatever its rounding): aten's backward operator on everything upcast."""
    x, W, b, h0, c0 = (a.detach().double() for a in args)
    out, gates = (t.double() for t in trajectory)
    return torch.ops.lltm.aten_seq_backward(
        *(g.double() for g in out_grads), x, W, h0, c0, out, gates, lengths, [True] * 5
    )


@pytest.mark.parametrize("device", DEVICES)
def test_aten_long_float32_backward_within_twice_plain_pytorch(device, capsys):
    """T = 3000, B = 8, S = 64, with lengths, float32. The gradients of each backend along its own forward
    trajectory, against the float64 backward along that same trajectory: aten's error is at most twice
    the python backend's, on the same device, in the same process (matmul precision torch's default: no
    TF32). This is where the recomputed cell states (seq_cells: the forward's rounding, bit for bit) and
    the reduction order (one GEMM / sum over all T*B rows) would show.

    The whole error against a float64 forward and backward is printed, not judged: over 3000 steps the
    cell state grows to ~1e3, the gradients of the first steps to ~1e4, and the trajectory's own float32
    rounding decides that error, which moves ~10x either way with the seed, between any two
    implementations (python's included) of the same float32 math."""
    if not lltm._backends.is_available("aten", device, "seq"):
        pytest.skip(f"aten has no sequence operators on {device}")
    assert torch.get_float32_matmul_precision() == "highest"
    args = make_seq(3000, 8, 32, 64, device=device, dtype=torch.float32, seed=6)
    lengths = torch.tensor([3000, 2999, 1500, 1, 0, 2500, 3000, 17], device=device)
    gen = torch.Generator().manual_seed(7)
    out_grads = [torch.randn(shape, generator=gen).to(device) for shape in ((3000, 8, 64), (8, 64), (8, 64))]
    x, W, b, h0, c0 = (a.detach() for a in args)
    names = NAMES

    def errors(got, ref):
        return [_rel_err(g, r) for g, r in zip(got, ref)]

    # aten: its forward operator's trajectory and its backward operator
    out, h_n, c_n, gates = torch.ops.lltm.aten_seq_forward(x, W, b, h0, c0, lengths)
    got_aten = torch.ops.lltm.aten_seq_backward(*out_grads, x, W, h0, c0, out, gates, lengths, [True] * 5)
    err_aten = errors(got_aten, _backward64((out, gates), args, lengths, out_grads))
    # python: autograd through its forward, and that forward's trajectory replayed
    leaves = [a.detach().requires_grad_() for a in args]
    py_out, (py_h, py_c) = functional.lltm(*leaves, lengths=lengths, backend="python")
    got_py = torch.autograd.grad((py_out, py_h, py_c), leaves, out_grads)
    trajectory = _python_trajectory(x, W, b, h0, c0, lengths)
    assert torch.equal(trajectory[0], py_out.detach())
    err_py = errors(got_py, _backward64(trajectory, args, lengths, out_grads))

    # for the record: the whole error, forward and backward, against float64
    up = [a.double().requires_grad_() for a in args]
    ref_out, (ref_h, ref_c) = functional.lltm(*up, lengths=lengths, backend="python")
    ref = torch.autograd.grad((ref_out, ref_h, ref_c), up, [g.double() for g in out_grads])
    whole = {"aten": errors(got_aten, ref), "python": errors(got_py, ref)}
    table = "\n".join(
        f"  {n:>7}: backward along its trajectory aten {ea:.1e} python {ep:.1e}; whole aten {wa:.1e} python {wp:.1e}"
        for n, ea, ep, wa, wp in zip(names, err_aten, err_py, whole["aten"], whole["python"])
    )
    with capsys.disabled():
        print(f"\nT=3000 float32 on {device}, relative errors against float64:\n{table}")
    for name, ea, ep in zip(names, err_aten, err_py):
        assert ea <= 2 * ep + 1e-7, f"{name}: aten's backward error {ea:.2e} > 2 x python's {ep:.2e}\n{table}"


@cuda_only
@pytest.mark.parametrize("backend", COMPILED)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("lengths", [None, [20, 3, 11, 0]], ids=["full", "lengths"])
@pytest.mark.parametrize("path", ["auto", "loop"])
def test_half_precision_within_twice_plain_pytorch(monkeypatch, backend, dtype, lengths, path):
    """The error against float64 is at most twice that of the per-step
    PyTorch reference run in the same dtype; every output is written."""
    if not lltm._backends.is_available(backend, "cuda", "seq"):
        pytest.skip(f"{backend} has no sequence operators on cuda")
    if path == "loop":
        monkeypatch.setenv("LLTM_SEQ_PATH", "loop")
    args = make_seq(20, 4, 24, 64, device="cuda", dtype=dtype, seed=5)
    lens = None if lengths is None else torch.tensor(lengths, device="cuda")
    got = _outputs_and_grads(lambda *a, **k: functional.lltm(*a, backend=backend, **k), args, lens)
    plain = _outputs_and_grads(lltm_reference, args, lens)
    up = [a.detach().double().requires_grad_() for a in args]
    ref = _outputs_and_grads(lltm_reference, up, lens)
    for name, g, p, r in zip(("output", "h_n", "c_n") + NAMES, got, plain, ref):
        assert g.dtype == dtype and torch.isfinite(g).all(), name
        err, err_plain = _rel_err(g, r), _rel_err(p, r)
        assert err <= 2 * err_plain + 1e-6, f"{name}: error {err:.2e} > 2 x plain PyTorch's {err_plain:.2e}"


@cuda_only
@pytest.mark.parametrize("backend", COMPILED)
def test_outputs_fully_written(backend):
    """Outputs come from the caching allocator poisoned with NaN first: every
    element of every output and gradient must be written."""
    if not lltm._backends.is_available(backend, "cuda", "seq"):
        pytest.skip(f"{backend} has no sequence operators on cuda")
    args = make_seq(9, 5, 7, 33, device="cuda", dtype=torch.float32, seed=7)
    poison = torch.full((1 << 22,), float("nan"), device="cuda")
    del poison  # the freed block is handed out again, NaN-filled
    got = _outputs_and_grads(lambda *a, **k: functional.lltm(*a, backend=backend, **k), args)
    ref = _outputs_and_grads(lltm_reference, [a.detach().double().cpu().requires_grad_() for a in args])
    for name, g, r in zip(("output", "h_n", "c_n") + NAMES, got, ref):
        assert torch.isfinite(g).all(), f"{name}: unwritten elements"
        assert _rel_err(g, r) <= 1e-5, name


def check_graph_capture_and_replay(backend: str, tol: float = 1e-5) -> None:
    """Forward and backward of a layer of `backend` captured in one CUDA graph
    (after warm-up on a side stream), replayed on new inputs copied into the
    captured ones: outputs and gradients against the float64 reference
    (relative error at most `tol`)."""
    T, B, I, S = 12, 8, 16, 32
    static = [a.detach().requires_grad_() for a in make_seq(T, B, I, S, device="cuda", dtype=torch.float32)]
    static_g = [torch.randn(T, B, S, device="cuda"), torch.randn(B, S, device="cuda")]

    def step():
        out, (h_n, c_n) = functional.lltm(*static, backend=backend)
        grads = torch.autograd.grad((out, c_n), static, static_g)
        return (out, h_n, c_n) + grads

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    for seed in (11, 12):
        fresh = make_seq(T, B, I, S, device="cuda", dtype=torch.float32, seed=seed, requires_grad=False)
        fresh_g = [torch.randn_like(g) for g in static_g]
        with torch.no_grad():
            for dst, src in zip(static + static_g, list(fresh) + fresh_g):
                dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        up = [a.double().cpu().requires_grad_() for a in fresh]
        r_out, (r_h, r_c) = lltm_reference(*up)
        r_grads = torch.autograd.grad((r_out, r_c), up, [g.double().cpu() for g in fresh_g])
        for o, r in zip(outs, (r_out, r_h, r_c) + r_grads):
            assert _rel_err(o, r) <= tol


@cuda_only
@pytest.mark.parametrize("backend", COMPILED)
@pytest.mark.parametrize("path", ["auto", "loop"])
def test_cuda_graph_capture_and_replay(monkeypatch, backend, path):
    """Forward and backward of a whole layer captured in one CUDA graph (no
    host synchronisation inside), replayed on new inputs."""
    if not lltm._backends.is_available(backend, "cuda", "seq"):
        pytest.skip(f"{backend} has no sequence operators on cuda")
    if path == "loop":
        monkeypatch.setenv("LLTM_SEQ_PATH", "loop")
    check_graph_capture_and_replay(backend)


@cuda_only
@pytest.mark.parametrize("backend", COMPILED)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_autocast_layer(backend, dtype):
    """Under torch.autocast the layer runs in the autocast dtype (like
    nn.LSTM); float32 parameters get float32 gradients."""
    model = lltm.LLTM(16, 32, num_layers=2, backend=backend, device="cuda")
    x = torch.randn(10, 4, 16, device="cuda")
    with torch.autocast("cuda", dtype=dtype):
        out, (h_n, c_n) = model(x)
    assert out.dtype == dtype
    out.float().sum().backward()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())
    ref = lltm.LLTM(16, 32, num_layers=2, backend="python", device="cuda", dtype=torch.float64)
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    assert _rel_err(out, ref(x.double())[0]) <= 3e-2


@cuda_only
@pytest.mark.parametrize("backend", COMPILED)
def test_other_current_device_and_side_stream(backend):
    """Runs under a device guard on the input's device and on the current
    stream (work queued on a side stream is ordered by it)."""
    n = torch.cuda.device_count()
    for k in range(n):
        args = make_seq(6, 3, 5, 8, device=f"cuda:{k}", dtype=torch.float32, requires_grad=False)
        side = torch.cuda.Stream(device=k)
        side.wait_stream(torch.cuda.current_stream(k))
        with torch.cuda.stream(side):  # the current stream of device k
            x = args[0] * 1.0  # produced on the side stream, consumed there
            with torch.cuda.device((k + 1) % n):
                out, (h_n, c_n) = functional.lltm(x, *args[1:], backend=backend)
                assert torch.cuda.current_device() == (k + 1) % n
        side.synchronize()
        ref, (r_h, r_c) = lltm_reference(*[a.double().cpu() for a in args])
        assert out.device == torch.device(f"cuda:{k}")
        assert _rel_err(out, ref) <= 1e-5 and _rel_err(c_n, r_c) <= 1e-5


@pytest.mark.parametrize("device,backend", backend_params(devices=["cpu"], backends=COMPILED))
def test_export_with_dynamic_length(device, backend):
    """torch.export of a 2-layer model with a symbolic T: the graph holds one
    sequence operator per layer and the exported program runs any length."""
    if not lltm._backends.is_available(backend, device, "seq"):
        pytest.skip(f"{backend} has no sequence operators on {device}")
    model = lltm.LLTM(3, 4, num_layers=2, backend=backend, device=device)
    steps = torch.export.Dim("T", min=2, max=1024)
    ep = torch.export.export(model, (torch.randn(6, 2, 3, device=device),), dynamic_shapes=({0: steps},))
    ops = [n for n in ep.graph.nodes if f"{backend}_seq_forward" in str(n.target)]
    assert len(ops) == 2
    for T in (3, 17, 100):
        x = torch.randn(T, 2, 3, device=device)
        torch.testing.assert_close(ep.module()(x), model(x))


@pytest.mark.parametrize("device,backend", backend_params(devices=["cpu"], backends=COMPILED))
def test_cpu_autocast_bfloat16(device, backend):
    """Under torch.autocast("cpu", bfloat16) the layer and the cell take the
    bfloat16 activations of the layers around them and run in bfloat16;
    float32 parameters get float32 gradients."""
    torch.manual_seed(0)
    model = lltm.LLTM(8, 16, num_layers=2, backend=backend)
    cell = lltm.LLTMCell(8, 16, backend=backend)
    proj = torch.nn.Linear(4, 8)
    x = torch.randn(5, 3, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, (h_n, c_n) = model(proj(x))
        new_h, _ = cell(proj(x[0]))
    assert out.dtype == new_h.dtype == torch.bfloat16
    (out.float().sum() + new_h.float().sum()).backward()
    assert all(p.grad.dtype == torch.float32 for p in list(model.parameters()) + list(cell.parameters()))
    ref = lltm.LLTM(8, 16, num_layers=2, backend="python", dtype=torch.float64)
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    expected, _ = ref(proj(x).double())
    assert _rel_err(out, expected) <= 2e-2
