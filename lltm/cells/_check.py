"""lltm.cells.check: a cell's compiled backends against its Python step.

For every compiled backend that runs the cell on the device (on a GPU, the
fused CUDA backend also with each of its time loops forced: the persistent
kernel over thread-block clusters, over a cooperative grid, the step loop):
the output, the final states and every gradient (input, weight_ih, weight_hh, bias_ih,
bias_hh, each initial state) against backend="python" in float64, on random
shapes with and without lengths; torch.autograd.gradcheck of the operator;
torch.library.opcheck of its forward (schema, fake kernel, autograd
registration, compiled dispatch). The report names every quantity that is
off, by how much, and where its worst element is (gate and unit for the
weights and biases).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Optional, Union

import torch
from torch import Tensor

from lltm import _backends

__all__ = ["CheckReport", "CheckRow", "check"]

# (T, B, I, S, with lengths): odd sizes, a state size past one vector of floats, a row of length 0
_SHAPES = ((5, 3, 4, 5, False), (6, 4, 3, 19, True), (1, 2, 2, 3, False))
_PARAMS = ("input", "weight_ih", "weight_hh", "bias_ih", "bias_hh")


@dataclass
class CheckRow:
    backend: str
    test: str  # "forward", "gradient", "gradcheck", "opcheck"
    quantity: str  # "output", "h_n", "grad weight_hh", ...
    ok: bool
    error: Optional[float] = None  # largest |difference| / (atol + rtol |reference|): <= 1 passes
    where: str = ""
    shape: str = ""

    def line(self) -> str:
        err = "" if self.error is None else f"{self.error:9.2e}"
        return (
            f"{'ok  ' if self.ok else 'FAIL'} {self.backend:13} {self.test:9} {self.quantity:18} {err:>9}  {self.where}"
        )


@dataclass
class CheckReport:
    """The result of lltm.cells.check: rows per backend, test and quantity."""

    cell: str
    device: str
    rows: list[CheckRow] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.rows) and all(r.ok for r in self.rows)

    @property
    def failures(self) -> list[CheckRow]:
        return [r for r in self.rows if not r.ok]

    def __str__(self) -> str:
        head = f"lltm.cells.check({self.cell!r}) on {self.device}: {'passed' if self.ok else 'FAILED'}"
        cols = "     backend       test      quantity           error/tol  worst element  [its shape T, B, I, S]"
        return "\n".join([head, cols] + [r.line() + (f"  [{r.shape}]" if r.shape else "") for r in self.rows])

    def raise_for_failure(self) -> None:
        """AssertionError with the failing rows, if any."""
        if not self.ok:
            raise AssertionError(str(self))


def _where(name: str, index: tuple[int, ...], cell, hidden: int) -> str:
    """The worst element, said in the cell's terms."""
    if name in ("grad weight_ih", "grad weight_hh", "grad bias_ih", "grad bias_hh") and index:
        gate, unit = divmod(index[0], hidden)
        gate_name = cell.gate_names[gate] if gate < len(cell.gate_names) else str(gate)
        col = f", column {index[1]}" if len(index) > 1 else ""
        return f"gate {gate_name!r}, unit {unit}{col}"
    if name in ("output", "grad input") and len(index) == 3:
        return f"step t={index[0]}, row b={index[1]}, {'unit' if name == 'output' else 'feature'} {index[2]}"
    if index:
        return "row b={}, unit {}".format(*index) if len(index) == 2 else str(index)
    return ""


def _compare(got: Tensor, want: Tensor, rtol: float, atol: float) -> tuple[float, tuple[int, ...]]:
    if got.shape != want.shape:
        return float("inf"), ()
    if got.numel() == 0:
        return 0.0, ()
    ratio = (got - want).abs() / (atol + rtol * want.abs())
    ratio = torch.where(torch.isnan(ratio), torch.full_like(ratio, float("inf")), ratio)
    flat = int(ratio.argmax())
    return float(ratio.flatten()[flat]), tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), ratio.shape))


