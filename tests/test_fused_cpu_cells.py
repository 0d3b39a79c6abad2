"""The fused CPU kernels of the seam's cells (lltm/csrc/cpu, written once over the cells' traits) where
tests/test_cells.py's generic suites do not reach; LLTM's own operators, adapters over the same kernels,
keep theirs in tests/test_fused_cpu.py:

- state sizes that do not fill a vector (S = 1, 3, 17, 70), rows of every length;
- every output element written: fresh memory filled with NaN (deterministic mode's fill);
- the same results with 1 and 2 threads (a team of threads splits the unit blocks of every step);
- bfloat16 and float16 by the rule "error <= 2x the error of plain PyTorch in the same dtype";
- every CPU capability build (AVX-512, AVX2, baseline) gives the same results (ATEN_CPU_CAPABILITY picks
  the build, as it does torch's), including LLTM's layer and cell.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lltm
from lltm import cells

from ._helpers import LOW_PRECISION, TOLERANCE, rel_err
from .test_cells import make_layer, outputs_and_grads, reference, run

SEAM = [cells.LSTM, cells.GRU]

pytestmark = pytest.mark.skipif(
    not all(lltm._backends.is_available("fused", "cpu", c.op_family()) for c in SEAM),
    reason="fused CPU kernels of the seam's cells not built",
)


def _to(args, dtype):
    x, w_ih, w_hh, b_ih, b_hh, state = args
    cast = [t.to(dtype) if t is not None else None for t in (x, w_ih, w_hh, b_ih, b_hh)]
    return (*cast, tuple(s.to(dtype) for s in state))


def _check(cell, args, lengths, dtype, tol=None):
    """The fused layer's outputs and every gradient against the float64 reference."""
    got = outputs_and_grads(run(cell, "fused"), args, lengths)
    want = outputs_and_grads(reference(cell), _to(args, torch.float64), lengths)
    tol = TOLERANCE[dtype] if tol is None else tol
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == dtype and g.shape == w.shape, f"result {k}"
        assert rel_err(g.double(), w) <= tol, f"result {k}: {rel_err(g.double(), w):.2e}"


@pytest.mark.parametrize("state", [1, 3, 17, 70])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("cell", SEAM, ids=lambda c: c.name)
def test_odd_state_sizes_and_lengths(cell, dtype, state):
    """S that does not fill a vector (the partial last vector of every row), batch 16 (two row tiles and
    smaller ones), rows of length T, 0, 3 and 5."""
    args = make_layer(cell, 6, 16, 5, state, dtype=dtype, seed=state)
    _check(cell, args, torch.tensor([6, 0, 3, 5] * 4), dtype)


@pytest.mark.parametrize("cell", SEAM, ids=lambda c: c.name)
def test_one_step_long_sequence_and_no_input(cell):
    """T = 1 and T = 300 (no drift between the forward's states and backward's recompute), and I = 0."""
    for T, I in ((1, 4), (300, 3), (4, 0)):
        args = make_layer(cell, T, 3, I, 9, seed=T)
        _check(cell, args, None, torch.float64)


# Large enough that a step's work splits over two threads. The backward's workers split the unit
# blocks at S = 256 (W_hh's packed panels past 512 KiB) and the batch rows at S = 70, whose unit
# blocks are of unequal count (5 blocks of 16 floats on AVX-512, 9 of 8 on AVX2), with lengths.
THREAD_CASES = {"B96-S256": (4, 96, 40, 256, None), "B64-S70-lengths": (5, 64, 40, 70, [5, 0, 3] * 21 + [4])}


@pytest.mark.parametrize("case", list(THREAD_CASES))
@pytest.mark.parametrize("cell", SEAM, ids=lambda c: c.name)
def test_one_and_two_threads_agree(cell, case, torch_settings):
    """Each unit's math is the same whatever the split (of the unit blocks or of the batch rows); only
    the summation order of the parameter gradients may change. Two threads also against the float64
    reference."""
    T, B, I, S, lengths = THREAD_CASES[case]
    lens = None if lengths is None else torch.tensor(lengths)
    args = make_layer(cell, T, B, I, S, dtype=torch.float32, seed=B + S)
    results = {}
    for n in (1, 2):
        torch_settings.set(num_threads=n)
        results[n] = outputs_and_grads(run(cell, "fused"), args, lens)
    for k, (a, b) in enumerate(zip(results[1], results[2])):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda m: f"result {k}: {m}")
    _check(cell, args, lens, torch.float32)  # still 2 threads


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("cell", SEAM, ids=lambda c: c.name)
def test_half_precision_within_twice_plain_pytorch(cell, dtype):
    """Outputs and every gradient at most 2x the error of the reference run in the same low precision
    (both against float64), with lengths, at T = 50 (the kernels compute in float32, one rounding per
    stored value)."""
    args = make_layer(cell, 50, 16, 16, 32, seed=9)
    lengths = torch.tensor([50, 0, 17, 49, 1, 33, 50, 2] * 2)
    low = _to(args, dtype)
    got = outputs_and_grads(run(cell, "fused"), low, lengths)
    plain = outputs_and_grads(reference(cell), low, lengths)
    exact = outputs_and_grads(reference(cell), args, lengths)
    for k, (g, p, e) in enumerate(zip(got, plain, exact)):
        assert g.dtype == dtype and torch.isfinite(g).all()
        assert rel_err(g, e) <= 2 * rel_err(p, e) + 1e-6, f"result {k}: {rel_err(g, e):.2e} vs {rel_err(p, e):.2e}"


