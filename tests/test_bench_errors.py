"""`lltm bench`: options checked before any work (one line, exit 2), and a
row that cannot run on this machine reported with the reason while the
others run."""

from __future__ import annotations

import json
import os

import pytest
import torch

from lltm import bench, cli

QUICK = ["--runs", "3", "--rounds", "2", "--warmup", "1", "--min-run-time", "0.01", "--no-progress"]
SMALL = ["-b", "2", "-f", "3", "-s", "4"]


@pytest.fixture
def no_measuring(monkeypatch):
    monkeypatch.setattr(bench.cli.timing, "measure", lambda *a, **k: pytest.fail("measured despite a bad argument"))


def _usage_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_json_into_proc_refused_before_the_run(no_measuring, capsys):
    err = _usage_error(["--json", "/proc/x.json"], capsys)
    assert err.startswith("lltm bench: error: argument --json: cannot write /proc/x.json: ")


def test_output_is_a_folder(no_measuring, tmp_path, capsys):
    err = _usage_error(["--plot", str(tmp_path)], capsys)
    assert f"argument --plot: {tmp_path} is a folder, not a file" in err


def test_probe_leaves_no_file(no_measuring, tmp_path, capsys):
    """Checking that --json can be written does not leave an empty file behind when the run stops early."""
    target = tmp_path / "r.json"
    assert cli.main(["bench", "--json", str(target), "-d", "--dtype", "float32"]) == 2
    assert not target.exists()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["-d", "--dtype", "float32"], "-d/--double means --dtype float64, but --dtype float32 was given too"),
        (["--autocast", "bfloat16", "-d"], "--autocast has no effect on float64"),
        (
            ["--autocast", "bfloat16", "--dtype", "bfloat16"],
            "--autocast bfloat16 with --dtype bfloat16 changes nothing",
        ),
        (["--json", "SAME", "--plot", "SAME"], "--json and --plot name the same file"),
    ],
    ids=["double-vs-dtype", "autocast-float64", "autocast-same-dtype", "same-output"],
)
def test_conflicting_options_refused(argv, message, no_measuring, tmp_path, capsys):
    argv = [str(tmp_path / "out") if a == "SAME" else a for a in argv]
    assert cli.main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lltm bench: error: {message}") and err.count("\n") == 1


ONEDNN = "could not create a primitive descriptor for the LSTM forward propagation primitive"


def test_a_row_that_fails_here_is_reported_and_the_others_run(monkeypatch, tmp_path, capsys):
    """nn.LSTM in bfloat16 on a CPU where oneDNN cannot run it (forced here): the lstm row is listed as not
    available with oneDNN's reason; python and aten are still measured; exit 0."""

    def fails(self, *args, **kwargs):
        raise RuntimeError(f"{ONEDNN}\nmore lines of detail")

    monkeypatch.setattr(torch.nn.LSTM, "forward", fails)
    out_json = tmp_path / "r.json"
    argv = ["bench", *SMALL, "--seq", "2", "--autocast", "bfloat16", "--rows", "python,lstm,aten", *QUICK]
    assert cli.main([*argv, "--json", str(out_json)]) == 0
    captured = capsys.readouterr()
    reason = f"failed on this machine: RuntimeError: {ONEDNN}"
    assert f"lltm bench: lstm is not available here: {reason}\n" in captured.err
    assert f"skipped lstm: {reason}" in captured.out
    data = json.loads(out_json.read_text())
    assert [r["name"] for r in data["results"]] == ["python", "aten"]
    assert data["skipped"]["lstm"] == reason


def test_every_row_failing_exits_1(monkeypatch, capsys):
    monkeypatch.setattr(torch.nn.LSTMCell, "forward", lambda self, *a, **k: (_ for _ in ()).throw(RuntimeError("no")))
    assert cli.main(["bench", *SMALL, "--rows", "lstm", *QUICK]) == 1
    err = capsys.readouterr().err
    assert "lstm is not available here: failed on this machine: RuntimeError: no" in err
    assert "no row could run here" in err
