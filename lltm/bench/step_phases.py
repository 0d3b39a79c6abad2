"""Where a step of the persistent sequence kernels goes: the mean cycles of
each phase of a step (dot products, their reduction, the cell math with the
exchange's stores, the barrier's two halves, the step's global stores and
loads; the forward's and the grid backward's stores fall in their dot),
read from clock64 by thread 0 of the first CTA of each launch; and,
for the forward kernels, the exchange's trace per batch chunk (the global
timer of every CTA as it leaves the step's arrive and its wait, over 64
steps): how far apart the CTAs arrive, and how long the last arrival takes
to end the first and the last CTA's wait.

Needs a profiling build (the kernels print the phases only there):

    LLTM_STEP_CLOCKS=1 TORCH_CUDA_ARCH_LIST=9.0 pip install --no-build-isolation -e .
    python -m lltm.bench.step_phases [--steps 1000] [--sizes 16x128,64x256] [--paths auto,cluster-fma,grid]
        [--dtype float32] [--tf32] [--cell lstm]

A size is BxS (input features I = S, or BxIxS). A path is a
seq_sweep.PATHS name (cluster8, cluster-mma, grid, grid-mma, auto, ...).
The cycles are the SM's (clock64); the ns column divides them by the SM
clock the kernel measured over its loop (its cycles over the global timer's
nanoseconds), which under load may be below the clock rate the runtime
reports (a build whose kernels print no clock: divided by that rate).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from typing import Optional

import torch

from lltm import cells as lltm_cells
from lltm.bench import cases
from lltm.bench.seq_sweep import DTYPES, PATHS, PLANNER_ROWS, _set_path

LINE = re.compile(
    r"lltm step clocks: (?P<what>\w+ \w+) (?P<shape>.*?) cycles/step: (?P<phases>.*?); total (?P<total>\d+)"
    r"(?:; sm clock (?P<ghz>[\d.]+) GHz)?"
)

TRACE = re.compile(r"lltm step trace: (?P<what>\w+ \w+) group=(?P<group>\d+) ctas (?P<ctas>\d+-\d+) (?P<rest>.*)")


def parse_trace(text: str) -> list[dict]:
    """The exchange's trace lines of one run: direction and path, group, the chunk's CTAs and the
    line's numbers as it reads."""
    return [
        {"what": m["what"], "group": int(m["group"]), "ctas": m["ctas"], "text": m["rest"]}
        for m in TRACE.finditer(text)
    ]


def _capture_stdout(fn, sync: bool = True) -> str:
    """What the process writes on file descriptor 1 while `fn` runs (device
    printf goes there, not through sys.stdout; `sync` waits for the device
    first, which flushes its printf buffer)."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+b") as f:
        os.dup2(f.fileno(), 1)
        try:
            fn()
            if sync:
                torch.cuda.synchronize()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        f.seek(0)
        return f.read().decode(errors="replace")


def parse(text: str) -> list[dict]:
    """The phase lines of one run: direction and path, the launch shape,
    phase -> mean cycles per step, and the SM clock the loop ran at in GHz
    (None where the line has none)."""
    rows = []
    for m in LINE.finditer(text):
        phases = {}
        for item in m["phases"].split(", "):
            name, value = item.rsplit(" ", 1)
            phases[name] = int(value)
        ghz = float(m["ghz"] or 0) or None  # a clock of 0: the loop took no measurable time
        rows.append({"what": m["what"], "shape": m["shape"], "phases": phases, "total": int(m["total"]), "ghz": ghz})
    return rows


def measure(T: int, B: int, I: int, S: int, dtype: torch.dtype, path: str, cell: str = "lltm") -> Optional[list[dict]]:
    """One forward and backward of the `cell`'s layer on `path` after a
    warm-up pass; the phase lines of the timed pass (None where the path
    cannot run)."""
    cfg = cases.Config(
        batch_size=B, features=I, state_size=S, seq=T, device=torch.device("cuda"), dtype=dtype, seed=0, cell=cell
    )
    _set_path(path)
    try:
        case = cases.seq_case("fused", cfg)
        case.backward(case.forward())
        torch.cuda.synchronize()
        text = _capture_stdout(lambda: case.backward(case.forward()))
    except RuntimeError as err:
        if "allows no time loop" not in str(err):
            raise
        return None
    finally:
        _set_path("auto")
    # One line per launch (one per wave): keep the first of each direction,
    # and the forward's trace lines of its chunks.
    seen: dict[str, dict] = {}
    for row in parse(text):
        seen.setdefault(row["what"].split()[0], row)
    if "forward" in seen:
        traces = [t for t in parse_trace(text) if t["what"] == seen["forward"]["what"]]
        seen["forward"]["trace"] = traces[: max(1, len({t["ctas"] for t in traces}))]
    return list(seen.values())


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--sizes", default="16x32x128,64x256,256x128")
    ap.add_argument("--paths", default="auto,cluster-fma,cluster-mma,grid,grid-mma")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--tf32", action="store_true", help="allow TF32 (float32 on the MMA dot)")
    ap.add_argument("--cell", choices=sorted(lltm_cells.BUILT_IN), default="lltm", help="the layer's cell")
    args = ap.parse_args(argv)
    persistent = [p for p in PATHS if p not in PLANNER_ROWS and not p.startswith("loop")]
    for p in args.paths.split(","):
        if p not in persistent:
            ap.error(f"--paths: {p!r} is not a persistent path; use a comma-separated subset of {','.join(persistent)}")
    sizes = []
    for size in args.sizes.split(","):
        dims = size.split("x")
        if len(dims) not in (2, 3) or not all(d.isdigit() and int(d) > 0 for d in dims):
            ap.error(f"--sizes: {size!r} is not BxS or BxIxS with positive whole numbers (e.g. 16x32x128,64x256)")
        B, I, S = (int(dims[0]), int(dims[1]), int(dims[1])) if len(dims) == 2 else map(int, dims)
        sizes.append((B, I, S))
    if not torch.cuda.is_available():
        print("step_phases: no CUDA device")
        return 1
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    dtype = DTYPES[args.dtype]
    # kHz in the runtime's device properties, where this torch exposes it
    rated = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "clock_rate", 0) / 1e6 or None
    print(
        f"step phases of the {args.cell} cell, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"T={args.steps}, {args.dtype}"
        f"{' (TF32 allowed)' if args.tf32 else ''}; cycles per step (thread 0 of CTA 0), ns at the SM clock the"
        f" loop ran at" + (f" (rated {rated:.3f} GHz)" if rated else "")
    )
    any_line = False
    for B, I, S in sizes:
        for path in args.paths.split(","):
            rows = measure(args.steps, B, I, S, dtype, path, args.cell)
            if rows is None:
                print(f"{B}x{I}x{S} {path}: cannot run")
                continue
            if not rows:
                print(f"{B}x{I}x{S} {path}: no persistent kernel ran (the loop)")
                continue
            any_line = True
            for row in rows:
                phases = " | ".join(f"{k} {v}" for k, v in row["phases"].items())
                ghz = row["ghz"] or rated
                ns = f" = {row['total'] / ghz:.0f} ns at {ghz:.3f} GHz" if ghz else ""
                print(f"{B}x{I}x{S} {path:12s} {row['what']:17s} {row['shape']}: {phases} | total {row['total']}{ns}")
                for t in row.get("trace", []):
                    print(f"    trace, CTAs {t['ctas']}: {t['text']}")
    if not any_line:
        print("step_phases: no phase lines; is this a profiling build (LLTM_STEP_CLOCKS=1 at build time)?")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
