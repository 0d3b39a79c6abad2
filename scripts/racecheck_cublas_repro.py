"""cuBLAS's GEMMs alone under compute-sanitizer's racecheck: no lltm code runs.

The GEMMs over all T*B rows of an LSTM layer's backward (T = 9, B = 5, S = 200,
4S = 800, I input features; float16), as plain torch calls. Under racecheck
(2025.3.1, CUDA 13.0, H200) they stop with "Internal Sanitizer Error: The
Sanitizer failed to handle a hardware exception" even when racecheck checks no
kernel, which is why gpu_check.sh racechecks lltm's held kernels in their
kernels-only test cases (docs/benchmarks-history.md, section 64):

    compute-sanitizer --tool racecheck --kernel-name kns=no_kernel_has_this_name \\
        python scripts/racecheck_cublas_repro.py [I]

I = 7 (default): the two GEMMs with n = I run, the weight gradient's addmm
faults; I = 8: the first GEMM faults. Without the sanitizer every GEMM runs.
"""

from __future__ import annotations

import sys

import torch


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    features = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    steps, batch, state = 9, 5, 200
    rows, gates = steps * batch, 4 * state
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=torch.float16, generator=gen)

    d_pre, x, w_ih, h = rand(rows, gates), rand(rows, features), rand(gates, features), rand(rows, state)
    gemms = {
        "grad_input = d_pre W_ih": lambda: d_pre @ w_ih,
        "grad_W_ih = d_pre^T x": lambda: d_pre.t() @ x,
        # h_{t-1}: h0's rows for step 0, then the outputs of steps 0 .. T - 2
        "grad_W_hh = d_pre^T h_prev": lambda: torch.addmm(
            d_pre[:batch].t() @ h[:batch], d_pre[batch:].t(), h[: rows - batch]
        ),
    }
    for name, gemm in gemms.items():
        out = gemm()
        torch.cuda.synchronize()
        print(f"ran {name}: {tuple(out.shape)}", flush=True)
    print(f"every GEMM ran (I = {features})")


if __name__ == "__main__":
    main()
