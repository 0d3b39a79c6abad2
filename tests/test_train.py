"""`lltm train`: tasks, parameter matching, smoke runs, bit-exact resume, checkpoints, DDP under torchrun."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from lltm import _backends as lltm_backends
from lltm import cli
from lltm.train import checkpoint
from lltm.train.model import ModelConfig, count_parameters, matched_hidden
from lltm.train.tasks import AddingTask, CharLMTask, CopyTask, make_task, shard

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Small everything: each run takes about a second on two cores.
SMALL = [
    "--hidden",
    "16",
    "--batch",
    "8",
    "--log-every",
    "2",
    "--eval-every",
    "3",
    "--eval-batches",
    "2",
    "--quiet",
    "--device",
    "cpu",
]


def _small(*args: str) -> list[str]:
    """SMALL, with a small embedding for the token tasks (--embed is refused for adding)."""
    task = args[args.index("--task") + 1] if "--task" in args else "charlm"
    return [*SMALL, *(["--embed", "8"] if task != "adding" else [])]


def _train(tmp_path, *args: str, out: str = "out") -> int:
    return cli.main(["train", *_small(*args), "--out", str(tmp_path / out), *args])


def _rows(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def _final(ckpt_dir) -> dict:
    _, path = checkpoint.list_checkpoints(str(ckpt_dir))[-1]
    return torch.load(path, weights_only=True)


def _assert_same_state(a: dict, b: dict) -> None:
    assert a["step"] == b["step"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for idx, sa in a["optimizer"]["state"].items():
        for key, va in sa.items():
            assert torch.equal(va, b["optimizer"]["state"][idx][key]), (idx, key)


# --- tasks ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["copy", "adding", "charlm"])
def test_batches_are_a_function_of_the_step(name):
    task = make_task(name, seed=3, batch=8)
    x, y = task.train_batch(5)
    x2, y2 = task.train_batch(5)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, task.train_batch(6)[0])
    assert not torch.equal(x, make_task(name, seed=4, batch=8).train_batch(5)[0])
    # Shards of any rank count put the global batch back together in order.
    for world in (1, 2, 4):
        assert torch.equal(torch.cat([shard(x, r, world) for r in range(world)]), x)
    held = list(task.held_out())
    assert len(held) == task.eval_batches
    assert torch.equal(held[0][0], next(iter(task.held_out()))[0])  # the same held-out data at every evaluation


def test_shard_needs_a_divisible_batch():
    with pytest.raises(ValueError, match="--batch 6 must be divisible by the number of ranks \\(4\\)"):
        shard(torch.zeros(6, 3), 0, 4)


def test_copy_task_layout():
    task = CopyTask(copy_len=4, seed=0, batch=16, seq_len=15, eval_batches=1)
    x, y = task.train_batch(0)
    assert x.shape == y.shape == (16, 15)
    assert ((x[:, :4] >= 1) & (x[:, :4] <= 8)).all()
    assert (x[:, 4:10] == 0).all() and (x[:, 10] == 9).all() and (x[:, 11:] == 0).all()
    assert torch.equal(y[:, 11:], x[:, :4]) and (y[:, :11] == -100).all()
    with pytest.raises(ValueError, match="--seq-len >= 2 \\* --copy-len \\+ 1 = 9"):
        CopyTask(copy_len=4, seed=0, batch=2, seq_len=8, eval_batches=1)


def test_adding_task_target_is_the_sum_of_the_marked_values():
    task = AddingTask(seed=1, batch=64, seq_len=10, eval_batches=1)
    x, y = task.train_batch(2)
    assert x.shape == (64, 10, 2) and y.shape == (64, 1)
    marks = x[..., 1].to(torch.float64)
    assert (marks.sum(1) == 2).all()
    assert (marks[:, :5].sum(1) == 1).all()  # one marker in each half
    expected = (x[..., 0].to(torch.float64) * marks).sum(1, keepdim=True)
    torch.testing.assert_close(y.to(torch.float64), expected, rtol=0, atol=1e-6)


def test_charlm_targets_are_the_next_bytes(tmp_path):
    text = tmp_path / "t.txt"
    text.write_bytes(bytes(range(256)) * 8)
    task = CharLMTask(text=str(text), seed=0, batch=4, seq_len=16, eval_batches=2)
    x, y = task.train_batch(0)
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal((x + 1) % 256, y)  # this text counts up byte by byte
    split = len(task.train_data)
    for xe, _ in task.held_out():  # held-out windows come from the end of the text
        assert xe.shape == (4, 16)
    assert split == int(256 * 8 * 0.95)
    with pytest.raises(ValueError, match="cannot read --text"):
        CharLMTask(text=str(tmp_path / "missing.txt"), seed=0, batch=4, seq_len=16, eval_batches=2)


def test_default_corpus_is_python_source():
    task = make_task("charlm", seed=0, batch=2)
    assert task.source == "python-stdlib"
    assert len(task.data) > 100_000
    assert b"def " in bytes(task.data[:200_000].tolist())


# --- model ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,layers", [("lltm", 1), ("lltm", 2), ("lstm", 2)])
def test_parameter_count_matches_the_formula(kind, layers):
    cfg = ModelConfig(kind=kind, n_in=256, n_out=256, hidden=24, layers=layers, embed=8, tokens=True, readout="all")
    S, gates, biases = 24, (3 if kind == "lltm" else 4), (1 if kind == "lltm" else 2)
    rnn = sum(gates * S * (S + (8 if k == 0 else S)) + biases * gates * S for k in range(layers))
    assert count_parameters(cfg) == 256 * 8 + rnn + 24 * 256 + 256


@pytest.mark.parametrize("hidden", [16, 64, 200])
def test_match_params_picks_the_closest_lstm(hidden):
    cfg = ModelConfig(kind="lltm", n_in=10, n_out=10, hidden=hidden, layers=2, embed=32, tokens=True, readout="all")
    target = count_parameters(cfg)
    h = matched_hidden(cfg, "lstm")

    def gap(size: int) -> int:
        return abs(count_parameters(ModelConfig(**{**cfg.as_dict(), "kind": "lstm", "hidden": size})) - target)

    assert h < hidden  # an LSTM layer has 4 gates to the LLTM's 3
    assert gap(h) <= gap(h - 1) and gap(h) <= gap(h + 1)
    assert gap(h) / target < 0.03


# --- smoke runs -----------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["copy", "adding", "charlm"])
def test_train_compare_smoke(tmp_path, task, capsys):
    extra = ["--seq-len", "16"] if task == "charlm" else []
    assert _train(tmp_path, "--task", task, "--steps", "6", "--compare", "--match-params", *extra) == 0
    out = capsys.readouterr().out
    assert "| lltm | 16 |" in out and "| lstm |" in out
    for kind in ("lltm", "lstm"):
        rows = _rows(tmp_path / "out" / f"{kind}.jsonl")
        assert rows[0]["kind"] == "config" and rows[0]["model"] == kind and rows[0]["task"] == task
        train = [r for r in rows if r["kind"] == "train"]
        assert [r["step"] for r in train] == [2, 4, 6]
        assert all(math.isfinite(r["loss"]) and r["tokens_per_s"] > 0 for r in train)
        assert [r["step"] for r in rows if r["kind"] == "eval"] == [3, 6]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    lltm_params, lstm_params = (r["params"] for r in summary["results"])
    assert abs(lltm_params - lstm_params) / lltm_params < 0.05
    png = tmp_path / "out" / "loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_train_a_cell_on_lltm_kernels(tmp_path, cell, capsys):
    """--cell trains lltm's LSTM / GRU (torch's parameters, so --compare sizes match exactly)."""
    assert _train(tmp_path, "--task", "copy", "--steps", "4", "--cell", cell, "--compare", "--no-plot") == 0
    rows = _rows(tmp_path / "out" / "lltm.jsonl")
    assert rows[0]["cell"] == cell
    assert all(math.isfinite(r["loss"]) for r in rows if r["kind"] == "train")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [r["kind"] for r in summary["results"]] == [f"lltm[{cell}]", "lstm"]
    assert f"| lltm[{cell}] |" in capsys.readouterr().out
    if cell == "lstm":  # torch's parameters: the same count, the same init, the same losses
        assert len({r["params"] for r in summary["results"]}) == 1
        losses = [r["eval_loss"] for r in summary["results"]]
        assert abs(losses[0] - losses[1]) < 1e-4 * abs(losses[1])


def test_unknown_cell_is_refused(tmp_path, capsys):
    assert _train(tmp_path, "--task", "copy", "--steps", "2", "--cell", "nope") == 2
    assert "unknown cell 'nope'" in capsys.readouterr().err


def test_charlm_learns(tmp_path):
    """40 steps bring the held-out loss of a tiny LLTM well below uniform guessing (ln 256)."""
    assert (
        _train(
            tmp_path,
            "--task",
            "charlm",
            "--seq-len",
            "16",
            "--steps",
            "40",
            "--eval-every",
            "40",
            "--lr",
            "1e-2",
            "--no-plot",
        )
        == 0
    )
    evals = [r for r in _rows(tmp_path / "out" / "lltm.jsonl") if r["kind"] == "eval"]
    assert evals[-1]["loss"] < math.log(256) - 1.0


@pytest.mark.parametrize("backend", ["python", "aten", "fused"])
def test_bf16_autocast_on_cpu(tmp_path, backend):
    """Every LLTM backend trains under CPU bfloat16 autocast (the layer is one sequence operator)."""
    if not lltm_backends.backends("cpu")[backend]:
        pytest.skip(f"{backend} is not built for the CPU here")
    args = ["--task", "adding", "--steps", "4", "--dtype", "bfloat16", "--backend", backend, "--no-plot"]
    assert _train(tmp_path, *args) == 0
    rows = _rows(tmp_path / "out" / "lltm.jsonl")
    assert rows[0]["bf16"] is True and math.isfinite(rows[-1]["loss"])


def test_bf16_autocast_lstm_on_cpu(tmp_path, capsys):
    """torch.nn.LSTM under CPU bfloat16 autocast: it trains where oneDNN has a bfloat16 LSTM for the
    CPU; elsewhere (AVX2-only CPUs) the run is refused before any work, in one line, instead of
    failing in oneDNN's primitive descriptor at the first step."""
    from lltm.train.cli import _lstm_bf16_runs_on_cpu

    code = _train(tmp_path, "--task", "adding", "--steps", "4", "--dtype", "bfloat16", "--model", "lstm", "--no-plot")
    if _lstm_bf16_runs_on_cpu():
        assert code == 0 and _rows(tmp_path / "out" / "lstm.jsonl")[0]["bf16"] is True
    else:
        assert code == 2
        assert capsys.readouterr().err == (
            "lltm train: error: torch.nn.LSTM does not run under CPU bfloat16 autocast on this machine (oneDNN "
            "has no bfloat16 LSTM for this CPU); use --dtype float32, --model lltm, or a CUDA device\n"
        )
        assert not (tmp_path / "out" / "lstm.jsonl").exists()


