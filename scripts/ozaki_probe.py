"""Would int8 slices with exact integer sums (the Ozaki scheme) keep the LLTM's float32 errors?

An emulation on the CPU, before any kernel: the fused backend's algorithm in float32 (x W_x^T over
all T*B rows, then h W_h^T a step, the cell math in float32, autograd for the backward), with
its products in a chosen arithmetic, against the same algorithm in float64.

An Ozaki product A B (A: (M, K), B: (K, N), float32 values) scales each row of A and each column
of B by a power of two into (-1, 1), splits them into int8 slices of 7 bits by round-to-nearest
(A = 2^e_i sum_s a_s 2^(-7 s), |a_1| <= 127, |a_s| <= 64 after), and sums the slice products
a_s b_t with s + t at most a cutoff. Each a_s b_t is an integer sum below 2^31 for K < 133,000,
exact in int32 on int8 tensor cores; here in float64, exact as well. The terms are combined in
float64 and rounded to float32 once: the best a kernel could do.

    python scripts/ozaki_probe.py [--steps 200 1000] [--seeds 2]

Prints the relative error of the output, the last cell state and every gradient against float64,
and each mode's worst ratio to strict float32's.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from lltm.reference import lltm_gates_reference, lltm_reference

BITS = 7  # magnitude bits of an int8 slice


@dataclass(frozen=True)
class Ozaki:
    """Slices of the first operand (its rows), of the second (its columns), and the largest s + t kept."""

    left: int
    right: int
    cutoff: int

    @property
    def products(self) -> int:
        return sum(1 for s in range(1, self.left + 1) for t in range(1, self.right + 1) if s + t <= self.cutoff)


def _slices(a: Tensor, dim: int, count: int) -> tuple[list[Tensor], Tensor]:
    """a (float64 holding float32 values) = scale * sum_s slices[s] * 2^(-7 (s + 1)), scale a power
    of two per row (dim=1) or column (dim=0), each slice integer valued within int8's range."""
    amax = a.abs().amax(dim=dim, keepdim=True)
    # 2^e >= amax * 128 / 127, so that the first slice rounds to at most 127.
    e = torch.where(amax > 0, torch.ceil(torch.log2(amax * (2**BITS) / (2**BITS - 1))), torch.zeros_like(amax))
    scale = torch.exp2(e)
    rest = a / scale
    out = []
    for s in range(1, count + 1):
        unit = 2.0 ** (BITS * s)
        piece = torch.round(rest * unit)
        out.append(piece)
        rest = rest - piece / unit
    assert max(p.abs().max().item() for p in out) <= 127
    return out, scale


def ozaki_mm(a: Tensor, b: Tensor, mode: Ozaki) -> Tensor:
    """a (M, K) @ b (K, N), both float32, by int8 slices with exact sums; float32 (M, N)."""
    a64, b64 = a.double(), b.double()
    sa, scale_a = _slices(a64, 1, mode.left)
    sb, scale_b = _slices(b64, 0, mode.right)
    assert a.shape[1] * 127 * 127 < 2**31
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    for s in range(mode.left, 0, -1):  # smallest terms first
        for t in range(mode.right, 0, -1):
            if s + t <= mode.cutoff:
                acc += (sa[s - 1] @ sb[t - 1]) * 2.0 ** (-BITS * (s + t))  # the integer sum is exact
    return (acc * scale_a * scale_b).float()


def tf32_mm(a: Tensor, b: Tensor) -> Tensor:
    """Operands rounded to TF32 (10 mantissa bits, to nearest), float32 sums."""

    def tf32(x: Tensor) -> Tensor:
        bits = x.view(torch.int32)
        return ((bits + 0x1000 + ((bits >> 13) & 1) - 1) & ~0x1FFF).view(torch.float32)

    return tf32(a) @ tf32(b)


MM = Callable[[Tensor, Tensor], Tensor]


