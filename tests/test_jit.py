"""The just-in-time build: LLTM_JIT=1 compiles the package's sources with
torch.utils.cpp_extension.load into TORCH_EXTENSIONS_DIR, says once whether
it compiled or loaded the cached build, and gives the same results as the
reference. A lock file left by a killed build is removed (no hang), and a
truncated or garbage cached library is rebuilt (no SIGBUS, no silent fallback
to python)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from lltm import _extension

SCRIPT = textwrap.dedent(
    """
    import torch, lltm
    from lltm import functional, _extension
    from lltm.reference import lltm_cell_reference
    torch.manual_seed(0)
    args = [torch.randn(3, 4, dtype=torch.float64, requires_grad=True),
            torch.randn(15, 9, dtype=torch.float64, requires_grad=True),
            torch.randn(15, dtype=torch.float64, requires_grad=True),
            torch.randn(3, 5, dtype=torch.float64, requires_grad=True),
            torch.randn(3, 5, dtype=torch.float64, requires_grad=True)]
    got = functional.lltm_cell(*args, backend="aten")
    want = lltm_cell_reference(*args)
    torch.testing.assert_close(got, want)
    assert torch.autograd.gradcheck(lambda *a: functional.lltm_cell(*a, backend="aten"), args)
    functional.lltm_cell(*args, backend="aten")  # second use: no second build message
    print("mode", _extension.loaded_mode())
    from lltm import cli
    cli.main(["info"])
    """
)


def _run(tmp_path, timeout=1200):
    # LLTM_JIT_OPT=0 (-O0, no debug info): the build of `make test` compiles
    # every source at -O3 already; what this file tests is the just-in-time
    # path (the cache, its lock, a damaged library), and at -O0 without debug
    # info it builds the same sources fastest (2-core Intel Xeon, two jobs:
    # 121 s, against 148 s with DEBUG=1's -O0 -g).
    env = dict(
        os.environ,
        LLTM_JIT="1",
        LLTM_JIT_OPT="0",
        TORCH_EXTENSIONS_DIR=str(tmp_path),
        USE_CUDA="0",
        MAX_JOBS=os.environ.get("MAX_JOBS", "2"),
    )
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "mode jit" in proc.stdout
    # `lltm info` names the level, which decides the CPU kernels' speed
    assert "build mode: just in time (torch.utils.cpp_extension.load), C++ only, C++ -O0\n" in proc.stdout
    return [line for line in proc.stderr.splitlines() if line.startswith("lltm:")]


@pytest.mark.slow
def test_jit_build_cache_lock_and_damaged_library(tmp_path):
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler")
    build_dir = tmp_path / "lltm_jit_cpu"
    library = build_dir / "lltm_jit_cpu.so"

    # 1. First use compiles, and says so once, naming the cache.
    messages = [m for m in _run(tmp_path) if "just in time" in m]
    assert len(messages) == 1, messages
    assert "prebuilt extension lltm._C ignored (LLTM_JIT=1); compiling C++ sources just in time" in messages[0]
    assert str(tmp_path) in messages[0]
    assert library.is_file()

    # 2. Second use loads the cached build and says that instead.
    messages = _run(tmp_path)
    assert len(messages) == 1 and "loaded the just-in-time build cached under" in messages[0], messages
    assert "compiling" not in messages[0]

    # 3. A lock file left by a killed build: removed with a warning (torch's own wait never ends).
    (build_dir / "lock").write_text("")
    messages = _run(tmp_path, timeout=300)
    assert any(
        f"removing {build_dir / 'lock'}, left by a just-in-time build that did not finish" in m for m in messages
    )
    assert not (build_dir / "lock").exists()

    # 4. A truncated library (dlopen would SIGBUS) and 5. a garbage one are rebuilt.
    for damage in (library.read_bytes()[: library.stat().st_size // 2], b"not a library" * 100):
        library.write_bytes(damage)
        messages = _run(tmp_path, timeout=600)
        assert any("is damaged (truncated or not a shared library); rebuilding" in m for m in messages), messages
        assert _extension._elf_intact(str(library))


def test_elf_check(tmp_path):
    """The check that guards dlopen: a whole library passes, a cut or foreign one does not."""
    whole = next((p for p in sys.modules["lltm"].__spec__.submodule_search_locations), None)
    libs = [os.path.join(whole, f) for f in os.listdir(whole) if f.startswith("_C") and f.endswith(".so")]
    if not libs:
        pytest.skip("no prebuilt lltm._C to read")
    data = open(libs[0], "rb").read()
    assert _extension._elf_intact(libs[0])
    for name, content in (("half.so", data[: len(data) // 2]), ("last.so", data[:-1]), ("text.so", b"x" * 4096)):
        path = tmp_path / name
        path.write_bytes(content)
        assert not _extension._elf_intact(str(path)), name
