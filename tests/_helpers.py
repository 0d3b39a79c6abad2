"""Helpers for the LLTM tests: devices, backends, inputs."""

from __future__ import annotations

import pytest
import torch

import lltm

HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
COMPILED = ("aten", "fused")


def backend_params(devices=DEVICES, backends=lltm._backends.NAMES):
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


def dtypes_for(device: str, backend: str) -> list[torch.dtype]:
    if device == "cuda":
        return [torch.float32, torch.float64, torch.float16, torch.bfloat16]
    return [torch.float32, torch.float64]


def make_inputs(batch, features, state, *, device="cpu", dtype=torch.float32, seed=0, bias=True, requires_grad=True):
    """Fresh random cell arguments (input, weights, bias, old_h, old_cell),
    uniform in [-1, 1) (weights scaled like the module's init, bias kept
    large enough that every gate regime, elu's negative branch included, is
    exercised)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape, scale=1.0):
        t = (torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1) * scale
        return t.to(device=device, dtype=dtype).requires_grad_(requires_grad)

    x = rand(batch, features)
    W = rand(3 * state, state + features, scale=max(state, 1) ** -0.5 * 2)
    b = rand(3 * state) if bias else None
    h = rand(batch, state)
    c = rand(batch, state)
    return x, W, b, h, c


def leaves(args):
    return [a for a in args if a is not None]