# (T, B, I, S, lengths): batch 1 and 3, states that do not fill a vector, rows past their length, and a
# layer that two threads split
POISON_CASES = [
    (5, 1, 2, 33, None),
    (6, 3, 4, 17, [6, 0, 2]),
    (5, 64, 40, 70, [5, 0, 3] * 21 + [4]),
]


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", POISON_CASES, ids=lambda c: "x".join(map(str, c[:4])) + ("-lengths" if c[4] else ""))
@pytest.mark.parametrize("cell", SEAM, ids=lambda c: c.name)
def test_every_element_written(cell, case, dtype, n_threads, torch_settings):
    """Every output element is written (a NaN left in one fails), and right: float32 by the suite's
    rule, bfloat16 within its own rounding (the 2x rule is test_half_precision_*'s)."""
    T, B, I, S, lengths = case
    lens = None if lengths is None else torch.tensor(lengths)
    args = _to(make_layer(cell, T, B, I, S, seed=S), dtype)
    torch_settings.set(num_threads=n_threads, deterministic_algorithms=(True, False), fill_uninitialized_memory=True)
    got = outputs_and_grads(run(cell, "fused"), args, lens)
    torch_settings.restore()
    want = outputs_and_grads(reference(cell), _to(args, torch.float64), lens)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == dtype and torch.isfinite(g).all(), f"result {k}"
        assert rel_err(g.double(), w) <= (TOLERANCE[dtype] if dtype == torch.float32 else 5e-2), f"result {k}"


CAPABILITY_SCRIPT = """
import torch, lltm
from lltm import functional
torch.manual_seed(0)
T, B, I, S = 4, 33, 7, 37
x = torch.randn(T, B, I, dtype=torch.float64)
lengths = torch.tensor([4, 0, 2] * 11)
rows = []
for cell, G, NS in (("lstm", 4, 2), ("gru", 3, 1), ("lltm", 3, 2)):
    w_ih = torch.randn(G * S, I, dtype=torch.float64) * 0.3
    w_hh = torch.randn(G * S, S, dtype=torch.float64) * 0.2
    b_ih, b_hh = torch.randn(2, G * S, dtype=torch.float64)
    state = tuple(torch.randn(B, S, dtype=torch.float64) for _ in range(NS))
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        args = [a.to(dtype).clone().requires_grad_() for a in (x, w_ih, w_hh, b_ih, b_hh, *state)]
        if cell == "lltm":  # its own operators: weights [W_hh | W_ih], one bias
            W = torch.cat([args[2], args[1]], 1)
            out, (h, c) = functional.lltm(args[0], W, args[3], *args[5:], backend="fused")
            out_l, (h_l, c_l) = functional.lltm(args[0], W, args[3], *args[5:], lengths=lengths, backend="fused")
            h_1, c_1 = functional.lltm_cell(args[0][0], W, args[3], *args[5:], backend="fused")
            finals = [out, h, c, out_l, h_l, c_l, h_1, c_1]
        else:
            out, fin = functional.rnn(cell, *args[:5], tuple(args[5:]), backend="fused")
            out_l, fin_l = functional.rnn(cell, *args[:5], tuple(args[5:]), lengths=lengths, backend="fused")
            finals = [out, *fin, out_l, *fin_l]
        loss = sum((f.double().sin() * (i + 1)).sum() for i, f in enumerate(finals))
        loss.backward()
        rows.append([t.detach().double() for t in finals] + [a.grad.double() for a in args if a.grad is not None])
torch.save((torch.backends.cpu.get_cpu_capability(), torch.ops.lltm._fused_cpu_capability(), rows), {path!r})
"""


def _runnable_capabilities() -> list[str]:
    """The values of ATEN_CPU_CAPABILITY this CPU can run: torch takes the one asked for even where the CPU
    lacks its instructions (then its own kernels die of SIGILL)."""
    caps = ["default"]
    if platform.machine() in ("x86_64", "AMD64"):
        caps += ["avx2"] * torch.cpu._is_avx2_supported() + ["avx512"] * torch.cpu._is_avx512_supported()
    return caps


def test_every_capability_build_agrees(tmp_path):
    """The baseline, AVX2 and AVX-512 builds of the kernels give the same results (to rounding) wherever
    torch can run each on this CPU: LSTM and GRU layers with and without lengths, and LLTM's layer and
    cell through its own operators, forward and every gradient, in float32, float64 and bfloat16."""
    root = Path(__file__).resolve().parents[1]
    results = {}
    for cap in _runnable_capabilities():
        path = tmp_path / f"{cap}.pt"
        env = dict(os.environ, ATEN_CPU_CAPABILITY=cap)
        proc = subprocess.run(
            [sys.executable, "-c", CAPABILITY_SCRIPT.format(path=str(path))],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr
        used, build, rows = torch.load(path)
        if platform.machine() in ("x86_64", "AMD64"):
            assert build == used.lower(), f"torch runs {used}, the fused kernels {build}"
        results[used] = rows
    assert "DEFAULT" in results, f"ran with {sorted(results)}"
    base = results["DEFAULT"]
    tol = {0: 1e-5, 1: 1e-12, 2: 3e-2}  # per dtype, in the script's order
    for used, rows in results.items():
        for k, (row, base_row) in enumerate(zip(rows, base)):
            assert len(row) == len(base_row)
            for i, (a, b) in enumerate(zip(row, base_row)):
                err = rel_err(a, b)
                assert err <= tol[k % 3], f"{used} vs DEFAULT, case {k}, tensor {i}: {err:.2e}"
