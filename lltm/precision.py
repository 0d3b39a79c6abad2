"""How lltm's float32 products run: strict fp32, TF32, or accurate TF32.

    lltm.set_fp32_precision("accurate")       # TF32 where it costs no accuracy
    with lltm.fp32_precision("ieee"):         # strict fp32 inside, the setting before after
        out, state = layer(x)
    lltm.get_fp32_precision()                 # lltm's setting, None: follow torch
    lltm.fp32_mode()                          # the mode in force now: "ieee" | "tf32" | "accurate"

Modes (docs/precision.md has the measurements):

    "ieee"      every float32 product strict fp32
    "tf32"      every float32 product on TF32 tensor cores (10-bit mantissa):
                the fastest, and at long T it loses the LLTM's gradients
                (no forget gate: the cell state keeps every step's rounding
                error of the forward, and the gradients follow that state)
    "accurate"  fp32-class accuracy with tensor cores where they keep it: the
                forward strict fp32; in the backward, the persistent
                kernels' step products (dz W_hh, where faster than their FMA
                dot) as 3xTF32 (each operand split into two TF32 parts, three
                TF32 products summed in float32 a k step), the rest strict
                (fused CUDA backend; the aten backend runs everything strict)
    None        follow torch: "tf32" where torch allows TF32 for cuBLAS
                matmuls (torch.backends.cuda.matmul.allow_tf32 = True,
                .fp32_precision = "tf32", torch.set_float32_matmul_precision
                "high" or "medium"), else "ieee" (the default)

The setting is lltm's own, process-wide, and read by the compiled operators
at every call (so a torch.compile'd model follows it; set it outside compiled
regions). The fused CUDA backend follows it in every product. The "aten"
backend's products are at::mm, which follows torch's switch: lltm's mode
only takes TF32 away from them ("ieee" and "accurate": strict); without
TF32 allowed by torch they stay strict. The "python" backend follows torch
alone, and so does everything on the CPU.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch

from lltm import _extension

MODES = ("ieee", "tf32", "accurate")

_setting: Optional[str] = None


def _check(mode: Optional[str]) -> None:
    if mode is not None and mode not in MODES:
        raise ValueError(
            f"lltm fp32 precision {mode!r} is not one of {', '.join(map(repr, MODES))} or None (follow torch)"
        )


def set_fp32_precision(mode: Optional[str]) -> None:
    """Sets lltm's float32 precision mode: "ieee", "tf32", "accurate", or None to follow torch's TF32
    switch. Raises ValueError for anything else."""
    global _setting
    _check(mode)
    before, _setting = _setting, mode
    try:
        _push()
    except Exception:
        _setting = before
        raise


def _push() -> None:
    """Hands the setting to lltm._C, where the operators read it, once the library is loaded (a setting
    made before that goes there when it loads: lltm._extension calls this)."""
    if _extension.loaded_mode() is None:
        return
    op = getattr(torch.ops.lltm, "_set_fp32_precision", None)
    if op is None:  # a library built before the setting existed
        if _setting is not None:
            raise RuntimeError(f"lltm: the loaded lltm._C has no fp32 precision setting; {_extension.BUILD_HINT}")
        return
    op(_setting or "")


def get_fp32_precision() -> Optional[str]:
    """lltm's setting (None: follow torch)."""
    return _setting


def torch_allows_tf32() -> bool:
    """Whether torch allows TF32 in cuBLAS float32 matmuls (either of its APIs)."""
    new_api = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
    if new_api in ("tf32", "ieee"):
        return new_api == "tf32"
    return torch.get_float32_matmul_precision() != "highest"


def fp32_mode() -> str:
    """The mode lltm's compiled CUDA operators use now: lltm's setting, or torch's."""
    if _setting is not None:
        return _setting
    return "tf32" if torch_allows_tf32() else "ieee"


@contextlib.contextmanager
def fp32_precision(mode: Optional[str]) -> Iterator[None]:
    """Sets lltm's float32 precision mode inside the block and puts the previous setting back after it
    (also on an exception). Raises ValueError for an unknown mode before changing anything."""
    _check(mode)
    before = _setting
    set_fp32_precision(mode)
    try:
        yield
    finally:
        set_fp32_precision(before)