def test_compile_smoke(tmp_path):
    assert (
        _train(
            tmp_path, "--task", "copy", "--seq-len", "5", "--copy-len", "2", "--steps", "2", "--compile", "--no-plot"
        )
        == 0
    )
    assert math.isfinite(_rows(tmp_path / "out" / "lltm.jsonl")[-1]["loss"])


def test_compile_runs_in_process(monkeypatch):
    """--compile keeps inductor's compilation in the process (its worker pool took cores from the training
    step: 121 against 316 steps/s on the H100 machine) unless TORCHINDUCTOR_COMPILE_THREADS is set."""
    import torch._inductor.config as inductor_config

    from lltm.train.loop import compile_in_process

    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    monkeypatch.setattr(inductor_config, "compile_threads", 8)
    compile_in_process()
    assert inductor_config.compile_threads == 1
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "4")
    monkeypatch.setattr(inductor_config, "compile_threads", 4)
    compile_in_process()
    assert inductor_config.compile_threads == 4


@pytest.mark.parametrize("compile", [[], ["--compile"]], ids=["eager", "compile"])
def test_warmup_is_timed_apart(tmp_path, compile, capsys):
    """The first --warmup-steps steps (compilation included) are timed apart from the steady state: the
    summary, its JSON and the metrics say both; a run that ends within its warm-up has no steady speed."""
    args = ["--task", "copy", "--seq-len", "5", "--copy-len", "2", "--no-plot", "--warmup-steps", "3", *compile]
    assert _train(tmp_path, *args, "--steps", "8") == 0
    table = capsys.readouterr().out
    assert "| warm-up |" in table and "| 3 steps, " in table and "steady state, after the warm-up steps" in table
    (r,) = json.loads((tmp_path / "out" / "summary.json").read_text())["results"]
    assert r["warmup_steps"] == 3 and r["warmup_s"] > 0 and r["steps_per_s"] > 0
    assert r["tokens_per_s"] == pytest.approx(r["steps_per_s"] * 8 * 5)  # batch 8, sequences of 5
    warm = [row for row in _rows(tmp_path / "out" / "lltm.jsonl") if row["kind"] == "warmup"]
    assert warm == [{"kind": "warmup", "step": 3, "steps": 3, "seconds": round(r["warmup_s"], 4)}]
    assert _train(tmp_path, *args, "--steps", "2", out="short") == 0
    (r,) = json.loads((tmp_path / "short" / "summary.json").read_text())["results"]
    assert r["warmup_steps"] == 2 and r["steps_per_s"] is None and r["tokens_per_s"] is None
    assert "| - | - | 2 steps, " in capsys.readouterr().out


