"""The fused CUDA sequence op's time loops over a grid of sizes: each path
forced (LLTM_SEQ_PATH: the cluster kernel at each cluster size, the grid
kernel, each on the FMA units, and both on tensor cores (LLTM_SEQ_DOT=mma,
the planner's split), the graph-replayed step loop), the planner's own pick, and nn.LSTM
(cuDNN) with and without TF32, and the planner's pick with TF32 allowed
and in lltm's accurate mode (float32), and nn.LSTM in float16 beside a bfloat16 run (cuDNN's fast half
path), side by side in one run, rounds interleaved; with, per grid
point, the planner's choice against the fastest path and the floor of the
work (the layer's FLOPs at the device's peak plus one barrier per step).

Every row is `lltm bench --seq`'s (lltm.bench.cases.seq_case: one
lltm.LLTM / nn.LSTM layer, input (T, B, I) with I = S, loss on the output)
timed by the same Timer rounds (lltm.bench.timing.timer_round).

    python -m lltm.bench.seq_sweep [--batches 16,64,256,512] [--states 128,256,512,1024]
        [--steps 100] [--dtype float32] [--paths cluster4,cluster8,cluster16,cluster-mma,grid,grid-mma,loop]
        [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
from typing import Optional

import torch

from lltm import cells as lltm_cells
from lltm.bench import cases, timing

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
# name -> (LLTM_SEQ_PATH, LLTM_SEQ_CLUSTER, LLTM_SEQ_DOT, LLTM_SEQ_LOOP_SPLITS, LLTM_TF32_K_MAJOR);
# "auto" is the planner's pick.
PATHS = {
    "cluster4": ("cluster", "4", "fma", None, None),
    "cluster8": ("cluster", "8", "fma", None, None),
    "cluster16": ("cluster", "16", "fma", None, None),
    "cluster-fma": ("cluster", None, "fma", None, None),
    "cluster-smem": ("cluster", None, "fma-smem", None, None),  # the FMA dot with W_h in shared memory
    "cluster-mma": ("cluster", None, "mma", None, None),
    "grid": ("grid", None, "fma", None, None),
    "grid-smem": ("grid", None, "fma-smem", None, None),
    "grid-mma": ("grid", None, "mma", None, None),
    "loop": ("loop", None, None, None, None),
    # the backward's GEMM of a step in N parts of k (1: one call, cuBLAS's own split of k)
    **{f"loop-k{n}": ("loop", None, None, str(n), None) for n in (1, 2, 3, 4)},
    # TF32's backward GEMMs on the operands as stored, without the K-major copies
    "loop-km0": ("loop", None, None, None, "0"),
    "auto-km0": (None, None, None, None, "0"),
    "nocluster": ("grid,loop", None, None, None, None),  # what a GPU without clusters gets
    "auto": (None, None, None, None, None),
}
# Rows the planner still picks in (not one forced path): on a GPU without
# clusters, and without the K-major copies.
PLANNER_ROWS = ("nocluster", "auto-km0")
# Per-step barrier latency of the persistent paths and a graph node's floor
# for the loop (µs, H100: docs/benchmarks-history.md).
BARRIER_US = {"cluster": 0.9, "grid": 1.1, "loop": 2.6}


def _set_path(name: str) -> None:
    names = ("LLTM_SEQ_PATH", "LLTM_SEQ_CLUSTER", "LLTM_SEQ_DOT", "LLTM_SEQ_LOOP_SPLITS", "LLTM_TF32_K_MAJOR")
    for var, value in zip(names, PATHS[name]):
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


def _peak_flops_per_us(dtype: torch.dtype, tensor_cores: bool) -> float:
    """Dense peak of the device (FLOP/µs) from its SM count and clock: FMA
    units (fp32 256 FLOP/cycle/SM, fp64 half) or tensor cores (TF32 8x,
    half types 16x the fp32 FMA rate on sm_80+)."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    ghz = getattr(props, "clock_rate", 0) / 1e6 or 1.755
    per_sm = 128.0 if dtype == torch.float64 else 256.0
    if tensor_cores:
        per_sm *= 16.0 if dtype in (torch.float16, torch.bfloat16) else 8.0
    return per_sm * props.multi_processor_count * ghz * 1e3


