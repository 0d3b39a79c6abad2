"""The `lltm` command: info, check and bench (a short run of each mode)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

import lltm
from lltm import bench, check, cli


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
    assert "Layer backward: python vs aten ... Ok" in out
    assert "Layer gradcheck: aten ... Ok" in out


def test_check_fails_on_a_wrong_layer(monkeypatch, capsys):
    """A layer whose h_n is off by 1e-6 is reported and exits 1."""
    real = lltm.functional.lltm

    def off(*args, backend="auto", **kw):
        out, (h, c) = real(*args, backend=backend, **kw)
        return (out, (h + 1e-6, c)) if backend == "aten" else (out, (h, c))

    monkeypatch.setattr(check.functional, "lltm", off)
    assert cli.main(["check"]) == 1
    assert "Layer forward: python vs aten ... MISMATCH" in capsys.readouterr().out


def test_check_fails_on_a_wrong_backend(monkeypatch, capsys):
    """A backend whose new_cell is off by 1e-6 is reported and exits 1."""
    real = lltm.functional.lltm_cell

    def off(*args, backend="auto"):
        h, c = real(*args, backend=backend)
        return (h, c + 1e-6) if backend == "aten" else (h, c)

    monkeypatch.setattr(check.functional, "lltm_cell", off)
    assert cli.main(["check"]) == 1
    assert "Forward: python vs aten ... MISMATCH" in capsys.readouterr().out


def _has_row(table: str, name: str) -> bool:
    """The table has a row `name` (marked `!` or not: these quick runs are too short for the clocks to agree)."""
    return re.search(rf"^ *{re.escape(name)}!? \|", table, re.M) is not None


QUICK = ["--runs", "3", "--rounds", "2", "--warmup", "1", "--min-run-time", "0.01", "--no-progress"]


def test_bench_cell_table_json_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    rc = cli.main(["bench", "-b", "4", "-f", "8", "-s", "16", *QUICK, "--json", str(out_json), "--plot", str(out_png)])
    assert rc == 0
    table = capsys.readouterr().out
    for row in ("python", "aten", "compile", "lstm", "gemm"):
        assert _has_row(table, row)
    assert "time / gemm" in table
    data = json.loads(out_json.read_text())
    names = [r["name"] for r in data["results"]]
    assert names[:2] == ["python", "aten"] and "compile" in names
    assert all(r["timer_fwd_us"] > 0 and r["bwd_median_us"] > 0 for r in data["results"])
    # Timer medians are the median of the interleaved rounds, each recorded.
    for r in data["results"]:
        fwds = sorted(f for f, _ in r["extra"]["timer_rounds_us"])
        assert len(fwds) == 2 and r["timer_fwd_us"] == pytest.approx((fwds[0] + fwds[1]) / 2, abs=0.01)
        # speed-ups over python: computed once, from the measurement the verdict names (Timer medians on a
        # quiet machine, host-clock minima on a busy one), the same in the JSON as in the table
        key = "timer_fwd_us" if data["meta"]["ratio_basis"] == "Timer medians" else "fwd_min_us"
        assert r["speedup_fwd"] == pytest.approx(data["results"][0][key] / r[key])
    assert data["meta"]["rounds"] == 2
    assert data["meta"]["verdict"].startswith("verdict: ") and data["meta"]["verdict"] in table
    assert data["meta"]["torch"] == torch.__version__
    if not torch.cuda.is_available():
        assert data["skipped"]["compile-ro"] == "CUDA only"
        assert "skipped compile-ro: CUDA only" in table
    assert out_png.read_bytes()[:4] == b"\x89PNG"


def test_bench_sequence_mode(tmp_path, capsys):
    out_json = tmp_path / "seq.json"
    argv = ["bench", "-b", "2", "-f", "3", "-s", "4", "--seq", "3", "--double", *QUICK, "--json", str(out_json)]
    assert cli.main(argv) == 0
    table = capsys.readouterr().out
    assert "sequence T=3" in table and "float64" in table
    for row in ("python", "aten", "compile", "lstm"):
        assert _has_row(table, row)
    assert "time / lstm" in table and "memory (saved for backward" in table
    results = {r["name"]: r for r in json.loads(out_json.read_text())["results"]}
    # saved for backward, parameters left out, float64: lltm's python loop saves
    # at least its gates (T, B, 3S) and nn.LSTM at least its (T, B, 4S) gates
    assert results["python"]["saved_bytes"] >= 3 * 2 * 12 * 8
    assert results["lstm"]["saved_bytes"] >= 3 * 2 * 16 * 8
    assert all(r["saved_bytes"] > 0 for r in results.values())


def test_bench_under_autocast(tmp_path, capsys):
    """--autocast: every row's forward under torch.autocast; the header and the JSON say so."""
    out_json = tmp_path / "ac.json"
    argv = ["bench", "-b", "2", "-f", "3", "-s", "4", "--seq", "3", "--autocast", "bfloat16", "--rows", "aten,python"]
    assert cli.main([*argv, *QUICK, "--json", str(out_json)]) == 0
    assert "float32 under autocast(bfloat16)" in capsys.readouterr().out
    assert json.loads(out_json.read_text())["meta"]["dtype"] == "float32 under autocast(bfloat16)"


