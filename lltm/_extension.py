"""Loads the compiled extension: the prebuilt lltm._C, or a just-in-time build.

Ahead of time, `pip install --no-build-isolation .` compiles lltm._C and
`import lltm` loads it. When it is absent (or LLTM_JIT=1), the first use of a
compiled backend compiles the same sources with torch.utils.cpp_extension.load,
cached under TORCH_EXTENSIONS_DIR, and logs one line saying so.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

import torch

from lltm import _sources

log = logging.getLogger("lltm")

_mode: Optional[str] = None  # "aot" | "jit" once loaded
_error: Optional[str] = None  # why loading failed, once tried

BUILD_HINT = (
    "build it ahead of time with `pip install --no-build-isolation .` "
    "(needs a C++ compiler; nvcc for the CUDA kernels), or let lltm build it "
    "just in time (needs a C++ compiler and ninja)"
)


def _jit_wants_cuda() -> bool:
    from torch.utils import cpp_extension

    flag = os.environ.get("USE_CUDA")
    if flag is not None:
        return flag not in ("0", "", "false", "OFF")
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def _load_jit() -> None:
    from torch.utils import cpp_extension

    with_cuda = _jit_wants_cuda()
    debug = os.environ.get("DEBUG", "0") == "1"
    name = "lltm_jit_cuda" if with_cuda else "lltm_jit_cpu"
    log.warning(
        "lltm: prebuilt extension lltm._C %s; compiling %s just in time "
        "with torch.utils.cpp_extension.load (cached under %s)",
        "ignored (LLTM_JIT=1)" if os.environ.get("LLTM_JIT") == "1" else "not found",
        "C++ and CUDA sources" if with_cuda else "C++ sources",
        os.environ.get("TORCH_EXTENSIONS_DIR", cpp_extension._get_build_directory("", False)),
    )
    cpp_extension.load(
        name=name,
        sources=_sources.sources(with_cuda),
        extra_cflags=_sources.cxx_flags(with_cuda, debug),
        extra_cuda_cflags=_sources.nvcc_flags(debug) if with_cuda else None,
        with_cuda=with_cuda,
        is_python_module=False,
        verbose=os.environ.get("LLTM_JIT_VERBOSE") == "1",
    )


def load() -> str:
    """Loads the operators (once) and returns the build mode, "aot" or "jit".

    Raises RuntimeError, saying how to build, when neither mode works.
    """
    global _mode, _error
    if _mode is not None:
        return _mode
    if _error is not None:
        raise RuntimeError(_error)
    try:
        if os.environ.get("LLTM_JIT") != "1":
            try:
                import lltm._C  # noqa: F401  (registers the operators)

                _mode = "aot"
            except ImportError:
                pass
        if _mode is None:
            _load_jit()
            _mode = "jit"
    except Exception as exc:  # compiler missing, build error, ...
        _error = f"lltm: the compiled extension is not available ({exc}); {BUILD_HINT}"
        raise RuntimeError(_error) from exc
    from lltm import _meta  # noqa: F401  (fake kernels need the schemas)

    return _mode


def try_load() -> Optional[str]:
    """Like load(), but returns None instead of raising."""
    try:
        return load()
    except RuntimeError:
        return None


def load_error() -> Optional[str]:
    return _error


def loaded_mode() -> Optional[str]:
    return _mode


def build_info() -> dict[str, str]:
    """Key/value pairs the C++ side reports about how it was compiled."""
    load()
    pairs = (item.split("=", 1) for item in torch.ops.lltm._build_info().split())
    return dict(pairs)


def preload_prebuilt() -> None:
    """At import: load lltm._C if it is there (cheap), never compile."""
    global _mode
    if os.environ.get("LLTM_JIT") == "1" or _mode is not None:
        return
    try:
        import lltm._C  # noqa: F401
    except ImportError:
        return
    _mode = "aot"
    from lltm import _meta  # noqa: F401
