"""What `lltm bench` times: one row vocabulary for the cell and the sequence mode.

A row is built into a :class:`Case` (a forward and a backward closure over
fixed inputs) or refused with :class:`Skip`, whose message says why (not
available on the device, CUDA only, cell mode only); the report lists the
skipped rows with that reason.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

import torch
from torch import Tensor, nn

from lltm import _backends, _registry, cells, functional
from lltm.precision import fp32_precision
from lltm.reference import lltm_cell_reference

Outputs = tuple[Tensor, ...]

BACKEND_ROWS = _registry.NAMES
# name -> what it is, in both modes (cell mode | sequence mode)
ROWS: dict[str, str] = {
    **{b.name: f"lltm, backend={b.name!r}: {b.summary}" for b in _registry.BACKENDS},
    "compile": "torch.compile of the python cell | of lltm.LLTM(backend='python') (unrolled: slow to compile)",
    "compile-ro": "the same, mode='reduce-overhead' (CUDA graphs; CUDA only)",
    "lstm": "nn.LSTMCell | nn.LSTM (cuDNN on GPU), same state size",
    "lstm-notf32": "nn.LSTM with torch.backends.cudnn.allow_tf32 = False (sequence mode, CUDA only)",
    "gru": "nn.GRU (cuDNN on GPU), same state size (sequence mode)",
    "gru-notf32": "nn.GRU with torch.backends.cudnn.allow_tf32 = False (sequence mode, CUDA only)",
    "lstm-fp16": "nn.LSTM in float16 (cuDNN's fast half path) beside a bfloat16 run: the faster of cuDNN's two "
    "half paths (sequence mode, CUDA, with --dtype bfloat16 or --autocast bfloat16)",
    "gru-fp16": "nn.GRU in float16, likewise",
    "fused-tf32": "lltm.LLTM(backend='fused') with torch.backends.cuda.matmul.allow_tf32 = True: TF32 wherever "
    "the layer runs cuBLAS or the persistent kernels' tensor-core dot (sequence mode, float32 on CUDA only); "
    "compare with lstm, as lstm-notf32 with fused",
    "fused-accurate": "lltm.LLTM(backend='fused') inside lltm.fp32_precision('accurate'): strict fp32's errors, "
    "tensor cores where they hold them (sequence mode, float32 on CUDA only); compare its time with fused-tf32",
    "gemm": "the bare GEMMs of one cell step: addmm forward, two mm backward (cell mode only)",
}
ALIASES = {"lstmcell": "lstm", "notf32": "lstm-notf32", "tf32": "fused-tf32", "accurate": "fused-accurate"}
CELL_DEFAULT = (*BACKEND_ROWS, "compile", "compile-ro", "lstm", "gemm")
SEQ_DEFAULT = (*BACKEND_ROWS, "compile", "compile-ro", "lstm", "lstm-notf32", "fused-tf32")
# nn.LSTM / nn.GRU in float16 whatever the run's dtype: cuDNN's fast half path
HALF_PEERS = ("lstm-fp16", "gru-fp16")
# Like with like on CUDA in float32 (each pair computes in the same precision):
# (row, peer) for `lltm bench --seq`'s footer.
LIKE_PAIRS = (("fused", "lstm-notf32"), ("fused-tf32", "lstm"))
# Rows that run the fused layer under one of lltm's float32 modes (lltm.fp32_precision), and that mode
FP32_MODE_ROWS = {"fused-tf32": "tf32", "fused-accurate": "accurate"}


class Skip(Exception):
    """A row that cannot run here; the message is the reason."""


@dataclass
class Case:
    """One row to time: forward() -> outputs, backward(outputs) -> None.

    `parameters` are left out of the saved-for-backward count (they exist
    anyway, whatever the row saves).
    """

    name: str
    forward: Callable[[], Outputs]
    backward: Callable[[Outputs], None]
    note: str = ""
    parameters: list[Tensor] = field(default_factory=list)
    autograd: bool = True  # False: no graph to measure memory of (the bare GEMMs)
    # False: the peak says nothing (CUDA graphs allocate their pool once, at capture)
    measure_peak: bool = True
    # what its float32 products and sums run in: "fp32", "TF32", or the dtype
    precision: str = ""


@dataclass(frozen=True)
class Config:
    """The sizes and settings every row of one run shares."""

    batch_size: int
    features: int
    state_size: int
    seq: int  # 0: cell mode
    device: torch.device
    dtype: torch.dtype
    seed: int = 0
    param_grads_only: bool = False
    accumulate_grads: bool = False
    # Forward under torch.autocast(device, autocast); parameters and inputs
    # stay `dtype`, backward runs outside the region (as autocast asks).
    autocast: Optional[torch.dtype] = None
    # The cell of the lltm rows in sequence mode (lltm.cells): lltm.LLTM,
    # lltm.LSTM or lltm.GRU; the peers nn.LSTM (lstm rows) and nn.GRU (gru rows).
    cell: str = "lltm"


def parse_rows(text: str) -> list[str]:
    """'python,aten' -> ['python', 'aten']; unknown names raise ValueError."""
    names = [ALIASES.get(n.strip(), n.strip()) for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROWS]
    if unknown or not names:
        raise ValueError(
            f"unknown row {', '.join(map(repr, unknown)) or '(none given)'}; choose from {', '.join(ROWS)}"
        )
    return list(dict.fromkeys(names))  # once each, in the order given


def _autograd_backward(grads: Outputs, leaves: list[Tensor], accumulate: bool) -> Callable[[Outputs], None]:
    """backward(outputs): autograd into `.grad` of `leaves`, reset to None
    first unless `accumulate` (set-to-None costs no kernel; zeroing would)."""
    leaves = [t for t in leaves if t.requires_grad]

    def backward(outputs: Outputs) -> None:
        if not accumulate:
            for t in leaves:
                t.grad = None
        torch.autograd.backward(outputs[: len(grads)], grads)

    return backward


@contextlib.contextmanager
def _tf32(switches: object, allowed: bool) -> Iterator[None]:
    """`switches.allow_tf32` (torch.backends.cudnn or torch.backends.cuda.matmul) set to `allowed` inside."""
    old = switches.allow_tf32
    switches.allow_tf32 = allowed
    try:
        yield
    finally:
        switches.allow_tf32 = old


def _within(case: Case, context: Callable[[], contextlib.AbstractContextManager], backward: bool = True) -> Case:
    """The same case with its forward (and its backward, if asked) inside `context()`."""
    forward, back = case.forward, case.backward

    def fwd() -> Outputs:
        with context():
            return forward()

    def bwd(outputs: Outputs) -> None:
        with context():
            back(outputs)

    case.forward = fwd
    if backward:
        case.backward = bwd
    return case


def _no_tf32(case: Case) -> Case:
    """The same case with cuDNN's TF32 off around forward and backward."""
    return _within(case, lambda: _tf32(torch.backends.cudnn, False))


