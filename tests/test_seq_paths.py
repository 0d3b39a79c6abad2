"""The time loops of the fused CUDA sequence operators, each forced through
LLTM_SEQ_PATH, against the float64 reference: the persistent kernel over
thread-block clusters (sm_90), the persistent kernel over a cooperative grid
(what GPUs without clusters run), each with its recurrent products on the
FMA units or on tensor cores (LLTM_SEQ_DOT), and the per-step loop replayed
from CUDA graphs; the planner that picks among them; and the arch gate that
keeps a kernel without a body for the device from running."""

from __future__ import annotations

import contextlib
import os
import warnings

import pytest
import torch

import lltm
from lltm import functional
from lltm.reference import lltm_reference

from ._helpers import env_in_backward, held_place
from .test_seq import NAMES, _check, _outputs_and_grads, _rel_err, check_graph_capture_and_replay, make_seq

# "cluster" and "grid" run their FMA dot (every dtype), with W_h in
# registers where the planner finds it fits (float32), "-smem" the
# FMA dot with W_h in shared memory; "-mma" their tensor-core dot (half
# types, and float32 as TF32: use_path allows TF32).
PATHS = ["cluster", "grid", "loop", "cluster-smem", "grid-smem"]
MMA_PATHS = ["cluster-mma", "grid-mma"]
# The relative error allowed float32 on TF32 (10 mantissa bits: ~1e-3).
TF32_TOL = 5e-3

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and lltm._backends.is_available("fused", "cuda", "seq")),
    reason="needs the fused sequence operators on a CUDA device",
)


def _plan(backward=False, steps=4, batch=4, state=16, dtype=torch.float32):
    return torch.ops.lltm._fused_cuda_seq_plan(backward, steps, batch, state, dtype, torch.cuda.current_device())


def _cluster_kernels_here():
    """Thread-block clusters on this device and cluster code in this build."""
    return "no thread-block cluster kernels" not in _plan()


@pytest.fixture
def use_path(monkeypatch, torch_settings):
    def use(path):
        """Forces the fused CUDA time loop `path` and its dot, and returns the
        float32 tolerance of its results: "-mma" allows TF32 (skips "cluster"
        where there are no cluster kernels: checked by
        test_cluster_kernels_present_or_refused; "-mma" before sm_80)."""
        name, _, dot = path.partition("-")
        if name == "cluster" and not _cluster_kernels_here():
            pytest.skip("no thread-block cluster kernels on this device or build")
        if dot == "mma" and torch.cuda.get_device_capability()[0] < 8:
            pytest.skip("no tensor-core MMA before sm_80")
        monkeypatch.setenv("LLTM_SEQ_PATH", name)
        monkeypatch.setenv("LLTM_SEQ_DOT", {"": "fma", "smem": "fma-smem", "regs": "fma-regs"}.get(dot, dot))
        if dot == "mma":
            torch_settings.set(matmul_tf32=True)
            return TF32_TOL
        return 1e-5

    return use


# (T, B, I, S): units and batch rows that divide into no cluster, group or
# thread split evenly, one unit, one batch row, one step, a float64 state
# whose W_h needs 16-CTA clusters, and batches of 300 and 1024 rows.
SHAPES = [
    (7, 5, 3, 17),
    (6, 33, 8, 70),
    (3, 1, 4, 1),
    (1, 3, 2, 5),
    (4, 64, 16, 256),
    (5, 9, 2, 130),
    (2, 3, 5, 300),
    (3, 300, 6, 45),
    (2, 1024, 4, 33),
]


def _shape_id(shape):
    return "x".join(map(str, shape))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("variant", ["bias", "nobias", "lengths"])
def test_paths_match_reference(monkeypatch, use_path, path, shape, variant):
    """Outputs and every gradient of each time loop against the float64
    reference."""
    use_path(path)
    T, B = shape[:2]
    args = make_seq(*shape, device="cuda", bias=variant != "nobias", seed=sum(shape))
    lengths = None
    if variant == "lengths":
        gen = torch.Generator().manual_seed(B)
        lengths = torch.randint(0, T + 1, (B,), generator=gen).cuda()
    _check("fused", args, lengths=lengths)


