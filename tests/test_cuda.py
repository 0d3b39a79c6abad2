"""GPU tests of the fused CUDA backend (lltm/csrc/cuda). Skipped without CUDA.

Both implementations of the backend are exercised wherever it matters
(`path`: "small" = the single tiled kernels, "blas" = cuBLAS GEMMs plus the
pointwise kernels; LLTM_CUDA_PATH forces one, "auto" picks by size):

- parity of forward and every gradient against a float64 reference, for
  float32/float64 with tight tolerances and float16/bfloat16 by the rule
  "error <= 2x the error of plain PyTorch in the same dtype";
- float64 gradcheck, opcheck, output_mask, determinism;
- real use: CUDA graph capture and replay with new inputs, torch.compile
  (reduce-overhead, fullgraph), batch 0 and 70000, non-contiguous and
  expanded inputs, a device that is not the current one, autocast;
- wrong input: devices or dtypes mixed, errors that name the argument.
"""

from __future__ import annotations

import math

import pytest
import torch

from lltm import _extension, functional
from lltm.reference import lltm_cell_reference

from ._helpers import LOW_PRECISION, assert_matches, make_inputs, reference64, rel_err, run_cell

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPE_IDS = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16"}
GRAD_NAMES = ("input", "weights", "bias", "old_h", "old_cell")


@pytest.fixture(autouse=True)
def _loaded():
    _extension.load()


@pytest.fixture(params=["small", "blas"])
def path(request, monkeypatch):
    """Forces one implementation of the fused CUDA backend."""
    monkeypatch.setenv("LLTM_CUDA_PATH", request.param)
    return request.param


def _poison_allocator(device="cuda"):
    """Leaves NaN in the caching allocator's free blocks, so an output element
    that a kernel forgets to write shows up as NaN."""
    small = [torch.full((250_000,), math.nan, device=device) for _ in range(8)]  # < 1 MiB: small pool
    large = torch.full((8 << 20,), math.nan, device=device)
    del small, large


def cuda_inputs(B, I, S, dtype, device="cuda", bias=True, grad=True, seed=0):
    """The shared generator with the module's init scale, on CUDA."""
    return make_inputs(B, I, S, device=device, dtype=dtype, seed=seed, bias=bias, requires_grad=grad, module_init=True)


def fused(*args):
    return functional.lltm_cell(*args, backend="fused")


SHAPES = {
    "16x32x128": (16, 32, 128),  # the tutorial's size
    "3x5x7": (3, 5, 7),  # S not a multiple of any vector width
    "33x17x24": (33, 17, 24),  # partial tiles everywhere
    "300x40x64": (300, 40, 64),  # batch split into row chunks (bias partial sums)
}


@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=DTYPE_IDS.get)
def test_parity(dtype, path, shape):
    B, I, S = SHAPES[shape]
    args = cuda_inputs(B, I, S, dtype, seed=B + I + S)
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(B, S, generator=gen, dtype=torch.float64).to("cuda", dtype) for _ in range(2)]
    _poison_allocator()
    out = run_cell(fused, args, grads)
    ref = reference64(args, grads)
    plain = run_cell(lltm_cell_reference, args, grads) if dtype in LOW_PRECISION else None  # PyTorch in dtype
    assert_matches(out, ref, dtype, plain=plain)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=DTYPE_IDS.get)
