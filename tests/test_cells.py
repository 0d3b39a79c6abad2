"""The seam's cells (lltm.cells) on every backend: LSTM and GRU as drop-ins for torch.nn's modules, the
operators against each cell's float64 reference, gradcheck, opcheck, torch.compile and torch.export.

Parametrised over cell x device x backend; a backend a build cannot run for a cell is kept, marked
skip, so the report shows what did not run."""

from __future__ import annotations

import io

import pytest
import torch
from torch.library import opcheck
from torch.nn.utils.rnn import pack_padded_sequence, pack_sequence

import lltm
from lltm import cells, functional
from lltm.reference import rnn_reference

from ._helpers import DEVICES, LOW_PRECISION, env_in_backward, held_place, rel_err

SEAM = [cells.LSTM, cells.GRU]
TORCH_LAYER = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}
TORCH_CELL = {"lstm": torch.nn.LSTMCell, "gru": torch.nn.GRUCell}
LAYER = {"lstm": lltm.LSTM, "gru": lltm.GRU}
CELL = {"lstm": lltm.LSTMCell, "gru": lltm.GRUCell}


def cell_params(devices=DEVICES, backends=lltm._registry.NAMES, seam=SEAM):
    """(cell, device, backend) params with ids like lstm-cpu-aten; unavailable ones marked skip."""
    params = []
    for cell in seam:
        for device in devices:
            for name in backends:
                ok = lltm._backends.is_available(name, device, cell.op_family())
                marks = () if ok else pytest.mark.skip(reason=f"{name} has no {cell.name} operators on {device}")
                params.append(pytest.param(cell, device, name, id=f"{cell.name}-{device}-{name}", marks=marks))
    return params


def compiled_params(devices=DEVICES):
    return cell_params(devices, lltm._registry.COMPILED)


def make_layer(cell, T, B, I, S, *, device="cpu", dtype=torch.float64, seed=0, bias=True):
    """Fresh random (input, weight_ih, weight_hh, bias_ih, bias_hh, state) of one layer, every value
    uniform in [-1, 1) (weights scaled by 2/sqrt(S): every gate regime is exercised)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        t = (torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1) * scale
        return t.to(device=device, dtype=dtype)

    G, bound = cell.gates, 2 * max(S, 1) ** -0.5
    x = rand(T, B, I)
    w_ih, w_hh = rand(G * S, I, scale=bound), rand(G * S, S, scale=bound)
    b_ih, b_hh = (rand(G * S), rand(G * S)) if bias else (None, None)
    state = tuple(rand(B, S) for _ in cell.states)
    return x, w_ih, w_hh, b_ih, b_hh, state


def outputs_and_grads(fn, args, lengths=None, seed=1, inputs_and_weights=True):
    """(output, final states..., gradient of every tensor argument) for a random linear loss on the
    output and every final state. inputs_and_weights=False: the input's and the weights' gradients
    are not asked for (zeros in their places), so a fused backward runs no GEMM."""
    x, w_ih, w_hh, b_ih, b_hh, state = args
    leaves = [x, w_ih, w_hh] + [b for b in (b_ih, b_hh) if b is not None] + list(state)
    leaves = [t.detach().requires_grad_(inputs_and_weights or k >= 3) for k, t in enumerate(leaves)]
    x, w_ih, w_hh = leaves[:3]
    rest = leaves[3:]
    if b_ih is not None:
        b_ih, b_hh, rest = rest[0], rest[1], rest[2:]
    out, final = fn(x, w_ih, w_hh, b_ih, b_hh, tuple(rest), lengths)
    gen = torch.Generator().manual_seed(seed)
    results = [out, *final]
    probes = [torch.rand(r.shape, generator=gen, dtype=torch.float64).to(r) for r in results]
    loss = sum((r * p).sum() for r, p in zip(results, probes))
    asked = iter(torch.autograd.grad(loss, [t for t in leaves if t.requires_grad], allow_unused=True))
    grads = [next(asked) if t.requires_grad else None for t in leaves]
    return [r.detach() for r in results] + [g if g is not None else torch.zeros_like(t) for g, t in zip(grads, leaves)]


def run(cell, backend):
    def fn(x, w_ih, w_hh, b_ih, b_hh, state, lengths):
        return functional.rnn(cell.name, x, w_ih, w_hh, b_ih, b_hh, state, lengths=lengths, backend=backend)

    return fn


def reference(cell):
    def fn(x, w_ih, w_hh, b_ih, b_hh, state, lengths):
        return rnn_reference(cell.reference, x, w_ih, w_hh, b_ih, b_hh, state, lengths)

    return fn


# (T, B, I, S): one step, one row, odd sizes, no input features
SHAPES = [(5, 3, 4, 6), (1, 1, 2, 3), (7, 4, 3, 17), (3, 2, 0, 5)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("cell,device,backend", cell_params())
def test_layer_matches_reference_float64(cell, device, backend, shape):
    args = make_layer(cell, *shape, device=device)
    got = outputs_and_grads(run(cell, backend), args)
    want = outputs_and_grads(reference(cell), [a.cpu() if torch.is_tensor(a) else a for a in _cpu(args)])
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == torch.float64
        assert rel_err(g, w) <= 1e-12, f"result {k}: {rel_err(g, w):.2e}"


def _cast(args, dtype):
    """make_layer's arguments in another dtype (None and the state tuple kept as they are)."""
    return [
        t.to(dtype) if torch.is_tensor(t) else (tuple(s.to(dtype) for s in t) if isinstance(t, tuple) else t)
        for t in args
    ]


