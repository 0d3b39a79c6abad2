"""`lltm check`: every available backend against the pure-PyTorch reference in
float64 (forward outputs and all five gradients), then torch.autograd.gradcheck
of each backend. Exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import sys

import torch

from lltm import _backends, functional
from lltm.reference import lltm_cell_reference


def _inputs(batch: int, features: int, state: int, device: torch.device, seed: int):
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape):
        t = torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1
        return t.to(device).requires_grad_()

    return (
        rand(batch, features),
        rand(3 * state, state + features),
        rand(3 * state),
        rand(batch, state),
        rand(batch, state),
    )


def _close(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=tol, atol=tol))


def add_arguments(p: argparse.ArgumentParser) -> None:
    from lltm.cli import device_arg, int_at_least, positive_float

    p.add_argument("-b", "--batch-size", type=int_at_least(1), default=3)
    p.add_argument("-f", "--features", type=int_at_least(1), default=17, help="input features")
    p.add_argument("-s", "--state-size", type=int_at_least(1), default=5)
    p.add_argument("--device", type=device_arg, default=torch.device("cpu"), help="cpu, cuda or cuda:N")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tol", type=positive_float, default=1e-10, help="allclose tolerance in float64")


def run(args: argparse.Namespace) -> int:
    device = args.device
    if device.type == "cuda" and not torch.cuda.is_available():
        print("lltm check: --device cuda asked for, but torch sees no CUDA device", file=sys.stderr)
        return 2
    names = [n for n, ok in _backends.backends(device).items() if ok]
    print(
        f"lltm check on {device}, float64, batch {args.batch_size}, features {args.features}, state {args.state_size}"
    )
    print("available backends: " + ", ".join(names))
    inputs = _inputs(args.batch_size, args.features, args.state_size, device, args.seed)
    weights_out = [torch.rand(args.batch_size, args.state_size, dtype=torch.float64, device=device) for _ in range(2)]

    def outputs_and_grads(fn):
        new_h, new_cell = fn(*inputs)
        grads = torch.autograd.grad((new_h, new_cell), inputs, weights_out)
        return (new_h, new_cell), grads

    ref_out, ref_grads = outputs_and_grads(lltm_cell_reference)
    failures = 0
    for name in names:
        if name == "python":
            continue  # the reference itself
        out, grads = outputs_and_grads(lambda *a, name=name: functional.lltm_cell(*a, backend=name))
        fwd_ok = all(_close(a, b, args.tol) for a, b in zip(out, ref_out))
        bwd_ok = all(_close(a, b, args.tol) for a, b in zip(grads, ref_grads))
        print(f"Forward: python vs {name} ... {'Ok' if fwd_ok else 'MISMATCH'}")
        print(f"Backward: python vs {name} ... {'Ok' if bwd_ok else 'MISMATCH'}")
        failures += (not fwd_ok) + (not bwd_ok)
    small = _inputs(2, 3, 2, device, args.seed + 1)
    for name in names:
        try:
            ok = torch.autograd.gradcheck(lambda *a, name=name: functional.lltm_cell(*a, backend=name), small)
        except RuntimeError as exc:  # gradcheck raises on mismatch
            ok = False
            print(exc)
        print(f"Gradcheck: {name} ... {'Ok' if ok else 'FAILED'}")
        failures += not ok
    return 1 if failures else 0