def test_gates_output(dtype, path):
    """The saved gates are the activated gates [sigmoid(i) | sigmoid(o) | elu(c)]."""
    x, W, b, h, c = cuda_inputs(20, 12, 40, dtype, grad=False)
    _, _, gates = torch.ops.lltm.fused_cell_forward(x, W, b, h, c)
    pre = torch.cat([h, x], 1).double() @ W.double().t() + b.double()
    i, o, cand = pre.chunk(3, 1)
    want = torch.cat([torch.sigmoid(i), torch.sigmoid(o), torch.nn.functional.elu(cand)], 1)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert gates.shape == (20, 120) and gates.is_contiguous()
    assert rel_err(gates, want) <= tol


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("shape", [(3, 4, 5), (2, 3, 8)], ids=["3x4x5", "2x3x8"])
def test_gradcheck_float64(path, shape, bias):
    args = cuda_inputs(*shape, torch.float64, bias=bias)
    fn = (lambda x, W, b, h, c: fused(x, W, b, h, c)) if bias else (lambda x, W, h, c: fused(x, W, None, h, c))
    inputs = tuple(a for a in args if a is not None)
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=DTYPE_IDS.get)
def test_opcheck_cuda(dtype, path):
    for shape, bias in (((4, 3, 8), True), ((5, 6, 7), False), ((0, 3, 4), True)):
        args = cuda_inputs(*shape, dtype, bias=bias)
        torch.library.opcheck(torch.ops.lltm.fused_cell_forward.default, args)
        x, W, b, h, c = (a.detach() if a is not None else None for a in args)
        _, new_cell, gates = torch.ops.lltm.fused_cell_forward(x, W, b, h, c)
        gh, gc = torch.randn_like(new_cell), torch.randn_like(new_cell)
        for mask in ([True] * 5, [False, True, True, False, False], [True, False, False, True, True]):
            torch.library.opcheck(torch.ops.lltm.fused_cell_backward.default, (gh, gc, new_cell, gates, x, W, h, mask))


def test_output_mask(path):
    x, W, b, h, c = cuda_inputs(9, 10, 16, torch.float32, grad=False)
    _, new_cell, gates = torch.ops.lltm.fused_cell_forward(x, W, b, h, c)
    gh, gc = torch.randn_like(new_cell), torch.randn_like(new_cell)
    full = torch.ops.lltm.fused_cell_backward(gh, gc, new_cell, gates, x, W, h, [True] * 5)
    for k in range(32):
        mask = [bool(k >> i & 1) for i in range(5)]
        got = torch.ops.lltm.fused_cell_backward(gh, gc, new_cell, gates, x, W, h, mask)
        for name, asked, g, f in zip(GRAD_NAMES, mask, got, full):
            if asked:
                torch.testing.assert_close(g, f, msg=f"grad_{name} with mask {mask}")
            else:
                assert g.shape == (0,), f"grad_{name} not asked for but has shape {tuple(g.shape)}"


def test_deterministic(path):
    args = cuda_inputs(1000, 64, 96, torch.float32)
    grads = [torch.randn(1000, 96, device="cuda") for _ in range(2)]
    first = run_cell(fused, args, grads)
    second = run_cell(fused, args, grads)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
def test_batch_zero(dtype, path):
    args = cuda_inputs(0, 6, 8, dtype)
    grads = [torch.empty(0, 8, device="cuda", dtype=dtype) for _ in range(2)]
    new_h, new_cell, gx, gW, gb, gh, gc = run_cell(fused, args, grads)
    assert new_h.shape == new_cell.shape == (0, 8) and gx.shape == (0, 6) and gh.shape == gc.shape == (0, 8)
    # gradients of the parameters are sums over no rows: exactly zero
    assert gW.shape == (24, 14) and gb.shape == (24,)
    assert not gW.any() and not gb.any()


def test_batch_70000(path):
    """More rows than gridDim.y could hold; the bias sums run over many row chunks."""
    B, I, S = 70_000, 8, 16
    args = cuda_inputs(B, I, S, torch.float32, seed=7)
    grads = [torch.randn(B, S, device="cuda") for _ in range(2)]
    out = run_cell(fused, args, grads)
    ref = reference64(args, grads)
    assert_matches(out, ref, torch.float32)


def test_non_contiguous(path):
    """Strided views: column blocks of wider tensors (used in place), a
    transposed state, every-other-column views, a strided bias; gradients
    that are expanded (stride 0) or transposed."""
    B, I, S = 24, 20, 32
    x, W, b, h, c = (a.detach() for a in cuda_inputs(B, I, S, torch.float32, grad=False))
    wide_x = torch.randn(B, I + 7, device="cuda")
    wide_x[:, 3 : 3 + I] = x
    wide_W = torch.randn(3 * S, S + I + 5, device="cuda")
    wide_W[:, 5:] = W
    h_t = h.t().contiguous().t()  # column-major
    c_2 = torch.randn(B, 2 * S, device="cuda")
    c_2[:, ::2] = c
    b_2 = torch.randn(6 * S, device="cuda")
    b_2[::2] = b
    views = (wide_x[:, 3 : 3 + I], wide_W[:, 5:], b_2[::2], h_t, c_2[:, ::2])
    assert not any(v.is_contiguous() for v in views)
    gh = torch.ones(1, 1, device="cuda").expand(B, S)  # what .sum().backward() sends
    gc = torch.randn(S, B, device="cuda").t()
    out = run_cell(fused, list(views), [gh, gc])
    ref = reference64([x, W, b, h, c], [gh.contiguous(), gc.contiguous()])
    assert_matches(out, ref, torch.float32)


