"""lltm.extending imports on its own, without the compiled LLTM extension."""

import os
import subprocess
import sys
from pathlib import Path

import lltm.extending

REPO = Path(__file__).resolve().parents[2]

REQUIRED = [
    "LinearFunction", "linear", "MulConstant", "CubeFunction", "cube", "SigmoidFunction", "DnnLayer",
    "ScalarTensor", "LoggingTensor", "MetadataTensor", "FusedConvBN2d", "FusedConvBN2dFunction",
    "load_sin_add_extension", "load_three_x_minus_y_extension",
]  # fmt: skip


def test_public_names_are_exported():
    missing = [n for n in REQUIRED if n not in lltm.extending.__all__]
    assert not missing
    for name in lltm.extending.__all__:
        assert getattr(lltm.extending, name) is not None, name


def test_import_does_not_need_compiled_extension():
    # Hide any prebuilt lltm._C and make every compile attempt fail loudly;
    # then import and use the subpackage.
    code = """
import sys
sys.modules["lltm._C"] = None  # `import lltm._C` now raises ImportError
import torch.utils.cpp_extension as ce
def refuse(*args, **kwargs):
    raise AssertionError("lltm.extending tried to compile at import")
ce.load = ce.load_inline = refuse
import torch
from lltm.extending import LinearFunction, linear, cube, DnnLayer, ScalarTensor, FusedConvBN2d
x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
w = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
linear(x, w).sum().backward()
assert torch.allclose(cube(x), x ** 3)
out = FusedConvBN2d(3, 2, 1)(torch.randn(2, 3, 4, 4))
assert out.shape == (2, 2, 4, 4)
print("ok")
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("ok")
