"""Tests of the fused CPU backend (lltm/csrc/cpu) beyond the shared suites
(test_parity, test_compile, ... cover it through lltm._backends.NAMES):

- state sizes that do not fill a vector (S = 1, 3, 17, 70), cell and layer;
- every output element written: the suites' cases rerun with fresh memory
  filled with NaN (deterministic mode's fill of uninitialized memory);
- the same results with 1 and 2 threads (a team of threads splits the unit
  blocks of every step; uneven splits, variable lengths);
- a cell in a training loop (W updated in place between calls);
- bfloat16 and float16 by the rule "error <= 2x the error of plain PyTorch
  in the same dtype", against a float64 reference;
- layers of T = 0, 1 and 300 steps, variable lengths, bias None,
  non-contiguous (batch_first transposed) input.

That every CPU capability build (AVX-512, AVX2, baseline) gives the same
results, the LLTM's operators included, is test_fused_cpu_cells.py's
test_every_capability_build_agrees.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Optional

import pytest
import torch

import lltm
from lltm import functional
from lltm.reference import lltm_cell_reference, lltm_reference

from ._helpers import LOW_PRECISION, assert_matches, make_inputs, rel_err

pytestmark = pytest.mark.skipif(not lltm.backends("cpu")["fused"], reason="fused CPU kernels not built")

DTYPE_IDS = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def run(fn: Callable, args: list, out_grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """Outputs of fn(*args) (a flat tuple) and the gradients of sum <out, g>
    with respect to every tensor argument (None ones skipped)."""
    args = [a.detach().requires_grad_(True) if a is not None else None for a in args]
    outs = fn(*args)
    leaves = [a for a in args if a is not None]
    # (the reference's empty output of a T = 0 layer has no graph)
    pairs = [(o, g) for o, g in zip(outs, out_grads) if o.requires_grad]
    grads = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs], allow_unused=True)
    grads = [torch.zeros_like(a) if g is None else g for a, g in zip(leaves, grads)]
    return [o.detach() for o in outs] + list(grads)


def cell_fn(backend: str) -> Callable:
    return lambda *a: functional.lltm_cell(*a, backend=backend)


def layer_fn(backend: str, lengths: Optional[torch.Tensor] = None) -> Callable:
    def fn(x, W, b, h0, c0):
        if backend == "reference":
            out, (h, c) = lltm_reference(x, W, b, h0, c0, lengths)
        else:
            out, (h, c) = functional.lltm(x, W, b, h0, c0, lengths=lengths, backend=backend)
        return out, h, c

    return fn


def seq_inputs(T, B, I, S, dtype=torch.float32, bias=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.rand(T, B, I, generator=gen, dtype=torch.float64) * 2 - 1).to(dtype)
    _, W, b, h0, c0 = make_inputs(B, I, S, dtype=dtype, seed=seed + 1, bias=bias, requires_grad=False)
    return [x, W, b, h0, c0]


def out_grads_like(outs: list[torch.Tensor], seed=1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype) for o in outs]


def check_against_reference(fn, ref_fn, args, dtype, names):
    """fn's outputs and gradients against ref_fn's in float64 (and, for
    bf16 / fp16, against 2x the error of ref_fn run in the same dtype)."""
    probe = ref_fn(*[a.detach().double() if a is not None else None for a in args])
    grads = out_grads_like(list(probe))
    got = run(fn, args, [g.to(dtype) for g in grads])
    ref = run(ref_fn, [a.double() if a is not None else None for a in args], grads)
    plain = run(ref_fn, args, [g.to(dtype) for g in grads]) if dtype in LOW_PRECISION else None
    assert len(got) == len(ref) == len(names)
    assert_matches(got, ref, dtype, plain=plain, names=names)


CELL_NAMES = ("new_h", "new_cell", "grad_input", "grad_weights", "grad_bias", "grad_old_h", "grad_old_cell")
SEQ_NAMES = ("output", "h_n", "c_n", "grad_input", "grad_weights", "grad_bias", "grad_h0", "grad_c0")


def without_bias(names):
    return tuple(n for n in names if n != "grad_bias")


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("state", [1, 3, 17, 70])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=DTYPE_IDS.get)
def test_cell_odd_state_sizes(dtype, state, bias):
    """S that does not fill a vector: the scalar tail of every row."""
    # batch 16: enough elements that the 2x rule of bf16 / fp16 is not decided by one rounding
    args = list(make_inputs(16, 7, state, dtype=dtype, seed=state, bias=bias, requires_grad=False))
    names = CELL_NAMES if bias else without_bias(CELL_NAMES)
    check_against_reference(cell_fn("fused"), lltm_cell_reference, args, dtype, names)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("state", [1, 3, 17, 70])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=DTYPE_IDS.get)
def test_layer_odd_state_sizes(dtype, state, bias):
    # batch 16, as for the cell: at S = 1 or 3 and batch 4, h_n and c_n have
    # 4 to 12 elements, and the 2x rule of bf16 was decided by a rounding or two
    args = seq_inputs(6, 16, 5, state, dtype=dtype, bias=bias, seed=state)
    names = SEQ_NAMES if bias else without_bias(SEQ_NAMES)
    check_against_reference(layer_fn("fused"), layer_fn("reference"), args, dtype, names)


@pytest.mark.parametrize("steps", [0, 1, 300])
def test_layer_lengths_of_time(steps):
    args = seq_inputs(steps, 3, 4, 9, dtype=torch.float64, seed=steps)
    check_against_reference(layer_fn("fused"), layer_fn("reference"), args, torch.float64, SEQ_NAMES)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=DTYPE_IDS.get)
def test_layer_variable_lengths(dtype):
    """Rows of length T, 0, 3, T - 1 and 1: padding outputs are 0 and h_n /
    c_n are each row's last state (a length above T is refused: tests/test_lengths.py)."""
    T = 7
    lengths = torch.tensor([T, 0, 3, T - 1, 1])
    args = seq_inputs(T, 5, 6, 19, dtype=dtype, seed=3)
    check_against_reference(layer_fn("fused", lengths), layer_fn("reference", lengths), args, dtype, SEQ_NAMES)


