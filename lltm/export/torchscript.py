"""TorchScript and lltm's modules.

torch.jit.script cannot compile lltm's modules: their forward picks a
backend, takes a PackedSequence and is written with Python annotations
TorchScript does not read (it used to fail with "Unknown type annotation:
'int' at" and no location). TorchScript is also deprecated in torch. A
module class opts into a clear error instead with one line,

    __prepare_scriptable__ = not_scriptable

(torch.jit.script calls ``module.__prepare_scriptable__()`` on the module
and each submodule before compiling them). The error names what to use:

- torch.export.export(model, (x,)) for a deployable program (the graph
  holds the torch.ops.lltm operators: a process that loads it with
  torch.export.load must ``import lltm`` first, so they are registered);
- torch.compile(model) to make it faster in Python;
- lltm.export.onnx.export(model, x) for ONNX;
- torch.jit.trace(model, (x,)) if a TorchScript module is required (it
  records the lltm operators for that input layout; loading it with
  torch.jit.load needs ``import lltm`` first too).
"""

from __future__ import annotations

from typing import NoReturn

import torch

__all__ = ["MESSAGE", "not_scriptable"]

MESSAGE = (
    "torch.jit.script cannot compile {name} (and TorchScript is deprecated in torch): use "
    "torch.export.export(model, (x,)) for a deployable program (import lltm before torch.export.load, so the "
    "lltm operators are registered), torch.compile(model) for speed, lltm.export.onnx.export(model, x) for ONNX, "
    "or torch.jit.trace(model, (x,)) if a TorchScript module is required"
)


def not_scriptable(module: torch.nn.Module) -> NoReturn:
    """``__prepare_scriptable__`` of a module TorchScript cannot compile:
    raises a RuntimeError that says what to use instead."""
    raise RuntimeError(MESSAGE.format(name=f"lltm's {type(module).__name__}"))
