"""The planner's cost model in Python (lltm.bench.plan_fit): the same constants as seq_plan.cpp's struct
Model, the same costs as the C++ planner wrote for real trials (tests/data/plan_trials.jsonl: ten points
of an H200's LLTM_SEQ_TUNE_ALL=1 run, forward and backward, every plan of each class timed), and a fit
that runs on them. Needs no GPU."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
import torch

import lltm
from lltm.bench import plan_fit

ROOT = Path(__file__).resolve().parents[1]
TRIALS = str(ROOT / "tests" / "data" / "plan_trials.jsonl")


def _cpp_model() -> dict[str, float]:
    source = (ROOT / "lltm" / "csrc" / "cuda" / "seq_plan.cpp").read_text()
    body = re.search(r"struct Model \{(.*?)\n\};", source, re.S).group(1)
    return {name: float(value) for name, value in re.findall(r"(?:double|int) (\w+) = ([-+0-9.e]+);", body)}


def test_constants_are_seq_plan_cpps():
    assert _cpp_model() == {name: float(value) for name, value in plan_fit.MODEL.items()}


def test_costs_are_the_cpp_planners():
    """Every timed plan's model cost as the C++ planner wrote it, to its six printed digits; a copy of
    the model with one constant moved is refused."""
    cases, sms = plan_fit.load([TRIALS])
    assert sms == 132 and len(cases) == 20
    assert {c.problem.backward for c in cases} == {False, True}
    paths = {q.split["path"] for c in cases for q in c.plans}
    assert paths == {"cluster", "grid", "loop"}
    clock = plan_fit.infer_clock_ghz(cases)
    assert clock == pytest.approx(1.98, rel=1e-3)
    plan_fit.check_reproduced(cases, sms, clock)
    moved = dict(plan_fit.MODEL, grid_fixed=plan_fit.MODEL["grid_fixed"] * 1.1)
    with pytest.raises(SystemExit, match="does not reproduce"):
        plan_fit.check_reproduced(cases, sms, clock, moved)


def test_scores_count_the_slow_picks():
    cases, sms = plan_fit.load([TRIALS])
    clock = plan_fit.infer_clock_ghz(cases)
    s = plan_fit.score(cases, plan_fit.MODEL, sms, clock)
    assert s.misses == len(s.missed) == 2
    for ratio, case, pick, best in s.missed:
        assert ratio == pytest.approx(pick.us / best.us) and ratio > plan_fit.MISS
        assert best.us == min(q.us for q in case.plans)


def test_fit_runs_and_keeps_or_improves_the_picks():
    cases, sms = plan_fit.load([TRIALS])
    clock = plan_fit.infer_clock_ghz(cases)
    out = io.StringIO()
    fitted = plan_fit.fit([TRIALS], iterations=40, out=out)
    report = out.getvalue()
    assert "20 classes, 203 timed plans; 132 SMs at 1.980 GHz" in report
    assert "constants for seq_plan.cpp's struct Model:" in report
    assert set(fitted) == set(plan_fit.MODEL)
    assert fitted["loop_gemm_tile_rows"] == plan_fit.MODEL["loop_gemm_tile_rows"]
    before = plan_fit.score(cases, plan_fit.MODEL, sms, clock)
    after = plan_fit.score(cases, fitted, sms, clock)
    assert after.misses <= before.misses and after.log_loss <= before.log_loss + 1e-6


def test_reports_without_trials_and_failed_plans():
    assert plan_fit.parse_report("lstm forward T=4 B=2 S=8 elem=4: cluster\n  cluster group=1 model_us=3") == []
    fields = "path=grid group=2 rows=2 rows_padded=8 row=24 nb=1 ks=1 threads=256 mma=1 wregs=0 mtiles=1 mstack=1"
    fields += " ksplit=8 waves=1 mc=1 model_us=12.5"
    report = (
        "lstm forward T=4 B=2 S=8 elem=2: grid\nmeasured: grid (loop; timed over 4 steps: "
        f"grid:2:mma:nb1:ks1:t256 {{{fields}}} failed; loop {{{fields.replace('path=grid', 'path=loop')}}} 30 us)"
    )
    plans = plan_fit.parse_report(report)
    assert [q.label for q in plans] == ["grid:2:mma:nb1:ks1:t256", "loop"]
    assert plans[0].us is None and plans[1].us == 30.0 and plans[0].model_us == 12.5
    assert plans[0].split["path"] == "grid" and plans[0].split["mtiles"] == 1.0


@pytest.mark.skipif(
    torch.cuda.is_available() and lltm._backends.is_available("fused", "cuda", "seq"),
    reason="collect runs here: the GPU suite's",
)
def test_collect_without_a_gpu_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        plan_fit.main(["collect", "--out", str(tmp_path / "trials.jsonl")])
    assert not (tmp_path / "trials.jsonl").exists()


def test_collect_names_an_unknown_precision(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        plan_fit.main(["collect", "--out", str(tmp_path / "trials.jsonl"), "--precisions", "fp16,fp32"])
    assert exit_info.value.code == 2
    assert "--precisions: fp32 unknown; use fp16, bf16, tf32, accurate, strict" in capsys.readouterr().err
    assert not (tmp_path / "trials.jsonl").exists()
