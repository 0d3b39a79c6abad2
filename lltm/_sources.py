"""Where the extension's sources are and how they are compiled.

Shared by setup.py (ahead-of-time build) and lltm/_extension.py (just-in-time
build) so both modes compile the same files with the same flags and the
same USE_CUDA rule. The folders and the list of compiled backends come from
lltm/_registry.py. Imports nothing but the standard library at the top:
setup.py loads this file by path.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(HERE, "csrc")

# Ahead-of-time builds without TORCH_CUDA_ARCH_LIST compile for every
# supported GPU (A100, RTX 30, L4 / RTX 40, H100) plus PTX for newer ones,
# instead of torch's default (the GPUs of the build machine, or all of
# torch's own list when it sees none). Just-in-time builds keep torch's
# default: they run where they are built.
CUDA_ARCH_LIST_DEFAULT = "8.0;8.6;8.9;9.0+PTX"


def default_cuda_arch_list(environ=os.environ) -> str:
    """Sets TORCH_CUDA_ARCH_LIST in `environ` to CUDA_ARCH_LIST_DEFAULT
    unless it is set; returns the list the build will use."""
    return environ.setdefault("TORCH_CUDA_ARCH_LIST", CUDA_ARCH_LIST_DEFAULT)


def _load_registry():
    if __package__:  # imported as lltm._sources
        from lltm import _registry

        return _registry
    # Loaded by path from setup.py, before the lltm package can be imported.
    spec = importlib.util.spec_from_file_location("lltm_registry", os.path.join(HERE, "_registry.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


_registry = _load_registry()


def source_globs(with_cuda: bool) -> tuple[str, ...]:
    """Globs under csrc: the common sources, then each compiled backend's folders."""
    globs = _registry.COMMON_CPU_SOURCES + (_registry.COMMON_CUDA_SOURCES if with_cuda else ())
    for backend in _registry.BACKENDS:
        globs += backend.cpu_sources + (backend.cuda_sources if with_cuda else ())
    return globs


def sources(with_cuda: bool) -> list[str]:
    """Absolute paths of the sources to compile, sorted for stable builds."""
    globs = source_globs(with_cuda)
    found: list[str] = []
    for pattern in globs:
        found.extend(sorted(glob.glob(os.path.join(CSRC, pattern))))
    return found


def want_cuda() -> bool:
    """Build the CUDA sources? USE_CUDA=0|1 decides; by default yes when torch
    is a CUDA build and a CUDA toolkit is found. (torch is imported here, not
    at the top: setup.py loads this file before anything else.)"""
    flag = os.environ.get("USE_CUDA")
    if flag is not None:
        return flag not in ("0", "", "false", "OFF")
    import torch
    from torch.utils import cpp_extension

    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def headers() -> list[str]:
    """Absolute paths of the headers the sources include: a change to one
    must rebuild too (setup.py passes them as `depends`)."""
    found: list[str] = []
    for pattern in ("*.h", "*/*.h", "*/*.cuh"):
        found.extend(sorted(glob.glob(os.path.join(CSRC, pattern))))
    return found


def openmp_flags() -> list[str]:
    """Compile and link flags for OpenMP, where the compiler has it (GCC or
    Clang on Linux). ATen's at::parallel_for is a header template that runs
    its loop on torch's threads only when the file that instantiates it is
    compiled with OpenMP, as torch's own sources are; without the flag every
    parallel loop of the extension runs on one thread. The library then uses
    the libgomp that torch has already loaded (same soname)."""
    return ["-fopenmp"] if sys.platform.startswith("linux") else []


JIT_OPT_LEVELS = ("0", "1", "2", "3")


def jit_opt_level(environ=os.environ) -> int:
    """The C++ compiler's -O for what is compiled just in time (LLTM_JIT=1 builds and the cells of
    lltm.cells.define): LLTM_JIT_OPT, default 3 as in the ahead-of-time build. Lower levels compile
    in a fraction of the time and run the fused CPU kernels slower (docs/cells.md: 36 s and 1.6x
    at 1, 17 s and 35-50x at 0, against 66 s at 3): for iterating on a cell, and for the tests.
    The CUDA kernels keep -O3."""
    value = environ.get("LLTM_JIT_OPT", "3").strip()
    if value not in JIT_OPT_LEVELS:
        raise ValueError(
            f"LLTM_JIT_OPT={value!r}: the C++ optimisation level of just-in-time builds is one of 0, 1, 2, 3"
        )
    return int(value)


def cxx_flags(with_cuda: bool, debug: bool, opt: int = 3) -> list[str]:
    # -g0: setuptools puts Python's own CFLAGS, -g among them, before these; the kernels' debug
    # info costs a quarter of the build's compile time (two fifths at -O0) and only a debugger
    # reads it, which is what DEBUG=1 builds are for (torchvision's release builds drop it too)
    flags = ["-O0", "-g"] if debug else [f"-O{opt}", "-g0"]
    if sys.platform != "win32":
        # torch's vectorised CPU headers carry nvcc's `#pragma unroll` and
        # clang's diagnostic pragmas, which -Wall has GCC report at every
        # include (torch builds itself with this flag too); and the
        # per-capability files pass and return its vector types in AVX
        # registers, which GCC notes as an ABI change (they live in the
        # capability's namespace, called only by code built for it)
        flags += ["-Wno-unknown-pragmas", "-Wno-psabi"]
    flags += openmp_flags()
    flags.append(_registry.compiled_define())
    if with_cuda:
        flags.append("-DLLTM_WITH_CUDA")
    return flags


def link_flags() -> list[str]:
    return openmp_flags()


@functools.lru_cache(maxsize=None)
def nvcc_release() -> tuple[int, int] | None:
    """(major, minor) of the nvcc the build will run (torch's CUDA_HOME), or
    None where there is none or its version cannot be read."""
    from torch.utils.cpp_extension import CUDA_HOME

    nvcc = os.path.join(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else shutil.which("nvcc")
    if not nvcc:
        return None
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"release (\d+)\.(\d+)", out)
    return (int(found.group(1)), int(found.group(2))) if found else None


def nvcc_flags(debug: bool) -> list[str]:
    flags = ["-DLLTM_WITH_CUDA", _registry.compiled_define(), "--expt-relaxed-constexpr", "-lineinfo"]
    flags += ["-O0", "-G"] if debug else ["-O3"]
    if (nvcc_release() or (0, 0)) >= (12, 8):
        # The grid path's multicast copies are Hopper code that the planner
        # runs on sm_90 only; ptxas (12.8 on) advises sm_90a for them once
        # per kernel, for the sake of later GPUs that never run them.
        flags.append("-Xptxas=--suppress-async-bulk-multicast-advisory-warning")
    if os.environ.get("LLTM_STEP_CLOCKS") == "1":
        # Profiling build: the persistent kernels print the cycles of each phase of a step.
        flags.append("-DLLTM_STEP_CLOCKS")
    return flags