def _cpu(args):
    x, w_ih, w_hh, b_ih, b_hh, state = args
    cpu = [t.cpu() if t is not None else None for t in (x, w_ih, w_hh, b_ih, b_hh)]
    return (*cpu, tuple(s.cpu() for s in state))


@pytest.mark.parametrize("cell,device,backend", cell_params())
def test_lengths_and_no_bias(cell, device, backend):
    """Rows of lengths 0 .. T (and bias=False): outputs 0 past each row's length, states kept, every
    gradient as the reference's."""
    args = make_layer(cell, 6, 5, 3, 7, device=device, bias=False, seed=3)
    lengths = torch.tensor([6, 0, 3, 1, 5], device=device)
    got = outputs_and_grads(run(cell, backend), args, lengths)
    want = outputs_and_grads(reference(cell), _cpu(args), lengths.cpu())
    for k, (g, w) in enumerate(zip(got, want)):
        assert rel_err(g, w) <= 1e-12, f"result {k}: {rel_err(g, w):.2e}"
    assert (got[0][3:, 2] == 0).all() and (got[0][:, 1] == 0).all()


def _argument_names(cell):
    """The names of make_layer's tensors in order, the state flattened: input, weights, biases, h0 (, c0)."""
    return ["input", "weight_ih", "weight_hh", "bias_ih", "bias_hh", *(f"{s}0" for s in cell.states)]


def one_grad_params():
    """cell_params() x each argument of the cell, ids like lstm-cpu-aten-weight_hh."""
    params = []
    for p in cell_params():
        cell, device, backend = p.values
        for name in _argument_names(cell):
            params.append(pytest.param(cell, device, backend, name, id=f"{p.id}-{name}", marks=p.marks))
    return params


@pytest.mark.parametrize("cell,device,backend,which", one_grad_params())
def test_one_argument_needs_grad(cell, device, backend, which):
    """One argument asks for its gradient, the others are frozen (the backward skips what nobody asked,
    and the CUDA time loops leave optional outputs unwritten): that gradient equals the float64
    reference's, with lengths 0 .. T and a loss on the output and every final state."""
    x, w_ih, w_hh, b_ih, b_hh, state = make_layer(cell, 6, 5, 3, 7, device=device, seed=7)
    names = _argument_names(cell)
    tensors = [x, w_ih, w_hh, b_ih, b_hh, *state]
    lengths = torch.tensor([6, 0, 3, 1, 5])

    def grad(fn, device):
        args = [t.detach().to(device).requires_grad_(n == which) for n, t in zip(names, tensors)]
        out, final = fn(*args[:5], tuple(args[5:]), lengths.to(device))
        gen = torch.Generator().manual_seed(2)
        loss = sum((r * torch.rand(r.shape, generator=gen, dtype=r.dtype).to(r)).sum() for r in (out, *final))
        return torch.autograd.grad(loss, args[names.index(which)])[0]

    got, want = grad(run(cell, backend), device), grad(reference(cell), "cpu")
    assert got.shape == want.shape
    assert rel_err(got, want) <= 1e-12, f"{which}: {rel_err(got, want):.2e}"


@pytest.mark.parametrize("cell,device,backend", cell_params())
def test_batch_zero_and_zero_steps(cell, device, backend):
    for T, B in ((0, 3), (4, 0)):
        args = make_layer(cell, T, B, 2, 4, device=device)
        got = outputs_and_grads(run(cell, backend), args)
        want = outputs_and_grads(reference(cell), _cpu(args))
        for g, w in zip(got, want):
            assert g.shape == w.shape
            torch.testing.assert_close(g.cpu(), w)


@pytest.mark.parametrize("cell,device,backend", cell_params())
def test_non_contiguous_arguments(cell, device, backend):
    x, w_ih, w_hh, b_ih, b_hh, state = make_layer(cell, 4, 3, 5, 6, device=device, seed=5)
    strided = (
        x.transpose(0, 1).contiguous().transpose(0, 1),
        w_ih.t().contiguous().t(),
        w_hh[:, :].t().contiguous().t(),
        b_ih,
        b_hh,
        tuple(s.t().contiguous().t() for s in state),
    )
    got = outputs_and_grads(run(cell, backend), strided)
    want = outputs_and_grads(reference(cell), _cpu((x, w_ih, w_hh, b_ih, b_hh, state)))
    for g, w in zip(got, want):
        assert rel_err(g, w) <= 1e-12


@pytest.mark.parametrize("cell,device,backend", compiled_params())
def test_gradcheck(cell, device, backend):
    x, w_ih, w_hh, b_ih, b_hh, state = make_layer(cell, 3, 2, 3, 4, device=device, seed=7)
    lengths = torch.tensor([3, 1], device=device)

    def fn(x, w_ih, w_hh, b_ih, b_hh, *state):
        out, final = functional.rnn(cell.name, x, w_ih, w_hh, b_ih, b_hh, state, lengths=lengths, backend=backend)
        return (out, *final)

    inputs = [t.requires_grad_() for t in (x, w_ih, w_hh, b_ih, b_hh, *state)]
    assert torch.autograd.gradcheck(fn, inputs)