def floor_us(path: str, T: int, B: int, I: int, S: int, dtype: torch.dtype, gates: int = 3) -> float:
    """The least time a path could take: the layer's GEMM FLOPs (projection,
    input and weight gradients) at the tensor-core or FMA peak cuBLAS would
    use, the recurrence's FLOPs (forward and backward) at the best peak the
    path has for them (the persistent kernels' tensor-core dot: strict float32
    as 3xTF32, a third of the TF32 rate; float64 on the FMA units), and one
    barrier (or graph node) per step each way."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    halfs = dtype in (torch.float16, torch.bfloat16)
    gemm_rate = _peak_flops_per_us(dtype, tensor_cores=halfs or (dtype == torch.float32 and tf32))
    if path == "loop":
        recurrent_rate = gemm_rate
    elif dtype == torch.float64:
        recurrent_rate = _peak_flops_per_us(dtype, tensor_cores=False)
    else:
        mma = _peak_flops_per_us(dtype, tensor_cores=True) / (1 if halfs or tf32 else 3)
        recurrent_rate = max(mma, _peak_flops_per_us(dtype, tensor_cores=False))
    gemm_flops = 2.0 * T * B * gates * S * (3 * I + S)
    recurrent_flops = 2 * 2.0 * T * B * gates * S * S
    kind = "loop" if path == "loop" else ("grid" if path == "grid" else "cluster")
    return gemm_flops / gemm_rate + recurrent_flops / recurrent_rate + 2 * T * BARRIER_US[kind]


def _plan(backward: bool, T: int, B: int, S: int, dtype: torch.dtype, cell: str = "lltm") -> str:
    return torch.ops.lltm._fused_cuda_seq_plan(backward, T, B, S, dtype, torch.cuda.current_device(), cell)


def _chosen(report: str) -> str:
    """The path a call runs: the measuring planner's choice where it timed the class, else the model's."""
    for line in report.splitlines():
        if line.startswith("measured: "):
            return line.split()[1]
    return report.splitlines()[0].rsplit(": ", 1)[1]


def _trials(report: str) -> tuple[Optional[str], dict[str, float]]:
    """The plan a call runs where the measuring planner chose it (its label), and the GPU time of
    every plan the planner timed for the class (label -> µs at the call's T); (None, {}) where
    it timed nothing (one candidate, or timing off)."""
    for line in report.splitlines():
        if line.startswith("measured: "):
            chosen = line.split("(", 1)[1].split(";", 1)[0]
            times = re.findall(r"((?:cluster|grid)[\w:-]*|loop) (\d+) us", line.split(": ", 2)[-1])
            return chosen, {label: float(us) for label, us in times}
    return None, {}


def trial_pick_ratio(point: dict) -> Optional[float]:
    """The planner's pick against the fastest plan any row's planner timed, by the trials' GPU
    times (forward plus backward): where the host, not the device, bounds a layer's f+b (the
    small points), the Timer rows of one plan differ by more than the plans do."""
    plans = point.get("plans", {})
    picked, best = 0.0, 0.0
    for direction in (0, 1):
        seen: dict[str, float] = {}
        for reports in plans.values():
            seen.update({k: min(v, seen.get(k, v)) for k, v in _trials(reports[direction])[1].items()})
        chosen = _trials(plans.get("auto", ["", ""])[direction])[0]
        if chosen is None or chosen not in seen:
            return None
        picked += seen[chosen]
        best += min(seen.values())
    return picked / best


def _build(name: str, cfg: cases.Config) -> Optional[cases.Case]:
    """The row's case, run once (a forced path's planning, compilation of
    the loop's graph keys), or None where a forced path does not fit."""
    try:
        case = cases.seq_case(name, cfg)
        case.backward(case.forward())
        torch.cuda.synchronize()
    except RuntimeError as err:
        if "allows no time loop" not in str(err):
            raise
        return None
    return case


