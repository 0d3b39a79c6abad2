"""C++ operators compiled on demand with ``torch.utils.cpp_extension.load_inline``.

``load_inline`` takes C++ source as strings, writes it into a build
directory, compiles it with the system compiler and ninja, and imports the
result as a Python module; ``functions=[...]`` generates the pybind11
bindings. It is the shortest path from an idea to a compiled operator: good
for experiments, tests and small helpers.

When *not* to use it: for code that ships to users, build ahead of time
(``setup.py`` with ``CppExtension``) or keep the sources in files and use
``cpp_extension.load``; register real operators with ``TORCH_LIBRARY`` when
they must work with ``torch.compile`` (the LLTM operators of this package do
both). The first call compiles (tens of seconds); later calls, in this
process (``functools.cache``) or the next (the build is cached under
``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``), are quick.

Both examples are compiled into one extension so that the compiler parses
``torch/extension.h`` once, not twice:

* :func:`load_sin_add_extension` -- ``sin_add(x, y) = sin(x) + sin(y)``, written
  with ATen ops, so autograd differentiates it without help;
* :func:`load_three_x_minus_y_extension` -- ``3 x - y`` with a separate C++
  backward, wrapped in :class:`ThreeXMinusYFunction`.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import sys
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "inline_build_available",
    "load_sin_add_extension",
    "load_three_x_minus_y_extension",
    "sin_add",
    "ThreeXMinusYFunction",
    "three_x_minus_y",
]

_log = logging.getLogger(__name__)

EXTENSION_NAME = "lltm_extending_inline"

SIN_ADD_SOURCE = r"""
// sin(x) + sin(y), elementwise. x, y: same shape, any dtype/device ATen supports.
at::Tensor sin_add(const at::Tensor& x, const at::Tensor& y) {
  TORCH_CHECK(x.sizes() == y.sizes(),
              "sin_add: x and y must have the same shape, got ", x.sizes(), " and ", y.sizes());
  return x.sin() + y.sin();
}
"""

THREE_X_MINUS_Y_SOURCE = r"""
// z = 3 x - y, elementwise. x, y: same shape, dtype and device.
at::Tensor three_x_minus_y_forward(const at::Tensor& x, const at::Tensor& y) {
  TORCH_CHECK(x.sizes() == y.sizes(),
              "three_x_minus_y: x and y must have the same shape, got ", x.sizes(), " and ", y.sizes());
  TORCH_CHECK(x.scalar_type() == y.scalar_type(),
              "three_x_minus_y: x and y must have the same dtype, got ", x.scalar_type(), " and ",
              y.scalar_type());
  TORCH_CHECK(x.device() == y.device(),
              "three_x_minus_y: x and y must be on the same device, got ", x.device(), " and ", y.device());
  return 3 * x - y;
}

// dz/dx = 3, dz/dy = -1. Scaling grad_output keeps its dtype and device.
std::vector<at::Tensor> three_x_minus_y_backward(const at::Tensor& grad_output) {
  return {grad_output * 3, -grad_output};
}
"""


def _compiler() -> str:
    return os.environ.get("CXX") or ("cl" if sys.platform == "win32" else "c++")


def inline_build_available() -> tuple[bool, str]:
    """``(True, "")`` if ``load_inline`` can build here, else ``(False, reason)``."""
    from torch.utils import cpp_extension

    cxx = _compiler()
    if shutil.which(cxx) is None:
        return False, f"no C++ compiler: {cxx!r} is not on PATH (install one, or set CXX)"
    if not cpp_extension.is_ninja_available():
        return False, "ninja is not installed (torch.utils.cpp_extension needs it: pip install ninja)"
    return True, ""


@functools.cache
def _build() -> ModuleType:
    from torch.utils import cpp_extension

    ok, reason = inline_build_available()
    if not ok:
        raise RuntimeError(f"lltm.extending.inline: cannot compile the load_inline examples: {reason}")
    _log.info("compiling %s with torch.utils.cpp_extension.load_inline (cached once built)", EXTENSION_NAME)
    return cpp_extension.load_inline(
        name=EXTENSION_NAME,
        cpp_sources=[SIN_ADD_SOURCE, THREE_X_MINUS_Y_SOURCE],
        functions={
            "sin_add": "sin(x) + sin(y), elementwise",
            "three_x_minus_y_forward": "3 * x - y, elementwise",
            "three_x_minus_y_backward": "gradients of 3 * x - y: (3 * grad, -grad)",
        },
        extra_cflags=["-O2"] if sys.platform != "win32" else None,
    )


def load_sin_add_extension() -> ModuleType:
    """Build (once) and return the extension module; it has ``sin_add(x, y)``.

    Raises RuntimeError naming what is missing if there is no C++ compiler
    or ninja.
    """
    return _build()


def load_three_x_minus_y_extension() -> ModuleType:
    """Build (once) and return the extension module; it has
    ``three_x_minus_y_forward(x, y)`` and ``three_x_minus_y_backward(grad)``.

    Raises RuntimeError naming what is missing if there is no C++ compiler
    or ninja.
    """
    return _build()


def sin_add(x: Tensor, y: Tensor) -> Tensor:
    """``sin(x) + sin(y)`` computed by the compiled extension. x, y: same shape."""
    return load_sin_add_extension().sin_add(x, y)


class ThreeXMinusYFunction(torch.autograd.Function):
    """``3 x - y`` with forward and backward in C++ (compiled on first use).

    x, y: same shape, dtype and device -> same shape.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, y: Tensor) -> Tensor:
        return load_three_x_minus_y_extension().three_x_minus_y_forward(x, y)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, Tensor]:
        grad_x, grad_y = load_three_x_minus_y_extension().three_x_minus_y_backward(grad_output)
        return grad_x, grad_y


def three_x_minus_y(x: Tensor, y: Tensor) -> Tensor:
    """``3 * x - y`` through :class:`ThreeXMinusYFunction`. x, y: same shape."""
    return ThreeXMinusYFunction.apply(x, y)