def test_sum_backward_expanded_grads(path):
    args = [a.detach().requires_grad_(True) for a in cuda_inputs(16, 32, 128, torch.float32)]
    new_h, new_cell = fused(*args)
    (new_h.sum() + new_cell.sum()).backward()
    ref_args = [a.detach().double().requires_grad_(True) for a in args]
    rh, rc = lltm_cell_reference(*ref_args)
    (rh.sum() + rc.sum()).backward()
    for a, r in zip(args, ref_args):
        assert rel_err(a.grad, r.grad) <= 1e-5


def test_other_current_device(path):
    """Tensors on cuda:k while another device is current: results are right
    and the current device is unchanged. With one GPU the 'other' device is
    the same one, which still runs the guarded code path."""
    n = torch.cuda.device_count()
    for k in range(n):
        other = (k + 1) % n
        args = cuda_inputs(8, 16, 32, torch.float32, device=f"cuda:{k}")
        grads = [torch.randn(8, 32, device=f"cuda:{k}") for _ in range(2)]
        with torch.cuda.device(other):
            out = run_cell(fused, args, grads)
            assert torch.cuda.current_device() == other
        torch.cuda.synchronize(k)
        ref = reference64(args, grads)
        assert all(o.device == torch.device(f"cuda:{k}") for o in out)
        assert_matches(out, ref, torch.float32)


def test_side_stream(path):
    """Work queued on a non-default stream is ordered by that stream."""
    args = cuda_inputs(64, 32, 128, torch.float32, grad=False)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        x = args[0] * 1.0  # produced on s, consumed on s without a sync
        new_h, new_cell, _ = torch.ops.lltm.fused_cell_forward(x, *args[1:])
    s.synchronize()
    ref = reference64(args, [torch.zeros(64, 128, device="cuda")] * 2)
    assert rel_err(new_h, ref[0]) <= 1e-5 and rel_err(new_cell, ref[1]) <= 1e-5


@pytest.mark.parametrize("shape", [(16, 32, 128), (256, 64, 128)], ids=["16x32x128", "256x64x128"])
@pytest.mark.parametrize("mode", ["small", "blas", "auto"])
def test_cuda_graph_replay(mode, shape, monkeypatch):
    """Forward and backward captured in one CUDA graph, replayed on new
    inputs ("auto" picks its path from the capture status)."""
    if mode == "auto":
        monkeypatch.delenv("LLTM_CUDA_PATH", raising=False)
    else:
        monkeypatch.setenv("LLTM_CUDA_PATH", mode)
    B, I, S = shape
    static = [a.detach().requires_grad_(True) for a in cuda_inputs(B, I, S, torch.float32, seed=1)]
    static_grads = [torch.randn(B, S, device="cuda") for _ in range(2)]

    def step():
        new_h, new_cell = fused(*static)
        grads = torch.autograd.grad((new_h, new_cell), static, static_grads)
        return (new_h, new_cell) + tuple(grads)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm up: cuBLAS handles and workspaces
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    for seed in (2, 3):
        fresh = cuda_inputs(B, I, S, torch.float32, seed=seed, grad=False)
        fresh_grads = [torch.randn(B, S, device="cuda") for _ in range(2)]
        with torch.no_grad():
            for dst, src in zip(static + static_grads, list(fresh) + fresh_grads):
                dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        ref = reference64(fresh, fresh_grads)
        assert_matches(outs, ref, torch.float32)


