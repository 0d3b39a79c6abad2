"""lltm.bench.layer_profile's kernel timeline: one pass's kernels in launch order with the device's idle
gaps, and its options checked before any work."""

from __future__ import annotations

import pytest

from lltm.bench import layer_profile


def _pass(t0: float) -> list[tuple[float, float, str]]:
    # a GEMM, a 5 µs idle gap, a long kernel, and a kernel that starts before it ends (overlap)
    return [(t0, t0 + 10, "gemm"), (t0 + 15, t0 + 115, "loop"), (t0 + 100, t0 + 130, "side")]


def test_timeline_takes_the_middle_pass_in_launch_order():
    records = _pass(0.0) + _pass(1000.0) + _pass(5000.0)
    rows = layer_profile.kernel_timeline(list(reversed(records)), passes=3)
    assert rows == [(0.0, 0.0, 10.0, "gemm"), (15.0, 5.0, 100.0, "loop"), (100.0, -15.0, 30.0, "side")]


def test_timeline_of_unequal_passes_keeps_every_kernel():
    records = _pass(0.0) + _pass(1000.0)[:2]
    rows = layer_profile.kernel_timeline(records, passes=2)
    assert [r[3] for r in rows] == ["gemm", "loop", "side", "gemm", "loop"]
    assert rows[3][:2] == (1000.0, 1000.0 - 130.0)  # the idle time between the passes
    assert layer_profile.kernel_timeline([], passes=3) == []


def test_timeline_table_names_span_and_kernel_time():
    text = layer_profile.format_timeline("t", layer_profile.kernel_timeline(_pass(0.0)))
    lines = text.splitlines()
    assert lines[0] == "== t: 3 kernels, span 130 µs, kernel time 140 µs"
    assert lines[-1].split() == ["100.0", "-15.0", "30.0", "side"]


@pytest.mark.parametrize("argv", [["--peer"], ["--time", "--timeline"]], ids=["peer-alone", "two-modes"])
def test_timeline_options_checked_first(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        layer_profile.main(argv)
    assert exc.value.code == 2
    assert "usage" in capsys.readouterr().err