@pytest.mark.parametrize("path", MMA_PATHS)
@pytest.mark.parametrize("shape", [(7, 5, 3, 17), (6, 33, 8, 70), (4, 64, 16, 256)], ids=_shape_id)
def test_mma_paths_use_tf32_when_allowed(monkeypatch, use_path, torch_settings, path, shape):
    """torch.backends.cuda.matmul.allow_tf32 = True: float32 on TF32 tensor
    cores (the plan says dot=mma), every output and gradient within
    TF32_TOL of the float64 reference; with TF32 off the tensor-core dot
    cannot be forced (strict float32 stays on the FMA units)."""
    tol = use_path(path)
    T, B, _, S = shape
    assert all(" dot=mma " in _plan(bw, T, B, S) for bw in (False, True))
    args = make_seq(*shape, device="cuda", dtype=torch.float32, seed=11)
    got = _outputs_and_grads(lambda *a, **k: functional.lltm(*a, backend="fused", **k), args)
    ref = _outputs_and_grads(lltm_reference, [a.detach().double().requires_grad_() for a in args])
    for name, g, r in zip(("output", "h_n", "c_n") + NAMES, got, ref):
        assert _rel_err(g, r) <= tol, f"{name}: TF32 error {_rel_err(g, r):.2e}"
    torch_settings.set(matmul_tf32=False)
    with pytest.raises(RuntimeError, match="float32 runs on tensor cores only with TF32 allowed"):
        functional.lltm(*args, backend="fused")


@pytest.mark.parametrize("path", MMA_PATHS)
@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_mma_paths_half_precision_match_fma(monkeypatch, use_path, path, shape, dtype):
    """Half types on tensor cores, every odd shape of SHAPES with lengths:
    outputs and every gradient as close to the float64 reference as the
    same path on the FMA units (within twice its error, plus 1e-3 where
    both are near half precision's resolution)."""
    T, B, _, S = shape
    args = make_seq(*shape, device="cuda", dtype=dtype, seed=sum(shape))
    lengths = torch.randint(0, T + 1, (B,), generator=torch.Generator().manual_seed(B)).cuda()
    ref = _outputs_and_grads(lltm_reference, [a.detach().double().requires_grad_() for a in args], lengths)
    errors = {}
    for p, dot in ((path, "mma"), (path.split("-")[0], "fma")):
        use_path(p)
        assert all(f"dot={dot}" in _plan(bw, T, B, S, dtype) for bw in (False, True))
        got = _outputs_and_grads(lambda *a, **k: functional.lltm(*a, backend="fused", **k), args, lengths)
        assert all(torch.isfinite(g).all() for g in got)
        errors[dot] = [_rel_err(g, r) for g, r in zip(got, ref)]
    for name, mma, fma in zip(("output", "h_n", "c_n") + NAMES, errors["mma"], errors["fma"]):
        assert mma <= 2 * fma + 1e-3, f"{name}: MMA error {mma:.2e} > 2 x the FMA dot's {fma:.2e}"


@pytest.mark.parametrize("path", MMA_PATHS)
@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
def test_accurate_mode_backward_mma_is_3xtf32_at_fma_accuracy(monkeypatch, use_path, torch_settings, path, shape):
    """lltm's accurate mode: the backward's step products on the tensor-core dot as 3xTF32 (the plan
    says so; the forward's stay on the strict FMA dot, the mode's only dot there), every odd shape
    of SHAPES with lengths: outputs and every gradient as close to the float64 reference as with
    the FMA dot in both passes (within twice its error, plus 2e-6 where both are near float32's
    resolution; plain TF32's are ~1e-3)."""
    T, B, _, S = shape
    args = make_seq(*shape, device="cuda", dtype=torch.float32, seed=sum(shape))
    lengths = torch.randint(0, T + 1, (B,), generator=torch.Generator().manual_seed(B)).cuda()
    ref = _outputs_and_grads(lltm_reference, [a.detach().double().requires_grad_() for a in args], lengths)
    use_path(path.split("-")[0])  # (skips where there are no cluster kernels)
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("no tensor-core MMA before sm_80")
    torch_settings.set(lltm_fp32_precision="accurate")
    assert " dot=fma" in _plan(False, T, B, S)
    errors = {}
    for dot in ("fma", "mma"):

        def fused(*a, **k):
            results = functional.lltm(*a, backend="fused", **k)
            env_in_backward(monkeypatch, results, LLTM_SEQ_DOT=dot)
            return results

        monkeypatch.setenv("LLTM_SEQ_DOT", "fma")
        got = _outputs_and_grads(fused, args, lengths)
        assert (" dot=mma 3xtf32 " if dot == "mma" else " dot=fma") in _plan(True, T, B, S)
        assert all(torch.isfinite(g).all() for g in got)
        errors[dot] = [_rel_err(g, r) for g, r in zip(got, ref)]
    for name, mma, fma in zip(("output", "h_n", "c_n") + NAMES, errors["mma"], errors["fma"]):
        assert mma <= 2 * fma + 2e-6, f"{name}: 3xTF32 error {mma:.2e} > 2 x the FMA dot's {fma:.2e}"


