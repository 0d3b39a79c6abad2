"""`lltm check`: every available backend against the pure-PyTorch reference in
float64 (forward outputs and all five gradients), for one cell step and for a
layer over --seq steps (with variable lengths), then torch.autograd.gradcheck
of each backend's cell and layer. Exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse

import torch

from lltm import _backends, functional
from lltm._argtypes import device_arg, int_at_least, positive_float
from lltm.reference import lltm_cell_reference, lltm_reference


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
    p.add_argument("-b", "--batch-size", type=int_at_least(1), default=3)
    p.add_argument("-f", "--features", type=int_at_least(1), default=17, help="input features")
    p.add_argument("-s", "--state-size", type=int_at_least(1), default=5)
    p.add_argument("--device", type=device_arg, default=torch.device("cpu"), help="cpu, cuda or cuda:N")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tol", type=positive_float, default=1e-10, help="allclose tolerance in float64")
    p.add_argument(
        "--seq", type=int_at_least(0), default=6, metavar="T", help="steps of the layer check (0: cell only)"
    )


def run(args: argparse.Namespace) -> int:
    device = args.device  # a device torch can use (device_arg)
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
    if args.seq > 0:
        failures += _check_layer(args, device, names)
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


def _check_layer(args: argparse.Namespace, device: torch.device, names: list[str]) -> int:
    """The layer (functional.lltm, one operator per call for the compiled
    backends) against the per-step reference: output, h_n, c_n and the five
    gradients, every row at its own length; then gradcheck. Returns the
    number of failures."""
    T, B, S = args.seq, args.batch_size, args.state_size
    x, W, b, h0, c0 = _inputs(B, args.features, S, device, args.seed + 2)
    seq = torch.rand(T, B, args.features, dtype=torch.float64, device=device).mul_(2).sub_(1).requires_grad_()
    # Row b stops after lengths[b] steps (the last row runs all T).
    lengths = (torch.arange(B, device=device) * 2 + 1).clamp(max=T)
    lengths[-1] = T
    leaves = (seq, W, b, h0, c0)
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 3)
    weights_out = [torch.rand(s, generator=gen, dtype=torch.float64).to(device) for s in ((T, B, S), (B, S), (B, S))]

    def outputs_and_grads(fn):
        out, (h_n, c_n) = fn(seq, W, b, h0, c0, lengths)
        grads = torch.autograd.grad((out, h_n, c_n), leaves, weights_out, allow_unused=True)
        return (out, h_n, c_n), grads

    ref_out, ref_grads = outputs_and_grads(lltm_reference)
    failures = 0
    print(f"layer: {T} steps, lengths {lengths.tolist()}")
    for name in names:
        if name == "python":
            continue
        out, grads = outputs_and_grads(lambda *a, name=name: functional.lltm(*a[:5], lengths=a[5], backend=name))
        fwd_ok = all(_close(a, r, args.tol) for a, r in zip(out, ref_out))
        bwd_ok = all(_close(a, r, args.tol) for a, r in zip(grads, ref_grads))
        print(f"Layer forward: python vs {name} ... {'Ok' if fwd_ok else 'MISMATCH'}")
        print(f"Layer backward: python vs {name} ... {'Ok' if bwd_ok else 'MISMATCH'}")
        failures += (not fwd_ok) + (not bwd_ok)
        # gradcheck on two rows (one stopping early unless T = 1)
        small = (
            *(t.detach()[..., :2, :].clone().requires_grad_() for t in (seq,)),
            W,
            b,
            *(t.detach()[:2].clone().requires_grad_() for t in (h0, c0)),
        )

        def layer(*a, name=name):
            out, (h_n, c_n) = functional.lltm(*a, lengths=lengths[:2], backend=name)
            return out, h_n, c_n

        try:
            ok = torch.autograd.gradcheck(layer, small)
        except RuntimeError as exc:
            ok = False
            print(exc)
        print(f"Layer gradcheck: {name} ... {'Ok' if ok else 'FAILED'}")
        failures += not ok
    return failures
