"""The time-loop planner's host code (lltm/csrc/cuda/seq_plan.cpp) compiled alone with the C++ compiler
against torch's headers and run over a grid of problems with an H200's limits (tests/data/held_plans.cpp):
every persistent split it offers whose warps hold the MMA dot's A fragments fits the held kernels
(held_split_fits, which the launch checks before it runs a plan), and splits built not to fit are refused.
Needs no GPU and no CUDA toolkit."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torch.utils import cpp_extension

ROOT = Path(__file__).resolve().parents[1]
CXX = shutil.which(os.environ.get("CXX", "c++"))


@pytest.fixture(scope="module")
def held_plans(tmp_path_factory) -> str:
    if CXX is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path_factory.mktemp("planner") / "held_plans"
    lib = Path(torch.__file__).parent / "lib"
    cmd = [CXX, "-std=c++20", "-O1", f"-I{ROOT / 'lltm' / 'csrc' / 'cuda'}"]
    cmd += [f"-I{p}" for p in cpp_extension.include_paths()]
    cmd += [str(ROOT / "tests" / "data" / "held_plans.cpp"), str(ROOT / "lltm" / "csrc" / "cuda" / "seq_plan.cpp")]
    cmd += [f"-L{lib}", "-lc10", f"-Wl,-rpath,{lib}", "-o", str(exe)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLTM_")}  # the planner's settings unset
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True, env=env).stdout


def test_every_held_split_the_planner_offers_fits(held_plans):
    m = re.search(r"^plans (\d+) held (\d+) backward (\d+) refused (\d+)$", held_plans, re.M)
    assert m is not None, held_plans
    plans, held, held_backward, refused = map(int, m.groups())
    assert plans > 1000 and held > 100 and held_backward > 50, held_plans  # the grid reaches the held plans
    assert refused == 0, held_plans


@pytest.mark.parametrize(
    "case,refused",
    [
        ("fits", 0),
        ("past_fragments", 1),  # all held, but a task's k steps run past its fragments
        ("past_fragments_part", 0),  # the same split part-held reads the rest from shared memory
        ("two_b_tiles", 1),
        ("tasks_past_warps", 1),
        ("backward", 0),  # one tile: every k step of each gate segment held
        ("backward_four_gates", 0),  # 4 gates: 24 fragments, each segment's 6 k steps
        ("backward_past_fragments", 1),  # 4 gates: 6 of each segment's 8 k steps
        ("backward_part", 0),
        ("backward_segments_past_fragments", 1),  # not a k step of each of 19 segments
        ("backward_tiles_past_fragments", 1),  # 3 tiles a task: 2 of 6 k steps held, not part-held
        ("float", 1),
        ("two_rows", 1),
    ],
)
def test_splits_the_held_kernels_cannot_run_are_refused(held_plans, case, refused):
    assert f"refused {case} {refused}\n" in held_plans, held_plans
