"""Helpers for the LLTM tests, on every device: backends, inputs, the float64
reference and the one rule a result must meet against it.

The rule (`assert_matches`): float32 and float64 results are within a
relative error (norm of the difference over norm of the reference) of
TOLERANCE[dtype] of the float64 reference; float16 and bfloat16 ones at most
2x the error of plain PyTorch run in the same low precision (flash-attention's
rule), since a fixed tolerance there would only measure the dtype.
"""

from __future__ import annotations

import re
from typing import Callable, Optional, Sequence

import pytest
import torch
from torch import Tensor

import lltm
from lltm.reference import lltm_cell_reference

HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
COMPILED = lltm._registry.COMPILED
LOW_PRECISION = (torch.float16, torch.bfloat16)
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5}
OUTPUT_NAMES = ("new_h", "new_cell", "grad_input", "grad_weights", "grad_bias", "grad_old_h", "grad_old_cell")


def backend_params(devices=DEVICES, backends=lltm._registry.NAMES):
    """pytest params over (device, backend) with ids like cpu-aten; backends
    this install cannot run on a device are kept, marked skip, so the report
    shows what did not run."""
    params = []
    for device in devices:
        for name in backends:
            ok = lltm.backends(device)[name]
            marks = () if ok else pytest.mark.skip(reason=f"{name} not available on {device}")
            params.append(pytest.param(device, name, id=f"{device}-{name}", marks=marks))
    return params


def make_inputs(
    batch,
    features,
    state,
    *,
    device="cpu",
    dtype=torch.float32,
    seed=0,
    bias=True,
    requires_grad=True,
    module_init=False,
):
    """Fresh random cell arguments (input, weights, bias, old_h, old_cell),
    uniform in [-1, 1). The weights are scaled by 2/sqrt(S) and the bias kept
    in [-1, 1), large enough that every gate regime, elu's negative branch
    included, is exercised; module_init=True draws weights and bias in
    ±1/sqrt(S) as the modules initialise them."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape, scale=1.0):
        t = (torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1) * scale
        return t.to(device=device, dtype=dtype).requires_grad_(requires_grad)

    bound = max(state, 1) ** -0.5
    x = rand(batch, features)
    W = rand(3 * state, state + features, scale=bound if module_init else 2 * bound)
    b = (rand(3 * state, scale=bound) if module_init else rand(3 * state)) if bias else None
    h = rand(batch, state)
    c = rand(batch, state)
    return x, W, b, h, c


def leaves(args):
    return [a for a in args if a is not None]


def run_cell(fn: Callable, args: Sequence[Optional[Tensor]], grads: Sequence[Tensor]) -> list[Optional[Tensor]]:
    """[new_h, new_cell, grad of each argument (None where the argument is
    None)] for the loss <new_h, grads[0]> + <new_cell, grads[1]>."""
    args = [a.detach().requires_grad_(True) if a is not None else None for a in args]
    new_h, new_cell = fn(*args)
    g = iter(torch.autograd.grad((new_h, new_cell), leaves(args), grads))
    return [new_h.detach(), new_cell.detach()] + [next(g) if a is not None else None for a in args]


def reference64(args: Sequence[Optional[Tensor]], grads: Sequence[Tensor]) -> list[Optional[Tensor]]:
    """run_cell of the reference in float64 on the CPU, on the same (possibly
    rounded) values."""
    up = [a.detach().double().cpu() if a is not None else None for a in args]
    return run_cell(lltm_cell_reference, up, [g.double().cpu() for g in grads])


def rel_err(a: Tensor, ref: Tensor) -> float:
    a, ref = a.double().cpu(), ref.double().cpu()
    return ((a - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def assert_matches(
    got: Sequence[Optional[Tensor]],
    ref: Sequence[Optional[Tensor]],
    dtype: torch.dtype,
    *,
    plain: Optional[Sequence[Optional[Tensor]]] = None,
    names: Sequence[str] = OUTPUT_NAMES,
    tol: Optional[float] = None,
) -> None:
    """The one rule (see the module docstring). `plain`: the same computation
    by plain PyTorch in `dtype`, needed for float16/bfloat16; `tol`
    overrides TOLERANCE[dtype]."""
    for i, (name, o, r) in enumerate(zip(names, got, ref)):
        if r is None:
            assert o is None, f"{name}: expected None"
            continue
        assert o.dtype == dtype and tuple(o.shape) == tuple(r.shape), f"{name}: {o.dtype} {tuple(o.shape)}"
        assert torch.isfinite(o).all(), f"{name}: unwritten or non-finite elements"
        err = rel_err(o, r)
        if dtype in LOW_PRECISION:
            assert plain is not None, "float16/bfloat16 results are judged against plain PyTorch's error"
            err_plain = rel_err(plain[i], r)
            assert err <= 2 * err_plain + 1e-6, f"{name}: error {err:.2e} > 2 x plain PyTorch's {err_plain:.2e}"
        else:
            limit = TOLERANCE[dtype] if tol is None else tol
            assert err <= limit, f"{name}: relative error {err:.2e} > {limit}"


def held_place(plan: str, path: str) -> tuple[int, Optional[str], str]:
    """(batch rows a chunk, W_hh's place, the line) of the forced `path`'s line of a plan
    report (torch.ops.lltm._fused_cuda_seq_plan) with the MMA dot: the place is the plan's w= token
    ("regs": every k step's A fragments held in registers, "regs+smem": the first ones), None where
    A is read from shared memory. Skips the test where this GPU's chunks have more than 8 rows (one
    B tile), which no held plan takes."""
    line = next(line for line in plan.splitlines() if line.strip().startswith(f"{path} group="))
    rows = int(re.search(r" rows=(\d+)", line).group(1))
    if rows > 8:
        pytest.skip(f"chunks of {rows} rows on this GPU's SM count: no held plan (one B tile of 8 rows)")
    w = re.search(r" dot=mma(?: w=(\S+))? ", line)
    assert w is not None, line
    return rows, w.group(1), line


def env_in_backward(monkeypatch: pytest.MonkeyPatch, results, **env: str) -> None:
    """Sets the environment variables `env` (through `monkeypatch`) once autograd reaches any tensor
    of `results`: the backward of the op that made them runs with them, its forward ran without
    (the fused CUDA ops read LLTM_SEQ_DOT at each call, so a test can force one pass's dot)."""

    def hook(grad: Tensor) -> Tensor:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return grad

    for t in torch.utils._pytree.tree_leaves(results):
        if isinstance(t, Tensor) and t.requires_grad:
            t.register_hook(hook)