def test_bench_sequence_compile_row(capsys):
    """torch.compile of the LLTM module runs in sequence mode (it was an empty table)."""
    assert cli.main(["bench", "-b", "2", "-f", "3", "-s", "4", "--seq", "4", "--rows", "compile", *QUICK]) == 0
    assert _has_row(capsys.readouterr().out, "compile")


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--rows", "foo"], "argument --rows/--backends: unknown row 'foo'; choose from python, aten, fused"),
        (["-r", "0"], "argument -r/--runs: must be at least 1, got 0"),
        (["--rounds", "0"], "argument --rounds: must be at least 1, got 0"),
        (["--seq", "-5"], "argument --seq: must be at least 0, got -5"),
        (["-s", "x"], "argument -s/--state-size: expected an integer, got 'x'"),
        (["--min-run-time", "0"], "argument --min-run-time: must be greater than 0"),
        (["--device", "tpux"], "argument --device: not a device: 'tpux'"),
        (["--plot", "/nonexistent/dir/x.png"], "argument --plot: folder /nonexistent/dir does not exist"),
        (["--json", "/nonexistent/dir/x.json"], "argument --json: folder /nonexistent/dir does not exist"),
        (["--cell", "rnn"], "argument --cell: unknown cell 'rnn'; choose gru, lltm, lstm or FILE.py:FUNCTION"),
    ],
    ids=["rows", "runs", "rounds", "seq", "state", "min-run-time", "device", "plot", "json", "cell"],
)
def test_bench_bad_arguments_are_usage_errors(argv, message, capsys, monkeypatch):
    """argparse rejects them (one line, exit 2) before any work."""
    monkeypatch.setattr(bench.cli.timing, "measure", lambda *a, **k: pytest.fail("measured despite a bad argument"))
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lltm bench: error: {message}") and err.count("\n") == 1


def test_bench_cell_needs_seq(capsys, monkeypatch):
    """--cell picks the layer of sequence mode: without --seq it is a usage error, before any work."""
    monkeypatch.setattr(bench.cli.timing, "measure", lambda *a, **k: pytest.fail("measured despite a bad argument"))
    assert cli.main(["bench", "--cell", "gru", *QUICK]) == 2
    err = capsys.readouterr().err
    assert err == "lltm bench: error: --cell gru times a layer: it needs --seq T\n"


@pytest.mark.parametrize("cell,peer", [("lstm", "lstm"), ("gru", "gru")])
def test_bench_seq_cell_against_its_torch_module(cell, peer, tmp_path, capsys):
    """--cell lstm / gru time lltm.LSTM / lltm.GRU, the ratios taken to nn.LSTM / nn.GRU."""
    out_json = tmp_path / "r.json"
    argv = ["bench", "-b", "2", "-f", "3", "-s", "4", "--seq", "3", "--cell", cell, "--rows", f"aten,{peer}"]
    assert cli.main([*argv, "--json", str(out_json), *QUICK]) == 0
    out = capsys.readouterr().out
    assert _has_row(out, "aten") and _has_row(out, peer) and f"time / {peer}" in out
    data = json.loads(out_json.read_text())
    assert data["meta"]["cell"] == cell
    aten = next(r for r in data["results"] if r["name"] == "aten")
    assert aten["peer"] == peer and aten["note"].startswith(f"lltm.{cell.upper()}, T=3")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the rows are available on a CUDA machine")
@pytest.mark.parametrize("mode", [[], ["--seq", "2"]], ids=["cell", "seq"])
def test_bench_nothing_can_run_exits_1(mode, capsys):
    assert cli.main(["bench", "--rows", "compile-ro,lstm-notf32", *mode, *QUICK]) == 1
    err = capsys.readouterr().err
    assert "skipping compile-ro: CUDA only" in err
    assert "no row can run here" in err


