"""The `lltm` command: info, check and bench (a short run of each mode)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import lltm
from lltm import check, cli


def test_info(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"torch {torch.__version__}" in out
    assert "build mode: ahead of time (lltm._C)" in out or "build mode: just in time" in out
    assert "backends on cpu: python yes, aten yes" in out


def test_check_passes(capsys):
    assert cli.main(["check"]) == 0
    out = capsys.readouterr().out
    assert "Forward: python vs aten ... Ok" in out
    assert "Backward: python vs aten ... Ok" in out
    assert "Gradcheck: aten ... Ok" in out


def test_check_fails_on_a_wrong_backend(monkeypatch, capsys):
    """A backend whose new_cell is off by 1e-6 is reported and exits 1."""
    real = lltm.functional.lltm_cell

    def off(*args, backend="auto"):
        h, c = real(*args, backend=backend)
        return (h, c + 1e-6) if backend == "aten" else (h, c)

    monkeypatch.setattr(check.functional, "lltm_cell", off)
    assert cli.main(["check"]) == 1
    assert "Forward: python vs aten ... MISMATCH" in capsys.readouterr().out


QUICK = ["--runs", "3", "--rounds", "2", "--warmup", "1", "--min-run-time", "0.01", "--no-progress"]


def test_bench_cell_table_json_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    rc = cli.main(["bench", "-b", "4", "-f", "8", "-s", "16", *QUICK, "--json", str(out_json), "--plot", str(out_png)])
    assert rc == 0
    table = capsys.readouterr().out
    for row in ("python", "aten", "compile", "lstmcell", "gemm"):
        assert f"{row} |" in table
    assert "time / GEMM floor" in table
    data = json.loads(out_json.read_text())
    names = [r["name"] for r in data["results"]]
    assert names[:2] == ["python", "aten"] and "compile" in names
    assert all(r["timer_fwd_us"] > 0 and r["bwd_median_us"] > 0 for r in data["results"])
    # Timer medians are the median of the interleaved rounds, each recorded.
    for r in data["results"]:
        fwds = sorted(f for f, _ in r["extra"]["timer_rounds_us"])
        assert len(fwds) == 2 and r["timer_fwd_us"] == pytest.approx((fwds[0] + fwds[1]) / 2, abs=0.01)
    assert data["meta"]["rounds"] == 2
    assert data["meta"]["torch"] == torch.__version__
    assert out_png.read_bytes()[:4] == b"\x89PNG"


def test_bench_sequence_mode(capsys):
    assert cli.main(["bench", "-b", "2", "-f", "3", "-s", "4", "--seq", "3", "--double", *QUICK]) == 0
    table = capsys.readouterr().out
    assert "sequence T=3" in table and "lstm |" in table and "float64" in table


def test_bench_rejects_zero_rounds():
    with pytest.raises(ValueError, match="--runs and --rounds must be at least 1"):
        cli.main(["bench", "--rounds", "0", "--no-progress"])


def test_bench_rejects_unknown_row():
    with pytest.raises(ValueError, match="unknown row 'nope'"):
        cli.main(["bench", "--rows", "python,nope", *QUICK])


def test_python_dash_m():
    out = subprocess.run([sys.executable, "-m", "lltm", "info"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("lltm ")
