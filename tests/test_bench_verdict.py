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
