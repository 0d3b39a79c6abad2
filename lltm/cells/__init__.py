"""The recurrent cells of lltm's kernels (the seam).

A cell is declared once: its traits header in lltm/csrc/cells/ (gate count,
states, what backward needs, the pointwise math for every backend) and its
entry here (the same sizes, and its step in PyTorch: the reference and the
"python" backend). Everything else (operators, fake kernels, autograd,
modules, tests, benchmarks) takes the cell as a parameter.

    lltm.cells.get("gru")   # Cell(name='gru', gates=3, states=('h',), ...)

A cell of your own: lltm.cells.define(...) compiles its C++ step just in
time into the same kernels, and lltm.cells.check(cell) tests it against its
Python step (docs/cells.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from torch import Tensor

from lltm.reference import States, gru_cell_reference, lltm_cell_reference, lstm_cell_reference

__all__ = ["Cell", "BUILT_IN", "get", "load", "define", "check", "defined", "UserCell", "CellCompileError"]


@dataclass(frozen=True)
class Cell:
    """A recurrent cell as the kernels see it.

    gates: G, the blocks of G * hidden_size rows of weight_ih / weight_hh;
    states: the carried states, h first (the output is h); saved: values per
    unit kept for backward; split: the cell needs the recurrent product of a
    gate apart from the input's (GRU's r * (W_hn h + b_hn)); reference:
    step(input, state, weight_ih, weight_hh, bias_ih, bias_hh) -> next state.
    """

    name: str
    gates: int
    states: tuple[str, ...]
    saved: int
    split: bool
    reference: Callable[..., States]
    gate_names: tuple[str, ...]

    @property
    def num_states(self) -> int:
        return len(self.states)

    def op_family(self) -> str:
        """The operator family of lltm._backends: 'seq' for LLTM's own operators,
        '<name>_seq' for lltm::<backend>_<name>_seq_forward."""
        return "seq" if self.name == "lltm" else f"{self.name}_seq"


def _lltm_step(
    input: Tensor,
    state: Sequence[Tensor],
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Optional[Tensor],
    bias_hh: Optional[Tensor],
) -> States:
    """The LLTM step in the seam's layout: its weights (3S, S + I) are [W_hh | W_ih]."""
    import torch

    weights = torch.cat([weight_hh, weight_ih], dim=1)
    bias = bias_ih if bias_hh is None else (bias_hh if bias_ih is None else bias_ih + bias_hh)
    return lltm_cell_reference(input, weights, bias, state[0], state[1])


LLTM = Cell("lltm", 3, ("h", "c"), 3, False, _lltm_step, ("i", "o", "c"))
LSTM = Cell("lstm", 4, ("h", "c"), 4, False, lstm_cell_reference, ("i", "f", "g", "o"))
GRU = Cell("gru", 3, ("h",), 4, True, gru_cell_reference, ("r", "z", "n"))

BUILT_IN: dict[str, Cell] = {c.name: c for c in (LLTM, LSTM, GRU)}
# The cells with the seam's own operators (LLTM keeps its original ones).
SEAM_OPS: tuple[Cell, ...] = (LSTM, GRU)


def get(name: str) -> Cell:
    """The cell called `name`: a built-in one, or one of lltm.cells.define."""
    cell = BUILT_IN.get(name) or _define._DEFINED.get(name)
    if cell is None:
        known = ", ".join([*BUILT_IN, *_define._DEFINED])
        raise ValueError(f"lltm.cells: unknown cell {name!r}; known: {known} (lltm.cells.define adds one)")
    return cell


_LOADED: dict[str, Cell] = {}  # lltm.cells.load's answers: each file runs once per process


def load(spec: str) -> Cell:
    """A cell named on a command line: a built-in or already defined cell's name, or
    "FILE.py:FUNCTION" / "package.module:FUNCTION", a function that returns a cell of
    lltm.cells.define (called here, so its build is cached and reused)."""
    if ":" not in spec:
        return get(spec)
    if spec in _LOADED:
        return _LOADED[spec]
    import importlib
    import importlib.util
    import os
    import sys

    where, _, attr = spec.rpartition(":")
    if where.endswith(".py"):
        if not os.path.isfile(where):
            raise ValueError(f"lltm.cells: {spec!r}: no file {where!r}")
        module_name = "lltm_cell_" + os.path.splitext(os.path.basename(where))[0]
        loader_spec = importlib.util.spec_from_file_location(module_name, where)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module  # importable by name, as torch.compile's tracing wants
        loader_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"lltm.cells: {spec!r}: {where} has no function {attr!r}")
    cell = fn()
    if not isinstance(cell, Cell):
        raise TypeError(f"lltm.cells: {spec!r} returned {type(cell).__name__}, not a cell of lltm.cells.define")
    _LOADED[spec] = cell
    return cell


def check_compiled(described: Sequence[str]) -> None:
    """The extension's cells (lltm::_compiled_cells: 'name:gates:states:saved:split') agree with BUILT_IN."""
    for entry in described:
        name, gates, states, saved, split = entry.split(":")
        cell = BUILT_IN.get(name)
        if cell is None or (cell.gates, cell.num_states, cell.saved, cell.split) != (
            int(gates),
            int(states),
            int(saved),
            split == "1",
        ):
            raise RuntimeError(
                f"lltm: the compiled extension declares cell {entry!r}, which lltm.cells does not match; "
                "rebuild the extension (pip install --no-build-isolation -e .)"
            )


from lltm.cells import _define  # noqa: E402  (defines on top of Cell and BUILT_IN)
from lltm.cells._check import check  # noqa: E402
from lltm.cells._define import CellCompileError, UserCell, define, defined  # noqa: E402
