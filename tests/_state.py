"""Global torch state the tests may change, and how they put it back.

Precision and execution switches (TF32 in cuBLAS and cuDNN, float32 matmul
precision, deterministic algorithms, default dtype, threads) are process-wide:
one test that leaves TF32 on makes a later, unrelated test judge strict
float32 results in TF32. Tests set them only through `Settings` (the
`torch_settings` fixture of conftest.py), which restores what it changed, and
the autouse check of conftest.py fails any test after which a switch differs
from what it was before.

Everything is read and written through torch's functions, never through
pytest's monkeypatch: `torch.backends.cuda.matmul.allow_tf32` is served by a
module `__getattr__`, and monkeypatch's undo of such an attribute depends on
the pytest version (pytest 9.2 records it as absent and fails to undo it).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import torch
import torch.utils.deterministic

import lltm

# The legacy TF32 getters raise once the fp32_precision API (torch >= 2.9) set
# a conflicting value: such a state reads as this marker, never equal to a
# snapshot, and the legacy setters put a consistent state back.
MIXED_API = "<set through the fp32_precision API>"


def _legacy(read: Callable[[], Any]) -> Callable[[], Any]:
    def get():
        try:
            return read()
        except RuntimeError:
            return MIXED_API

    return get


def _set_deterministic(value: Tuple[bool, bool]) -> None:
    torch.use_deterministic_algorithms(value[0], warn_only=value[1])


def _set_fill(value: bool) -> None:
    torch.utils.deterministic.fill_uninitialized_memory = value


def _set_attr(obj: Any, name: str) -> Callable[[Any], None]:
    return lambda value: setattr(obj, name, value)


# name -> (get, set); set is given what get returned. The float32 matmul
# precision comes before the TF32 switches: setting it sets them too.
SWITCHES: Dict[str, Tuple[Callable[[], Any], Callable[[Any], None]]] = {
    "float32_matmul_precision": (_legacy(torch.get_float32_matmul_precision), torch.set_float32_matmul_precision),
    "matmul_tf32": (
        _legacy(lambda: torch.backends.cuda.matmul.allow_tf32),
        _set_attr(torch.backends.cuda.matmul, "allow_tf32"),
    ),
    "cudnn_tf32": (_legacy(lambda: torch.backends.cudnn.allow_tf32), _set_attr(torch.backends.cudnn, "allow_tf32")),
    "fp16_reduced_precision_reduction": (
        lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        _set_attr(torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction"),
    ),
    "bf16_reduced_precision_reduction": (
        lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        _set_attr(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction"),
    ),
    "deterministic_algorithms": (
        lambda: (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
        _set_deterministic,
    ),
    "fill_uninitialized_memory": (lambda: torch.utils.deterministic.fill_uninitialized_memory, _set_fill),
    "cudnn_deterministic": (
        lambda: torch.backends.cudnn.deterministic,
        _set_attr(torch.backends.cudnn, "deterministic"),
    ),
    "cudnn_benchmark": (lambda: torch.backends.cudnn.benchmark, _set_attr(torch.backends.cudnn, "benchmark")),
    "cudnn_enabled": (lambda: torch.backends.cudnn.enabled, _set_attr(torch.backends.cudnn, "enabled")),
    "default_dtype": (torch.get_default_dtype, torch.set_default_dtype),
    # lltm's own float32 precision mode (lltm.set_fp32_precision; None follows torch)
    "lltm_fp32_precision": (lltm.get_fp32_precision, lltm.set_fp32_precision),
    "num_threads": (torch.get_num_threads, torch.set_num_threads),
}


def snapshot() -> Dict[str, Any]:
    """The current value of every switch of SWITCHES."""
    return {name: get() for name, (get, _) in SWITCHES.items()}


def restore(saved: Dict[str, Any]) -> None:
    """Sets every switch that differs from `saved` back to its saved value, in the order of SWITCHES
    (each read again just before: one switch may set another)."""
    for name, (get, put) in SWITCHES.items():
        if name in saved and saved[name] != MIXED_API and get() != saved[name]:
            put(saved[name])


def differences(before: Dict[str, Any], after: Dict[str, Any]) -> str:
    """'name: before -> after' for each switch that changed, comma-separated."""
    return ", ".join(f"{n}: {before[n]!r} -> {after[n]!r}" for n in before if before[n] != after[n])


class Settings:
    """Sets switches for one test and puts back what it changed.

        def test_x(torch_settings):
            torch_settings.set(matmul_tf32=True, num_threads=1)

    Names are those of SWITCHES; `deterministic_algorithms` takes (enabled, warn_only).
    """

    def __init__(self) -> None:
        # every switch as it was before the first set(): switches set one another
        self._saved: Dict[str, Any] = {}

    def set(self, **values: Any) -> None:
        unknown = sorted(set(values) - set(SWITCHES))
        if unknown:
            raise KeyError(f"unknown torch switch(es) {unknown}; known: {sorted(SWITCHES)}")
        if not self._saved:
            self._saved = snapshot()
        for name, value in values.items():
            SWITCHES[name][1](value)

    def restore(self) -> None:
        if self._saved:
            restore(self._saved)
        self._saved = {}