# --- checkpoints and resume -----------------------------------------------------------------

RESUME = ["--task", "copy", "--layers", "2", "--dropout", "0.3", "--ckpt-every", "3", "--no-plot"]


def test_resume_is_bit_exact(tmp_path):
    """8 steps straight == 4 steps, then a new process-level run resuming to 8 (dropout on: RNG restored)."""
    assert _train(tmp_path, *RESUME, "--steps", "8", "--ckpt", str(tmp_path / "straight"), out="a") == 0
    assert _train(tmp_path, *RESUME, "--steps", "4", "--ckpt", str(tmp_path / "split"), out="b") == 0
    assert [s for s, _ in checkpoint.list_checkpoints(str(tmp_path / "split"))] == [3, 4]
    assert _train(tmp_path, *RESUME, "--steps", "8", "--ckpt", str(tmp_path / "split"), "--resume", out="b") == 0
    _assert_same_state(_final(tmp_path / "straight"), _final(tmp_path / "split"))
    # The metrics of the two parts read as one run.
    rows = [r for r in _rows(tmp_path / "b" / "lltm.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [2, 4, 6, 8]
    straight = [r["loss"] for r in _rows(tmp_path / "a" / "lltm.jsonl") if r["kind"] == "train"]
    assert [r["loss"] for r in rows] == straight


def test_keep_last_k(tmp_path):
    assert (
        _train(tmp_path, *RESUME, "--steps", "9", "--ckpt-every", "1", "--keep", "2", "--ckpt", str(tmp_path / "ck"))
        == 0
    )
    assert sorted(os.listdir(tmp_path / "ck")) == ["ckpt-00000008.pt", "ckpt-00000009.pt"]


def test_wrong_checkpoint_gives_a_clear_error(tmp_path, capsys):
    ck = str(tmp_path / "ck")
    assert _train(tmp_path, *RESUME, "--steps", "3", "--ckpt", ck) == 0
    capsys.readouterr()
    assert _train(tmp_path, *RESUME, "--steps", "6", "--ckpt", ck, "--resume", "--hidden", "24") == 2
    err = capsys.readouterr().err
    assert "was written for another model or task (hidden: checkpoint 16, this run 24)" in err
    assert "use another --ckpt directory" in err
    assert _train(tmp_path, *RESUME, "--steps", "6", "--ckpt", ck, "--resume", "--model", "lstm") == 2
    assert "kind: checkpoint 'lltm', this run 'lstm'" in capsys.readouterr().err
    assert _train(tmp_path, "--task", "adding", "--steps", "6", "--ckpt", ck, "--resume") == 2
    assert "task: checkpoint 'copy', this run 'adding'" in capsys.readouterr().err
    # Without --resume a directory holding checkpoints is not overwritten.
    assert _train(tmp_path, *RESUME, "--steps", "6", "--ckpt", ck) == 2
    assert "already holds checkpoints (up to step 3); pass --resume" in capsys.readouterr().err


def test_killed_mid_save_leaves_the_previous_checkpoint(tmp_path):
    """A process SIGKILLed while writing its second checkpoint: the first stays loadable, the
    partial file is ignored, and resuming from it ends bit-identical to an uninterrupted run."""
    ck = tmp_path / "ck"
    args = [*_small(*RESUME), *RESUME, "--steps", "6", "--ckpt", str(ck), "--out", str(tmp_path / "killed")]
    script = textwrap.dedent(f"""
        import io, os, signal, torch
        from lltm import cli
        real_save, calls = torch.save, [0]
        def dying_save(obj, f, *a, **k):
            calls[0] += 1
            if calls[0] == 2:  # the second checkpoint: half of it reaches the disk, then the process dies
                buf = io.BytesIO(); real_save(obj, buf)
                f.write(buf.getvalue()[: len(buf.getvalue()) // 2]); f.flush(); os.fsync(f.fileno())
                os.kill(os.getpid(), signal.SIGKILL)
            return real_save(obj, f, *a, **k)
        torch.save = dying_save
        cli.main(["train", *{args!r}])
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], check=False, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert [s for s, _ in checkpoint.list_checkpoints(str(ck))] == [3]
    assert any(name.startswith(".ckpt-00000006.pt.tmp.") for name in os.listdir(ck))
    _, state = checkpoint.load_latest(str(ck))
    assert state["step"] == 3
    assert _train(tmp_path, *RESUME, "--steps", "6", "--ckpt", str(ck), "--resume", out="killed") == 0
    assert sorted(os.listdir(ck)) == ["ckpt-00000003.pt", "ckpt-00000006.pt"]  # the partial file is gone
    assert _train(tmp_path, *RESUME, "--steps", "6", "--ckpt", str(tmp_path / "whole")) == 0
    _assert_same_state(_final(ck), _final(tmp_path / "whole"))


def test_damaged_newest_checkpoint_falls_back(tmp_path):
    d = str(tmp_path)
    for step in (1, 2):
        checkpoint.save(d, step, {"step": step, "w": torch.randn(100)}, keep=0)
    newest = checkpoint.path_for(d, 2)
    with open(newest, "r+b") as f:
        f.truncate(os.path.getsize(newest) // 2)
    with pytest.warns(UserWarning, match="skipping unreadable checkpoint"):
        path, state = checkpoint.load_latest(d)
    assert state["step"] == 1 and path == checkpoint.path_for(d, 1)


def test_resume_needs_a_checkpoint_directory(tmp_path, capsys):
    assert _train(tmp_path, "--task", "copy", "--steps", "2", "--resume") == 2
    assert capsys.readouterr().err == "lltm train: error: --resume needs --ckpt DIR (the directory to resume from)\n"


def _damage(path) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def test_resume_when_no_checkpoint_loads_is_an_error(tmp_path, capsys):
    """--resume (and --auto-resume) over checkpoints that are all damaged: an error naming each and
    its reason, and the files left as they were (no training from step 0, no rotation deleting them)."""
    ck = tmp_path / "ck"
    assert _train(tmp_path, *RESUME, "--steps", "6", "--ckpt", str(ck)) == 0
    for _, path in checkpoint.list_checkpoints(str(ck)):
        _damage(path)
    before = {name: os.path.getsize(ck / name) for name in os.listdir(ck)}
    capsys.readouterr()
    for flag in ("--resume", "--auto-resume"):
        with pytest.warns(UserWarning, match="skipping unreadable checkpoint"):
            assert _train(tmp_path, *RESUME, "--steps", "9", "--ckpt", str(ck), flag) == 2
        err = capsys.readouterr().err
        assert err.startswith(
            f"lltm train: error: none of the 2 checkpoint(s) in {ck} can be loaded (ckpt-00000006.pt: "
        )
        assert "; ckpt-00000003.pt: " in err and err.endswith(
            "); they were left as they are. Move them away to start from step 0, or use another --ckpt directory.\n"
        )
        assert {name: os.path.getsize(ck / name) for name in os.listdir(ck)} == before


def test_resume_from_an_empty_directory(tmp_path, capsys):
    """--resume with no checkpoint at all is an error; --auto-resume starts at step 0 (so one command
    starts a run and restarts it under torchrun --max-restarts)."""
    ck = tmp_path / "ck"
    assert _train(tmp_path, *RESUME, "--steps", "3", "--ckpt", str(ck), "--resume") == 2
    assert capsys.readouterr().err == (
        f"lltm train: error: --resume: no checkpoint in {ck} (--auto-resume starts at step 0 when there is none)\n"
    )
    assert _train(tmp_path, *RESUME, "--steps", "3", "--ckpt", str(ck), "--auto-resume") == 0
    assert [s for s, _ in checkpoint.list_checkpoints(str(ck))] == [3]
    assert _train(tmp_path, *RESUME, "--steps", "6", "--ckpt", str(ck), "--auto-resume") == 0
    assert "resumed lltm from" in capsys.readouterr().out
    assert [s for s, _ in checkpoint.list_checkpoints(str(ck))] == [3, 6]


def test_damaged_newest_checkpoint_is_put_aside(tmp_path, capsys):
    """A damaged newest checkpoint: the run resumes from the one before it and renames the damaged
    file <name>.damaged, so that it is neither loaded again, nor counted by --keep, nor deleted."""
    ck = tmp_path / "ck"
    assert _train(tmp_path, *RESUME, "--steps", "6", "--ckpt", str(ck)) == 0
    _damage(checkpoint.path_for(str(ck), 6))
    with pytest.warns(UserWarning, match="skipping unreadable checkpoint"):
        assert _train(tmp_path, *RESUME, "--steps", "12", "--ckpt", str(ck), "--resume", "--keep", "2") == 0
    out = capsys.readouterr().out
    assert f"newer checkpoint(s) that do not load renamed to {ck}/ckpt-00000006.pt.damaged" in out
    assert "resumed lltm from" in out and "(step 3, " in out
    assert sorted(os.listdir(ck)) == ["ckpt-00000006.pt.damaged", "ckpt-00000009.pt", "ckpt-00000012.pt"]


@pytest.mark.parametrize(
    "argv,difference",
    [
        (["--seed", "1"], "seed: checkpoint 0, this run 1"),
        (["--lr", "0.001"], "lr: checkpoint 0.003, this run 0.001"),
        (["--batch", "4"], "batch: checkpoint 8, this run 4"),
        (["--seq-len", "21"], "seq_len: checkpoint 20, this run 21"),
    ],
    ids=["seed", "lr", "batch", "seq-len"],
)
def test_resume_refuses_other_training_options(tmp_path, capsys, argv, difference):
    """--resume with another --seed, --lr, --batch or --seq-len than the checkpoint's is refused,
    naming the difference; --override continues with the new values from the checkpoint's step."""
    ck = tmp_path / "ck"
    assert _train(tmp_path, *RESUME, "--steps", "3", "--ckpt", str(ck)) == 0
    capsys.readouterr()
    assert _train(tmp_path, *RESUME, "--steps", "6", "--ckpt", str(ck), "--resume", *argv) == 2
    err = capsys.readouterr().err
    path = checkpoint.path_for(str(ck), 3)
    assert err == (
        f"lltm train: error: checkpoint {path} was trained with other options ({difference}); pass the options "
        "it was trained with, or --override to continue with these from its step\n"
    )
    assert [s for s, _ in checkpoint.list_checkpoints(str(ck))] == [3]
    assert _train(tmp_path, *RESUME, "--steps", "6", "--ckpt", str(ck), "--resume", "--override", *argv) == 0
    assert f"--override: {difference}" in capsys.readouterr().out
    state = _final(ck)
    assert state["step"] == 6
    if argv[0] == "--lr":
        assert state["optimizer"]["param_groups"][0]["lr"] == 0.001
        assert state["config"]["train"]["lr"] == 0.001


def test_resume_refuses_another_optimizer(tmp_path, capsys):
    ck = tmp_path / "ck"
    assert _train(tmp_path, *RESUME, "--steps", "3", "--ckpt", str(ck)) == 0
    capsys.readouterr()
    for extra in ([], ["--override"]):
        assert (
            _train(tmp_path, *RESUME, "--steps", "6", "--ckpt", str(ck), "--resume", "--optimizer", "sgd", *extra) == 2
        )
        assert "was trained with another optimizer (optimizer: checkpoint 'adam', this run 'sgd')" in (
            capsys.readouterr().err
        )


def test_resume_at_or_past_steps_says_so(tmp_path, capsys):
    """--steps below the checkpoint's step is an error that says what to pass; --steps equal to it says
    there is nothing to train and exits 0; neither changes the checkpoints or the metrics."""
    ck = tmp_path / "ck"
    assert _train(tmp_path, *RESUME, "--steps", "6", "--ckpt", str(ck)) == 0
    metrics = (tmp_path / "out" / "lltm.jsonl").read_text()
    capsys.readouterr()
    assert _train(tmp_path, *RESUME, "--steps", "4", "--ckpt", str(ck), "--resume") == 2
    path = checkpoint.path_for(str(ck), 6)
    assert capsys.readouterr().err == (
        f"lltm train: error: --steps 4 is below the step of {path} (6): nothing to train; pass --steps above 6 "
        "to train on from it\n"
    )
    assert _train(tmp_path, *RESUME, "--steps", "6", "--ckpt", str(ck), "--resume") == 0
    assert capsys.readouterr().out == f"lltm train: lltm: {path} is at step 6 = --steps: nothing to train\n"
    assert [s for s, _ in checkpoint.list_checkpoints(str(ck))] == [3, 6]
    assert (tmp_path / "out" / "lltm.jsonl").read_text() == metrics


def test_empty_text_is_one_line(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert _train(tmp_path, "--task", "charlm", "--text", str(empty), "--steps", "2") == 2
    assert capsys.readouterr().err == f"lltm train: error: --text {empty} is empty; give charlm a text to model\n"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--dropout", "0.2"], "--dropout acts between recurrent layers, so it has no effect with --layers 1; pass --layers 2 or more"),  # noqa: E501
        (["--compare", "--model", "lstm"], "--compare trains both models (lltm, then lstm); drop --model"),
        (["--match-params"], "--match-params sizes nn.LSTM to the LLTM's parameter count: use it with --compare or --model lstm"),  # noqa: E501
        (["--text", "{file}"], "--text is the charlm task's text; --task copy does not read it"),
        (["--task", "adding", "--copy-len", "3"], "--copy-len applies to --task copy only, not --task adding"),
        (["--task", "adding", "--embed", "8"], "--embed has no effect on --task adding (its two features go in as they are)"),  # noqa: E501
        (["--model", "lstm", "--backend", "aten"], "--backend picks the LLTM's backend; --model lstm (torch.nn.LSTM) has none"),  # noqa: E501
        (["--ckpt-every", "5"], "--ckpt-every has no effect without --ckpt DIR"),
        (["--keep", "5"], "--keep has no effect without --ckpt DIR"),
        (["--override"], "--override applies to a resumed run: pass it with --resume or --auto-resume"),
        (["--ckpt", "{dir}", "--resume", "--auto-resume"], "--resume and --auto-resume exclude each other (--auto-resume also starts a new run)"),  # noqa: E501
        (["--auto-resume"], "--auto-resume needs --ckpt DIR (the directory to resume from)"),
        (["--batch", "6", "--accumulate", "4"], "--accumulate 4 must divide each rank's 6 rows (--batch 6 over 1 rank(s))"),  # noqa: E501
        (["--static-graph", "--accumulate", "2"], "--static-graph with --accumulate: DDP's static graph fails an internal assert in torch's reducer when its first backward runs under no_sync (torch 2.13); drop one of them"),  # noqa: E501
        (["--model", "lstm", "--cell", "gru"], "--cell picks the lltm model's cell; --model lstm (torch.nn.LSTM) has none"),  # noqa: E501
    ],
    ids=[
        "dropout-one-layer", "compare-model", "match-params-lltm", "text-copy", "copy-len-adding", "embed-adding",
        "backend-lstm", "ckpt-every", "keep", "override", "resume-twice", "auto-resume", "accumulate", "static-no-sync",
        "cell-lstm",
    ],
)  # fmt: skip
def test_ignored_or_conflicting_options_are_refused(tmp_path, argv, message, capsys, monkeypatch):
    """An option that would be ignored, or that conflicts with another, ends the run before any work
    with one line naming it and the fix."""
    monkeypatch.setattr("lltm.train.cli.train_model", lambda *a, **k: pytest.fail("trained despite a bad option"))
    monkeypatch.setattr("lltm.train.cli.make_task", lambda *a, **k: pytest.fail("built the task despite a bad option"))
    file = tmp_path / "a.txt"
    file.write_text("x" * 1000)
    argv = [a.format(file=file, dir=tmp_path / "ck") for a in argv]
    task = [] if "--task" in argv else ["--task", "copy"]
    assert cli.main(["train", *SMALL, "--out", str(tmp_path / "o"), "--steps", "2", *task, *argv]) == 2
    assert capsys.readouterr().err == f"lltm train: error: {message}\n"


def test_options_for_several_ranks_warn_in_one_process(tmp_path, capsys):
    """DDP-only options given to one process: a warning line, and the run goes on."""
    args = ["--task", "copy", "--steps", "2", "--no-plot", "--bucket-cap-mb", "1", "--static-graph"]
    assert _train(tmp_path, *args) == 0
    assert capsys.readouterr().err == (
        "lltm train: warning: --bucket-cap-mb, --static-graph: no effect in one process (they apply under torchrun)\n"
    )


def test_every_option_has_help():
    import argparse

    from lltm.train import cli as train_cli

    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    missing = [a.option_strings for a in parser._actions if not a.help]
    assert not missing, f"options without help text: {missing}"


def test_accumulate_and_sgd(tmp_path):
    """--accumulate 2 computes the gradient of the whole batch from its two halves: with SGD the result
    equals the whole batch at once within float32 rounding (the grouping of the sums differs)."""
    args = ["--task", "copy", "--steps", "4", "--no-plot", "--optimizer", "sgd", "--lr", "0.1", "--clip", "0"]
    assert _train(tmp_path, *args, "--ckpt", str(tmp_path / "a")) == 0
    assert _train(tmp_path, *args, "--accumulate", "2", "--ckpt", str(tmp_path / "b"), out="b") == 0
    a, b = _final(tmp_path / "a"), _final(tmp_path / "b")
    for k in a["model"]:
        torch.testing.assert_close(b["model"][k], a["model"][k], rtol=1e-5, atol=1e-6, msg=k)
    assert a["config"]["train"]["optimizer"] == "sgd" and b["accumulate"] == 2


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["--backend", "cpp"],
            "argument --backend: unknown backend 'cpp'; choose 'auto' or one of 'python', 'aten', "
            "'fused'. The tutorial's 'cpp' backend is lltm's 'aten'",
        ),
        (["--device", "tpu"], "argument --device: not a device: 'tpu' (cpu, cuda or cuda:N)"),
        (["--out", "{file}/sub"], "argument --out: {file} is not a folder, so {file}/sub cannot be created in it"),
        (["--ckpt", "{file}/ck"], "argument --ckpt: {file} is not a folder, so {file}/ck cannot be created in it"),
        (["--steps", "0"], "argument --steps: must be at least 1, got 0"),
        (["--dropout", "2"], "argument --dropout: must be in [0, 1], got 2"),
        (["--lr", "x"], "argument --lr: expected a number, got 'x'"),
    ],
    ids=["backend", "device", "out", "ckpt", "steps", "dropout", "lr"],
)
def test_bad_arguments_are_one_line(tmp_path, argv, message, capsys, monkeypatch):
    """Rejected before any work: one line on stderr, exit 2, no traceback."""
    monkeypatch.setattr("lltm.train.cli.train_model", lambda *a, **k: pytest.fail("trained despite a bad argument"))
    file = tmp_path / "a-file"
    file.write_text("")
    argv = [a.format(file=file) for a in argv]
    with pytest.raises(SystemExit) as exc:
        _train(tmp_path, "--task", "copy", "--steps", "2", *argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err == f"lltm train: error: {message.format(file=file)} (see lltm train --help)\n"


def test_unavailable_backend_is_one_line(tmp_path, capsys, monkeypatch):
    """A backend that exists but not on this device: known once the device is, still before any work."""
    monkeypatch.setattr("lltm.train.cli.train_model", lambda *a, **k: pytest.fail("trained despite a bad argument"))
    monkeypatch.setattr(lltm_backends, "_cache", {("fused", "cpu", "seq"): False})
    assert _train(tmp_path, "--task", "copy", "--steps", "2", "--backend", "fused") == 2
    err = capsys.readouterr().err
    assert err.startswith("lltm train: error: backend 'fused' is not available on cpu; available: python, aten")
    assert err.count("\n") == 1


def test_runs_to_the_end_without_matplotlib(tmp_path, capsys, monkeypatch):
    """The curves are skipped with one line saying how to get them; metrics and summary are written; exit 0."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert _train(tmp_path, "--task", "copy", "--steps", "2") == 0
    out = capsys.readouterr().out
    assert 'no loss curves: they need matplotlib (pip install "lltm[plot]"; --no-plot: do not ask)' in out
    assert (tmp_path / "out" / "summary.json").exists() and not (tmp_path / "out" / "loss.png").exists()