def test_layer_non_contiguous_arguments():
    """batch_first input transposed to time-major, weights and states that
    are views with strides of their own."""
    T, B, I, S = 5, 4, 6, 11
    x, W, b, h0, c0 = seq_inputs(T, B, I, S, dtype=torch.float64, seed=4)
    x_bf = x.transpose(0, 1).contiguous()  # (B, T, I)
    x_nc = x_bf.transpose(0, 1)  # (T, B, I), not contiguous
    W_nc = W.t().contiguous().t()
    h0_nc = torch.cat([h0, h0], 1)[:, ::2]
    assert not (x_nc.is_contiguous() or W_nc.is_contiguous() or h0_nc.is_contiguous())
    args = [x_nc, W_nc, b, h0_nc, c0]
    check_against_reference(layer_fn("fused"), layer_fn("reference"), args, torch.float64, SEQ_NAMES)


def test_module_batch_first_matches_reference():
    torch.manual_seed(0)
    model = lltm.LLTM(6, 13, num_layers=2, batch_first=True, backend="fused").double()
    ref = lltm.LLTM(6, 13, num_layers=2, batch_first=True, backend="python").double()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(3, 8, 6, dtype=torch.float64)
    out, (h, c) = model(x)
    out_ref, (h_ref, c_ref) = ref(x)
    torch.testing.assert_close(out, out_ref)
    torch.testing.assert_close((h, c), (h_ref, c_ref))


@contextlib.contextmanager
def threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# Large enough that each step's work splits over two threads; S = 70 splits
# into unit blocks of unequal count (5 blocks of 16 floats on AVX-512).
LENGTHS_64 = [5, 0, 3] * 21 + [4]
THREAD_CASES = {
    "cell": lambda: (cell_fn("fused"), list(make_inputs(96, 40, 256, seed=5, requires_grad=False))),
    "cell-S70": lambda: (cell_fn("fused"), list(make_inputs(64, 40, 70, seed=6, requires_grad=False))),
    "layer": lambda: (layer_fn("fused"), seq_inputs(4, 96, 40, 256, seed=5)),
    "layer-S70-lengths": lambda: (layer_fn("fused", torch.tensor(LENGTHS_64)), seq_inputs(5, 64, 40, 70, seed=7)),
}


@pytest.mark.parametrize("case", list(THREAD_CASES))
def test_one_and_two_threads_agree(case):
    fn, args = THREAD_CASES[case]()
    probe = fn(*args)
    grads = out_grads_like(list(probe))
    with threads(1):
        one = run(fn, args, grads)
    with threads(2):
        two = run(fn, args, grads)
    for k, (a, b) in enumerate(zip(one, two)):
        # each unit's math is the same whatever the split; only the
        # summation order of the weight gradients may change
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda m: f"output {k}: {m}")