@pytest.mark.parametrize("cell,device,backend", compiled_params())
def test_opcheck(cell, device, backend):
    x, w_ih, w_hh, b_ih, b_hh, state = make_layer(cell, 3, 2, 3, 4, device=device, seed=8)
    forward = getattr(torch.ops.lltm, f"{backend}_{cell.name}_seq_forward").default
    args = [t.requires_grad_() for t in (x, w_ih, w_hh)]
    opcheck(forward, (*args, b_ih, b_hh, [s.requires_grad_() for s in state], torch.tensor([3, 2], device=device)))
    out, state_n, saved = forward(
        x.detach(), w_ih.detach(), w_hh.detach(), b_ih, b_hh, [s.detach() for s in state], None
    )
    backward = getattr(torch.ops.lltm, f"{backend}_{cell.name}_seq_backward").default
    for mask in ([True] * 6, [False, True, False, False, True, False], [False] * 6):
        opcheck(
            backward,
            (torch.randn_like(out), [torch.randn_like(s) for s in state_n], x.detach(), w_ih.detach(), w_hh.detach(),
             [s.detach() for s in state], out, saved, None, mask),
        )  # fmt: skip


@pytest.mark.parametrize("cell,device,backend", compiled_params())
def test_double_backward_is_a_clear_error(cell, device, backend):
    x, w_ih, w_hh, b_ih, b_hh, state = make_layer(cell, 3, 2, 3, 4, device=device)
    w_hh.requires_grad_()
    out, _ = functional.rnn(cell.name, x, w_ih, w_hh, b_ih, b_hh, state, backend=backend)
    (g,) = torch.autograd.grad(out.sum(), w_hh, create_graph=True)
    with pytest.raises(RuntimeError, match=rf"backend '{backend}' does not support double backward.*backend='python'"):
        g.sum().backward()


# ---------------------------------------------------------------- the modules


def _copy_into(ours, theirs):
    ours.load_state_dict(theirs.state_dict())


@pytest.mark.parametrize("layers,bidirectional", [(1, False), (2, True)], ids=["1layer", "2layers-bidir"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["time-major", "batch-first"])
@pytest.mark.parametrize("cell,device,backend", cell_params())
def test_layer_is_a_drop_in_for_torch(cell, device, backend, batch_first, layers, bidirectional):
    """Same constructor (positional), parameter names and shapes, state_dict both ways; outputs, final
    states and every gradient equal torch's within float64 rounding."""
    torch.manual_seed(0)
    args = (5, 7, layers, True, batch_first, 0.0, bidirectional)
    theirs = TORCH_LAYER[cell.name](*args, dtype=torch.float64).to(device)
    ours = LAYER[cell.name](*args, dtype=torch.float64, backend=backend).to(device)
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [(n, p.shape) for n, p in theirs.named_parameters()]
    _copy_into(ours, theirs)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn((3, 4, 5) if batch_first else (4, 3, 5), dtype=torch.float64, device=device)
    D = 2 if bidirectional else 1
    state = tuple(torch.randn(layers * D, 3, 7, dtype=torch.float64, device=device) for _ in cell.states)
    hx = state if cell.num_states == 2 else state[0]
    results = []
    for m in (ours, theirs):
        m.zero_grad()
        xi = x.clone().requires_grad_()
        out, h = m(xi, hx)
        finals = h if isinstance(h, tuple) else (h,)
        (out.sum() + sum((f * f).sum() for f in finals)).backward()
        results.append([out, *finals, xi.grad] + [p.grad for p in m.parameters()])
    for k, (a, b) in enumerate(zip(*results)):
        assert rel_err(a, b) <= 1e-12, f"result {k}: {rel_err(a, b):.2e}"


@pytest.mark.parametrize("cell,device,backend", cell_params())
def test_layer_packed_and_unbatched_like_torch(cell, device, backend):
    torch.manual_seed(1)
    theirs = TORCH_LAYER[cell.name](3, 4, 2, bidirectional=True, dtype=torch.float64).to(device)
    ours = LAYER[cell.name](3, 4, 2, bidirectional=True, dtype=torch.float64, backend=backend).to(device)
    _copy_into(ours, theirs)
    seqs = [torch.randn(n, 3, dtype=torch.float64, device=device) for n in (5, 2, 4)]
    packed = pack_sequence(seqs, enforce_sorted=False)
    (po, ph), (to, th) = ours(packed), theirs(packed)
    torch.testing.assert_close(po.data, to.data)
    torch.testing.assert_close(ph, th)
    unbatched = torch.randn(6, 3, dtype=torch.float64, device=device)
    (uo, uh), (vo, vh) = ours(unbatched), theirs(unbatched)
    assert uo.shape == vo.shape == (6, 8)
    torch.testing.assert_close(uo, vo)
    torch.testing.assert_close(uh, vh)


@pytest.mark.parametrize("cell,device,backend", cell_params())
def test_cell_module_is_a_drop_in_for_torch(cell, device, backend):
    torch.manual_seed(2)
    theirs = TORCH_CELL[cell.name](5, 6, dtype=torch.float64).to(device)
    ours = CELL[cell.name](5, 6, dtype=torch.float64, backend=backend).to(device)
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [(n, p.shape) for n, p in theirs.named_parameters()]
    _copy_into(ours, theirs)
    x = torch.randn(3, 5, dtype=torch.float64, device=device)
    state = tuple(torch.randn(3, 6, dtype=torch.float64, device=device) for _ in cell.states)
    hx = state if cell.num_states == 2 else state[0]
    for args in ((x,), (x, hx), (x[0],)):
        a, b = ours(*args), theirs(*args)
        torch.testing.assert_close(a, b)


def test_init_matches_torch_distribution():
    """Uniform in ±1/sqrt(hidden_size), as torch initialises every parameter."""
    torch.manual_seed(3)
    for m in (lltm.LSTM(8, 64), lltm.GRU(8, 64), lltm.LSTMCell(8, 64), lltm.GRUCell(8, 64)):
        for name, p in m.named_parameters():
            assert p.abs().max() <= 64**-0.5 and p.abs().max() > 0.9 * 64**-0.5, name


def test_lstm_proj_size_is_a_clear_error():
    with pytest.raises(ValueError, match=r"lltm.LSTM: proj_size=4 is not supported.*torch.nn.LSTM"):
        lltm.LSTM(3, 8, proj_size=4)


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: lltm.LSTM(3, 4, 2.0), r"lltm.LSTM: num_layers must be an int, got 2.0"),
        (lambda: lltm.GRU(3, 4, "2"), r"lltm.GRU: num_layers must be an int, got '2'"),
        (lambda: lltm.LSTM(3, 4, dropout=True), r"dropout must be a float probability in \[0, 1\], got True"),
        (lambda: lltm.GRU(3, 0), r"hidden_size must be an integer of at least 1, got 0"),
        (lambda: lltm.LSTMCell(3, 4, bias="yes"), r"lltm.LSTMCell: bias must be a bool, got 'yes'"),
    ],
)
def test_bad_constructor_arguments(make, message):
    with pytest.raises((TypeError, ValueError), match=message):
        make()


