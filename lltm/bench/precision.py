"""Accuracy and time of each float32 precision mode: the relative error of the output, the final
states and every gradient against a float64 run on the same inputs, and the forward + backward time,
for lltm.LLTM with each backend, for torch.nn.LSTM / nn.GRU, and for lltm.LSTM / lltm.GRU on lltm's
backends (against nn.LSTM's / nn.GRU's float64 run).

    python -m lltm.bench.precision [--steps 100,1000] [--sizes 16x32x128] [--models python,aten,fused,lstm]
        [--modes strict,tf32,accurate,bf16,fp16] [--device cuda] [--min-run-time 0.3] [--no-time] [--json FILE]

Models: python, aten, fused (lltm.LLTM on that backend); lstm, gru (torch.nn.LSTM, nn.GRU); lstm-aten,
lstm-fused, gru-aten, gru-fused (lltm.LSTM, lltm.GRU on that backend, the same parameters as the torch
module of the size).

Modes (docs/precision.md): strict = float32 with TF32 off (torch's matmul and cuDNN, lltm's "ieee");
tf32 = float32 with TF32 on everywhere (torch.set_float32_matmul_precision("high"), cuDNN's
allow_tf32, lltm's "tf32"); accurate = torch's matmul TF32 on and lltm's "accurate" (the backward's
recurrent products as 3xTF32, the rest strict; lltm's compiled backends only); bf16 / fp16 = the model and
inputs in that dtype (products in it, sums in float32). Sizes are BxIxS. Error = ||got - ref|| / ||ref||
per tensor (float64 norms). Time = torch.utils.benchmark.Timer median of one forward + backward
(from .grad = None). Every global switch it changes is put back on exit.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import sys
from typing import Any, Callable, Iterator, Optional

import torch
import torch.utils.benchmark as benchmark

import lltm

MODES = ("strict", "tf32", "accurate", "bf16", "fp16")
LLTM_MODELS = ("python", "aten", "fused")
TORCH_MODELS = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}  # each cell's float64 reference too
# lltm.LSTM / lltm.GRU on a backend: "cell-backend" -> (cell, backend)
SEAM_MODELS = {f"{cell}-{backend}": (cell, backend) for cell in TORCH_MODELS for backend in ("aten", "fused")}
MODELS = (*LLTM_MODELS, *TORCH_MODELS, *SEAM_MODELS)
# The table's columns: outputs, then the gradients (lltm names; the torch layout's weights / biases
# are weight_ih and weight_hh / bias_ih and bias_hh together). A GRU has no c_n and d_c0.
COLUMNS = ("output", "h_n", "c_n", "d_input", "d_weights", "d_bias", "d_h0", "d_c0")
NO_CELL_STATE = ("c_n", "d_c0")


def cell_of(model: str) -> str:
    """The cell a model runs: "lltm", "lstm" or "gru"."""
    if model in TORCH_MODELS:
        return model
    return SEAM_MODELS[model][0] if model in SEAM_MODELS else "lltm"


def backend_of(model: str) -> Optional[str]:
    """The lltm backend a model runs on; None for torch's own modules."""
    if model in TORCH_MODELS:
        return None
    return SEAM_MODELS[model][1] if model in SEAM_MODELS else model


def reference_model(cell: str) -> str:
    """The model whose float64 run is a cell's reference: the python LLTM, nn.LSTM, nn.GRU."""
    return "python" if cell == "lltm" else cell


HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


