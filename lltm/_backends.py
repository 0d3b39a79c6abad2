"""Which backends this install can run, and how "auto" chooses."""

from __future__ import annotations

from typing import Optional, Union

import torch

from lltm import _extension

NAMES = ("python", "aten", "fused")  # the compiled ones must match lltm/csrc/backends.h
FAMILIES = ("cell", "seq")  # operator families: one step, a whole layer
# The names of the tutorial (extension-cpp): what each is called here.
TUTORIAL_NAMES = {"py": "python", "cpp": "aten", "cuda": "fused"}
# "auto" takes the first available in this order: fastest first.
AUTO_ORDER = ("fused", "aten", "python")

# (backend, device type, family) -> available; filled lazily, read on every call.
_cache: dict[tuple[str, str, str], bool] = {}


def _has_kernel(op: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"lltm::{op}", key)


def _device_usable(device_type: str) -> bool:
    """No backend runs on a device torch cannot use (cuda on a CPU-only torch)."""
    if device_type == "cuda":
        return torch.cuda.is_available()
    return True


def _compute(name: str, device_type: str, family: str) -> bool:
    if not _device_usable(device_type):
        return False
    if name == "python":
        return True
    if _extension.try_load() is None:
        return False
    op = f"{name}_{family}_forward"
    if name == "aten":  # ATen ops: every device torch itself supports
        return _has_kernel(op, "CompositeExplicitAutograd")
    # fused: a kernel compiled for this device's dispatch key
    key = {"cpu": "CPU", "cuda": "CUDA"}.get(device_type)
    return key is not None and _has_kernel(op, key)


def is_available(name: str, device_type: str, family: str = "cell") -> bool:
    """Whether backend `name` has the `family` operators ("cell" or "seq")
    for `device_type`."""
    key = (name, device_type, family)
    if key not in _cache:
        _cache[key] = _compute(name, device_type, family)
    return _cache[key]


def backends(device: Optional[Union[str, torch.device]] = None) -> dict[str, bool]:
    """{backend name: available} for `device` (default: torch's default device).

    Asking may build the extension just in time (once) when no prebuilt one is
    installed.
    """
    dev = torch.device(device) if device is not None else torch.get_default_device()
    return {name: is_available(name, dev.type) for name in NAMES}


def _unavailable(backend: str, device_type: str) -> str:
    have = [n for n in NAMES if is_available(n, device_type)]
    msg = f"lltm: backend {backend!r} is not available on {device_type}; available: {', '.join(have)}"
    if backend in ("aten", "fused") and _extension.load_error():
        msg += f". {_extension.load_error()}"
    elif backend == "fused":
        msg += " (the fused kernels are built for CPU and CUDA devices only)"
    return msg


def unknown_backend(backend: str, device_type: Optional[str] = None) -> str:
    """The message for a backend name lltm does not know; the tutorial's
    names are answered with the lltm backend they correspond to."""
    msg = f"lltm: unknown backend {backend!r}; choose 'auto' or one of {', '.join(map(repr, NAMES))}"
    if device_type is not None:
        msg += f" (available on {device_type}: {', '.join(repr(n) for n in NAMES if is_available(n, device_type))})"
    if backend in TUTORIAL_NAMES:
        msg += f". The tutorial's {backend!r} backend is lltm's {TUTORIAL_NAMES[backend]!r}"
    return msg


# Runs eagerly even under torch.compile: the choice is a constant of the graph.
@torch.compiler.assume_constant_result
def has_seq_ops(name: str, device_type: str) -> bool:
    """Whether a resolved backend runs a whole layer as one operator (else
    the layer loops over its cell operator)."""
    return name != "python" and is_available(name, device_type, "seq")


# Runs eagerly even under torch.compile: the choice is a constant of the graph.
@torch.compiler.assume_constant_result
def resolve(backend: str, device_type: str) -> str:
    """Maps the `backend=` argument to a concrete backend for a device type."""
    if backend == "auto":
        for name in AUTO_ORDER:
            if is_available(name, device_type):
                return name
    if backend not in NAMES:
        raise ValueError(unknown_backend(backend, device_type))
    if not is_available(backend, device_type):
        raise RuntimeError(_unavailable(backend, device_type))
    return backend