@pytest.mark.parametrize("case", ["cell-S70", "layer-S70-lengths"])
def test_two_threads_match_reference(case):
    fn, args = THREAD_CASES[case]()
    ref_fn = lltm_cell_reference if case.startswith("cell") else layer_fn("reference", torch.tensor(LENGTHS_64))
    names = CELL_NAMES if case.startswith("cell") else SEQ_NAMES
    with threads(2):
        check_against_reference(fn, ref_fn, args, torch.float32, names)


@contextlib.contextmanager
def poisoned_memory():
    """Fresh tensors (the operators' outputs and buffers) filled with NaN."""
    before = torch.are_deterministic_algorithms_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)
        torch.utils.deterministic.fill_uninitialized_memory = fill


# (T or 0 for the cell, B, I, S, lengths): batch 0, 1 and 3, states that do
# not fill a vector, rows past their length, one and two threads
POISON_CASES = [
    (0, 0, 4, 6, None),
    (0, 1, 5, 3, None),
    (0, 3, 7, 17, None),
    (0, 64, 40, 70, None),
    (4, 0, 3, 5, None),
    (5, 1, 2, 33, None),
    (6, 3, 4, 17, [6, 0, 2]),
    (5, 64, 40, 70, LENGTHS_64),
]


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("case", POISON_CASES, ids=lambda c: "x".join(map(str, c[:4])) + ("-lengths" if c[4] else ""))
def test_every_element_written(case, dtype, n_threads):
    """Every output element is written (a NaN left in one fails), and right:
    float32 by the suite's rule; bfloat16 within its own rounding (the 2x
    rule is test_*_odd_state_sizes', on enough elements to decide it)."""
    T, B, I, S, lengths = case
    lens = None if lengths is None else torch.tensor(lengths)
    if T == 0:
        args = list(make_inputs(B, I, S, dtype=dtype, seed=S, requires_grad=False))
        fn, ref_fn, names = cell_fn("fused"), lltm_cell_reference, CELL_NAMES
    else:
        args = seq_inputs(T, B, I, S, dtype=dtype, seed=S)
        fn, ref_fn, names = layer_fn("fused", lens), layer_fn("reference", lens), SEQ_NAMES
    probe = ref_fn(*[a.detach().double() for a in args])
    grads = out_grads_like(list(probe))
    with poisoned_memory(), threads(n_threads):
        got = run(fn, args, [g.to(dtype) for g in grads])
    ref = run(ref_fn, [a.double() for a in args], grads)
    if dtype == torch.float32:
        assert_matches(got, ref, dtype, names=names)
        return
    for name, o, r in zip(names, got, ref):
        assert o.dtype == dtype and o.shape == r.shape and torch.isfinite(o).all(), name
        assert rel_err(o, r) <= 5e-2, f"{name}: {rel_err(o, r):.2e}"


def test_cell_training_loop_matches_reference():
    """A cell called step by step between in-place weight updates (optimizer
    steps, then a change under no_grad): the packed W always the current one."""
    torch.manual_seed(0)
    cell = lltm.LLTMCell(7, 19, backend="fused", dtype=torch.float64)
    ref = lltm.LLTMCell(7, 19, backend="python", dtype=torch.float64)
    ref.load_state_dict(cell.state_dict())
    opt, opt_ref = torch.optim.SGD(cell.parameters(), lr=0.5), torch.optim.SGD(ref.parameters(), lr=0.5)
    x = torch.randn(5, 3, 7, dtype=torch.float64)
    for _ in range(3):
        for model, o in ((cell, opt), (ref, opt_ref)):
            o.zero_grad()
            state = None
            for t in range(5):
                state = model(x[t], state)
            (state[0].sum() + state[1].square().sum()).backward()
            o.step()
        torch.testing.assert_close(cell.weights, ref.weights, rtol=1e-10, atol=1e-12)
    with torch.no_grad():
        cell.weights.data.mul_(-1.0)  # through .data too
        ref.weights.data.mul_(-1.0)
        torch.testing.assert_close(cell(x[0])[0], ref(x[0])[0], rtol=1e-10, atol=1e-12)