@contextlib.contextmanager
def precision_mode(mode: str) -> Iterator[torch.dtype]:
    """Sets torch's and lltm's switches for `mode` inside the block (yields the dtype to run in) and puts
    back what they were: torch's float32 matmul precision (legacy API, which keeps its new
    fp32_precision in step), cuDNN's TF32 switch and lltm's setting."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
    saved = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32, lltm.get_fp32_precision())
    tf32 = mode in ("tf32", "accurate")
    try:
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
        torch.backends.cudnn.allow_tf32 = tf32
        lltm.set_fp32_precision({"strict": "ieee", "tf32": "tf32", "accurate": "accurate"}.get(mode))
        yield HALF.get(mode, torch.float32)
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cudnn.allow_tf32 = saved[1]
        lltm.set_fp32_precision(saved[2])


class Problem:
    """One model over one sequence: float64 parameters and inputs (seeded), and the upstream gradients
    of output, h_n and c_n."""

    def __init__(self, model: str, T: int, B: int, I: int, S: int, device: torch.device, seed: int = 0):
        if model not in MODELS:
            raise ValueError(f"unknown model {model!r}; models: {', '.join(MODELS)}")
        self.model = model
        self.cell = cell_of(model)
        gen = torch.Generator().manual_seed(seed)
        if model in TORCH_MODELS:
            self.module = TORCH_MODELS[model](I, S)
        elif model in SEAM_MODELS:
            cell, backend = SEAM_MODELS[model]
            self.module = {"lstm": lltm.LSTM, "gru": lltm.GRU}[cell](I, S, backend=backend)
        else:
            self.module = lltm.LLTM(I, S, backend=model)
        # the same parameters for every model of a size (lltm's init, one generator)
        with torch.no_grad():
            for p in self.module.parameters():
                p.copy_((torch.rand(p.shape, generator=gen, dtype=torch.float64) * 2 - 1) * S**-0.5)
        self.module = self.module.to(device, torch.float64)

        def rand(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device)

        self.x, self.h0, self.c0 = rand(T, B, I), rand(1, B, S), rand(1, B, S)
        self.grads = (rand(T, B, S), rand(1, B, S), rand(1, B, S))

    def run(self, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], Callable[[], None]]:
        """The results in `dtype` (output, final states, every gradient; float64 copies keyed by COLUMNS),
        and a closure that runs one forward + backward again (for timing)."""
        # a copy in `dtype` (Module.to converts in place)
        module = copy.deepcopy(self.module).to(dtype) if dtype != torch.float64 else self.module
        leaves = [t.detach().to(dtype).requires_grad_() for t in (self.x, self.h0, self.c0)]
        grads = [g.to(dtype) for g in self.grads]
        params = dict(module.named_parameters())

        gru = self.cell == "gru"

        def step() -> tuple[torch.Tensor, ...]:
            for p in (*leaves, *params.values()):
                p.grad = None
            if gru:
                out, h_n = module(leaves[0], leaves[1])
                torch.autograd.backward([out, h_n], grads[:2])
                return out, h_n, None
            out, (h_n, c_n) = module(leaves[0], (leaves[1], leaves[2]))
            torch.autograd.backward([out, h_n, c_n], grads)
            return out, h_n, c_n

        out, h_n, c_n = step()
        if self.cell == "lltm":
            weights, bias = params["weights_l0"].grad, params["bias_l0"].grad
        else:
            weights = torch.cat([params["weight_ih_l0"].grad.flatten(), params["weight_hh_l0"].grad.flatten()])
            bias = torch.cat([params["bias_ih_l0"].grad, params["bias_hh_l0"].grad])
        got = (out, h_n, c_n, leaves[0].grad, weights, bias, leaves[1].grad, leaves[2].grad)
        result = {name: t.detach().double() for name, t in zip(COLUMNS, got) if not (gru and name in NO_CELL_STATE)}
        return result, step


def relative_errors(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> dict[str, float]:
    """||got - ref|| / ||ref|| per entry (float64)."""
    return {k: ((got[k] - ref[k]).norm() / ref[k].norm().clamp_min(1e-300)).item() for k in ref}


def time_ms(step: Callable[[], Any], min_run_time: float) -> float:
    """Median of one call, ms (torch.utils.benchmark.Timer, which synchronises CUDA)."""
    step()  # warm: plans, graphs, cuBLAS heuristics
    timer = benchmark.Timer(stmt="step()", globals={"step": step})
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e3


def applies(model: str, mode: str, device: torch.device) -> Optional[str]:
    """None where the (model, mode) pair runs, else why not."""
    if mode == "accurate" and model in ("python", *TORCH_MODELS):
        return "follows torch alone (no accurate mode)"
    if mode in ("tf32", "accurate") and device.type != "cuda":
        return "TF32 is a CUDA matter"
    if mode == "fp16" and device.type != "cuda" and model != "python":
        return "float16 on CUDA only"
    return None


def measure(
    steps: list[int],
    sizes: list[tuple[int, int, int]],
    models: list[str],
    modes: list[str],
    device: torch.device,
    min_run_time: float = 0.3,
    timed: bool = True,
    log: Callable[[str], None] = lambda _: None,
) -> list[dict[str, Any]]:
    """One row per (T, size, model, mode): errors against the float64 run and the f+b time (ms)."""
    rows: list[dict[str, Any]] = []
    for T in steps:
        for B, I, S in sizes:
            # One float64 reference a cell: the python backend's for the LLTM, torch's module's for the
            # LSTM and the GRU (the same parameters and inputs for every model of the cell).
            refs: dict[str, dict[str, torch.Tensor]] = {}
            for model in models:
                problem = Problem(model, T, B, I, S, device)
                cell = problem.cell
                if cell not in refs:
                    ref_model = reference_model(cell)
                    ref_problem = problem if model == ref_model else Problem(ref_model, T, B, I, S, device)
                    with precision_mode("strict"):
                        refs[cell], _ = ref_problem.run(torch.float64)
                ref = refs[cell]
                for mode in modes:
                    row: dict[str, Any] = {"T": T, "B": B, "I": I, "S": S, "model": model, "mode": mode}
                    why_not = applies(model, mode, device)
                    if why_not is None:
                        try:
                            with precision_mode(mode) as dtype:
                                got, step = problem.run(dtype)
                                row["errors"] = relative_errors(got, ref)
                                if timed:
                                    row["time_ms"] = time_ms(step, min_run_time)
                        except (RuntimeError, ValueError, NotImplementedError) as exc:
                            row["skipped"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
                    else:
                        row["skipped"] = why_not
                    rows.append(row)
                    log(_line(row))
    return rows


def _name(model: str) -> str:
    if model in TORCH_MODELS:
        return f"nn.{model.upper()}"
    if model in SEAM_MODELS:
        cell, backend = SEAM_MODELS[model]
        return f"lltm.{cell.upper()} {backend}"
    return f"lltm {model}"


def _line(row: dict[str, Any]) -> str:
    if "errors" not in row:
        return f"T={row['T']} {_name(row['model'])} {row['mode']}: {row['skipped']}"
    e = row["errors"]
    t = f" {row['time_ms']:.2f} ms" if "time_ms" in row else ""
    return f"T={row['T']} {_name(row['model'])} {row['mode']}:{t} out {e['output']:.1e} d_weights {e['d_weights']:.1e}"


def table(rows: list[dict[str, Any]]) -> str:
    """A markdown table per (T, size), then the accurate mode against strict and TF32."""
    out = []
    keys = sorted({(r["T"], r["B"], r["I"], r["S"]) for r in rows})
    for T, B, I, S in keys:
        out += [f"\n**T = {T}, B = {B}, I = {I}, S = {S}** (relative error against float64; f+b ms)\n"]
        out += ["| model | mode | f+b ms | " + " | ".join(COLUMNS) + " |", "|---|---|---|" + "---|" * len(COLUMNS)]
        for r in rows:
            if (r["T"], r["B"], r["I"], r["S"]) != (T, B, I, S):
                continue
            if "errors" not in r:
                out.append(
                    f"| {_name(r['model'])} | {r['mode']} | - | " + f"({r['skipped']}) |" + " |" * (len(COLUMNS) - 1)
                )
                continue
            t = f"{r['time_ms']:.2f}" if "time_ms" in r else "-"
            cells = " | ".join(f"{r['errors'][c]:.1e}" if c in r["errors"] else "-" for c in COLUMNS)
            out.append(f"| {_name(r['model'])} | {r['mode']} | {t} | {cells} |")
    summary = summarize(rows)
    if summary:
        out += ["", "accurate against strict (worst error ratio over every column) and against tf32 (time):", ""]
        out += summary
    return "\n".join(out)


def summarize(rows: list[dict[str, Any]]) -> list[str]:
    """Per (T, size, model) with an accurate row: max over columns of accurate / strict error, and
    accurate / tf32 time."""
    found = {(r["T"], r["B"], r["I"], r["S"], r["model"], r["mode"]): r for r in rows if "errors" in r}
    lines = []
    for (T, B, I, S, model, mode), acc in found.items():
        if mode != "accurate":
            continue
        strict = found.get((T, B, I, S, model, "strict"))
        tf32 = found.get((T, B, I, S, model, "tf32"))
        parts = [f"- T={T} {B}x{I}x{S} {_name(model)}:"]
        if strict:
            worst = max(acc["errors"], key=lambda c: acc["errors"][c] / max(strict["errors"][c], 1e-300))
            ratio = acc["errors"][worst] / max(strict["errors"][worst], 1e-300)
            parts.append(f"error / strict <= {ratio:.2f} (worst: {worst})")
        if tf32:
            parts.append(
                f"d_weights error tf32 {tf32['errors']['d_weights']:.1e}, accurate {acc['errors']['d_weights']:.1e}"
            )
            if "time_ms" in acc and "time_ms" in tf32:
                parts.append(f"time / tf32 {acc['time_ms'] / tf32['time_ms']:.2f}")
        lines.append(" ".join(parts))
    return lines


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def _sizes(text: str) -> list[tuple[int, int, int]]:
    out = []
    for item in text.split(","):
        parts = [int(v) for v in item.lower().split("x")]
        if len(parts) != 3:
            raise argparse.ArgumentTypeError(f"size {item!r} is not BxIxS")
        out.append((parts[0], parts[1], parts[2]))
    return out


def _names(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [v for v in text.split(",") if v]
        bad = [n for n in names if n not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(allowed)}")
        return names

    return parse


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lltm.bench.precision", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=_ints, default=[100, 1000], help="sequence lengths T (default 100,1000)")
    parser.add_argument("--sizes", type=_sizes, default=[(16, 32, 128)], help="BxIxS list (default 16x32x128)")
    parser.add_argument(
        "--models",
        type=_names(MODELS),
        default=[*LLTM_MODELS, "lstm"],
        help="python,aten,fused,lstm (default); also gru, lstm-aten, lstm-fused, gru-aten, gru-fused",
    )
    parser.add_argument("--modes", type=_names(MODES), default=list(MODES), help="strict,tf32,accurate,bf16,fp16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--min-run-time", type=float, default=0.3, help="seconds of timing per row")
    parser.add_argument("--no-time", action="store_true", help="errors only")
    parser.add_argument("--json", help="write the rows (and the setup) here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    models = [m for m in args.models if backend_of(m) is None or lltm.backends(device.type).get(backend_of(m))]
    rows = measure(
        args.steps,
        args.sizes,
        models,
        args.modes,
        device,
        args.min_run_time,
        not args.no_time,
        log=lambda s: print(s, file=sys.stderr, flush=True),
    )
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    head = f"{name}, torch {torch.__version__}, {datetime.date.today().isoformat()}"
    print(head)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"device": name, "torch": torch.__version__, "date": datetime.date.today().isoformat(), "rows": rows},
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