def test_bad_state_and_input_are_clear_errors():
    m = lltm.LSTM(3, 4)
    with pytest.raises(ValueError, match=r"expected state to be None or a tuple \(h, c\)"):
        m(torch.randn(2, 1, 3), torch.zeros(1, 1, 4))
    with pytest.raises(ValueError, match=r"expected h0 of shape .* = \[1, 1, 4\], but got \[2, 1, 4\]"):
        m(torch.randn(2, 1, 3), (torch.zeros(2, 1, 4), torch.zeros(1, 1, 4)))
    with pytest.raises(TypeError, match=r"lltm.GRU: expected input to be a torch.Tensor"):
        lltm.GRU(3, 4)([[1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match=r"lltm.GRU: expected input with input_size = 3 features, but got 2"):
        lltm.GRU(3, 4, batch_first=True)(torch.randn(5, 6, 2))
    with pytest.raises(
        ValueError, match=r"expected weight_hh of shape \(3 \* hidden_size, hidden_size\) \(gru has 3 gates\)"
    ):
        functional.gru(torch.randn(2, 1, 3), torch.randn(16, 3), torch.randn(16, 4), None, None, torch.zeros(1, 4))


def test_flatten_parameters_and_all_weights():
    m = lltm.LSTM(3, 4, 2, bidirectional=True)
    m.flatten_parameters()
    assert len(m.all_weights) == 4 and all(len(w) == 4 for w in m.all_weights)


# --------------------------------------------------------- compile and export


@pytest.mark.parametrize("cell,device,backend", compiled_params())
def test_compile_fullgraph_dynamic_matches_eager(cell, device, backend):
    torch._dynamo.reset()
    torch.manual_seed(4)
    model = LAYER[cell.name](4, 6, 2, backend=backend, dtype=torch.float64).to(device)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for T, B in ((3, 2), (5, 4)):
        x = torch.randn(T, B, 4, dtype=torch.float64, device=device, requires_grad=True)
        eager_out, _ = model(x)
        (gx,) = torch.autograd.grad(eager_out.sum(), x)
        out, _ = compiled(x)
        (cx,) = torch.autograd.grad(out.sum(), x)
        torch.testing.assert_close(out, eager_out)
        torch.testing.assert_close(cx, gx)


@pytest.mark.parametrize("cell,device,backend", compiled_params())
def test_export_with_dynamic_shapes(cell, device, backend):
    torch.manual_seed(5)
    model = LAYER[cell.name](4, 6, backend=backend).to(device).eval()
    x = torch.randn(5, 3, 4, device=device)
    T, B = torch.export.Dim("T", min=2), torch.export.Dim("B", min=2)
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: T, 1: B},))
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    buf.seek(0)
    loaded = torch.export.load(buf)
    y = torch.randn(7, 2, 4, device=device)
    torch.testing.assert_close(loaded.module()(y)[0], model(y)[0])