def precision(name: str, cfg: Config) -> str:
    """What a row's float32 products run in on this device with the current
    switches: "TF32" where tensor cores may round the inputs to TF32 (cuDNN's
    nn.LSTM by default, cuBLAS when matmul TF32 is allowed), "fp32" where
    every product is an fp32 FMA; other dtypes by name (fp32 accumulation)."""
    dtype = cfg.autocast or cfg.dtype
    if name in HALF_PEERS:
        return "float16"
    if dtype != torch.float32:
        return str(dtype).replace("torch.", "")
    if cfg.device.type != "cuda":
        return "fp32"
    if name in HALF_PEERS:
        return "float16"
    if name == "fused-tf32":
        return "TF32"
    if name == "fused-accurate":
        return "accurate"
    if name in ("lstm-notf32", "gru-notf32"):
        return "fp32"
    if name in ("lstm", "gru"):
        return "TF32" if torch.backends.cudnn.allow_tf32 else "fp32"
    return "TF32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"


def _check_common(name: str, cfg: Config) -> None:
    """Reasons shared by both modes for a row not to run."""
    cuda = cfg.device.type == "cuda"
    if name in BACKEND_ROWS and not _backends.is_available(name, cfg.device.type):
        raise Skip(f"backend {name!r} is not available on {cfg.device.type}")
    if name in ("compile-ro", "lstm-notf32", "gru-notf32", *FP32_MODE_ROWS) and not cuda:
        raise Skip("CUDA only")
    if name in HALF_PEERS and not cuda:
        raise Skip("CUDA only (cuDNN's half path)")
    if name in HALF_PEERS and (cfg.autocast or cfg.dtype) != torch.bfloat16:
        raise Skip("a peer of bfloat16 runs (--dtype bfloat16 or --autocast bfloat16); with float16 the lstm row is it")
    if name in FP32_MODE_ROWS and (cfg.dtype != torch.float32 or cfg.autocast is not None):
        raise Skip(f"float32 only ({FP32_MODE_ROWS[name]} is a float32 mode)")
    if name in FP32_MODE_ROWS and not _backends.is_available("fused", cfg.device.type):
        raise Skip(f"backend 'fused' is not available on {cfg.device.type}")