def _inputs(cell, shape, device, generator):
    T, B, I, S, with_lengths = shape
    G = cell.gates

    def rand(*size, scale=1.0):
        return ((torch.rand(*size, generator=generator, dtype=torch.float64) * 2 - 1) * scale).to(device)

    args = {
        "input": rand(T, B, I),
        "weight_ih": rand(G * S, I, scale=0.5),
        "weight_hh": rand(G * S, S, scale=0.5),
        "bias_ih": rand(G * S, scale=0.5),
        "bias_hh": rand(G * S, scale=0.5),
        "state": [rand(B, S) for _ in cell.states],
    }
    lengths = None
    if with_lengths:
        lengths = torch.randint(0, T + 1, (B,), generator=generator)
        lengths[0], lengths[-1] = T, 0
    return args, lengths


def _run(cell, backend, args, lengths, weights):
    """Output, final states and the gradients of a random weighted sum of them."""
    from lltm import functional

    leaves = {
        k: (v.clone().requires_grad_() if k != "state" else [s.clone().requires_grad_() for s in v])
        for k, v in args.items()
    }
    out, finals = functional.rnn(
        cell.name,
        leaves["input"],
        leaves["weight_ih"],
        leaves["weight_hh"],
        leaves["bias_ih"],
        leaves["bias_hh"],
        leaves["state"],
        lengths=lengths,
        backend=backend,
    )
    loss = (out * weights[0]).sum() + sum((f * w).sum() for f, w in zip(finals, weights[1:]))
    inputs = [leaves[k] for k in _PARAMS] + leaves["state"]
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    named = {"output": out.detach()}
    named.update({f"{s}_n": f.detach() for s, f in zip(cell.states, finals)})
    for k, g, x in zip([*_PARAMS, *(f"{s}0" for s in cell.states)], grads, inputs):
        named[f"grad {k}"] = torch.zeros_like(x) if g is None else g
    return named


def check(
    cell: Union[str, object],
    *,
    device: Union[str, torch.device] = "cpu",
    backends: Optional[tuple[str, ...]] = None,
    rtol: float = 1e-7,
    atol: float = 1e-9,
    seed: int = 0,
) -> "CheckReport":
    """Checks a cell's compiled backends (default: those that run it on `device`) against its
    Python step, in float64: forward, every gradient, gradcheck and opcheck. Returns a
    CheckReport (print it; report.ok; report.raise_for_failure())."""
    from lltm import cells as _cells

    spec = _cells.get(cell) if isinstance(cell, str) else cell
    device = torch.device(device)
    family = spec.op_family()
    if backends is None:
        backends = tuple(b for b in ("aten", "fused") if _backends.is_available(b, device.type, family))
    report = CheckReport(spec.name, str(device))
    if not backends:
        report.rows.append(CheckRow("-", "build", "operators", False, where="no compiled backend runs this cell here"))
        return report
    # (label, backend, forced time loop): the fused CUDA backend once as planned, then each loop
    runs = [(b, b, None) for b in backends]
    if device.type == "cuda" and "fused" in backends:
        runs += [(f"fused:{path}", "fused", path) for path in _cuda_paths(spec, device)]
    generator = torch.Generator().manual_seed(seed)
    worst: dict[tuple[str, str, str], CheckRow] = {}
    for shape in _SHAPES:
        args, lengths = _inputs(spec, shape, device, generator)
        T, B, _, S, _ = shape
        weights = [torch.randn(T, B, S, generator=generator, dtype=torch.float64).to(device)] + [
            torch.randn(B, S, generator=generator, dtype=torch.float64).to(device) for _ in spec.states
        ]
        want = _run(spec, "python", args, lengths, weights)
        shape_text = f"{T}, {B}, {shape[2]}, {S}" + (", lengths" if lengths is not None else "")
        for label, backend, path in runs:
            try:
                with _seq_path(path):
                    got = _run(spec, backend, args, lengths, weights)
            except Exception as exc:  # a crash of the operator is a failed check, with its message
                worst[(label, "forward", "call")] = CheckRow(
                    label, "forward", "call", False, float("inf"), f"{type(exc).__name__}: {exc}", shape_text
                )
                continue
            for name, reference in want.items():
                err, index = _compare(got[name], reference, rtol, atol)
                test = "gradient" if name.startswith("grad") else "forward"
                row = CheckRow(label, test, name, err <= 1.0, err, _where(name, index, spec, S), shape_text)
                # one row per quantity: its worst shape
                key = (label, test, name)
                if key not in worst or err > worst[key].error:
                    worst[key] = row
    order = {label: k for k, (label, _, _) in enumerate(runs)}
    report.rows.extend(sorted(worst.values(), key=lambda r: (order[r.backend], r.test != "forward")))
    for label, backend, path in runs:
        with _seq_path(path):
            report.rows.append(_gradcheck(spec, backend, label, device, generator))
        if path is None:
            report.rows.append(_opcheck(spec, backend, device, generator))
    return report


