"""The measuring planner of the fused CUDA sequence ops (lltm/csrc/cuda/seq_tune.h): the model's
few best plans of a new problem class are timed once and the fastest kept; never during CUDA graph
capture or in deterministic mode; LLTM_SEQ_TUNE=0 turns it off; LLTM_SEQ_TUNE_CACHE keeps the
choices across processes. Each test uses problem sizes of its own: the choices live for the process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import lltm

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and lltm._backends.is_available("fused", "cuda", "lstm_seq")),
    reason="needs the fused sequence operators on a CUDA device",
)


def _stats() -> tuple[int, int, int]:
    """(classes timed, classes read from the cache file, calls that took the model's plan)."""
    return tuple(torch.ops.lltm._fused_cuda_seq_tune_stats())


def _report(backward: bool, T: int, B: int, S: int, dtype=torch.float32, cell: str = "lstm") -> str:
    return torch.ops.lltm._fused_cuda_seq_plan(backward, T, B, S, dtype, torch.cuda.current_device(), cell)


def _candidates(report: str) -> int:
    """Viable candidates of the model within the tuner's spread (2x of the cheapest)."""
    costs = [
        float(line.split("model_us=")[1].split()[0])
        for line in report.splitlines()[1:]
        if "model_us=" in line and "cannot run" not in line
    ]
    return sum(c <= 2 * min(costs) for c in costs) if costs else 0


def _layer(T: int, B: int, S: int, seed: int = 0):
    torch.manual_seed(seed)
    layer = lltm.LSTM(S, S, backend="fused").cuda()
    x = torch.randn(T, B, S, device="cuda", requires_grad=True)
    return layer, x


def _pass(layer, x):
    out, (h, c) = layer(x)
    grads = torch.autograd.grad((out.square().sum() + h.sum() + c.sum()), [x, *layer.parameters()])
    return [out, h, c, *grads]


def _python_twin(layer, x):
    twin = lltm.LSTM(layer.input_size, layer.hidden_size, backend="python").cuda()
    twin.load_state_dict(layer.state_dict())
    return _pass(twin, x)


def test_a_new_class_is_timed_once_and_its_choice_reported():
    T, B, S = 40, 24, 96
    if _candidates(_report(False, T, B, S)) < 2:
        pytest.skip("the model leaves one plan here: nothing to time")
    layer, x = _layer(T, B, S)
    before = _stats()
    got = _pass(layer, x)
    torch.cuda.synchronize()
    after_first = _stats()
    assert after_first[0] > before[0], "a new class was not timed"
    _pass(layer, x)
    assert _stats()[0] == after_first[0], "a class was timed twice"
    for backward in (False, True):
        report = _report(backward, T, B, S)
        measured = [line for line in report.splitlines() if line.startswith("measured: ")]
        if measured:
            path = measured[0].split()[1]
            assert path in ("cluster", "grid", "loop"), report
            # timed over 16 and 32 steps; each plan's time at T=40 extrapolated from the two
            assert f"timed over 16 and 32 steps, at T={T}" in measured[0], report
            for at_t, short, long in re.findall(r" (\d+) us \((\d+), (\d+)\)", measured[0]):
                at_t, short, long = int(at_t), int(short), int(long)
                assert long <= at_t <= long * T / 32 + 1, report
    # the call's own results come from the chosen plan, written once after the timing
    want = _python_twin(layer, x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=2e-4, atol=2e-5)


def _kinds(report: str) -> dict[str, float]:
    """The model's cheapest plan of each kind (seq_plan.h's PlanKind: "loop", "cluster-mma",
    "grid-fma-regs", ...): its cost in µs, from the plan report."""
    line = next(line for line in report.splitlines() if line.strip().startswith("cheapest of each kind:"))
    return {kind: float(cost) for kind, cost in re.findall(r"([\w-]+) ([\d.e+-]+) us;", line)}


def _timed_kinds(measured: str) -> set[str]:
    """The kinds of the plans a "measured:" line timed (labels as seq_tune.cpp's plan_label writes
    them: path:group:dot:..., or loop)."""
    labels = re.findall(r"(?:: |; )((?:cluster|grid)[\w:-]*|loop) (?:\d+ us|failed)", measured)
    return {label if label == "loop" else "-".join(label.split(":")[0:3:2]) for label in labels}


# Where the cheapest plans of one kind hid a faster one of another kind on an H200
# (docs/benchmarks-history.md, sections 37 and 38): (cell, dtype, TF32, B, S).
KIND_CASES = [
    ("lstm", torch.float16, False, 16, 128),  # four MMA splits hid an FMA split
    ("lltm", torch.float32, False, 64, 128),  # grid splits of the FMA dot hid a cluster one
    ("lltm", torch.float32, True, 16, 256),  # a grid FMA split and cluster MMA ones hid a cluster FMA one
]


@pytest.mark.parametrize("cell,dtype,tf32,B,S", KIND_CASES)
def test_the_cheapest_plan_of_each_kind_is_timed(torch_settings, cell, dtype, tf32, B, S):
    """The tuner times the cheapest plan of each kind within its spread (the step loop, and the
    cluster and grid kernels by dot, whose costs the model fits apart), cheapest kinds first, before
    the next cheapest of any kind: six plans at most."""
    T = 40
    torch_settings.set(matmul_tf32=tf32)
    kinds = _kinds(_report(False, T, B, S, dtype, cell))
    eligible = sorted((cost, kind) for kind, cost in kinds.items() if cost <= 2 * min(kinds.values()))
    if len(eligible) < 2:
        pytest.skip(f"the model leaves one kind within its spread on this device: {kinds}")
    torch.manual_seed(0)
    make = {"lstm": lltm.LSTM, "lltm": lltm.LLTM}[cell]
    layer = make(S, S, backend="fused").to(device="cuda", dtype=dtype)
    with torch.no_grad():
        layer(torch.randn(T, B, S, device="cuda", dtype=dtype))
    report = _report(False, T, B, S, dtype, cell)
    measured = [line for line in report.splitlines() if line.startswith("measured: ")]
    assert measured, report
    assert _timed_kinds(measured[0]) >= {kind for _, kind in eligible[:6]}, report


def test_timing_off_by_environment(monkeypatch):
    monkeypatch.setenv("LLTM_SEQ_TUNE", "0")
    T, B, S = 20, 26, 88
    layer, x = _layer(T, B, S)
    before = _stats()
    _pass(layer, x)
    assert _stats()[0] == before[0]
    assert "measured" not in _report(False, T, B, S)


def test_deterministic_mode_takes_the_model(torch_settings):
    T, B, S = 20, 27, 72
    if _candidates(_report(False, T, B, S)) < 2:
        pytest.skip("the model leaves one plan here: nothing to time")
    torch_settings.set(deterministic_algorithms=(True, True))
    layer, x = _layer(T, B, S)
    before = _stats()
    _pass(layer, x)
    after = _stats()
    assert after[0] == before[0] and after[2] > before[2]
    assert "measured" not in _report(False, T, B, S)


@pytest.mark.skipif(
    not torch.cuda.is_available()
    or torch.cuda.get_device_capability()[0] != 9
    or torch.cuda.get_device_properties(0).multi_processor_count < 132,
    reason="the model's fit is an H100 / H200 (132 SMs) one",
)
@pytest.mark.parametrize("cell", ["lstm", "lltm"])
def test_the_model_alone_keeps_flashrnns_point_on_the_grid(cell):
    """Where nothing is timed (LLTM_SEQ_TUNE=0, deterministic algorithms, a first call inside a CUDA
    graph capture) the model's plan runs: at FlashRNN's point (fp16, T = 1024, B = 16, S = 768) it
    must be the grid kernels in both directions, which run there in half the step loop's time
    (docs/benchmarks-history.md, section 40; the model before its refit sent the backward to the loop)."""
    for backward in (False, True):
        first = _report(backward, 1024, 16, 768, torch.float16, cell).splitlines()[0]
        assert first.endswith(": grid"), first


def test_tune_all_times_every_plan_with_its_split(monkeypatch, torch_settings):
    """LLTM_SEQ_TUNE_ALL=1 (the data of lltm.bench.plan_fit): the tuner times at least the plans it
    times without it, and its report gives each plan's split and model cost, which plan_fit's copy of
    the model reproduces on this device, in both directions."""
    from lltm.bench import plan_fit

    torch_settings.set(matmul_tf32=False)
    T, B, S = 24, 21, 80
    usual = _candidates(_report(False, T, B, S))
    if usual < 2:
        pytest.skip("the model leaves one plan here: nothing to time")
    monkeypatch.setenv("LLTM_SEQ_TUNE_ALL", "1")
    layer, x = _layer(T, B, S, seed=3)
    _pass(layer, x)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for backward in (False, True):
        report = _report(backward, T, B, S)
        plans = [q for q in plan_fit.parse_report(report) if q.us is not None]
        assert len(plans) >= (usual if not backward else 2), report
        problem = plan_fit.Problem(4, backward, T, B, S, 4, False)
        case = plan_fit.Case("lstm", "strict", problem, plans)
        plan_fit.check_reproduced([case], sms, plan_fit.infer_clock_ghz([case]))


def test_nothing_is_timed_during_graph_capture(monkeypatch):
    T, B, S = 12, 29, 80
    if _candidates(_report(False, T, B, S)) < 2:
        pytest.skip("the model leaves one plan here: nothing to time")
    layer, x = _layer(T, B, S)
    static_x = x.detach().clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, with timing off: the class stays new
        monkeypatch.setenv("LLTM_SEQ_TUNE", "0")
        with torch.no_grad():
            layer(static_x)
        monkeypatch.delenv("LLTM_SEQ_TUNE")
    torch.cuda.current_stream().wait_stream(side)
    before = _stats()
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        out, _ = layer(static_x)
    after = _stats()
    assert after[0] == before[0] and after[2] > before[2]
    graph.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        want, _ = _python_twin_forward(layer, static_x)
    torch.testing.assert_close(out, want, rtol=2e-4, atol=2e-5)


def _python_twin_forward(layer, x):
    twin = lltm.LSTM(layer.input_size, layer.hidden_size, backend="python").cuda()
    twin.load_state_dict(layer.state_dict())
    return twin(x)


def test_a_forced_path_is_not_timed(monkeypatch):
    monkeypatch.setenv("LLTM_SEQ_PATH", "loop")
    layer, x = _layer(10, 31, 64)
    before = _stats()
    _pass(layer, x)
    assert _stats()[0] == before[0]


_CHILD = textwrap.dedent(
    """
    import torch, lltm
    torch.manual_seed(0)
    layer = lltm.LSTM(104, 104, backend="fused").cuda()
    x = torch.randn(30, 22, 104, device="cuda", requires_grad=True)
    out, _ = layer(x)
    out.sum().backward()
    torch.cuda.synchronize()
    print("stats", *torch.ops.lltm._fused_cuda_seq_tune_stats())
    print(torch.ops.lltm._fused_cuda_seq_plan(False, 30, 22, 104, torch.float32, 0, "lstm"))
    """
)


def test_the_cache_file_serves_a_later_process(tmp_path):
    if _candidates(_report(False, 30, 22, 104)) < 2:
        pytest.skip("the model leaves one plan here: nothing to time")
    cache = tmp_path / "plans.txt"
    env = dict(os.environ, LLTM_SEQ_TUNE_CACHE=str(cache))
    env.pop("LLTM_SEQ_TUNE", None)

    def child() -> tuple[list[int], str]:
        done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        lines = done.stdout.splitlines()
        stats = next(line for line in lines if line.startswith("stats "))
        return [int(v) for v in stats.split()[1:]], "\n".join(lines)

    first, _ = child()
    assert first[0] >= 1 and first[1] == 0, first
    entries = cache.read_text().splitlines()
    assert len(entries) == first[0] and all("\t" in e and "|lstm|" in e for e in entries), entries
    second, report = child()
    assert second[0] == 0 and second[1] == first[0], (first, second)
    assert "read from" in report, report