def test_bench_one_vocabulary_for_both_modes(capsys):
    """A row of the other mode is listed as skipped with the reason;
    'lstmcell' is the old name of the lstm row."""
    assert cli.main(["bench", "-b", "2", "-f", "3", "-s", "4", "--seq", "2", "--rows", "aten,gemm", *QUICK]) == 0
    out = capsys.readouterr().out
    assert _has_row(out, "aten") and "skipped gemm: cell mode only" in out
    assert cli.main(["bench", "-b", "2", "-f", "3", "-s", "4", "--rows", "lstmcell", *QUICK]) == 0
    assert _has_row(capsys.readouterr().out, "lstm")


def test_bench_help_lists_every_row(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for row in bench.cases.ROWS:
        assert f"  {row} " in out
    assert "--no-progress" in out and "no progress bar" in out
    assert "--seq T" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message when there is no CUDA device")
@pytest.mark.parametrize("command", ["check", "bench", "train"])
def test_cuda_without_cuda_is_one_line(command, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([command, "--device", "cuda"])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"lltm {command}: error: argument --device: 'cuda' asked for, but torch sees no CUDA device (use cpu) "
        f"(see lltm {command} --help)\n"
    )


CLI_MODULES = ["lltm.cli", "lltm.bench.cli", "lltm.check", "lltm.train.cli"]


def _imported_modules(module: str) -> set[str]:
    """Every module `module`'s source imports ("from lltm import cli" counts as lltm.cli)."""
    import ast
    import importlib

    tree = ast.parse(open(importlib.import_module(module).__file__).read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


@pytest.mark.parametrize("module", CLI_MODULES)
def test_each_command_module_imports_alone(module):
    """No import circle: each command module imports in a fresh interpreter,
    and none imports the top-level command (they share lltm._argtypes)."""
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True, capture_output=True)
    if module != "lltm.cli":
        assert "lltm.cli" not in _imported_modules(module)
        assert "lltm._argtypes" in _imported_modules(module)


def test_readme_matches_help():
    """README's command lines name every option of `lltm bench` and `lltm check`, and every row."""
    import argparse
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for sub in (bench, check):
        parser = argparse.ArgumentParser()
        sub.add_arguments(parser)
        for action in parser._actions:
            names = [o for o in action.option_strings if o not in ("-h", "--help")]
            # as written in the usage lines: "[-b 16", "[--seq T]", "| -d]"
            assert not names or any(f"[{o} " in readme or f"[{o}]" in readme or f" {o}]" in readme for o in names), (
                f"{sub.__name__}: {names} missing from README.md"
            )
    for row in bench.cases.ROWS:
        assert f"`{row}`" in readme, f"row {row} missing from README.md"


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"lltm {lltm.__version__} (torch {torch.__version__})"


def test_python_dash_m():
    out = subprocess.run([sys.executable, "-m", "lltm", "info"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("lltm ")


def _fake_results(
    host_us: dict[str, tuple[float, float]], timer_us: dict[str, tuple[float, float]], peer: str, pipelined=False
):
    from lltm.bench.cases import Case
    from lltm.bench.report import results
    from lltm.bench.timing import Measurement

    cases = [Case(name, forward=lambda: (), backward=lambda o: None) for name in host_us]
    measured = [
        Measurement([f / 1e6] * 3, [b / 1e6] * 3, timer_rounds_s=[(timer_us[n][0] / 1e6, timer_us[n][1] / 1e6)])
        for n, (f, b) in host_us.items()
    ]
    return results(cases, measured, peer=peer, pipelined=pipelined)


def test_bench_marks_rows_whose_clocks_disagree():
    """A row whose Timer and host-clock medians differ by more than 2x (the machine was busy during one of
    them) is marked in the table and the JSON; every ratio of the table then comes from the host-clock
    minima (the measurement a busy machine can only have slowed down), and the verdict says so."""
    from lltm.bench import report

    host = {"python": (100.0, 200.0), "fused": (50.0, 78.6), "gemm": (10.0, 20.0)}
    timer = {"python": (110.0, 190.0), "fused": (52.0, 63790.0), "gemm": (11.0, 39.0)}  # fused bwd: 811x
    rows = {r.name: r for r in _fake_results(host, timer, peer="gemm")}
    assert not rows["python"].clocks_disagree and not rows["gemm"].clocks_disagree  # 1.95x: still agrees
    assert rows["fused"].clocks_disagree and rows["fused"].clock_ratio_bwd == pytest.approx(63790 / 78.6)
    assert {r.ratio_basis for r in rows.values()} == {report.HOST_MIN}
    assert rows["fused"].speedup_bwd == pytest.approx(200 / 78.6)  # not 190 / 63790
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
    table = report.format_table(list(rows.values()), meta, {})
    lines = {line.split("|")[0].strip(): line for line in table.splitlines() if "|" in line}
    assert "fused!" in lines and "63790.0!" in lines["fused!"]
    assert "python" in lines and "!" not in lines["python"]
    assert "verdict: THE MACHINE WAS BUSY" in table and "every ratio is taken from the host-clock minima" in table
    assert "time / gemm (host-clock minima): python fwd 10.00 bwd 10.00 f+b 10.00" in table
    assert f"fused fwd {50 / 10:.2f} bwd {78.6 / 20:.2f} f+b {128.6 / 30:.2f}" in table
    assert "x = speed-up over python (host-clock minima)" in table
    assert "! fused: the Timer and host-clock medians disagree by more than 2x" in table
    data = json.loads(json.dumps([report.asdict(r) for r in rows.values()]))
    assert [r["clocks_disagree"] for r in data] == [False, True, False]
    # a quiet run: Timer medians, and the verdict says the clocks agree
    timer["fused"] = (52.0, 80.0)
    rows = _fake_results(host, timer, peer="gemm")
    assert {r.ratio_basis for r in rows} == {report.TIMER}
    assert report.verdict(rows) == "verdict: the two clocks agree on every row; ratios from the Timer medians"


def test_bench_on_a_gpu_marks_only_a_slower_timer():
    """On CUDA the Timer's passes overlap their launches, the host clock's do not: a Timer median far below
    the host clock's is how launch-bound rows look there, not noise; one far above it still is."""
    host = {"lstm": (550.0, 950.0), "fused": (750.0, 1030.0)}
    timer = {"lstm": (260.0, 1100.0), "fused": (470.0, 2900.0)}
    rows = {r.name: r for r in _fake_results(host, timer, peer="lstm", pipelined=True)}
    assert not rows["lstm"].clocks_disagree and rows["fused"].clocks_disagree
    rows = {r.name: r for r in _fake_results(host, timer, peer="lstm", pipelined=False)}
    assert rows["lstm"].clocks_disagree


def test_bench_rows_say_their_precision(torch_settings):
    """Each row names what its float32 products run in, from the switches in force, and the footer
    compares like with like: fused strict against nn.LSTM strict, fused with TF32 against nn.LSTM's
    default (TF32 in cuDNN)."""
    from lltm.bench import cases, report

    cuda = cases.Config(batch_size=1, features=1, state_size=1, seq=2, device=torch.device("cuda"), dtype=torch.float32)
    torch_settings.set(matmul_tf32=False, cudnn_tf32=True)
    names = ("fused", "fused-tf32", "fused-accurate", "lstm", "lstm-notf32", "python")
    got = {n: cases.precision(n, cuda) for n in names}
    assert got == {
        "fused": "fp32",
        "fused-tf32": "TF32",
        "fused-accurate": "accurate",
        "lstm": "TF32",
        "lstm-notf32": "fp32",
        "python": "fp32",
    }
    torch_settings.set(matmul_tf32=True)
    assert cases.precision("fused", cuda) == "TF32"
    bf16 = cases.Config(
        batch_size=1,
        features=1,
        state_size=1,
        seq=2,
        device=torch.device("cuda"),
        dtype=torch.float32,
        autocast=torch.bfloat16,
    )
    assert cases.precision("lstm", bf16) == "bfloat16"
    cpu = cases.Config(batch_size=1, features=1, state_size=1, seq=2, device=torch.device("cpu"), dtype=torch.float32)
    assert cases.precision("lstm", cpu) == "fp32"
    built, skipped = cases.build(["fused", "fused-tf32", "fused-accurate"], cpu)
    assert [c.name for c in built] == ["fused"]
    assert skipped == {"fused-tf32": "CUDA only", "fused-accurate": "CUDA only"}

    names = ("fused", "fused-tf32", "fused-accurate", "lstm", "lstm-notf32")
    host = {n: (100.0, 200.0) for n in names}
    timer = {
        "fused": (60.0, 120.0),
        "fused-tf32": (40.0, 80.0),
        "fused-accurate": (50.0, 100.0),
        "lstm": (100.0, 200.0),
        "lstm-notf32": (150.0, 300.0),
    }
    rows = _fake_results(host, timer, peer="lstm", pipelined=True)
    for r, p in zip(rows, ("fp32", "TF32", "accurate", "TF32", "fp32")):
        r.precision = p
    meta = {
        "seq": 2,
        "batch_size": 1,
        "features": 1,
        "state_size": 1,
        "dtype": "float32",
        "device": "cuda",
        "device_name": "a GPU",
        "torch": "x",
        "date": "d",
        "runs": 3,
        "rounds": 1,
        "gradients": "all",
    }
    table = report.format_table(rows, meta, {})
    assert "precision: fused fp32, fused-tf32 TF32, fused-accurate accurate, lstm TF32, lstm-notf32 fp32" in table
    assert "accurate mode over TF32, f+b (Timer medians): fused-accurate / fused-tf32 1.25" in table
    like = (
        "like with like, f+b (Timer medians): fused (fp32) / lstm-notf32 (fp32) 0.40, "
        "fused-tf32 (TF32) / lstm (TF32) 0.40"
    )
    assert like in table


def test_bench_header_names_the_cpu(capsys):
    from lltm.bench.cli import cpu_name

    assert cli.main(["bench", "-b", "2", "-f", "3", "-s", "4", "--rows", "aten", *QUICK]) == 0
    name = cpu_name()
    assert name and f"float32 on {name}, " in capsys.readouterr().out
    if os.path.exists("/proc/cpuinfo"):
        model = next(line for line in open("/proc/cpuinfo") if line.startswith("model name")).split(":", 1)[1]
        assert model.strip() in name


def test_seq_sweep_summary_against_the_targets():
    """The sweep's last lines: max and median of each ratio over the grid, and how often the planner's
    pick is within 10% of the fastest forced path (nocluster, a subset of paths, is not a candidate)."""
    from lltm.bench.seq_sweep import format_point, summary

    def point(auto, grid, loop, tf32, accurate):
        times = {
            "grid": (grid, 0.0),
            "loop": (loop, 0.0),
            "nocluster": (min(grid, loop), 0.0),
            "auto": (auto, 0.0),
            "lstm": (100.0, 0.0),
            "lstm-notf32": (200.0, 0.0),
            "auto-tf32": (tf32, 0.0),
            "auto-accurate": (accurate, 0.0),
        }
        return {"B": 16, "S": 128, "picked": ["grid", "loop"], "floors": {"grid": 1.0}, "times": times}

    points = [point(50, 50, 80, 40, 48), point(120, 100, 130, 90, 180), point(90, 95, 90, 60, 75)]
    text = summary(points, ["grid", "loop", "nocluster"])
    assert "auto / lstm strict: max 0.60, median 0.45" in text
    assert "auto TF32 / lstm (TF32 both): max 0.90, median 0.60" in text
    assert "auto / fastest forced path: max 1.20, median 1.00, within 1.10 at 2 of 3 points" in text
    assert "auto accurate / auto TF32: max 2.00, median 1.25, within 1.30 at 2 of 3 points" in text
    row = format_point(points[1], ["grid", "loop", "nocluster"])
    assert row.startswith("| 16x128 | 100 | 130 | 100 | 120 (grid/loop) | 1.20 | 100 | 200 | 1.20 | 0.60 | 0.50 |")
    assert "| 90 | 0.90 | 180 | 2.00 |" in row


def test_seq_sweep_planner_by_trial_times():
    """The planner's pick against the fastest plan any row's planner timed, from the plan reports'
    "measured:" lines (the trials' GPU times at the call's T, forward plus backward); None where
    the pick was not timed (the model's single candidate)."""
    from lltm.bench.seq_sweep import summary, trial_pick_ratio

    def measured(chosen: str, times: dict[str, int]) -> str:
        listed = "; ".join(f"{label} {us} us ({us // 4}, {us // 2})" for label, us in times.items())
        path = chosen.split(":")[0]
        head = f"lltm forward T=100 B=16 S=128 elem=2: {path}\n  loop model_us=1\n"
        return head + f"measured: {path} ({chosen}; timed over 16 and 32 steps, at T=100: {listed})"

    auto = [
        measured("grid:2:fma-regs:nb1:ks4:t256", {"grid:2:fma-regs:nb1:ks4:t256": 181, "loop": 500}),
        measured("grid:2:fma-regs:nb1:ks4:t256", {"grid:2:fma-regs:nb1:ks4:t256": 204, "grid:4:mma:nb1:ks1:t256": 240}),
    ]
    cluster = [
        measured("cluster:4:fma-regs:nb2:ks4:t256", {"cluster:4:fma-regs:nb2:ks4:t256": 159}),
        measured("cluster:4:fma-regs:nb2:ks4:t256", {"cluster:4:fma-regs:nb2:ks4:t256": 174, "loop": 600}),
    ]
    point = {"plans": {"auto": auto, "cluster-fma": cluster, "loop": ["loop model_us=1", "loop model_us=1"]}}
    assert trial_pick_ratio(point) == pytest.approx((181 + 204) / (159 + 174))
    point["plans"]["auto"] = [auto[0], "lltm backward T=100 B=16 S=128 elem=2: grid"]  # a model pick
    assert trial_pick_ratio(point) is None
    times = {"grid": (1.0, 0.0), "auto": (1.0, 0.0), "lstm": (1.0, 0.0), "lstm-notf32": (1.0, 0.0)}
    points = [{"plans": {"auto": auto, "cluster-fma": cluster}, "times": times}, {"times": times}]
    assert "(trial GPU times): max 1.16, median 1.16, within 1.10 at 0 of 1 points" in summary(points, ["grid"])


def test_step_phases_reads_the_kernels_phase_lines():
    """lltm.bench.step_phases parses the profiling build's device printf (one
    line per launch) into phase -> cycles, ignores other output, and its
    stdout capture sees what is written on file descriptor 1."""
    import os

    from lltm.bench.step_phases import _capture_stdout, parse, parse_trace

    text = (
        "noise\n"
        "lltm step clocks: forward cluster group=8 units=16 rows=1 dot=fma steps=1000 cycles/step: "
        "dot 461, reduce 547, cell+put 719, arrive 269, stores+loads 326, wait 83; total 2408\n"
        "lltm step clocks: backward grid group=2 units=64 rows=4 dot=mma steps=10 cycles/step: "
        "cell+put 3, arrive 4, stores+loads 5, wait 6, dot 7, reduce 8; total 33; sm clock 1.755 GHz\n"
    )
    rows = parse(text)
    assert [r["what"] for r in rows] == ["forward cluster", "backward grid"]
    assert rows[0]["shape"] == "group=8 units=16 rows=1 dot=fma steps=1000"
    assert rows[0]["phases"] == {
        "dot": 461,
        "reduce": 547,
        "cell+put": 719,
        "arrive": 269,
        "stores+loads": 326,
        "wait": 83,
    }
    assert rows[0]["total"] == 2408 and rows[1]["phases"]["reduce"] == 8
    # the SM clock the loop ran at, where the line has it (builds before it: none)
    assert rows[0]["ghz"] is None and rows[1]["ghz"] == pytest.approx(1.755)
    assert parse("nothing here\n") == []
    # the forward's exchange trace: one line per batch chunk
    traces = parse_trace(
        text + "lltm step trace: forward grid group=64 ctas 64-127 steps=64: arrivals 197 ns apart (first to "
        "last), the last arrival to the first wait's end 1216 ns and to the last's 1412 ns; step 2442 ns\n"
    )
    assert [(t["what"], t["group"], t["ctas"]) for t in traces] == [("forward grid", 64, "64-127")]
    assert traces[0]["text"].startswith("steps=64: arrivals 197 ns apart")
    assert parse_trace(text) == []
    got = _capture_stdout(lambda: os.write(1, b"from fd 1\n"), sync=False)
    assert got == "from fd 1\n"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--sizes", "16x"], "--sizes: '16x' is not BxS or BxIxS"),
        (["--sizes", "16x0x128"], "--sizes: '16x0x128' is not BxS or BxIxS"),
        (["--paths", "loop"], "--paths: 'loop' is not a persistent path"),
        (["--paths", "cluster-fma,fast"], "--paths: 'fast' is not a persistent path"),
        (["--cell", "nope"], "argument --cell: invalid choice: 'nope'"),
    ],
)
def test_step_phases_bad_arguments_are_clear_errors(capsys, args, message):
    """A malformed size or a path without a persistent kernel is a usage
    error naming the argument, on any machine (checked before the GPU)."""
    from lltm.bench.step_phases import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