def test_accurate_mode_forward_has_no_tensor_core_dot(monkeypatch, use_path, torch_settings):
    """The accurate mode keeps the forward's step products strict: LLTM_SEQ_DOT=mma there is an error
    that says where float32 runs on tensor cores."""
    use_path("grid")
    torch_settings.set(lltm_fp32_precision="accurate")
    monkeypatch.setenv("LLTM_SEQ_DOT", "mma")
    args = make_seq(4, 3, 5, 16, device="cuda", dtype=torch.float32, seed=0)
    with pytest.raises(RuntimeError, match="in the backward, as 3xTF32"):
        functional.lltm(*args, backend="fused")


# (path, S, CTAs a chunk, B, W_hh's place forward, backward): the LLTM's plans (3 gates) whose warps
# hold W_hh's A fragments, every k step ("regs") or the first ones ("regs+smem"; the backward's the
# first of each gate segment's share); tests/test_cells.py's test_holds_w_in_registers has the
# LSTM's and the GRU's.
LLTM_HELD_A = [
    ("grid", 200, 8, 5, "regs", "regs"),  # one tile, 13 k steps: four accumulator sets and a tail
    ("grid", 160, 4, 5, "regs", "regs"),  # four-tile tasks over four k slices; backward 3 tiles, 2 of 2
    ("grid", 400, 16, 5, "regs+smem", "regs+smem"),  # one tile, 18 of 25 k steps held; backward 3 of 4
    ("grid", 400, 13, 5, "regs+smem", "regs+smem"),  # three tiles, slices of 6 and 7 k steps, 6 held
    ("grid", 896, 56, 5, "regs+smem", "regs+smem"),  # backward one tile, 6 of 7: a run of one past them
    ("grid", 512, 16, 40, "regs+smem", "regs+smem"),  # five rows of different lengths in the B tile
    ("cluster", 128, 4, 5, "regs", "regs"),
    ("cluster", 512, 16, 5, "regs+smem", "regs+smem"),
]


