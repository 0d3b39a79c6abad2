"""The just-in-time build: LLTM_JIT=1 compiles the package's sources with
torch.utils.cpp_extension.load into TORCH_EXTENSIONS_DIR, says so once, and
gives the same results as the reference."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import torch, lltm
    from lltm import functional, _extension
    from lltm.reference import lltm_cell_reference
    torch.manual_seed(0)
    args = [torch.randn(3, 4, dtype=torch.float64, requires_grad=True),
            torch.randn(15, 9, dtype=torch.float64, requires_grad=True),
            torch.randn(15, dtype=torch.float64, requires_grad=True),
            torch.randn(3, 5, dtype=torch.float64, requires_grad=True),
            torch.randn(3, 5, dtype=torch.float64, requires_grad=True)]
    got = functional.lltm_cell(*args, backend="aten")
    want = lltm_cell_reference(*args)
    torch.testing.assert_close(got, want)
    assert torch.autograd.gradcheck(lambda *a: functional.lltm_cell(*a, backend="aten"), args)
    functional.lltm_cell(*args, backend="aten")  # second use: no second build message
    print("mode", _extension.loaded_mode())
    """
)


@pytest.mark.slow
def test_jit_build(tmp_path):
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler")
    env = dict(os.environ, LLTM_JIT="1", TORCH_EXTENSIONS_DIR=str(tmp_path), USE_CUDA="0", MAX_JOBS=os.environ.get("MAX_JOBS", "2"))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "mode jit" in proc.stdout
    messages = [line for line in proc.stderr.splitlines() if "just in time" in line]
    assert len(messages) == 1, proc.stderr
    assert "prebuilt extension lltm._C ignored (LLTM_JIT=1)" in messages[0]
    assert str(tmp_path) in messages[0]
    built = [f for _, _, files in os.walk(tmp_path) for f in files if f.endswith(".so")]
    assert built, "no shared library in TORCH_EXTENSIONS_DIR"