def test_compile_reduce_overhead_fullgraph():
    torch._dynamo.reset()
    B, I, S = 16, 32, 128

    def step(x, W, b, h, c):
        return functional.lltm_cell(x, W, b, h, c, backend="fused")

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for seed in range(4):  # warm-up, recording, then replays with new values
        args = [a.detach().requires_grad_(True) for a in cuda_inputs(B, I, S, torch.float32, seed=seed)]
        grads = [torch.randn(B, S, device="cuda") for _ in range(2)]
        torch.compiler.cudagraph_mark_step_begin()
        new_h, new_cell = compiled(*args)
        got = [new_h.detach().clone(), new_cell.detach().clone()]
        got += [g.clone() for g in torch.autograd.grad((new_h, new_cell), args, grads)]
        ref = reference64(args, grads)
        assert_matches(got, ref, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("backend", ["fused", "aten"])
def test_autocast(dtype, backend):
    """Under torch.autocast the cell runs in the autocast dtype (like
    nn.Linear); the float32 parameters get float32 gradients."""
    x, W, b, h, c = (a.detach() for a in cuda_inputs(32, 24, 64, torch.float32))
    W.requires_grad_(True)
    b.requires_grad_(True)
    with torch.autocast("cuda", dtype=dtype):
        new_h, new_cell = functional.lltm_cell(x, W, b, h, c, backend=backend)
    assert new_h.dtype == new_cell.dtype == dtype
    (new_h.float().sum() + new_cell.float().sum()).backward()
    assert W.grad.dtype == b.grad.dtype == torch.float32
    rh, rc = lltm_cell_reference(x.double(), W.double(), b.double(), h.double(), c.double())
    assert rel_err(new_h, rh) <= 2e-2 and rel_err(new_cell, rc) <= 2e-2


def test_autocast_leaves_float64_alone():
    args = [a.detach() for a in cuda_inputs(4, 5, 8, torch.float64)]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        new_h, _ = functional.lltm_cell(*args, backend="fused")
    assert new_h.dtype == torch.float64


@pytest.mark.parametrize("name", ["weights", "bias", "old_h", "old_cell"])
def test_mixed_devices_raise(name):
    args = dict(zip(("input", "weights", "bias", "old_h", "old_cell"), cuda_inputs(4, 5, 8, torch.float32, grad=False)))
    args[name] = args[name].cpu()
    with pytest.raises(RuntimeError, match=rf"{name}.*(device|cuda|cpu)"):
        torch.ops.lltm.fused_cell_forward(*args.values())
    with pytest.raises(RuntimeError, match=name):
        functional.lltm_cell(*args.values(), backend="fused")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_devices_raise():
    x, W, b, h, c = cuda_inputs(4, 5, 8, torch.float32, grad=False)
    with pytest.raises(RuntimeError, match="weights"):
        torch.ops.lltm.fused_cell_forward(x, W.to("cuda:1"), b, h, c)


def test_backward_mixed_devices_raise():
    x, W, b, h, c = cuda_inputs(4, 5, 8, torch.float32, grad=False)
    _, new_cell, gates = torch.ops.lltm.fused_cell_forward(x, W, b, h, c)
    gh = torch.randn_like(new_cell)
    with pytest.raises(RuntimeError, match="grad_cell"):
        torch.ops.lltm.fused_cell_backward(gh, gh.cpu(), new_cell, gates, x, W, h, [True] * 5)


def test_wrong_dtypes_raise():
    x, W, b, h, c = cuda_inputs(4, 5, 8, torch.float32, grad=False)
    with pytest.raises((RuntimeError, TypeError), match="weights"):
        torch.ops.lltm.fused_cell_forward(x, W.half(), b, h, c)
    with pytest.raises((RuntimeError, TypeError), match="input"):
        torch.ops.lltm.fused_cell_forward(x.int(), W, b, h, c)


def test_build_info_reports_cuda():
    info = _extension.build_info()
    assert info.get("cuda") == "1", info
    major, minor = torch.cuda.get_device_capability()
    archs = info.get("arch", "").split(",")
    assert any(a.isdigit() for a in archs), info
    # __CUDA_ARCH_LIST__ spelling: 900 for sm_90
    assert any(int(a) <= 100 * major + 10 * minor for a in archs if a.isdigit()), info
