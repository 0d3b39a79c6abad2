"""load_inline examples: compiled once per session (and cached on disk), skipped without a compiler."""

import pytest
import torch
from torch.autograd import gradcheck

from lltm.extending import (
    ThreeXMinusYFunction,
    inline,
    inline_build_available,
    load_sin_add_extension,
    load_three_x_minus_y_extension,
    sin_add,
    three_x_minus_y,
)

AVAILABLE, REASON = inline_build_available()
needs_compiler = pytest.mark.skipif(not AVAILABLE, reason=f"load_inline cannot build here: {REASON}")
# The first build compiles torch/extension.h (tens of seconds); later ones reuse the disk cache.
built = [pytest.mark.slow, needs_compiler]

f64 = torch.float64


def test_missing_compiler_is_reported_clearly(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    ok, reason = inline_build_available()
    assert not ok
    assert reason == "no C++ compiler: '/nonexistent/c++' is not on PATH (install one, or set CXX)"
    # The uncached builder raises before touching the compiler.
    with pytest.raises(RuntimeError, match=r"cannot compile the load_inline examples: no C\+\+ compiler"):
        inline._build.__wrapped__()


def test_missing_ninja_is_reported_clearly(monkeypatch):
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    monkeypatch.setattr(inline.shutil, "which", lambda name: "/usr/bin/" + name)
    ok, reason = inline_build_available()
    assert not ok and "ninja is not installed" in reason


class TestBuilt:
    pytestmark = built

    def test_builders_return_the_cached_module(self):
        module = load_sin_add_extension()
        assert load_sin_add_extension() is module
        assert load_three_x_minus_y_extension() is module  # one extension holds both examples
        assert {"sin_add", "three_x_minus_y_forward", "three_x_minus_y_backward"} <= set(dir(module))

    def test_sin_add_forward_and_autograd(self):
        x, y = torch.randn(4, 3, dtype=f64, requires_grad=True), torch.randn(4, 3, dtype=f64, requires_grad=True)
        out = sin_add(x, y)
        torch.testing.assert_close(out, x.sin() + y.sin())
        # Written with ATen ops: autograd records them, no hand-written backward needed.
        assert gradcheck(sin_add, (x, y))

    def test_sin_add_shape_mismatch(self):
        with pytest.raises(RuntimeError, match=r"sin_add: x and y must have the same shape, got \[2\] and \[3\]"):
            sin_add(torch.ones(2), torch.ones(3))

    def test_three_x_minus_y_forward_backward(self):
        x, y = torch.randn(5, dtype=f64, requires_grad=True), torch.randn(5, dtype=f64, requires_grad=True)
        out = three_x_minus_y(x, y)
        torch.testing.assert_close(out, 3 * x - y)
        assert "ThreeXMinusYFunction" in type(out.grad_fn).__name__
        grad = torch.randn(5, dtype=f64)
        gx, gy = torch.autograd.grad(out, (x, y), grad)
        torch.testing.assert_close(gx, 3 * grad)
        torch.testing.assert_close(gy, -grad)
        assert gradcheck(ThreeXMinusYFunction.apply, (x, y))

    def test_three_x_minus_y_backward_keeps_dtype(self):
        grad = torch.ones(3, dtype=f64)
        gx, gy = load_three_x_minus_y_extension().three_x_minus_y_backward(grad)
        assert gx.dtype == gy.dtype == f64

    @pytest.mark.parametrize(
        "x, y, match",
        [
            (torch.ones(2), torch.ones(2, 1), r"same shape, got \[2\] and \[2, 1\]"),
            (torch.ones(2), torch.ones(2, dtype=f64), r"same dtype, got Float and Double"),
        ],
        ids=["shape", "dtype"],
    )
    def test_three_x_minus_y_bad_inputs(self, x, y, match):
        with pytest.raises(RuntimeError, match="three_x_minus_y: x and y must have the " + match):
            three_x_minus_y(x, y)
