"""Fits the fused CUDA planner's cost model (struct Model in lltm/csrc/cuda/seq_plan.cpp) to the
measuring planner's trial times.

    python -m lltm.bench.plan_fit collect --out trials.jsonl   # on a GPU
    python -m lltm.bench.plan_fit fit trials.jsonl [more.jsonl ...]

`collect` runs one forward + backward of every cell and precision over the T = 100 grid (B 16..512 x
S 128..1024, I = S), FlashRNN's point (fp16, T = 1024, B = 16, S = 768) and T = 1000, B = 16, S = 128
with LLTM_SEQ_TUNE_ALL=1: the tuner times every viable plan of each class and its report gives each
plan's split and model cost beside its time (one JSON line a point). `fit` runs anywhere: the model
below, a copy of seq_plan.cpp's, first reproduces every model cost the C++ planner wrote (so the two
cannot drift apart unseen; the data must come from a build whose constants are MODEL's), then is fitted
(a least-squares fit of log time, then a search on the picks) and prints the constants for
seq_plan.cpp with the classes where the model's pick is more than 10% slower than the fastest timed
plan, before and after. docs/benchmarks-history.md, section 40, has the fit that set MODEL.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

# seq_plan.cpp's struct Model, member for member (tests/test_plan_fit.py compares them).
MODEL: dict[str, float] = {
    "cluster_fixed": 1280,
    "cluster_per_cta": 92.8,
    "grid_fixed": 3230,
    "grid_per_cta": 13.7,
    "grid_l2_bytes_per_cycle": 26.4,
    "issue_factor": 2.26,
    "backward_factor": 0.965,
    "launch_us": 29.7,
    "loop_pointwise_us": 7.96,
    "loop_gemm_floor_us": 0,
    "loop_gemm_floor_tc_us": 0,
    "loop_gemm_efficiency": 0.698,
    "loop_gemm_efficiency_tc": 0.435,
    "loop_bytes_per_us": 5.41e6,
    "loop_half_factor": 0.742,
    "loop_gemm_tile_rows": 64,
    "mma_chain": 72.5,
    "mma_pipe": 3.99,
    "mma_step_offset": 327,
    "mma_3xtf32_chain": 1.29,
    "cell_row_cycles": 1100,
    "fma_regs_factor": 0.712,
    "cluster_mma_factor": 1.34,
}
FIXED = ("loop_gemm_tile_rows",)  # not fitted
SIGNED = ("mma_step_offset",)  # fitted on a linear scale (may be negative)

GATES = {"lltm": 3, "lstm": 4, "gru": 3}
# lltm.bench.precision's modes that collect runs in (bf16 shares fp16's tuner classes).
PRECISIONS = ("fp16", "bf16", "tf32", "accurate", "strict")
MISS = 1.10  # a pick this much slower than the fastest timed plan is a miss


@dataclass
class Problem:
    gates: int
    backward: bool
    steps: int
    batch: int
    state: int
    elem: int
    tensor_cores: bool
    is_double: bool = False
    tf32x3: bool = False  # float32's MMA dot as 3xTF32 (the accurate mode)


@dataclass
class Plan:
    label: str
    split: dict  # path, group, rows_padded, row, nb, ks, threads, mma, wregs, mtiles, mstack, ksplit, waves, mc
    model_us: float
    us: float | None  # the trial's time at T, None where the plan failed


@dataclass
class Case:
    """One class: a direction of one (cell, precision, T, B, S), with its timed plans."""

    cell: str
    prec: str
    problem: Problem
    plans: list[Plan] = field(default_factory=list)

    def name(self) -> str:
        p = self.problem
        return f"{self.cell} {self.prec} T={p.steps} {p.batch}x{p.state} {'bwd' if p.backward else 'fwd'}"


# ------------------------------------------------------------------ the model (seq_plan.cpp)


def _mma_ksteps(p: Problem) -> int:
    kstep = 16 if p.elem == 2 else 8
    return (p.gates if p.backward else 1) * math.ceil(p.state / kstep)


def _reg_fragments(segments: int, part: bool) -> int:
    """seq_plan.h's mma_reg_fragments: the A fragments a warp of the all-held (or part-held) kernels holds."""
    return 24 if segments == 4 and not part else 18