def sweep_point(
    T: int, B: int, S: int, dtype: torch.dtype, paths: list[str], rounds: int, mrt: float, cell: str = "lltm"
) -> dict:
    """Every row of one grid point, timed in `rounds` interleaved rounds (each
    row once per round, in turn), so a slow spell of the device hits them alike.
    The peer rows are torch's module on cuDNN (nn.GRU for the gru cell, else
    nn.LSTM), named "lstm" and "lstm-notf32" in the point either way."""
    cfg = cases.Config(
        batch_size=B, features=S, state_size=S, seq=T, device=torch.device("cuda"), dtype=dtype, seed=0, cell=cell
    )
    gates = lltm_cells.get(cell).gates
    floors = {kind: floor_us(kind, T, B, S, S, dtype, gates) for kind in ("cluster", "grid", "loop")}
    point: dict = {"T": T, "B": B, "I": S, "S": S, "cell": cell, "times": {}, "plans": {}, "floors": floors}
    point["graphs"] = {}
    # row -> (bench row, LLTM_SEQ_PATH setting); the fused rows differ only in the path they force
    rows = {name: ("fused", name) for name in paths + ["auto"]}
    peer = "gru" if cell == "gru" else "lstm"
    rows.update({"lstm": (peer, "auto"), "lstm-notf32": (f"{peer}-notf32", "auto")})
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        rows["auto-tf32"] = ("fused-tf32", "auto")
        rows["auto-accurate"] = ("fused-accurate", "auto")
    if dtype == torch.bfloat16:  # cuDNN's fast half path beside its bfloat16 one
        rows["lstm-fp16"] = (f"{peer}-fp16", "auto")
    built: dict[str, cases.Case] = {}
    got: dict[str, list[tuple[float, float]]] = {}
    try:
        for name, (row, path) in rows.items():
            _set_path(path)
            case = _build(row, cfg)
            point["times"][name] = None
            if case is not None:
                built[name], got[name] = case, []
                if row == "fused":
                    point["plans"][name] = [_plan(bw, T, B, S, dtype, cell) for bw in (False, True)]
        for _ in range(rounds):
            for name, case in built.items():
                _set_path(rows[name][1])
                before = torch.ops.lltm._fused_cuda_seq_graph_stats()
                got[name].append(timing.timer_round(case, mrt))
                after = torch.ops.lltm._fused_cuda_seq_graph_stats()
                seen = point["graphs"].setdefault(name, [0, 0, 0])  # eager, captures, replays
                point["graphs"][name] = [s + b - a for s, a, b in zip(seen, before, after)]
    finally:
        _set_path("auto")
    for name, samples in got.items():
        point["times"][name] = (
            statistics.median(f for f, _ in samples) * 1e6,
            statistics.median(b for _, b in samples) * 1e6,
        )
    point["picked"] = [_chosen(_plan(bw, T, B, S, dtype, cell)) for bw in (False, True)]
    return point


def _total(v: Optional[tuple[float, float]]) -> Optional[float]:
    return None if v is None else v[0] + v[1]


def format_point(point: dict, paths: list[str]) -> str:
    t = {k: _total(v) for k, v in point["times"].items()}
    forced = {k: v for k, v in t.items() if k in paths and k not in PLANNER_ROWS and v is not None}
    best = min(forced.values()) if forced else None
    fmt = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
    ratio = lambda a, b: "-" if a is None or b is None else f"{a / b:.2f}"  # noqa: E731
    cells = [f"{point['B']}x{point['S']}"] + [fmt(t.get(p)) for p in paths]
    cells += [
        f"{fmt(t['auto'])} ({'/'.join(point['picked'])})",
        ratio(t["auto"], best),
        fmt(t["lstm"]),
        fmt(t["lstm-notf32"]),
        ratio(t["auto"], t["lstm"]),
        ratio(t["auto"], t["lstm-notf32"]),
    ]
    if "nocluster" in paths:
        cells.append(ratio(t["nocluster"], t["lstm-notf32"]))
    if "auto-tf32" in t:
        cells += [fmt(t["auto-tf32"]), ratio(t["auto-tf32"], t["lstm"])]
    if "auto-accurate" in t:
        cells += [fmt(t["auto-accurate"]), ratio(t["auto-accurate"], t["auto-tf32"])]
    if "lstm-fp16" in t:
        faster = None if t["lstm"] is None or t["lstm-fp16"] is None else min(t["lstm"], t["lstm-fp16"])
        cells += [fmt(t["lstm-fp16"]), ratio(t["auto"], t["lstm-fp16"]), ratio(t["auto"], faster)]
    cells.append(" / ".join(f"{k} {v:.0f}" for k, v in point["floors"].items()))
    return "| " + " | ".join(cells) + " |"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lltm.bench.seq_sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="16,64,256,512")
    parser.add_argument("--states", default="128,256,512,1024", help="state sizes; the input size is the same")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument(
        "--cell", choices=sorted(lltm_cells.BUILT_IN), default="lltm", help="the layer's cell (peer: nn.GRU for gru)"
    )
    parser.add_argument("--paths", default="cluster4,cluster8,cluster16,cluster-mma,grid,grid-mma,loop,nocluster")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--min-run-time", type=float, default=0.05)
    parser.add_argument(
        "--tf32",
        action="store_true",
        help="float32 with TF32 allowed in every fused row (torch.backends.cuda.matmul.allow_tf32)",
    )
    parser.add_argument("--json", help="write every point (times, plans, floors) here")
    opts = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.exit(2, "seq_sweep: needs a CUDA device\n")
    paths = [p for p in opts.paths.split(",") if p]
    unknown = [p for p in paths if p not in PATHS or p == "auto"]
    if unknown:
        parser.error(f"unknown path {', '.join(unknown)}; choose from {', '.join(p for p in PATHS if p != 'auto')}")
    dtype = DTYPES[opts.dtype]
    torch.backends.cuda.matmul.allow_tf32 = opts.tf32 or torch.backends.cuda.matmul.allow_tf32
    precision = ""
    if dtype == torch.float32:
        precision = "TF32 allowed" if torch.backends.cuda.matmul.allow_tf32 else "strict fp32 (TF32 off)"
    print(
        f"fused sequence time loops, cell {opts.cell}, T={opts.steps}, I=S, {opts.dtype} {precision}, "
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; f+b µs (Timer medians of {opts.rounds} rounds)"
    )
    head = ["B x S"] + paths + ["auto (fwd/bwd pick)", "auto / best", "lstm", "lstm strict", "/ lstm", "/ strict"]
    if "nocluster" in paths:
        head.append("nocluster / strict")
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        head += ["auto TF32", "TF32 / lstm", "auto accurate", "accurate / TF32"]
    if dtype == torch.bfloat16:
        head += ["lstm fp16", "/ lstm fp16", "/ faster cuDNN half"]
    head.append("floor µs")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    points = []
    for B in (int(b) for b in opts.batches.split(",")):
        for S in (int(s) for s in opts.states.split(",")):
            point = sweep_point(opts.steps, B, S, dtype, paths, opts.rounds, opts.min_run_time, opts.cell)
            points.append(point)
            print(format_point(point, paths), flush=True)
            torch.cuda.empty_cache()
            if opts.json:  # after every point: a run cut short keeps what it measured
                with open(opts.json, "w") as f:
                    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": opts.dtype}
                    meta["cell"] = opts.cell
                    json.dump({**meta, "points": points}, f, indent=1)
    print(summary(points, paths))
    return 0


