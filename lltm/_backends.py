"""Which backends this install can run, and how "auto" chooses (the
backends themselves are listed once, in lltm/_registry.py)."""

from __future__ import annotations

from typing import Optional, Union

import torch

from lltm import _extension, _registry
from lltm._registry import AUTO_ORDER, NAMES

FAMILIES = ("cell", "seq")  # operator families: one step, a whole layer

# (backend, device type, family) -> available; filled lazily, read on every call.
_cache: dict[tuple[str, str, str], bool] = {}


def _has_kernel(op: str, key: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(f"lltm::{op}", key)
    except RuntimeError:  # no such operator (a cell of lltm.cells.define not built)
        return False


def _device_usable(device_type: str) -> bool:
    """No backend runs on a device torch cannot use (cuda on a CPU-only torch)."""
    if device_type == "cuda":
        return torch.cuda.is_available()
    return True


def _compute(name: str, device_type: str, family: str) -> bool:
    if not _device_usable(device_type):
        return False
    kernels = _registry.BY_NAME[name].kernels
    if kernels == "python":
        return True
    if _extension.try_load() is None:
        return False
    op = f"{name}_{family}_forward"
    if kernels == "composite":  # ATen ops: every device torch itself supports
        return _has_kernel(op, "CompositeExplicitAutograd")
    # a kernel compiled for this device's dispatch key
    key = {"cpu": "CPU", "cuda": "CUDA"}.get(device_type)
    return key is not None and _has_kernel(op, key)


def is_available(name: str, device_type: str, family: str = "cell") -> bool:
    """Whether backend `name` has the `family` operators ("cell" or "seq")
    for `device_type`."""
    key = (name, device_type, family)
    if key not in _cache:
        _cache[key] = _compute(name, device_type, family)
    return _cache[key]


def forget(family: str) -> None:
    """Drops what is known of `family`'s operators (a cell's library was just loaded)."""
    for key in [k for k in _cache if k[2] == family]:
        del _cache[key]


def backends(device: Optional[Union[str, torch.device]] = None) -> dict[str, bool]:
    """{backend name: available} for `device` (default: torch's default device).

    Asking may build the extension just in time (once) when no prebuilt one is
    installed.
    """
    dev = torch.device(device) if device is not None else torch.get_default_device()
    return {name: is_available(name, dev.type) for name in NAMES}


def _unavailable(backend: str, device_type: str, family: str = "cell") -> str:
    have = [n for n in NAMES if is_available(n, device_type, family)]
    msg = f"lltm: backend {backend!r} is not available on {device_type}; available: {', '.join(have)}"
    entry = _registry.BY_NAME[backend]
    if entry.compiled and _extension.load_error():
        msg += f". {_extension.load_error()}"
    elif entry.kernels == "device":
        msg += f" (its kernels are built for {' and '.join(entry.devices)} devices only)"
    return msg


def unknown_backend(backend: str, device_type: Optional[str] = None) -> str:
    """The message for a backend name lltm does not know; the tutorial's
    names are answered with the lltm backend they correspond to."""
    available = ""
    if device_type is not None:
        have = ", ".join(repr(n) for n in NAMES if is_available(n, device_type))
        available = f" (available on {device_type}: {have})"
    return f"lltm: unknown backend {backend!r}; {_registry.choose_hint(backend, available)}"


# Runs eagerly even under torch.compile: the choice is a constant of the graph.
@torch.compiler.assume_constant_result
def resolve(backend: str, device_type: str, family: str = "cell") -> str:
    """Maps the `backend=` argument to a concrete backend that has the
    `family` operators ("cell" or "seq") for a device type."""
    if backend == "auto":
        for name in AUTO_ORDER:
            if is_available(name, device_type, family):
                return name
    if backend not in NAMES:
        raise ValueError(unknown_backend(backend, device_type))
    if not is_available(backend, device_type, family):
        raise RuntimeError(_unavailable(backend, device_type, family))
    return backend
