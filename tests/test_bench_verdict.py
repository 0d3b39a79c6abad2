"""`lltm bench` on a busy machine: the ratios come from the measurement the
table trusts (Timer medians when the two clocks agree on every row, else
the host-clock minima), and the table's first lines give the verdict."""

from __future__ import annotations

import pytest

from lltm.bench import report
from lltm.bench.cases import Case
from lltm.bench.timing import Measurement


def _rows(host_us, timer_us, peer, pipelined=False):
    cases = [Case(name, forward=lambda: (), backward=lambda o: None) for name in host_us]
    measured = [
        Measurement([f / 1e6] * 3, [b / 1e6] * 3, timer_rounds_s=[(timer_us[n][0] / 1e6, timer_us[n][1] / 1e6)])
        for n, (f, b) in host_us.items()
    ]
    return {r.name: r for r in report.results(cases, measured, peer=peer, pipelined=pipelined)}


@pytest.mark.parametrize("pipelined", [False, True], ids=["cpu", "cuda"])
def test_busy_machine_ratios_from_host_minima(pipelined):
    """`make bench` on a busy machine: the python row's Timer backward came out 0 (its step median below its
    forward median), which made every speed-up 0.00. That row is now untrusted and the ratios come from the
    host-clock minima, on every device."""
    host = {"python": (300.0, 600.0), "aten": (100.0, 150.0), "gemm": (10.0, 20.0)}
    timer = {"python": (2000.0, 0.0), "aten": (110.0, 160.0), "gemm": (11.0, 21.0)}
    rows = _rows(host, timer, peer="gemm", pipelined=pipelined)
    assert rows["python"].clocks_disagree
    assert rows["aten"].speedup_bwd == pytest.approx(600 / 150)
    assert rows["aten"].speedup_total == pytest.approx(900 / 250)
    assert rows["aten"].peer_ratio_fwd == pytest.approx(100 / 10)
    assert all(r.speedup_fwd and r.speedup_bwd for r in rows.values())  # no 0.00 anywhere


def test_verdict_leads_the_table():
    host = {"python": (300.0, 600.0), "aten": (100.0, 150.0)}
    timer = {"python": (2000.0, 0.0), "aten": (110.0, 160.0)}
    rows = list(_rows(host, timer, peer="gemm").values())
    meta = {
        "seq": 0,
        "batch_size": 1,
        "features": 1,
        "state_size": 1,
        "dtype": "float32",
        "device": "cpu",
        "device_name": "a CPU",
        "torch": "x",
        "date": "d",
        "runs": 3,
        "rounds": 1,
        "gradients": "all",
    }
    table = report.format_table(rows, meta, {})
    assert table.splitlines()[2].startswith("verdict: THE MACHINE WAS BUSY")
    assert "on 1 of 2 rows (python, marked !)" in table
    python = next(line for line in table.splitlines() if line.strip().startswith("python!"))
    assert "0.0!" in python and "1.00" in python  # its Timer backward is marked, its speed-up over itself is 1


def test_half_paths_footer_names_the_faster_and_the_ratio_to_it():
    """A bfloat16 run on CUDA times nn.LSTM in both half precisions (cuDNN's bf16 path is several times
    slower than its fp16 one); the footer says which is faster and holds the lltm rows to that one."""
    host = {"python": (900.0, 900.0), "fused": (100.0, 200.0), "lstm": (1200.0, 1200.0), "lstm-fp16": (150.0, 250.0)}
    timer = {k: v for k, v in host.items()}
    rows = list(_rows(host, timer, peer="lstm").values())
    for r in rows:
        r.precision = {"lstm-fp16": "float16"}.get(r.name, "bfloat16")
    meta = {
        "seq": 100,
        "batch_size": 16,
        "features": 1,
        "state_size": 1,
        "dtype": "bfloat16",
        "device": "cuda",
        "device_name": "a GPU",
        "torch": "x",
        "date": "d",
        "runs": 3,
        "rounds": 1,
        "gradients": "all",
    }
    table = report.format_table(rows, meta, {})
    line = next(t for t in table.splitlines() if t.startswith("cuDNN's half paths"))
    assert "lstm-fp16 (float16) 400.0 µs, lstm (bfloat16) 2400.0 µs: lstm-fp16 is faster by 6.00x" in line
    assert "time / lstm-fp16: python 4.50, fused 0.75" in line


def test_half_peer_rows_skip_with_their_reason():
    import torch

    from lltm.bench import cases

    cfg = cases.Config(batch_size=2, features=3, state_size=4, device=torch.device("cpu"), dtype=torch.float32, seq=4)
    with pytest.raises(cases.Skip, match="CUDA only"):
        cases.seq_case("lstm-fp16", cfg)
