"""What an ahead-of-time build compiles for (setup.py with lltm/_sources.py)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest
import torch
from torch.utils import cpp_extension

from lltm import _sources


def test_default_cuda_arch_list_covers_every_supported_gpu(monkeypatch):
    """Without TORCH_CUDA_ARCH_LIST the CUDA build has machine code for
    sm_80, sm_86, sm_89 and sm_90 and compute_90 PTX for newer GPUs, as
    torch's flag builder reads the list setup.py sets; a list the user sets
    is kept."""
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    assert _sources.default_cuda_arch_list(os.environ) == "8.0;8.6;8.9;9.0+PTX"
    try:
        flags = cpp_extension._get_cuda_arch_flags()
    except Exception as exc:  # noqa: BLE001 (a torch without the private helper)
        pytest.skip(f"torch's arch flag builder is not available: {exc}")
    for arch in ("80", "86", "89", "90"):
        assert f"-gencode=arch=compute_{arch},code=sm_{arch}" in flags
    assert "-gencode=arch=compute_90,code=compute_90" in flags
    env = {"TORCH_CUDA_ARCH_LIST": "9.0"}
    assert _sources.default_cuda_arch_list(env) == "9.0"


def test_jit_opt_level_is_the_cxx_level_of_just_in_time_builds():
    """LLTM_JIT_OPT (default 3, as the ahead-of-time build) is the C++ -O of LLTM_JIT=1 builds and of
    defined cells, without debug info; DEBUG=1 still means -O0 -g; any other value is refused with
    the variable's name and its choices."""
    assert _sources.jit_opt_level({}) == 3
    for level in range(4):
        assert _sources.jit_opt_level({"LLTM_JIT_OPT": str(level)}) == level
        assert _sources.cxx_flags(False, False, level)[:2] == [f"-O{level}", "-g0"]
    assert _sources.cxx_flags(False, False)[:2] == ["-O3", "-g0"]
    assert _sources.cxx_flags(False, True, 3)[:2] == ["-O0", "-g"]
    for bad in ("4", "-1", "fast", "O2", ""):
        with pytest.raises(ValueError, match=r"LLTM_JIT_OPT=.*: .* one of 0, 1, 2, 3"):
            _sources.jit_opt_level({"LLTM_JIT_OPT": bad})


def test_every_source_file_is_built():
    """A CUDA build compiles every .cpp and .cu file under lltm/csrc, a CPU build every one outside the
    CUDA-only places (lltm/csrc/cuda/ and the .cu files), so a new file in a backend's folder cannot be
    left out of the library (its symbols would be missing at load time)."""
    import glob

    every = {
        os.path.relpath(p, _sources.CSRC)
        for ext in ("cpp", "cu")
        for p in glob.glob(os.path.join(_sources.CSRC, "**", f"*.{ext}"), recursive=True)
    }
    cuda_only = {p for p in every if p.endswith(".cu") or p.startswith("cuda" + os.sep)}
    assert {os.path.relpath(p, _sources.CSRC) for p in _sources.sources(True)} == every
    assert {os.path.relpath(p, _sources.CSRC) for p in _sources.sources(False)} == every - cuda_only


@pytest.mark.parametrize(
    "banner, release",
    [
        ("Cuda compilation tools, release 13.0, V13.0.88\n", (13, 0)),
        ("Cuda compilation tools, release 12.4, V12.4.131\n", (12, 4)),
        ("no version here\n", None),
    ],
)
def test_nvcc_release_and_the_multicast_advisory_flag(tmp_path, monkeypatch, banner, release):
    """The build reads nvcc's release from the nvcc it will run, and passes
    ptxas the flag that silences its sm_90a advisory for the multicast
    copies only from 12.8, where ptxas has it (an older ptxas would reject
    it); no readable nvcc, no flag."""
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(f"#!/bin/sh\nprintf '{banner}'\n")
    nvcc.chmod(0o755)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(tmp_path))
    _sources.nvcc_release.cache_clear()
    try:
        assert _sources.nvcc_release() == release
        flag = "-Xptxas=--suppress-async-bulk-multicast-advisory-warning"
        assert (flag in _sources.nvcc_flags(False)) == (release is not None and release >= (12, 8))
    finally:
        _sources.nvcc_release.cache_clear()


@pytest.mark.parametrize("name", ["grid_exchange_probe.cu", "grid_step_probe.cu", "tf32_split_probe.cu"])
def test_probe_compiles(tmp_path, name):
    """The scripts/ probes behind measured decisions (docs/benchmarks-history.md: the grid and
    cluster exchanges, sections 50-52, and tagged words, section 63; the grid step in one part and two, section 59; the
    split-TF32 dot's error and cost, section 52) still compile for sm_90 with the toolkit's nvcc,
    so a rerun on a GPU does not start with a repair."""
    nvcc = shutil.which("nvcc") or (
        os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc") if cpp_extension.CUDA_HOME else None
    )
    if not nvcc or not os.access(nvcc, os.X_OK):
        pytest.skip("no nvcc")
    probe = os.path.join(os.path.dirname(__file__), "..", "scripts", name)
    done = subprocess.run(
        [nvcc, "-arch=sm_90", "-O3", "-std=c++17", "-c", probe, "-o", str(tmp_path / "probe.o")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_ozaki_probe(capsys, monkeypatch):
    """scripts/ozaki_probe.py (docs/benchmarks-history.md section 57): its int8-slice product is
    exact up to its slices (five a side: float32's product to float32's rounding; fewer: a larger
    error, in order), every slice fits int8, and a short run prints each mode's row."""
    path = os.path.join(os.path.dirname(__file__), "..", "scripts", "ozaki_probe.py")
    spec = importlib.util.spec_from_file_location("ozaki_probe", path)
    probe = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "ozaki_probe", probe)  # its dataclass looks itself up there
    spec.loader.exec_module(probe)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(24, 40, generator=gen) * torch.logspace(-3, 3, 40)  # columns of every scale
    b = torch.randn(40, 16, generator=gen)
    exact = a.double() @ b.double()
    scale = a.double().abs() @ b.double().abs()  # the size of each sum's terms

    def error(left: int, right: int, cutoff: int) -> float:
        got = probe.ozaki_mm(a, b, probe.Ozaki(left, right, cutoff)).double()
        return ((got - exact).abs() / scale).max().item()

    assert error(5, 5, 6) < 2.0**-23  # the dropped terms are below 2^-35 of a row's scale
    assert error(5, 5, 6) < error(4, 4, 5) < error(3, 3, 4)
    assert probe.Ozaki(4, 4, 5).products == 10 and probe.Ozaki(3, 4, 5).products == 9
    pieces, _ = probe._slices(a.double(), 1, 4)
    assert all(p.abs().max() <= 127 and torch.equal(p, p.round()) for p in pieces)
    assert probe.main(["--steps", "3", "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "| strict fp32 | " in out and "4x4, s+t<=5 (10)" in out and "T = 3, strict fp32: 1.00 - 1.00" in out