class Product(torch.autograd.Function):
    """a @ b with the forward's arithmetic `fwd` and the backward's `bwd` (both products of dC)."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, fwd: MM, bwd: MM) -> Tensor:
        ctx.save_for_backward(a, b)
        ctx.bwd = bwd
        return fwd(a, b)

    @staticmethod
    def backward(ctx, grad: Tensor):
        a, b = ctx.saved_tensors
        return ctx.bwd(grad, b.t().contiguous()), ctx.bwd(a.t().contiguous(), grad), None, None


def lltm_layer(x: Tensor, w: Tensor, bias: Tensor, h: Tensor, c: Tensor, fwd: MM, bwd: MM):
    """x: (T, B, I); w: (3S, S + I) as [W_h | W_x]; bias: (3S,); h, c: (B, S). (outputs (T, B, S), c_T).

    lltm.reference's layer over x W_x^T + bias projected first, as the fused backend does; each
    step adds h W_h^T and runs the reference's pointwise part."""
    T, B, I = x.shape
    S = h.shape[1]
    w_h, w_x = w[:, :S], w[:, S:]
    projected = Product.apply(x.reshape(T * B, I), w_x.t(), fwd, bwd).reshape(T, B, 3 * S) + bias

    def step(p: Tensor, _w, _b, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
        return lltm_gates_reference(p + Product.apply(h, w_h.t(), fwd, bwd), c)

    out, (_, c_T) = lltm_reference(projected, w, None, h, c, cell=step)
    return out, c_T


def errors(steps: int, seed: int, modes: dict[str, tuple[MM, MM]], B: int = 16, I: int = 32, S: int = 128):
    gen = torch.Generator().manual_seed(seed)
    bound = 1.0 / math.sqrt(S)

    def uniform(*shape: int, lo: float = -1.0, hi: float = 1.0) -> Tensor:
        return torch.rand(*shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo

    inputs = [uniform(steps, B, I), uniform(3 * S, S + I, lo=-bound, hi=bound), uniform(3 * S, lo=-bound, hi=bound)]
    inputs += [uniform(B, S), uniform(B, S)]
    grad_out, grad_c = uniform(steps, B, S), uniform(B, S)
    names = ["input", "weights", "bias", "h0", "c0"]

    def run(dtype: torch.dtype, fwd: MM, bwd: MM) -> dict[str, Tensor]:
        leaves = [t.to(dtype, copy=True).requires_grad_() for t in inputs]
        out, c = lltm_layer(*leaves, fwd, bwd)
        torch.autograd.backward([out, c], [grad_out.to(dtype), grad_c.to(dtype)])
        got = {"output": out.detach(), "c_T": c.detach()}
        got.update({"d " + n: t.grad for n, t in zip(names, leaves)})
        return {k: v.double() for k, v in got.items()}

    plain: MM = torch.mm
    truth = run(torch.float64, plain, plain)
    table = {}
    for label, (fwd, bwd) in modes.items():
        got = run(torch.float32, fwd, bwd)
        table[label] = {k: ((got[k] - truth[k]).norm() / truth[k].norm()).item() for k in truth}
    return table


def speed(batches: list[int], states: list[int], steps: int = 100) -> None:
    """On a GPU: the LLTM's largest products, x W_x^T over T*B rows ((T B, S) @ (S, 3S)), as one
    TF32 GEMM, one strict float32 GEMM, and as the int8 GEMMs of the 4x4 split (s + t <= 5: ten
    slice products, four GEMMs by s + t, each group's slices side by side along k, torch._int_mm)."""
    from torch.utils.benchmark import Timer

    saved = torch.backends.cuda.matmul.allow_tf32
    print("| T B x S | strict µs | TF32 µs | int8, 10 products µs | int8 / TF32 | TF32 TFLOPS | int8 TOPS |")
    print("|---|---|---|---|---|---|---|")
    try:
        for B in batches:
            for S in states:
                M, K, N = steps * B, S, 3 * S
                a = torch.randn(M, K, device="cuda")
                b = torch.randn(K, N, device="cuda")
                groups = [  # (M, g K) @ (g K, N) int8 for g = 1, 2, 3, 4 slice pairs
                    (
                        torch.randint(-127, 128, (M, g * K), device="cuda", dtype=torch.int8),
                        torch.randint(-127, 128, (N, g * K), device="cuda", dtype=torch.int8).t(),
                    )
                    for g in (1, 2, 3, 4)
                ]

                env = {"a": a, "b": b, "groups": groups, "torch": torch}

                def median_us(stmt: str, tf32: bool) -> float:
                    torch.backends.cuda.matmul.allow_tf32 = tf32
                    return Timer(stmt, globals=env).blocked_autorange(min_run_time=0.3).median * 1e6

                strict = median_us("a @ b", False)
                tf32 = median_us("a @ b", True)
                int8 = median_us("[torch._int_mm(x, y) for x, y in groups]", False)
                flops = 2.0 * M * K * N
                print(
                    f"| {steps} {B} x {S} | {strict:,.0f} | {tf32:,.0f} | {int8:,.0f} | {int8 / tf32:.2f} | "
                    f"{flops / tf32 / 1e6:.0f} | {10 * flops / int8 / 1e6:.0f} |",
                    flush=True,
                )
                torch.cuda.empty_cache()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--speed", action="store_true", help="time the int8 products on a GPU instead")
    opts = parser.parse_args(argv)
    if opts.speed:
        speed([16, 64, 256, 512], [256, 512, 1024])
        return 0

    def oz(left: int, right: int, cutoff: int) -> MM:
        return lambda a, b: ozaki_mm(a, b, Ozaki(left, right, cutoff))

    strict: MM = torch.mm

    def reverse(a: Tensor, b: Tensor) -> Tensor:  # the same products, another rounding
        return a.flip(1) @ b.flip(0)

    # (name, forward products, backward products). In x W^T and h W^T the weights are the right
    # operand; "a x w" gives the activations a slices and the weights w.
    modes = {
        "strict fp32": (strict, strict),
        "strict fp32, k summed in reverse": (reverse, reverse),
        "TF32 every product": (tf32_mm, tf32_mm),
        "3x3, s+t<=4 (6 products)": (oz(3, 3, 4), oz(3, 3, 4)),
        "4x3, s+t<=5 (9): the activations 4 slices": (oz(4, 3, 5), oz(3, 3, 4)),
        "3x4, s+t<=5 (9): the weights 4 slices": (oz(3, 4, 5), oz(3, 3, 4)),
        "3x4 (9), the backward's products 3x4 too": (oz(3, 4, 5), oz(3, 4, 5)),
        "4x4, s+t<=5 (10)": (oz(4, 4, 5), oz(4, 4, 5)),
    }
    keys = ["output", "c_T", "d input", "d weights", "d bias", "d h0", "d c0"]
    spread: dict[tuple[int, str], list[float]] = {}
    for steps in opts.steps:
        for seed in range(opts.seeds):
            table = errors(steps, seed, modes)
            print(f"\nT = {steps}, seed {seed}, B = 16, I = 32, S = 128: relative error against float64")
            print("| mode | " + " | ".join(keys) + " | worst / strict |")
            print("|---|" + "---|" * (len(keys) + 1))
            base = table["strict fp32"]
            for label, row in table.items():
                worst = max(row[k] / base[k] for k in keys)
                spread.setdefault((steps, label), []).append(worst)
                print(f"| {label} | " + " | ".join(f"{row[k]:.1e}" for k in keys) + f" | {worst:.2f} |", flush=True)
    print(f"\nworst error / strict's over {opts.seeds} seeds (min - max):")
    for (steps, label), values in spread.items():
        print(f"T = {steps}, {label}: {min(values):.2f} - {max(values):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
