"""lltm.bench.ddp_scaling: its measurements run (one process, and 2 gloo ranks with every DDP option),
and its tables compute the scaling efficiencies and the targets right. Nothing here is timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lltm.bench import ddp_scaling

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--device", "cpu", "--hidden", "8", "--seq-len", "4", "--per-rank-batch", "2,4", "--global-batch", "8"]
TINY += ["--steps", "2", "--warmup", "1", "--phase-steps", "1"]
VARIANTS = "default;bucket_cap_mb=1;gradient_as_bucket_view;static_graph;rebuilt_buckets;accumulate=2"


def _records(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_runs_on_one_and_two_ranks(tmp_path, torch_settings):
    torch_settings.set(num_threads=1)
    out = tmp_path / "s.jsonl"
    assert ddp_scaling.main(["run", *TINY, "--json", str(out)]) == 0
    one = _records(out)
    assert [(r["world"], r["per_rank_batch"]) for r in one] == [(1, 2), (1, 4), (1, 8)]  # weak 2, 4; strong 8
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += ["-m", "lltm.bench.ddp_scaling", "run", *TINY, "--json", str(out), "--variants", VARIANTS]
    cmd += ["--variants-at", "8,4"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    two = _records(out)[len(one) :]
    assert [(r["world"], r["per_rank_batch"], ddp_scaling._variant_name(r["variant"])) for r in two] == [
        (2, 2, "default"),
        (2, 4, "default"),
        (2, 4, "bucket_cap_mb=1"),
        (2, 4, "gradient_as_bucket_view"),
        (2, 4, "static_graph"),
        (2, 4, "rebuilt_buckets"),
        (2, 4, "accumulate=2"),
    ]
    for r in two:
        assert r["tokens_per_s"] > 0 and r["allreduce_ms"] > 0 and 0 <= r["hidden_share"] <= 1
        assert r["global_batch"] == 2 * r["per_rank_batch"] and r["grad_mb"] > 0
    text = ddp_scaling.tables(_records(out))
    assert "| 8 | 4 | " in text and "**Strong scaling**" in text and "| 2 | 8 | 4 | accumulate=2 |" in text
    assert "- weak scaling, hidden 512, per-rank batch 256, 4 ranks: not measured" in text


def _rec(world: int, rows: int, tps: float, hidden: int = 512, **variant) -> dict:
    r = {
        "world": world,
        "hidden": hidden,
        "seq_len": 128,
        "per_rank_batch": rows,
        "global_batch": world * rows,
        "dtype": "float32",
        "variant": variant,
        "tokens_per_s": tps,
        "step_ms": 1.0,
        "fwd_ms": 1.0,
        "bwd_ms": 2.0,
        "bwd_local_ms": 1.5,
        "opt_ms": 0.1,
        "grad_mb": 4.0,
        "gpu": "GPU",
        "torch": "2.x",
        "date": "today",
        "backend": "auto",
    }
    if world > 1:
        r.update(allreduce_ms=1.0, ddp_in_backward_ms=0.5, hidden_share=0.5)
    return r


def test_tables_compute_the_efficiencies_and_targets():
    records = [
        _rec(1, 256, 100.0),
        _rec(1, 1024, 200.0),
        _rec(2, 256, 190.0),
        _rec(2, 512, 300.0),
        _rec(4, 256, 370.0),
        _rec(4, 256, 380.0, static_graph=True),
    ]
    text = ddp_scaling.tables(records)
    assert "| 512 | 256 | 100 | 190 (0.95) | 370 (0.93) |" in text  # 370 / (4 * 100)
    assert "| 512 | 1024 | 200 | 300 (1.50x, 0.75) | 370 (1.85x, 0.46) |" in text  # 370 / 200, / 4
    assert "| 4 | 512 | 256 | static_graph | 380 | 1.027 | 0.50 |" in text
    assert "- weak scaling, hidden 512, per-rank batch 256, 4 ranks: efficiency 0.93 (target 0.90: met)" in text
    assert "- strong scaling, hidden 512, global batch 1024, 4 ranks: efficiency 0.46 (target 0.75: missed)" in text
    oom = {**_rec(1, 1024, 0.0, hidden=1024), "error": "out of memory"}
    assert "- not measured: 1 rank(s) hidden 1024 rows 1024: out of memory" in ddp_scaling.tables(records + [oom])


@pytest.mark.parametrize(
    "text,message",
    [
        ("bucket_cap=3", "unknown DDP variant 'bucket_cap'"),
        ("static_graph=2", "static_graph takes no value"),
        ("static_graph+accumulate=2", "static_graph with accumulate > 1"),
    ],
)
def test_bad_variants_are_refused(text, message, capsys):
    with pytest.raises(SystemExit) as exc:
        ddp_scaling.main(["run", "--device", "cpu", "--variants", text])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m lltm.bench.ddp_scaling run: error: argument --variants: ") and message in err
    assert err.count("\n") == 1


def test_variants_parse():
    assert ddp_scaling.parse_variant("default") == {}
    assert ddp_scaling.parse_variant("bucket_cap_mb=1+gradient_as_bucket_view") == {
        "bucket_cap_mb": 1.0,
        "gradient_as_bucket_view": True,
    }