class _Random:
    """Uniform [-1, 1) tensors from one seeded CPU generator, moved to the device."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.gen = torch.Generator(device="cpu").manual_seed(cfg.seed)

    def __call__(self, *shape: int, grad: bool, scale: float = 1.0) -> Tensor:
        t = (torch.rand(*shape, generator=self.gen) * 2 - 1) * scale
        return t.to(device=self.cfg.device, dtype=self.cfg.dtype).requires_grad_(grad)


def cell_case(name: str, cfg: Config) -> Case:
    """A row of the cell mode: one step, input (B, I), state (B, S)."""
    _check_common(name, cfg)
    if name in ("lstm-notf32", "gru", "gru-notf32", *FP32_MODE_ROWS, *HALF_PEERS):
        raise Skip("sequence mode only")
    B, I, S = cfg.batch_size, cfg.features, cfg.state_size
    rand = _Random(cfg)
    input_grad = not cfg.param_grads_only
    x = rand(B, I, grad=input_grad)
    h = rand(B, S, grad=input_grad)
    c = rand(B, S, grad=input_grad)
    bound = S**-0.5
    W = rand(3 * S, S + I, grad=True, scale=bound)
    b = rand(3 * S, grad=True, scale=bound)
    grads = (rand(B, S, grad=False), rand(B, S, grad=False))
    backward = _autograd_backward(grads, [x, h, c, W, b], cfg.accumulate_grads)

    if name in BACKEND_ROWS:
        return Case(name, lambda: functional.lltm_cell(x, W, b, h, c, backend=name), backward, parameters=[W, b])
    if name in ("compile", "compile-ro"):
        mode = "reduce-overhead" if name == "compile-ro" else None
        compiled = torch.compile(lltm_cell_reference, mode=mode, fullgraph=True)

        def fwd() -> Outputs:
            if mode is not None:
                torch.compiler.cudagraph_mark_step_begin()
            return compiled(x, W, b, h, c)

        note = "torch.compile of the python cell" + (f", {mode}" if mode else "")
        return Case(name, fwd, backward, note=note, parameters=[W, b], measure_peak=mode is None)
    if name == "lstm":
        cell = nn.LSTMCell(I, S, device=cfg.device, dtype=cfg.dtype)
        params = list(cell.parameters())
        cell_backward = _autograd_backward(grads, [x, h, c, *params], cfg.accumulate_grads)
        return Case(
            name, lambda: cell(x, (h, c)), cell_backward, note="nn.LSTMCell, same state size", parameters=params
        )
    if name == "gemm":
        # The floor: the GEMMs every backend must run. Forward: gates =
        # addmm(b, X, W^T); backward: dX = dG W and dW = dG^T X.
        X = rand(B, S + I, grad=False)
        Wd, bd = W.detach(), b.detach()
        dG = rand(B, 3 * S, grad=False)

        def gemm_bwd(_outputs: Outputs) -> None:
            torch.mm(dG, Wd)
            torch.mm(dG.t(), X)

        return Case(
            name, lambda: (torch.addmm(bd, X, Wd.t()),), gemm_bwd, note="bare GEMMs: addmm / two mm", autograd=False
        )
    raise ValueError(f"unknown row {name!r}")


def seq_case(name: str, cfg: Config) -> Case:
    """A row of the sequence mode: one layer over T steps, time-major,
    input (T, B, I), loss on the output (T, B, S). Only the public modules
    are used, so whatever lltm.LLTM runs per backend is what is timed."""
    from lltm.modules import GRU, LLTM, LSTM

    _check_common(name, cfg)
    if name == "gemm":
        raise Skip("cell mode only")
    T, B, I, S = cfg.seq, cfg.batch_size, cfg.features, cfg.state_size
    rand = _Random(cfg)
    x = rand(T, B, I, grad=not cfg.param_grads_only)
    grad_out = rand(T, B, S, grad=False)
    factory = {"device": cfg.device, "dtype": cfg.dtype}
    spec = cells.load(cfg.cell)  # a built-in cell, or one of lltm.cells.define (FILE.py:FUNCTION)
    layer = {"lltm": LLTM, "lstm": LSTM, "gru": GRU}.get(cfg.cell) or spec.Layer
    note = f"lltm.{layer.__qualname__}, T={T}"
    if name in BACKEND_ROWS or name in FP32_MODE_ROWS:
        backend = "fused" if name in FP32_MODE_ROWS else name
        if not _backends.is_available(backend, cfg.device.type, spec.op_family()):
            raise Skip(f"{backend} has no {cfg.cell} operators on {cfg.device.type}")
        module: nn.Module = layer(I, S, backend=backend, **factory)
        call = module
        if name == "fused-tf32":
            note += ", torch.backends.cuda.matmul.allow_tf32 = True"
        elif name == "fused-accurate":
            note += ", lltm.fp32_precision('accurate')"
    elif name in ("compile", "compile-ro"):
        module = layer(I, S, backend="python", **factory)
        mode = "reduce-overhead" if name == "compile-ro" else None
        compiled = torch.compile(module, mode=mode, fullgraph=True)

        def call(inp: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
            if mode is not None:
                torch.compiler.cudagraph_mark_step_begin()
            return compiled(inp)

        note = f"torch.compile of lltm.{layer.__name__}(backend='python')" + (f", {mode}" if mode else "")
    elif name in HALF_PEERS:  # float16 copies of the inputs, whatever the run's dtype
        peer = nn.GRU if name.startswith("gru") else nn.LSTM
        module = peer(I, S, device=cfg.device, dtype=torch.float16)
        x = x.detach().to(torch.float16).requires_grad_(x.requires_grad)
        grad_out = grad_out.to(torch.float16)
        call = module
        note = f"nn.{peer.__name__} in float16 (cuDNN's fast half path), same state size"
    else:  # lstm, lstm-notf32, gru, gru-notf32
        peer = nn.GRU if name.startswith("gru") else nn.LSTM
        module = peer(I, S, **factory)
        call = module
        note = f"nn.{peer.__name__}, same state size" + (
            ", cudnn.allow_tf32 = False" if name.endswith("notf32") else ""
        )

    params = list(module.parameters())

    def fwd() -> Outputs:
        output, _ = call(x)
        return (output,)

    backward = _autograd_backward((grad_out,), [x, *params], cfg.accumulate_grads)
    case = Case(name, fwd, backward, note=note, parameters=params, measure_peak=name != "compile-ro")
    if name.endswith("-notf32"):
        return _no_tf32(case)
    if name == "fused-tf32":
        return _within(case, lambda: _tf32(torch.backends.cuda.matmul, True))
    if name == "fused-accurate":
        return _within(case, lambda: fp32_precision("accurate"))
    return case


def build(names: list[str], cfg: Config) -> tuple[list[Case], dict[str, str]]:
    """The cases that can run, and {row: reason} for those that cannot."""
    make = seq_case if cfg.seq else cell_case
    cases, skipped = [], {}
    for name in names:
        try:
            case = make(name, cfg)
        except Skip as why:
            skipped[name] = str(why)
            continue
        case.precision = precision(name, cfg)
        if cfg.autocast is not None and name not in HALF_PEERS:
            case = _within(case, lambda: torch.autocast(cfg.device.type, dtype=cfg.autocast), backward=False)
        cases.append(case)
    return cases, skipped