@pytest.mark.parametrize("asked", ["all", "kernels-only"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("path,S,group,B,held,held_backward", LLTM_HELD_A, ids=str)
def test_lltm_holds_w_in_registers(monkeypatch, use_path, path, S, group, B, held, held_backward, dtype, asked):
    """The LLTM's persistent MMA kernels, forward and backward, with W_hh's A fragments held in
    registers (all or the first k steps) against the same plans reading them from shared memory every
    step (LLTM_SEQ_DOT=mma-smem): the same MMAs in the same order, so outputs, final states and every
    gradient equal bit for bit. "kernels-only": no input features and only the bias's and the initial
    states' gradients, so neither pass runs a cuBLAS GEMM (what compute-sanitizer's racecheck checks,
    as tests/test_cells.py's test_holds_w_in_registers)."""
    use_path(f"{path}-mma")
    monkeypatch.setenv("LLTM_SEQ_CLUSTER" if path == "cluster" else "LLTM_SEQ_GROUP", str(group))
    full = asked == "all"
    T, I = 9, 7 if full else 0
    x, W, bias, h0, c0 = make_seq(T, B, I, S, device="cuda", dtype=dtype, seed=S + B)
    args = (x.requires_grad_(full), W.requires_grad_(full), bias, h0, c0)
    names = ("output", "h_n", "c_n") + tuple(n for n, a in zip(NAMES, args) if a.requires_grad)
    lengths = torch.randint(0, T + 1, (B,), generator=torch.Generator().manual_seed(S)).cuda()
    lengths[:2] = torch.tensor([T, 0])
    results = {}
    for dot, want in (("mma", (held, held_backward)), ("mma-smem", (None, None))):
        monkeypatch.setenv("LLTM_SEQ_DOT", dot)
        for backward, want_w in zip((False, True), want):
            _, place, line = held_place(_plan(backward, T, B, S, dtype), path)
            assert place == want_w, line
        results[dot] = _outputs_and_grads(lambda *a, **k: functional.lltm(*a, backend="fused", **k), args, lengths)
    for name, a, b in zip(names, results["mma"], results["mma-smem"]):
        assert torch.isfinite(a).all(), f"{name}: unwritten or non-finite elements"
        assert torch.equal(a, b), f"{name}: held fragments differ from shared memory's"


@pytest.mark.parametrize("cluster", ["1", "2", "3", "16"])
def test_cluster_sizes(monkeypatch, use_path, cluster):
    """Every cluster size gives the reference's results: the unit split and
    the DSMEM exchange do not depend on it."""
    use_path("cluster")
    monkeypatch.setenv("LLTM_SEQ_CLUSTER", cluster)
    args = make_seq(6, 11, 5, 45, device="cuda", seed=int(cluster))
    _check("fused", args, lengths=torch.tensor([6, 0, 3, 6, 1, 6, 5, 2, 6, 6, 4], device="cuda"))


@pytest.mark.parametrize("dot", ["fma-regs", "fma-smem"])
@pytest.mark.parametrize("path", ["cluster", "grid"])
def test_one_cta_per_chunk_float32(monkeypatch, use_path, path, dot):
    """One CTA per batch chunk (cluster of 1, grid group of 1) with W_h in
    registers and in shared memory, float32, 30 launches: a CTA alone in
    its cluster waits for no other CTA's stores (an mbarrier armed for no
    bytes completes at once, which once let a lagging warp wait for the
    phase after: a hang that came and went with warp timing)."""
    tol = use_path(path)
    monkeypatch.setenv("LLTM_SEQ_CLUSTER" if path == "cluster" else "LLTM_SEQ_GROUP", "1")
    monkeypatch.setenv("LLTM_SEQ_DOT", dot)
    args = make_seq(6, 11, 5, 45, device="cuda", dtype=torch.float32, seed=3)
    lengths = torch.tensor([6, 0, 3, 6, 1, 6, 5, 2, 6, 6, 4], device="cuda")
    w = "w=regs" if dot == "fma-regs" else "w=smem"
    for backward in (False, True):
        assert w in _plan(backward, 6, 11, 45, torch.float32).splitlines()[1]
    ref = _outputs_and_grads(lltm_reference, [a.detach().double().cpu().requires_grad_() for a in args], lengths.cpu())
    fused = lambda *a, **k: functional.lltm(*a, backend="fused", **k)  # noqa: E731
    for _ in range(30):
        got = _outputs_and_grads(fused, args, lengths)
    for name, g, r in zip(("output", "h_n", "c_n") + NAMES, got, ref):
        assert _rel_err(g, r) <= tol, f"{name}: error {_rel_err(g, r):.2e}"


@pytest.mark.parametrize("group", ["1", "2", "3", "7", "45"])
def test_grid_group_sizes(monkeypatch, use_path, group):
    """Every grid group size (CTAs sharing one batch chunk through L2) gives
    the reference's results; 45 CTAs own one unit each."""
    use_path("grid")
    monkeypatch.setenv("LLTM_SEQ_GROUP", group)
    args = make_seq(6, 11, 5, 45, device="cuda", seed=int(group))
    _check("fused", args, lengths=torch.tensor([6, 0, 3, 6, 1, 6, 5, 2, 6, 6, 4], device="cuda"))


def _grid_line(report):
    return next(line for line in report.splitlines() if line.strip().startswith("grid group="))


def _multicast_here():
    """Hopper, whose build has the grid path's multicast kernels."""
    return torch.cuda.get_device_capability()[0] == 9


@pytest.mark.parametrize("multicast", ["2", "4", "8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grid_multicast(monkeypatch, use_path, dtype, multicast):
    """Clusters of a grid group sharing each reload by multicast
    (LLTM_SEQ_MULTICAST; the MMA dot on Hopper) give the results of the
    plain grid kernels and the reference's, forward and backward; the plan
    names them, and a launch that runs without them (its warning) is an
    error here."""
    if not _multicast_here():
        pytest.skip("the grid's multicast kernels run on Hopper (sm_90)")
    tol = use_path("grid-mma")
    monkeypatch.setenv("LLTM_SEQ_GROUP", "8")
    args = make_seq(6, 11, 5, 45, device="cuda", dtype=dtype, seed=int(multicast))
    lengths = torch.tensor([6, 0, 3, 6, 1, 6, 5, 2, 6, 6, 4], device="cuda")
    fused = lambda *a, **k: functional.lltm(*a, backend="fused", **k)  # noqa: E731
    monkeypatch.setenv("LLTM_SEQ_MULTICAST", "1")
    plain = _outputs_and_grads(fused, args, lengths)
    monkeypatch.setenv("LLTM_SEQ_MULTICAST", multicast)
    for backward in (False, True):
        assert f"multicast={multicast}" in _grid_line(_plan(backward, 6, 11, 45, dtype))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*LLTM_SEQ_MULTICAST.*")
        shared = _outputs_and_grads(fused, args, lengths)
        if dtype == torch.float32:
            _check("fused", args, lengths=lengths, tol=tol)
    # The same bytes land in shared memory either way: the same results, bit for bit.
    for a, b in zip(plain, shared):
        assert torch.equal(a, b)


def test_grid_multicast_plans_what_the_clusters_place(monkeypatch, use_path):
    """GPCs hold whole clusters, so clusters of 4 may place fewer CTAs than
    the plain kernels (30 clusters, 120 CTAs, of this shape on a 132-SM
    Hopper): the planner asks before it splits the batch, and plans chunks
    of a wave that all fit (there, the forward's one chunk of 16 rows in
    place of two of 8), so the launch runs the clusters asked for, without
    a warning, with the reference's results."""
    if not _multicast_here():
        pytest.skip("the grid's multicast kernels run on Hopper (sm_90)")
    tol = use_path("grid-mma")
    monkeypatch.setenv("LLTM_SEQ_GROUP", "64")  # 64 CTAs of one CTA an SM a chunk
    monkeypatch.setenv("LLTM_SEQ_MULTICAST", "4")
    for backward in (False, True):
        assert "multicast=4" in _grid_line(_plan(backward, 5, 16, 768, torch.float32))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*LLTM_SEQ_MULTICAST.*")
        _check("fused", make_seq(5, 16, 7, 768, device="cuda", dtype=torch.float32, seed=5), tol=tol)


def test_grid_multicast_that_cannot_run_warns(monkeypatch, use_path):
    """Clusters of 8 in a group of 3 CTAs cannot run: the grid path runs
    without clusters, says so (naming the setting and the group), with the
    plain kernels' results. (bfloat16: the warning comes once per process
    and kernel family, and no other test makes this one warn.)"""
    if not _multicast_here():
        pytest.skip("the grid's multicast kernels run on Hopper (sm_90)")
    use_path("grid-mma")
    monkeypatch.setenv("LLTM_SEQ_GROUP", "3")
    monkeypatch.setenv("LLTM_SEQ_MULTICAST", "8")
    assert "multicast=1" in _grid_line(_plan(False, 6, 11, 45, torch.bfloat16))
    args = make_seq(6, 11, 5, 45, device="cuda", dtype=torch.bfloat16, seed=8)
    fused = lambda *a, **k: functional.lltm(*a, backend="fused", **k)  # noqa: E731
    with pytest.warns(UserWarning, match="LLTM_SEQ_MULTICAST=8 cannot run here.*group of 3 CTAs"):
        got = _outputs_and_grads(fused, args)
    monkeypatch.setenv("LLTM_SEQ_MULTICAST", "1")
    for a, b in zip(got, _outputs_and_grads(fused, args)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("setting", [None, "1"])
def test_grid_multicast_default(monkeypatch, use_path, setting):
    """The planner shares the reload of the grid's MMA kernels in clusters of
    2 from S = 768 on (Hopper), not below, and not with LLTM_SEQ_MULTICAST=1;
    the results are the reference's either way."""
    if not _multicast_here():
        pytest.skip("the grid's multicast kernels run on Hopper (sm_90)")
    tol = use_path("grid-mma")
    monkeypatch.setenv("LLTM_SEQ_GROUP", "64")  # W_h's slices fit the CTAs' shared memory
    if setting is not None:
        monkeypatch.setenv("LLTM_SEQ_MULTICAST", setting)
    assert "multicast=1" in _grid_line(_plan(False, 6, 3, 767, torch.float16))
    expected = "multicast=1" if setting == "1" else "multicast=2"
    for backward in (False, True):
        assert expected in _grid_line(_plan(backward, 6, 3, 768, torch.float16))
    _check("fused", make_seq(6, 3, 5, 768, device="cuda", dtype=torch.float32, seed=3), tol=tol)


@pytest.mark.parametrize("value", ["3", "0", "16", "two"])
def test_grid_multicast_bad_setting(monkeypatch, value):
    """LLTM_SEQ_MULTICAST other than 1, 2, 4 or 8 is an error naming it."""
    monkeypatch.setenv("LLTM_SEQ_MULTICAST", value)
    with pytest.raises(RuntimeError, match=f"LLTM_SEQ_MULTICAST={value}"):
        _plan(False, 6, 3, 256)


@pytest.mark.parametrize("loss_on", ["output", "h_n", "c_n"])
@pytest.mark.parametrize("path", PATHS)
def test_paths_loss_on_one_output(monkeypatch, use_path, loss_on, path):
    use_path(path)
    _check("fused", make_seq(8, 6, 5, 40, device="cuda", seed=2), loss_on=(loss_on,))


@pytest.mark.parametrize("path", PATHS)
def test_paths_long_float32(monkeypatch, use_path, path):
    """T = 1000 in float32: the error against float64 is at most twice that
    of the per-step PyTorch reference in float32 (the recurrence amplifies
    round-off over 1000 steps, in any implementation)."""
    use_path(path)
    args = make_seq(1000, 16, 32, 128, device="cuda", dtype=torch.float32, seed=4)
    got = _outputs_and_grads(lambda *a, **k: functional.lltm(*a, backend="fused", **k), args)
    plain = _outputs_and_grads(lltm_reference, args)
    ref = _outputs_and_grads(lltm_reference, [a.detach().double().requires_grad_() for a in args])
    for name, g, p, r in zip(("output", "h_n", "c_n") + NAMES, got, plain, ref):
        err, err_plain = _rel_err(g, r), _rel_err(p, r)
        assert err <= 2 * err_plain + 1e-6, f"{name}: error {err:.2e} > 2 x plain PyTorch's {err_plain:.2e}"


@pytest.mark.parametrize("path", PATHS + MMA_PATHS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("lengths", [None, [20, 3, 11, 0, 20, 7]], ids=["full", "lengths"])
def test_paths_half_precision_within_twice_plain_pytorch(monkeypatch, use_path, path, dtype, lengths):
    """The error against float64 is at most twice that of the per-step
    PyTorch reference run in the same dtype; every output is written."""
    use_path(path)
    args = make_seq(20, 6, 24, 72, device="cuda", dtype=dtype, seed=5)
    lens = None if lengths is None else torch.tensor(lengths, device="cuda")
    got = _outputs_and_grads(lambda *a, **k: functional.lltm(*a, backend="fused", **k), args, lens)
    plain = _outputs_and_grads(lltm_reference, args, lens)
    ref = _outputs_and_grads(lltm_reference, [a.detach().double().requires_grad_() for a in args], lens)
    for name, g, p, r in zip(("output", "h_n", "c_n") + NAMES, got, plain, ref):
        assert g.dtype == dtype and torch.isfinite(g).all(), name
        err, err_plain = _rel_err(g, r), _rel_err(p, r)
        assert err <= 2 * err_plain + 1e-6, f"{name}: error {err:.2e} > 2 x plain PyTorch's {err_plain:.2e}"


@pytest.mark.parametrize("path", PATHS + MMA_PATHS)
def test_paths_write_every_output(monkeypatch, use_path, path):
    """Outputs come from the caching allocator poisoned with NaN first: every
    element of every output and gradient must be written."""
    tol = use_path(path)
    args = make_seq(9, 5, 7, 33, device="cuda", dtype=torch.float32, seed=7)
    poison = torch.full((1 << 22,), float("nan"), device="cuda")
    del poison  # the freed block is handed out again, NaN-filled
    got = _outputs_and_grads(lambda *a, **k: functional.lltm(*a, backend="fused", **k), args)
    ref = _outputs_and_grads(lltm_reference, [a.detach().double().cpu().requires_grad_() for a in args])
    for name, g, r in zip(("output", "h_n", "c_n") + NAMES, got, ref):
        assert torch.isfinite(g).all(), f"{name}: unwritten elements"
        assert _rel_err(g, r) <= tol, name


@pytest.mark.parametrize("path", PATHS + MMA_PATHS)
def test_paths_in_a_users_cuda_graph(monkeypatch, use_path, path):
    """Forward and backward of a whole layer captured in the user's CUDA
    graph (no host synchronisation inside), replayed on new inputs."""
    check_graph_capture_and_replay("fused", tol=use_path(path))


@pytest.mark.parametrize("graphs", ["1", "0"], ids=["replay", "no-replay"])
@pytest.mark.parametrize("lengths", [None, [5, 2, 0, 5]], ids=["full", "lengths"])
def test_loop_replays_its_graph(monkeypatch, graphs, lengths):
    """The step loop runs the same call eagerly, then captures it, then
    replays the graph: every call gives the reference's results, new
    inputs in the same buffers included, and a call with other buffers or
    sizes is not served a graph of another key."""
    monkeypatch.setenv("LLTM_SEQ_PATH", "loop")
    monkeypatch.setenv("LLTM_SEQ_GRAPHS", graphs)
    # A memory pool of the test's own (torch 2.6+): the blocks earlier tests left free in the caching
    # allocator's shared pool (split and merged as they came) do not decide where this test's buffers
    # land, so every call gets the same ones, as in a training loop.
    caching = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1"
    pool = torch.cuda.MemPool() if caching and hasattr(torch.cuda, "MemPool") else None
    with torch.cuda.use_mem_pool(pool) if pool is not None else contextlib.nullcontext():
        _replay_calls(graphs, lengths)


def _replay_calls(graphs, lengths):
    lens = None if lengths is None else torch.tensor(lengths, device="cuda")
    static = [a.detach() for a in make_seq(5, 4, 6, 24, device="cuda", dtype=torch.float32, seed=1)]
    before = torch.ops.lltm._fused_cuda_seq_graph_stats()
    for call in range(5):
        # new values made on the host: no CUDA block of this call's inputs shifts where its outputs land
        fresh = make_seq(5, 4, 6, 24, device="cpu", dtype=torch.float32, seed=20 + call, requires_grad=False)
        with torch.no_grad():
            for dst, src in zip(static, fresh):
                dst.copy_(src)
        args = [a.requires_grad_() for a in static]
        got = _outputs_and_grads(lambda *a, **k: functional.lltm(*a, backend="fused", **k), args, lens)
        ref = _outputs_and_grads(
            lltm_reference,
            [a.detach().double().cpu().requires_grad_() for a in args],
            None if lens is None else lens.cpu(),
        )
        for name, g, r in zip(("output", "h_n", "c_n") + NAMES, got, ref):
            assert _rel_err(g, r) <= 1e-5, f"call {call}, {name}"
        del got  # every call then gets the same blocks from the caching allocator: one key per direction
        for a in static:
            a.requires_grad_(False)
    eager, captures, replays = (b - a for a, b in zip(before, torch.ops.lltm._fused_cuda_seq_graph_stats()))
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1":
        pass  # every call's buffers come from cudaMalloc, at new addresses: no key is seen twice
    elif graphs == "1":  # forward and backward keys: run eagerly, captured, then replayed
        assert replays >= 2, (eager, captures, replays)
    else:
        assert eager == captures == replays == 0, (eager, captures, replays)
    other = make_seq(5, 3, 6, 24, device="cuda", dtype=torch.float32, seed=99)
    _check("fused", other, tol=2e-5)


def test_bad_settings_are_clear_errors(monkeypatch):
    """A wrong LLTM_SEQ_PATH / LLTM_SEQ_CLUSTER / LLTM_SEQ_GROUP /
    LLTM_SEQ_LOOP_SPLITS / LLTM_SEQ_DOT names the setting and its values; the tensor-core dot
    forced for float64 says it has none."""
    args = make_seq(2, 2, 3, 4, device="cuda", dtype=torch.float32, requires_grad=False)
    for value in ("fast", "grid,fast", ","):
        monkeypatch.setenv("LLTM_SEQ_PATH", value)
        with pytest.raises(RuntimeError, match=f"LLTM_SEQ_PATH={value} (is not a sequence path|names no)"):
            functional.lltm(*args, backend="fused")
    monkeypatch.delenv("LLTM_SEQ_PATH")
    for name, value in (
        ("LLTM_SEQ_CLUSTER", "40"),
        ("LLTM_SEQ_CLUSTER", "two"),
        ("LLTM_SEQ_GROUP", "0"),
        ("LLTM_SEQ_LOOP_SPLITS", "9"),
    ):
        monkeypatch.setenv(name, value)
        with pytest.raises(RuntimeError, match=f"{name}={value} must be a whole number"):
            functional.lltm(*args, backend="fused")
        monkeypatch.delenv(name)
    monkeypatch.setenv("LLTM_SEQ_DOT", "tensor")
    with pytest.raises(RuntimeError, match="LLTM_SEQ_DOT=tensor is not a dot"):
        functional.lltm(*args, backend="fused")
    monkeypatch.setenv("LLTM_SEQ_DOT", "mma")
    monkeypatch.setenv("LLTM_SEQ_PATH", "grid")
    with pytest.raises(RuntimeError, match="no tensor-core dot for float64"):
        functional.lltm(*[a.double() for a in args], backend="fused")
    monkeypatch.setenv("LLTM_SEQ_DOT", "mma-smem")  # the setting named as given
    with pytest.raises(RuntimeError, match="LLTM_SEQ_DOT=mma-smem: no tensor-core dot for float64"):
        functional.lltm(*[a.double() for a in args], backend="fused")
    monkeypatch.setenv("LLTM_SEQ_DOT", "fma-regs")
    for dtype in (torch.bfloat16, torch.float64):
        with pytest.raises(RuntimeError, match="fma-regs: W_h in registers for float32 only"):
            functional.lltm(*[a.to(dtype) for a in args], backend="fused")


def test_fma_dot_keeps_w_h_in_registers_where_it_fits(monkeypatch):
    """Strict float32 at B = 16, S = 128 runs the FMA dot with W_h's slice
    in registers in both directions (the plan says w=regs); forced where a
    lane would hold more than its registers take (S = 2048: 512 chunks of a
    row over 16 lanes), the error names the setting; the
    shared-memory form stays available (fma-smem)."""
    monkeypatch.setenv("LLTM_SEQ_PATH", "grid")
    monkeypatch.setenv("LLTM_SEQ_GROUP", "8")  # one candidate: 16 units a CTA, 16 lanes a unit
    for backward in (False, True):
        assert "dot=fma w=regs" in _plan(backward, 100, 16, 128).splitlines()[1]
    monkeypatch.setenv("LLTM_SEQ_DOT", "fma-smem")
    for backward in (False, True):
        assert "dot=fma w=smem" in _plan(backward, 100, 16, 128).splitlines()[1]
    monkeypatch.setenv("LLTM_SEQ_DOT", "fma-regs")
    args = make_seq(1, 1, 1, 2048, device="cuda", dtype=torch.float32, requires_grad=False)
    with pytest.raises(RuntimeError, match="grid: W_h's slice does not fit in the registers"):
        functional.lltm(*args, backend="fused")


@pytest.mark.parametrize("path", ["cluster", "grid"])
def test_forced_path_that_cannot_run_is_a_clear_error(monkeypatch, use_path, path):
    """W_h of S = 2500 in float64 (150 MB) fits in no cluster and no grid:
    forcing either names the path and why; unforced, the loop runs."""
    use_path(path)
    args = make_seq(1, 1, 1, 2500, device="cuda", requires_grad=False)
    with pytest.raises(RuntimeError, match=f"allows no time loop that can run here: {path}: "):
        functional.lltm(*args, backend="fused")
    monkeypatch.delenv("LLTM_SEQ_PATH")
    out, _ = functional.lltm(*args, backend="fused")
    assert torch.isfinite(out).all()


def test_plan_report_names_the_choice(monkeypatch):
    """lltm::_fused_cuda_seq_plan lists every candidate with the model's
    time and the choice; "grid,loop" (what GPUs without clusters get)
    never picks the cluster kernel."""
    for backward in (False, True):
        report = _plan(backward, 100, 64, 256)
        first = report.splitlines()[0]
        assert first.startswith("lltm " + ("backward" if backward else "forward"))  # the cell, then the direction
        chosen = first.rsplit(": ", 1)[1]
        assert chosen in PATHS
        assert any(line.strip().startswith(chosen) and "model_us=" in line for line in report.splitlines()[1:])
    monkeypatch.setenv("LLTM_SEQ_PATH", "grid,loop")
    for batch, state in ((16, 128), (512, 1024), (64, 256)):
        chosen = _plan(False, 100, batch, state).splitlines()[0].rsplit(": ", 1)[1]
        assert chosen in ("grid", "loop")


def test_cluster_kernels_present_or_refused(monkeypatch):
    """The cluster kernels run only where the device has clusters and the
    build has their code for it (a build for "8.0+PTX" JIT-compiles sm_80
    code, without clusters, on a Hopper GPU): otherwise forcing them is a
    clear error and the default path still gives the reference's results."""
    archs = [int(a) for a in torch.ops.lltm._build_info().split("arch=")[1].split(",")]
    expected = torch.cuda.get_device_capability()[0] >= 9 and max(archs) >= 900
    assert _cluster_kernels_here() == expected
    args = make_seq(5, 3, 4, 16, device="cuda", seed=3)
    if not expected:
        monkeypatch.setenv("LLTM_SEQ_PATH", "cluster")
        with pytest.raises(RuntimeError, match="no thread-block cluster kernels"):
            functional.lltm(*args, backend="fused")
        monkeypatch.delenv("LLTM_SEQ_PATH")
    _check("fused", args)