def _cuda_paths(spec, device: torch.device) -> list[str]:
    """The time loops of the fused CUDA backend that this device and build have (LLTM_SEQ_PATH)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    plan = torch.ops.lltm._fused_cuda_seq_plan(False, 2, 2, 8, torch.float64, index, spec.name)
    clusters = "no thread-block cluster kernels" not in plan
    return (["cluster"] if clusters else []) + ["grid", "loop"]


@contextlib.contextmanager
def _seq_path(path: Optional[str]):
    """LLTM_SEQ_PATH=path for the calls inside (nothing when None); the planner reads it per call."""
    if path is None:
        yield
        return
    before = os.environ.get("LLTM_SEQ_PATH")
    os.environ["LLTM_SEQ_PATH"] = path
    try:
        yield
    finally:
        if before is None:
            del os.environ["LLTM_SEQ_PATH"]
        else:
            os.environ["LLTM_SEQ_PATH"] = before


def _gradcheck(spec, backend, label, device, generator) -> CheckRow:
    from lltm import functional

    args, lengths = _inputs(spec, (3, 2, 3, 4, True), device, generator)
    inputs = [args[k].requires_grad_() for k in _PARAMS] + [s.requires_grad_() for s in args["state"]]
    n = len(_PARAMS)

    def fn(*xs):
        out, finals = functional.rnn(spec.name, *xs[:n], list(xs[n:]), lengths=lengths, backend=backend)
        return (out, *finals)

    try:
        ok = torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-4, raise_exception=True)
        return CheckRow(label, "gradcheck", "all inputs", bool(ok), shape="3, 2, 3, 4, lengths")
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return CheckRow(label, "gradcheck", "all inputs", False, where=first[:200], shape="3, 2, 3, 4, lengths")


def _opcheck(spec, backend, device, generator) -> CheckRow:
    args, lengths = _inputs(spec, (4, 3, 2, 5, True), device, generator)
    op = getattr(torch.ops.lltm, f"{backend}_{spec.name}_seq_forward").default
    sample = (
        args["input"].requires_grad_(),
        args["weight_ih"].requires_grad_(),
        args["weight_hh"].requires_grad_(),
        args["bias_ih"],
        args["bias_hh"],
        args["state"],
        lengths.to(device),  # the operator takes lengths on the input's device (lltm.functional moves them)
    )
    try:
        results = torch.library.opcheck(op, sample)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return CheckRow(backend, "opcheck", "forward op", False, where=first[:200])
    bad = [k for k, v in results.items() if v != "SUCCESS"]
    return CheckRow(backend, "opcheck", "forward op", not bad, where=", ".join(f"{k}: {results[k]}" for k in bad))