# ------------------------------------------------------------- half precision


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("cell,device,backend", compiled_params(["cuda"]) if "cuda" in DEVICES else [])
def test_half_precision_within_twice_plain_pytorch(cell, device, backend, dtype):
    """Outputs and every gradient at most 2x the error of the reference run in the same low precision
    (both against float64), with lengths, at T = 50."""
    args = make_layer(cell, 50, 6, 16, 32, device=device, seed=9)
    lengths = torch.tensor([50, 0, 17, 49, 1, 33], device=device)
    low = _cast(args, dtype)
    got = outputs_and_grads(run(cell, backend), low, lengths)
    plain = outputs_and_grads(reference(cell), low, lengths)
    exact = outputs_and_grads(reference(cell), args, lengths)
    for k, (g, p, e) in enumerate(zip(got, plain, exact)):
        assert g.dtype == dtype
        assert torch.isfinite(g).all()
        assert rel_err(g, e) <= 2 * rel_err(p, e) + 1e-6, f"result {k}: {rel_err(g, e):.2e} vs {rel_err(p, e):.2e}"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("S", [16, 12, 10], ids=lambda s: f"S{s}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("layer", [lltm.LSTM, lltm.LLTM], ids=["lstm", "lltm"])
def test_state_recompute_over_many_steps(layer, dtype, S):
    """The backward's rebuilt cell states over T = 70 steps (four of the recompute's 16-step stages and
    a partial one), packed rows of several lengths: the output and every gradient within 2x the error
    of the python backend in the same dtype (both against float64). S = 16 takes the staged kernel
    (16-byte copies of S's rows) in both dtypes, S = 12 in float32 only, S = 10 in neither."""
    T, B, I = 70, 5, 8
    x = torch.rand(T, B, I, generator=torch.Generator().manual_seed(S), dtype=torch.float64) * 2 - 1
    lengths = torch.tensor([70, 1, 33, 69, 16])
    probe = torch.rand(int(lengths.sum()), S, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def results(backend, dt, device):
        torch.manual_seed(0)  # the same initial weights for every run
        m = layer(I, S, backend=backend).to(device=device, dtype=dt)
        xi = x.to(device=device, dtype=dt).requires_grad_()
        out = m(pack_padded_sequence(xi, lengths, enforce_sorted=False))[0].data
        (out * probe.to(out)).sum().backward()
        return [t.detach().double().cpu() for t in (out, xi.grad, *(p.grad for p in m.parameters()))]

    got = results("fused", dtype, "cuda")
    plain = results("python", dtype, "cuda")
    exact = results("python", torch.float64, "cpu")
    for k, (g, p, e) in enumerate(zip(got, plain, exact)):
        assert torch.isfinite(g).all(), f"result {k}: unwritten or non-finite elements"
        assert rel_err(g, e) <= 2 * rel_err(p, e) + 1e-6, f"result {k}: {rel_err(g, e):.2e} vs {rel_err(p, e):.2e}"


# --------------------------------------------------- the CUDA time loops, each forced

# (path, LLTM_SEQ_DOT): the persistent kernels with each dot, and the graph-replayed step loop
CUDA_PATHS = [
    ("cluster", "fma"),
    ("cluster", "fma-smem"),
    ("grid", "fma"),
    ("grid", "mma"),
    ("cluster", "mma"),
    ("grid", "mma-3xtf32"),
    ("cluster", "mma-3xtf32"),
    ("loop", None),
]
# (T, B, I, S): units and rows that divide into no split evenly, one row, and a wide state
PATH_SHAPES = [(7, 5, 3, 17), (5, 33, 8, 70), (3, 1, 4, 1), (4, 64, 16, 256)]


def _cluster_kernels_here() -> bool:
    return "no thread-block cluster kernels" not in torch.ops.lltm._fused_cuda_seq_plan(
        False, 2, 2, 8, torch.float32, 0, "lstm"
    )


def _force_path(monkeypatch, torch_settings, path, dot):
    """Forces the CUDA time loop `path` (and the persistent kernels' `dot`); skips where the build has
    no cluster kernels. Returns (dtype, tolerance): float64 to 1e-12 on the FMA dots and the loop,
    float32 on TF32 to 5e-3 on the tensor-core dot, float32 as 3xTF32 (lltm's accurate mode) to 1e-5."""
    if path == "cluster" and not _cluster_kernels_here():
        pytest.skip("no thread-block cluster kernels on this device or build")
    monkeypatch.setenv("LLTM_SEQ_PATH", path)
    if dot is not None:
        monkeypatch.setenv("LLTM_SEQ_DOT", "fma" if dot == "mma-3xtf32" else dot)
    if dot == "mma":
        torch_settings.set(matmul_tf32=True)
        return torch.float32, 5e-3
    if dot == "mma-3xtf32":  # the forward on the FMA dot (strict), the backward on 3xTF32 (see the test)
        torch_settings.set(lltm_fp32_precision="accurate")
        return torch.float32, 1e-5
    return torch.float64, 1e-12


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("shape", PATH_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("path,dot", CUDA_PATHS, ids=lambda v: str(v))
@pytest.mark.parametrize("cell", SEAM, ids=lambda c: c.name)
def test_cuda_paths_match_reference(monkeypatch, torch_settings, cell, path, dot, shape):
    """Every time loop of the fused CUDA operators, forced, for every cell: float64 on the FMA dots,
    float32 with TF32 allowed on the tensor-core dot (within 5e-3) and, in lltm's accurate mode, the
    backward's as 3xTF32 (within 1e-5; its forward stays strict), with lengths, every gradient."""
    dtype, tol = _force_path(monkeypatch, torch_settings, path, dot)
    T, B, I, S = shape
    args = make_layer(cell, T, B, I, S, device="cuda", dtype=dtype, seed=B + S)
    lengths = torch.randint(0, T + 1, (B,), generator=torch.Generator().manual_seed(S)).cuda()
    plan = torch.ops.lltm._fused_cuda_seq_plan(False, T, B, S, dtype, 0, cell.name)
    assert plan.splitlines()[0].endswith(path), plan
    fn = run(cell, "fused")
    if dot == "mma-3xtf32":

        def fn(*a, _forward=fn):
            results = _forward(*a)
            env_in_backward(monkeypatch, results, LLTM_SEQ_DOT="mma")
            return results

    got = outputs_and_grads(fn, args, lengths)
    if dot == "mma-3xtf32":
        plan = torch.ops.lltm._fused_cuda_seq_plan(True, T, B, S, dtype, 0, cell.name)
        assert plan.splitlines()[0].endswith(path) and " dot=mma 3xtf32 " in plan, plan
    exact = [
        a.double() if torch.is_tensor(a) else (tuple(s.double() for s in a) if isinstance(a, tuple) else a)
        for a in _cpu(args)
    ]
    want = outputs_and_grads(reference(cell), exact, lengths.cpu())
    for k, (g, w) in enumerate(zip(got, want)):
        assert torch.isfinite(g).all(), f"result {k}: unwritten or non-finite elements"
        assert rel_err(g, w) <= tol, f"result {k}: {rel_err(g, w):.2e}"


# (path, S, CTAs a chunk, B, W_hh's place for the LSTM, for the GRU, each (forward, backward)): plans
# whose warps hold W_hh's A fragments in registers, every k step of a task ("regs") or its first ones
# with the rest read from shared memory every step ("regs+smem", the part-held kernels), with tasks of
# 1 to 4 tiles among the cells' gate counts (4 and 3). Forward, all held: grid 200/8 (one tile, 13 k
# steps: four accumulator sets and a tail), 70/3 (LSTM 3 tiles, GRU 1), 128/4 (4 and 3), 40/8 (2 and 1,
# five warps idle), cluster 128/4 (4 and 3); part held: grid 512/16 (4 tiles, 4 of 8 k steps held; GRU
# 3, 6 of 8), 400/16 (one tile, 18 of 25), 160/4 (LSTM 2 tiles, 9 of 10; GRU all held), 400/13 (slices
# of 6 and 7 k steps: the GRU's 6 held, so three of its four tasks end within them), cluster 512/16.
# The backward holds 18 / (tiles x gates) k steps of each gate segment's share, the LSTM's all-held
# kernels 24 / (tiles x 4): all of them in tasks of one tile (40/8, 200/16; FlashRNN's share at
# 768/64: 6 of 6, the LSTM's from 24 fragments; the LSTM's 640/40: 5, under its 6), of two (200/8, 70/3,
# 128/4, cluster 128/4: 2 of 2) and of three (160/4: 2 of 2); part held with one tile (the LSTM's
# 896/56 and 1024/64: 4 of 7 and of 8) and two (512/16, 400/16, 400/13: the LSTM's 2 of 4, the GRU's
# 3 of 4); the one-tile tasks' k steps past the held ones as a run of fixed length: the GRU's 1
# (896/56: 6 of 7) and 2 (1024/64: 6 of 8), the LSTM's 3 (896/56), and its 4 past them (1024/64) as
# the loop. B = 40 puts several rows of different lengths in a chunk's B tile (5 on a 132-SM GPU).
# Forward 768/64: 3 tiles, 6 of 6 k steps held.
R, P = "regs", "regs+smem"
HELD_A = [
    ("grid", 200, 8, 5, (R, R), (R, R)),
    ("grid", 70, 3, 5, (R, R), (R, R)),
    ("grid", 128, 4, 5, (R, R), (R, R)),
    ("grid", 40, 8, 5, (R, R), (R, R)),
    ("grid", 512, 16, 5, (P, P), (P, P)),
    ("grid", 400, 16, 5, (P, P), (P, P)),
    ("grid", 160, 4, 5, (P, R), (R, R)),
    ("grid", 768, 64, 5, (R, R), (R, R)),
    ("grid", 400, 13, 5, (P, P), (P, P)),
    ("grid", 640, 40, 5, (P, R), (R, R)),
    ("grid", 896, 56, 5, (P, P), (P, P)),
    ("grid", 1024, 64, 5, (P, P), (P, P)),
    ("grid", 512, 16, 40, (P, P), (P, P)),
    ("grid", 200, 16, 40, (R, R), (R, R)),
    ("cluster", 512, 16, 5, (P, P), (P, P)),
    ("cluster", 128, 4, 5, (R, R), (R, R)),
]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("asked", ["all", "kernels-only"])
@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("path,S,group,B,lstm_w,gru_w", HELD_A, ids=lambda v: str(v))
@pytest.mark.parametrize("cell", SEAM, ids=lambda c: c.name)
def test_holds_w_in_registers(monkeypatch, cell, path, S, group, B, lstm_w, gru_w, dtype, asked):
    """The persistent MMA kernels, forward and backward, with each warp's A fragments of W_hh (all or
    the first of them) held in registers (the plans say dot=mma w=regs, or w=regs+smem) against the
    same plans reading them from shared memory every step (LLTM_SEQ_DOT=mma-smem): the same MMAs in
    the same order, so outputs, final states and every gradient equal bit for bit; and within 2x the
    python backend's error in the same dtype. "kernels-only": no input features and only the biases'
    and states' gradients, so neither pass runs a cuBLAS GEMM, only lltm's kernels, and the python
    backend's run on the CPU: no cuBLAS call on the GPU at all (what compute-sanitizer's racecheck
    checks: cuBLAS's sm_90 GEMMs stop it with a hardware exception even where it checks no kernel;
    docs/benchmarks-history.md, section 64)."""
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("no tensor-core MMA before sm_80")
    if path == "cluster" and not _cluster_kernels_here():
        pytest.skip("no thread-block cluster kernels on this device or build")
    monkeypatch.setenv("LLTM_SEQ_PATH", path)
    monkeypatch.setenv("LLTM_SEQ_CLUSTER" if path == "cluster" else "LLTM_SEQ_GROUP", str(group))
    full = asked == "all"
    T, I = 9, 7 if full else 0
    args = make_layer(cell, T, B, I, S, device="cuda", seed=S + group)
    lengths = torch.randint(0, T + 1, (B,), generator=torch.Generator().manual_seed(S + B)).cuda()
    lengths[:2] = torch.tensor([T, 0])
    low = _cast(args, dtype)
    want_w = {"lstm": lstm_w, "gru": gru_w}[cell.name]
    results = {}
    for dot in ("mma", "mma-smem"):
        monkeypatch.setenv("LLTM_SEQ_DOT", dot)
        for backward, want in zip((False, True), want_w):
            plan = torch.ops.lltm._fused_cuda_seq_plan(backward, T, B, S, dtype, 0, cell.name)
            rows, place, line = held_place(plan, path)
            assert rows > 1 or B < 8, line
            assert place == (want if dot == "mma" else None), line
        results[dot] = outputs_and_grads(run(cell, "fused"), low, lengths, inputs_and_weights=full)
    exact = outputs_and_grads(reference(cell), _cpu(args), lengths.cpu(), inputs_and_weights=full)
    # the python backend in the same dtype; kernels-only on the CPU (no cuBLAS: see above)
    base, base_lengths = (low, lengths) if full else (_cpu(low), lengths.cpu())
    plain = outputs_and_grads(reference(cell), base, base_lengths, inputs_and_weights=full)
    for k, (held, smem, e, p) in enumerate(zip(results["mma"], results["mma-smem"], exact, plain)):
        assert torch.isfinite(held).all(), f"result {k}: unwritten or non-finite elements"
        assert torch.equal(held, smem), f"result {k}: held fragments differ from shared memory's"
        bound = 2 * rel_err(p, e) + 1e-6
        assert rel_err(held, e) <= bound, f"result {k}: {rel_err(held, e):.2e} (bound {bound:.2e})"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("asked", ["ih", "hh", "both", "none"])
@pytest.mark.parametrize("path,dot", [("cluster", "fma"), ("grid", "mma"), ("loop", None)], ids=str)
@pytest.mark.parametrize("cell", SEAM, ids=lambda c: c.name)
def test_cuda_bias_gradients_asked_alone(monkeypatch, torch_settings, cell, path, dot, asked):
    """Either bias's gradient asked without the other's, both, or neither (frozen biases: W_hh's
    gradient asked instead), on the persistent kernels (whose per-row sums one launch adds up for
    every bias) and the step loop: each equals the float64 reference's, every element written (the
    allocator's blocks poisoned with NaN first)."""
    dtype, tol = _force_path(monkeypatch, torch_settings, path, dot)
    T, B, I, S = 6, 37, 5, 70
    x, w_ih, w_hh, b_ih, b_hh, state = make_layer(cell, T, B, I, S, device="cuda", dtype=dtype, seed=3)
    wanted = {"ih": [0], "hh": [1], "both": [0, 1], "none": []}[asked]
    probe = torch.rand(T, B, S, generator=torch.Generator().manual_seed(4), dtype=torch.float64)

    def grads(fn, device, dtype):
        biases = [b.detach().to(device, dtype).requires_grad_(k in wanted) for k, b in enumerate((b_ih, b_hh))]
        x_, w_ih_, w_hh_ = (t.detach().to(device, dtype) for t in (x, w_ih, w_hh))
        leaves = [biases[k] for k in wanted] or [w_hh_.requires_grad_()]
        out, _ = fn(x_, w_ih_, w_hh_, *biases, tuple(s.to(device, dtype) for s in state), None)
        return torch.autograd.grad((out * probe.to(out)).sum(), leaves)

    poison = torch.full((1 << 22,), float("nan"), device="cuda")
    del poison  # the freed block is handed out again, NaN-filled
    got = grads(run(cell, "fused"), "cuda", dtype)
    want = grads(reference(cell), "cpu", torch.float64)
    for name, g, w in zip([f"bias {k}" for k in wanted] or ["W_hh"], got, want):
        assert torch.isfinite(g).all(), f"{name}: unwritten or non-finite elements"
        assert rel_err(g, w) <= tol, f"{name}: {rel_err(g, w):.2e}"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("splits", ["1", "3", "8"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16], ids=["float64", "float16"])
@pytest.mark.parametrize("cell", SEAM, ids=lambda c: c.name)
def test_loop_backward_in_parts_of_k(monkeypatch, cell, dtype, splits):
    """The backward step loop's GEMM of a step in LLTM_SEQ_LOOP_SPLITS parts of k, which the next step's
    kernel adds (1: one GEMM accumulating into dh), with lengths and the initial states' gradients (the
    last parts are added after the loop): float64 matches the reference, float16 stays within 2x the
    python backend's float16 error."""
    monkeypatch.setenv("LLTM_SEQ_PATH", "loop")
    monkeypatch.setenv("LLTM_SEQ_LOOP_SPLITS", splits)
    T, B, I, S = 9, 6, 5, 24  # k = G S = 72 or 96: 3 and 8 divide both
    args = make_layer(cell, T, B, I, S, device="cuda", seed=int(splits))
    lengths = torch.tensor([9, 0, 4, 8, 1, 9], device="cuda")
    exact = outputs_and_grads(reference(cell), _cpu(args), lengths.cpu())
    low = _cast(args, dtype)
    got = outputs_and_grads(run(cell, "fused"), low, lengths)
    plain = outputs_and_grads(reference(cell), low, lengths) if dtype != torch.float64 else None
    for k, (g, e) in enumerate(zip(got, exact)):
        assert torch.isfinite(g).all(), f"result {k}: unwritten or non-finite elements"
        bound = 1e-12 if plain is None else 2 * rel_err(plain[k], e) + 1e-6
        assert rel_err(g, e) <= bound, f"result {k}: {rel_err(g, e):.2e} (bound {bound:.2e})"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("splits", ["1", "3"])
@pytest.mark.parametrize("path", ["loop", None], ids=["loop", "auto"])
@pytest.mark.parametrize("cell", SEAM, ids=lambda c: c.name)
def test_tf32_backward_k_major(monkeypatch, torch_settings, cell, path, splits):
    """TF32's backward GEMMs from K-major copies of their operands (LLTM_TF32_K_MAJOR=N forces them at any
    size: W_hh^T for the step loop's GEMMs, whole or in parts of k, and the weight gradients' copies in
    chunks of N rows, 5 here, across the boundary of h0's rows and the outputs'): the same products read
    in another order, so every result stays within 2x the python backend's TF32 error of float64, and as
    close to the run without them. A wrong value is an error naming the setting."""
    torch_settings.set(matmul_tf32=True)
    if path is not None:
        monkeypatch.setenv("LLTM_SEQ_PATH", path)
    monkeypatch.setenv("LLTM_SEQ_LOOP_SPLITS", splits)
    T, B, I, S = 9, 6, 5, 24  # k = G S = 72 or 96: 3 divides both
    args = make_layer(cell, T, B, I, S, device="cuda", seed=7)
    lengths = torch.tensor([9, 0, 4, 8, 1, 9], device="cuda")
    exact = outputs_and_grads(reference(cell), _cpu(args), lengths.cpu())
    low = _cast(args, torch.float32)
    plain = outputs_and_grads(reference(cell), low, lengths)
    got = {}
    for setting in ("0", "5", "1000"):
        monkeypatch.setenv("LLTM_TF32_K_MAJOR", setting)
        got[setting] = outputs_and_grads(run(cell, "fused"), low, lengths)
    for k, e in enumerate(exact):
        bound = 2 * rel_err(plain[k], e) + 1e-6
        for setting, results in got.items():
            g = results[k]
            assert torch.isfinite(g).all(), f"LLTM_TF32_K_MAJOR={setting}, result {k}: non-finite elements"
            assert rel_err(g, e) <= bound, f"{setting}, result {k}: {rel_err(g, e):.2e} (bound {bound:.2e})"
        for setting in ("5", "1000"):
            assert rel_err(got[setting][k], got["0"][k]) <= bound, f"{setting} against 0, result {k}"
    monkeypatch.setenv("LLTM_TF32_K_MAJOR", "some")
    with pytest.raises(RuntimeError, match="LLTM_TF32_K_MAJOR=some must be 0"):
        outputs_and_grads(run(cell, "fused"), low, lengths)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cell", SEAM, ids=lambda c: c.name)
def test_strict_loop_on_the_fma_layouts(monkeypatch, torch_settings, cell):
    """Strict float32's step loop at a size where its forward steps read a copy of W_hh^T and its
    backward GEMM of a step runs in 4 parts of k (B = 256, S = 512: 32 tiles of 64 x 64, G S B S at least
    2^24 multiply-adds), with lengths: every result within 2x the python backend's float32 error of
    float64."""
    torch_settings.set(matmul_tf32=False)
    monkeypatch.setenv("LLTM_SEQ_PATH", "loop")
    T, B, I, S = 3, 256, 8, 512
    args = make_layer(cell, T, B, I, S, device="cuda", seed=11)
    lengths = torch.randint(0, T + 1, (B,), generator=torch.Generator().manual_seed(3)).cuda()
    exact = outputs_and_grads(reference(cell), _cpu(args), lengths.cpu())
    low = _cast(args, torch.float32)
    plain = outputs_and_grads(reference(cell), low, lengths)
    got = outputs_and_grads(run(cell, "fused"), low, lengths)
    for k, (g, e) in enumerate(zip(got, exact)):
        assert torch.isfinite(g).all(), f"result {k}: unwritten or non-finite elements"
        bound = 2 * rel_err(plain[k], e) + 1e-6
        assert rel_err(g, e) <= bound, f"result {k}: {rel_err(g, e):.2e} (bound {bound:.2e})"


def test_torch_func_names_the_python_backend():
    """torch.func over the cells' compiled operators is refused with an error naming backend='python',
    which supports it (per-sample gradients below)."""
    model = lltm.LSTM(3, 4, backend="aten", dtype=torch.float64)
    params = dict(model.named_parameters())
    x = torch.randn(5, 2, 3, dtype=torch.float64)

    def loss(p, x):
        out, _ = torch.func.functional_call(model, p, (x,))
        return out.sum()

    with pytest.raises(RuntimeError, match=r"torch.func transforms .* 'aten' backend's lstm .* backend='python'"):
        torch.func.grad(loss)(params, x)
    model.backend = "python"
    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 1))(params, x.unsqueeze(2))
    assert grads["weight_hh_l0"].shape == (2, 16, 4)