def _held_share(p: Problem, s: dict) -> float:
    """seq_plan.cpp's mma_held_share: the share of a task's k steps whose A fragments it holds (the
    backward's: of each gate segment's share; all of them where the all-held kernels' fragments cover it)."""
    if not (s["mma"] and s["wregs"]):
        return 0.0
    segments = p.gates if p.backward else 1
    per_segment = math.ceil(_mma_ksteps(p) // segments / s["ksplit"])
    held = _reg_fragments(segments, False) // (s["mstack"] * segments)
    if held < per_segment:
        held = _reg_fragments(segments, True) // (s["mstack"] * segments)
    return min(1.0, held / per_segment)


def _mma_dot_cycles(p: Problem, s: dict, k: dict) -> float:
    ksteps = _mma_ksteps(p)
    nt = s["rows_padded"] / 8.0
    warps = s["threads"] / 32.0
    task_rows = s["mtiles"] // s["mstack"]  # integer division, as in C++
    tasks = math.ceil(task_rows * s["ksplit"] / warps)
    per_task = math.ceil(ksteps / s["ksplit"])
    a_loads = 4.0 * (1.0 - _held_share(p, s))  # A held in registers is not loaded each step
    loads = a_loads * s["mstack"] + 2 * nt
    mmas = 3.0 if p.tf32x3 else 1.0  # 3xTF32: three MMAs a tile, each word split, the two results added
    rnd = (3.0 if p.tf32x3 else 1.0) * loads if p.elem == 4 else 0
    adds = 8.0 * s["mstack"] * nt if p.tf32x3 else 0.0
    issue = k["issue_factor"] * (loads + rnd + mmas * s["mstack"] * nt + adds)
    chain = k["mma_chain"] * (k["mma_3xtf32_chain"] if p.tf32x3 else 1.0)
    chains = tasks * per_task * max(chain / 2, issue)
    tensor = mmas * s["mtiles"] * ksteps * nt * k["mma_pipe"] / 4
    smem = ksteps * (a_loads * s["mtiles"] + 2 * nt * task_rows)
    return max(chains, tensor, smem) + k["mma_step_offset"]


def _step_cycles(p: Problem, s: dict, k: dict) -> float:
    V = 16 // p.elem
    iters = math.ceil(math.ceil(p.state / V) / s["ks"])
    nb = s["nb"]
    convert = 1.0 if p.elem == 2 else 0.0
    w_chunks = p.gates * iters
    x_chunks = (p.gates if p.backward else 1.0) * iters * nb
    loads = (0.0 if s["wregs"] else w_chunks) + x_chunks
    fmas = p.gates * iters * V * nb
    instr = loads + convert * V * (w_chunks + x_chunks) + fmas * (2.0 if p.is_double else 1.0)
    issue = k["issue_factor"] * instr * math.ceil(s["threads"] / 32.0 / 4.0)
    smem = s["threads"] * loads * 16.0 / 128.0
    reduce = math.log2(s["ks"]) * (nb if p.backward else p.gates * nb) * 8.0
    if s["mma"]:
        dot = _mma_dot_cycles(p, s, k) + (nb - 1) * k["cell_row_cycles"]
    else:
        dot = max(issue, smem) + reduce
    if s["wregs"] and not s["mma"]:
        dot *= k["fma_regs_factor"]
    if s["mma"] and s["path"] == "cluster":
        dot *= k["cluster_mma_factor"]
    if s["path"] == "cluster":
        exchange = k["cluster_fixed"] + k["cluster_per_cta"] * s["group"]
    else:
        moved = (p.gates if p.backward else 1.0) * s["rows_padded"] * s["row"] * p.elem
        exchange = (
            k["grid_fixed"]
            + k["grid_per_cta"] * s["group"]
            + moved / (k["grid_l2_bytes_per_cycle"] * math.sqrt(s["mc"]))
        )
    return (dot + exchange) * (k["backward_factor"] if p.backward else 1.0)


def _loop_step_us(p: Problem, k: dict, sms: int, clock_ghz: float) -> float:
    per_sm = 128.0 if p.is_double else 256.0
    efficiency = k["loop_gemm_efficiency_tc"] if p.tensor_cores else k["loop_gemm_efficiency"]
    if p.tensor_cores:
        per_sm *= 8.0
    rate = per_sm * sms * clock_ghz * 1e3 * efficiency
    rows = max(p.batch, k["loop_gemm_tile_rows"])
    flops = 2.0 * rows * p.gates * p.state * p.state
    floor = k["loop_gemm_floor_tc_us"] if p.tensor_cores else k["loop_gemm_floor_us"]
    gemm = max(floor, flops / rate)
    moved = p.batch * p.state * p.elem * (10 if p.backward else 8)
    pointwise = max(k["loop_pointwise_us"], moved / k["loop_bytes_per_us"])
    return (gemm + pointwise) * (k["loop_half_factor"] if p.elem == 2 else 1.0)


def plan_cost_us(p: Problem, s: dict, k: dict, sms: int, clock_ghz: float) -> float:
    """The model's time for the whole time loop (seq_plan.cpp's set_cost)."""
    if s["path"] == "loop":
        return p.steps * _loop_step_us(p, k, sms, clock_ghz)
    return s["waves"] * (k["launch_us"] + p.steps * _step_cycles(p, s, k) / (clock_ghz * 1e3))


# ------------------------------------------------------------------ the data


_MEASURED = re.compile(r"\nmeasured: \w+ \(([^;]+); timed over [^:]*: (.*)\)\s*$", re.S)
_PLAN = re.compile(r"(\S+) \{([^}]*)\} (\d+ us|failed)")


def parse_report(report: str) -> list[Plan]:
    """The timed plans of a plan report (lltm::_fused_cuda_seq_plan) written under LLTM_SEQ_TUNE_ALL=1."""
    found = _MEASURED.search(report)
    if found is None:
        return []
    plans = []
    for item in _PLAN.finditer(found.group(2)):
        split: dict = {}
        for pair in item.group(2).split():
            key, value = pair.split("=", 1)
            split[key] = value if key == "path" else float(value)
        model_us = split.pop("model_us")
        us = None if item.group(3) == "failed" else float(item.group(3).split()[0])
        plans.append(Plan(item.group(1), split, model_us, us))
    return plans


def load(paths: Iterable[str]) -> tuple[list[Case], int]:
    """The classes with at least two timed plans in `paths` (collect's JSON lines), and the SMs."""
    cases, sms, seen = [], None, set()
    for path in paths:
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                if record.get("kind") == "device":
                    sms = sms or record["sms"]
                    continue
                elem = 2 if record["prec"] in ("fp16", "bf16") else 4
                for direction in ("fwd", "bwd"):
                    problem = Problem(
                        GATES[record["cell"]],
                        direction == "bwd",
                        record["T"],
                        record["B"],
                        record["S"],
                        elem,
                        elem == 2 or record["prec"] == "tf32",
                        tf32x3=record["prec"] == "accurate",
                    )
                    # The tuner's class (seq_tune.cpp's class_key): bf16 and fp16 share one, timed once.
                    key = (
                        path,
                        record["cell"],
                        direction,
                        elem,
                        problem.tensor_cores,
                        problem.tf32x3,
                        record["B"],
                        record["S"],
                        record["T"],
                    )
                    plans = [q for q in parse_report(record[direction]) if q.us is not None]
                    if len(plans) >= 2 and key not in seen:
                        seen.add(key)
                        cases.append(Case(record["cell"], record["prec"], problem, plans))
    if sms is None:
        raise SystemExit("plan_fit: no device record (collect's first line) in the data")
    return cases, sms


def infer_clock_ghz(cases: Sequence[Case], k: dict = MODEL) -> float:
    """The clock the planner costed with (cudaDevAttrClockRate), from its persistent plans' model times."""
    clocks = []
    for case in cases:
        p = case.problem
        for q in case.plans:
            s = q.split
            if s["path"] != "loop" and q.model_us > s["waves"] * k["launch_us"]:
                cycles = _step_cycles(p, s, k)
                clocks.append(p.steps * cycles * s["waves"] / ((q.model_us - s["waves"] * k["launch_us"]) * 1e3))
    if not clocks:
        raise SystemExit("plan_fit: no persistent plan in the data")
    return statistics.median(clocks)


def check_reproduced(cases: Sequence[Case], sms: int, clock_ghz: float, k: dict = MODEL, tol: float = 2e-3) -> None:
    """Every model cost of the data is MODEL's: the data's build and this copy of the model agree."""
    worst, where = 0.0, ""
    for case in cases:
        for q in case.plans:
            ours = plan_cost_us(case.problem, q.split, k, sms, clock_ghz)
            err = abs(ours - q.model_us) / max(q.model_us, 1e-9)
            if err > worst:
                worst, where = err, f"{case.name()} {q.label}: {ours:.2f} against the planner's {q.model_us:.2f} us"
    if worst > tol:
        raise SystemExit(
            f"plan_fit: this copy of the model does not reproduce the data's model costs ({where}): the data "
            "comes from a build with other constants or another model than lltm/bench/plan_fit.py's MODEL"
        )


# ------------------------------------------------------------------ the fit


@dataclass
class Score:
    misses: int
    log_loss: float  # sum over classes of log(time of the model's pick / fastest time)
    missed: list[tuple[float, Case, Plan, Plan]]


def score(cases: Sequence[Case], k: dict, sms: int, clock_ghz: float) -> Score:
    misses, loss, missed = 0, 0.0, []
    for case in cases:
        costs = [plan_cost_us(case.problem, q.split, k, sms, clock_ghz) for q in case.plans]
        pick = case.plans[costs.index(min(costs))]
        best = min(case.plans, key=lambda q: q.us)
        ratio = pick.us / best.us
        loss += math.log(ratio)
        if ratio > MISS:
            misses += 1
            missed.append((ratio, case, pick, best))
    return Score(misses, loss, missed)


def _objective(cases, k, sms, clock_ghz) -> float:
    s = score(cases, k, sms, clock_ghz)
    return 0.05 * s.misses + s.log_loss


def _free(k: dict) -> list[str]:
    return [n for n in k if n not in FIXED and (n in SIGNED or k[n] > 0)]


def _unpack(start: dict, names: list[str], x) -> dict:
    k = dict(start)
    for n, v in zip(names, x):
        k[n] = float(v) if n in SIGNED else math.exp(v)
    return k


def least_squares(cases, start: dict, sms: int, clock_ghz: float, iterations: int = 25) -> dict:
    """Levenberg-Marquardt on the log error of every timed plan (plans within 1.5x of their class's
    fastest weighted 1, the others 0.3), the constants on a log scale (SIGNED ones linear)."""
    import numpy as np

    names = _free(start)
    x = np.array([start[n] if n in SIGNED else math.log(start[n]) for n in names], dtype=float)
    weights = []
    for case in cases:
        best = min(q.us for q in case.plans)
        weights += [1.0 if q.us < 1.5 * best else 0.3 for q in case.plans]
    w = np.array(weights)

    def residuals(x):
        k = _unpack(start, names, x)
        r = [
            math.log(max(plan_cost_us(c.problem, q.split, k, sms, clock_ghz), 1e-9) / q.us)
            for c in cases
            for q in c.plans
        ]
        return w * np.array(r)

    r = residuals(x)
    damping = 1e-2
    for _ in range(iterations):
        jac = np.empty((r.size, x.size))
        for j in range(x.size):
            step = 1e-4 * max(1.0, abs(x[j]))
            xj = x.copy()
            xj[j] += step
            jac[:, j] = (residuals(xj) - r) / step
        jtj, jtr = jac.T @ jac, jac.T @ r
        while damping < 1e8:
            dx = np.linalg.solve(jtj + damping * np.diag(np.diag(jtj) + 1e-12), -jtr)
            r_new = residuals(x + dx)
            if r_new @ r_new < r @ r:
                x, r, damping = x + dx, r_new, damping / 3
                break
            damping *= 4
        else:
            break
    return _unpack(start, names, x)


def search(cases, start: dict, sms: int, clock_ghz: float, iterations: int, seed: int = 0) -> dict:
    """A random local search on the picks: one to three constants moved at a time, kept where the
    misses (weighted 0.05 each) plus the sum of log pick / fastest fall."""
    rng = random.Random(seed)
    names = _free(start)
    best, best_o = dict(start), _objective(cases, start, sms, clock_ghz)
    for _ in range(iterations):
        k = dict(best)
        for n in rng.sample(names, rng.choice([1, 2, 3])):
            if n in SIGNED:
                k[n] += rng.gauss(0, 150)
            else:
                k[n] *= math.exp(rng.gauss(0, 0.15))
        o = _objective(cases, k, sms, clock_ghz)
        if o < best_o:
            best, best_o = k, o
    return best


def _significant(v: float, digits: int = 3) -> float:
    if v == 0:
        return 0.0
    return round(v, digits - 1 - int(math.floor(math.log10(abs(v)))))


def _breakdown(cases, k, sms, clock_ghz, key) -> str:
    groups: dict[str, list[Case]] = {}
    for c in cases:
        groups.setdefault(key(c), []).append(c)
    return ", ".join(f"{g} {score(cs, k, sms, clock_ghz).misses}/{len(cs)}" for g, cs in sorted(groups.items()))


def fit(paths: Sequence[str], iterations: int, least_squares_first: bool = True, out=sys.stdout) -> dict:
    cases, sms = load(paths)
    clock = infer_clock_ghz(cases)
    check_reproduced(cases, sms, clock)
    before = score(cases, MODEL, sms, clock)
    k = least_squares(cases, MODEL, sms, clock) if least_squares_first else dict(MODEL)
    if _objective(cases, k, sms, clock) > _objective(cases, MODEL, sms, clock):
        k = dict(MODEL)  # the least-squares fit moved the picks the wrong way: search from MODEL
    k = search(cases, k, sms, clock, iterations)
    k = {n: (v if n in FIXED else _significant(v)) for n, v in k.items()}
    after = score(cases, k, sms, clock)
    print(
        f"{len(cases)} classes, {sum(len(c.plans) for c in cases)} timed plans; {sms} SMs at {clock:.3f} GHz", file=out
    )
    print(f"model's pick more than {MISS - 1:.0%} slower than the fastest timed plan:", file=out)
    print(f"  before: {before.misses} classes (sum of log ratios {before.log_loss:.2f})", file=out)
    print(f"  after:  {after.misses} classes (sum of log ratios {after.log_loss:.2f})", file=out)
    for label, key in (("by cell", lambda c: c.cell), ("by precision", lambda c: c.prec)):
        print(
            f"  {label}: before {_breakdown(cases, MODEL, sms, clock, key)};"
            f" after {_breakdown(cases, k, sms, clock, key)}",
            file=out,
        )
    print("misses after:", file=out)
    for ratio, case, pick, best in sorted(after.missed, key=lambda m: -m[0]):
        print(
            f"  {case.name()}: {pick.label} {pick.us:.0f} us, fastest {best.label} {best.us:.0f} ({ratio:.2f})",
            file=out,
        )
    print("constants for seq_plan.cpp's struct Model:", file=out)
    for n, v in k.items():
        print(f"  {n} = {v:g};  // was {MODEL[n]:g}", file=out)
    return k


# ------------------------------------------------------------------ the data's collection (GPU)


def collect(out: str, cells: Sequence[str], precisions: Sequence[str]) -> None:
    import torch

    import lltm
    from lltm.bench.precision import precision_mode

    if not (torch.cuda.is_available() and lltm._backends.is_available("fused", "cuda", "seq")):
        raise SystemExit("plan_fit collect: needs a CUDA device and lltm's fused CUDA sequence operators")
    os.environ["LLTM_SEQ_TUNE_ALL"] = "1"
    layer = {"lltm": lltm.LLTM, "lstm": lltm.LSTM, "gru": lltm.GRU}
    props = torch.cuda.get_device_properties(0)
    points = [("fp16", 1024, 16, 768), ("strict", 1000, 16, 128), ("tf32", 1000, 16, 128)]
    points += [(prec, 100, B, S) for prec in precisions for B in (16, 64, 256, 512) for S in (128, 256, 512, 1024)]
    with open(out, "w") as f:
        f.write(
            json.dumps(
                {"kind": "device", "name": props.name, "sms": props.multi_processor_count, "torch": torch.__version__}
            )
            + "\n"
        )
        try:
            for prec, T, B, S in points:
                if prec not in precisions:
                    continue
                with precision_mode(prec) as dtype:
                    for cell in cells:
                        m = layer[cell](S, S, backend="fused", device="cuda", dtype=dtype)
                        x = torch.randn(T, B, S, device="cuda", dtype=dtype, requires_grad=True)
                        y, _ = m(x)
                        y.float().sum().backward()
                        torch.cuda.synchronize()
                        record = {"kind": "class", "cell": cell, "prec": prec, "T": T, "B": B, "S": S}
                        for backward in (False, True):
                            record["bwd" if backward else "fwd"] = torch.ops.lltm._fused_cuda_seq_plan(
                                backward, T, B, S, dtype, 0, cell
                            )
                        f.write(json.dumps(record) + "\n")
                        f.flush()
                        print(f"{prec} {cell} T={T} {B}x{S}", flush=True)
        finally:
            os.environ.pop("LLTM_SEQ_TUNE_ALL", None)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lltm.bench.plan_fit", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="time every viable plan of each class (a GPU; LLTM_SEQ_TUNE_ALL=1)")
    c.add_argument("--out", required=True, help="JSON lines to write")
    c.add_argument("--cells", default="lltm,lstm,gru")
    c.add_argument("--precisions", default="fp16,tf32,strict", help=f"of {', '.join(PRECISIONS)}")
    f = sub.add_parser("fit", help="fit the model's constants to collected trials (any machine)")
    f.add_argument("data", nargs="+", help="collect's JSON lines (several runs: one fit over all)")
    f.add_argument("--iterations", type=int, default=2000, help="steps of the search on the picks")
    f.add_argument("--no-least-squares", action="store_true", help="search from MODEL directly")
    args = parser.parse_args(argv)
    if args.command == "collect":
        precisions = args.precisions.split(",")
        unknown = [p for p in precisions if p not in PRECISIONS]
        if unknown:
            parser.error(f"--precisions: {', '.join(unknown)} unknown; use {', '.join(PRECISIONS)}")
        collect(args.out, args.cells.split(","), precisions)
    else:
        fit(args.data, args.iterations, not args.no_least_squares)


if __name__ == "__main__":
    main()
