"""How `lltm bench` measures a case: time (two methods) and memory.

- The tutorial's method: host clock around each pass, synchronised, over
  `runs` passes (median and min), forward and backward separately.
- torch.utils.benchmark.Timer.blocked_autorange medians of the forward alone
  and of forward + backward; backward is their difference. Rows are measured
  in interleaved rounds and each reports its median round.
- Memory: bytes saved for backward (saved_tensors_hooks, each storage once,
  parameters left out) and, on CUDA, the peak allocated during one
  forward + backward above what was allocated before it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from lltm.bench.cases import Case
from lltm.extending.memory import saved_tensors_report


@dataclass
class Measurement:
    """Raw numbers of one case; times in seconds, bytes as counted."""

    fwd_s: list[float]  # host clock, one per pass
    bwd_s: list[float]
    timer_rounds_s: list[tuple[float, float]] = field(default_factory=list)  # (fwd, bwd) per round
    saved_bytes: Optional[int] = None
    peak_bytes: Optional[int] = None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_clock(case: Case, runs: int, warmup: int, device: torch.device, tick: Callable[[], Any]) -> Measurement:
    """The tutorial's method: host clock around each synchronised pass."""
    for _ in range(warmup):  # compilation, caches, cuBLAS handles
        case.backward(case.forward())
    sync(device)
    fwd_times, bwd_times = [], []
    for _ in range(runs):
        sync(device)
        t0 = time.perf_counter()
        outputs = case.forward()
        sync(device)
        t1 = time.perf_counter()
        case.backward(outputs)
        sync(device)
        t2 = time.perf_counter()
        fwd_times.append(t1 - t0)
        bwd_times.append(t2 - t1)
        del outputs
        tick()
    return Measurement(fwd_times, bwd_times)


def timer_round(case: Case, min_run_time: float) -> tuple[float, float]:
    """torch.utils.benchmark medians (s) of the forward and of the backward
    (a whole step minus the forward)."""
    from torch.utils.benchmark import Timer

    def step() -> None:
        case.backward(case.forward())

    scope = {"forward": case.forward, "step": step}
    # Timer runs with one thread unless told otherwise: time with the
    # threads the run was set up with (the table's header names them).
    threads = torch.get_num_threads()
    t_fwd = Timer("forward()", globals=scope, num_threads=threads).blocked_autorange(min_run_time=min_run_time).median
    t_step = Timer("step()", globals=scope, num_threads=threads).blocked_autorange(min_run_time=min_run_time).median
    return t_fwd, max(t_step - t_fwd, 0.0)


def saved_bytes(case: Case) -> Optional[int]:
    """Bytes autograd saves for backward in one forward, each storage once,
    the row's parameters left out; None where the row cannot be observed
    (e.g. a compiled graph that refuses saved-tensor hooks)."""
    if not case.autograd:
        return None
    try:
        report = saved_tensors_report(case.forward, exclude=case.parameters)
    except Exception:  # noqa: BLE001  (any refusal means "not measured")
        return None
    case.backward(report.output)
    return report.activation_bytes


def peak_bytes(case: Case, device: torch.device) -> Optional[int]:
    """CUDA: peak allocated during one forward + backward above the memory
    in use before it; None on other devices and for CUDA-graph rows (their
    pool is allocated at capture, so a replay's peak would read near zero)."""
    if device.type != "cuda" or not case.autograd or not case.measure_peak:
        return None
    sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    case.backward(case.forward())
    sync(device)
    return torch.cuda.max_memory_allocated(device) - base


def failure(exc: BaseException) -> str:
    """Why a row could not run, in one line: the exception's type and the
    first line of its message (oneDNN's, say: "could not create a primitive
    descriptor for the LSTM forward propagation primitive")."""
    lines = str(exc).strip().splitlines()
    return f"failed on this machine: {type(exc).__name__}: {lines[0] if lines else '(no message)'}"


def measure(
    cases: list[Case],
    *,
    runs: int,
    warmup: int,
    rounds: int,
    min_run_time: float,
    device: torch.device,
    tick: Callable[[str], Any] = lambda name: None,
) -> tuple[list[Case], list[Measurement], dict[str, str]]:
    """Every case by both methods and its memory; `tick(label)` after each
    timed pass and Timer round (progress).

    A case that raises (a kernel this machine cannot run, for one) is
    dropped with the reason instead of ending the run: returns the cases
    measured, their measurements, and {name: reason} for the dropped ones.
    Each case first runs one untimed pass, so a row that cannot run fails
    before any time is spent on the others' measurements.
    """
    failed: dict[str, str] = {}
    kept: list[tuple[Case, Measurement]] = []
    for case in cases:
        try:
            case.backward(case.forward())
            sync(device)
            m = host_clock(case, runs, warmup, device, lambda name=case.name: tick(name))
            m.saved_bytes = saved_bytes(case)
            m.peak_bytes = peak_bytes(case, device)
        except Exception as exc:  # noqa: BLE001  (any error: the row is reported, the others still run)
            failed[case.name] = failure(exc)
            continue
        kept.append((case, m))
    # The Timer rows are measured in rounds, every row once per round, and
    # each row reports its median over the rounds: a slow spell of a noisy
    # machine then hits every row alike instead of one row's whole sample.
    for _ in range(rounds):
        for case, m in list(kept):
            try:
                m.timer_rounds_s.append(timer_round(case, min_run_time))
            except Exception as exc:  # noqa: BLE001
                failed[case.name] = failure(exc)
                kept = [(c, mm) for c, mm in kept if c is not case]
            tick(f"{case.name} (Timer)")
    return [c for c, _ in kept], [m for _, m in kept], failed