def summary(points: list[dict], paths: list[str]) -> str:
    """The grid's ratios against the targets: max and median per comparison,
    and at how many points the planner's pick is within 10% of the fastest."""

    def stats(label: str, values: list[float]) -> str:
        if not values:
            return f"{label}: -"
        return f"{label}: max {max(values):.2f}, median {statistics.median(values):.2f}"

    def ratios(num: str, den: str) -> list[float]:
        out = []
        for p in points:
            a, b = _total(p["times"].get(num)), _total(p["times"].get(den))
            if a is not None and b is not None:
                out.append(a / b)
        return out

    def within(label: str, values: list[float], bound: float) -> str:
        line = stats(label, values)
        return line + (
            f", within {bound:.2f} at {sum(r <= bound for r in values)} of {len(values)} points" if values else ""
        )

    forced = [p for p in paths if p != "nocluster"]
    picks = []
    for p in points:
        best = [v for v in (_total(p["times"].get(k)) for k in forced) if v is not None]
        if best and p["times"].get("auto") is not None:
            picks.append(_total(p["times"]["auto"]) / min(best))
    trial_picks = [r for r in (trial_pick_ratio(p) for p in points) if r is not None] if forced else []
    lines = [
        stats("auto / lstm strict", ratios("auto", "lstm-notf32")),
        stats("nocluster / lstm strict", ratios("nocluster", "lstm-notf32")),
        stats("loop / lstm strict", ratios("loop", "lstm-notf32")),
        stats("auto / lstm (default precision)", ratios("auto", "lstm")),
        stats("auto TF32 / lstm (TF32 both)", ratios("auto-tf32", "lstm")),
        within("auto accurate / auto TF32", ratios("auto-accurate", "auto-tf32"), 1.30),
        stats("auto / lstm fp16 (cuDNN's fast half path)", ratios("auto", "lstm-fp16")),
        stats("lstm fp16 / lstm (cuDNN fp16 over its own dtype)", ratios("lstm-fp16", "lstm")),
        within("auto / fastest forced path", picks, 1.10),
        within("auto / fastest plan timed by any row's planner (trial GPU times)", trial_picks, 1.10),
    ]
    return "\n".join(line for line in lines if not line.endswith(": -"))


if __name__ == "__main__":
    raise SystemExit(main())
