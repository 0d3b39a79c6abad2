"""Where the extension's sources are and how they are compiled.

Shared by setup.py (ahead-of-time build) and lltm/_extension.py (just-in-time
build) so both modes compile the same files with the same flags. Imports
nothing but the standard library: setup.py loads this file by path.
"""

from __future__ import annotations

import glob
import os

CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")

# One folder per backend; csrc/*.cpp holds the schemas, checks and autograd.
CPU_SOURCE_GLOBS = ("*.cpp", "aten/*.cpp", "cpu/*.cpp")
CUDA_SOURCE_GLOBS = ("cuda/*.cu", "cuda/*.cpp")


def sources(with_cuda: bool) -> list[str]:
    """Absolute paths of the sources to compile, sorted for stable builds."""
    globs = CPU_SOURCE_GLOBS + (CUDA_SOURCE_GLOBS if with_cuda else ())
    found: list[str] = []
    for pattern in globs:
        found.extend(sorted(glob.glob(os.path.join(CSRC, pattern))))
    return found


def cxx_flags(with_cuda: bool, debug: bool) -> list[str]:
    flags = ["-O0", "-g"] if debug else ["-O3"]
    if with_cuda:
        flags.append("-DLLTM_WITH_CUDA")
    return flags


def nvcc_flags(debug: bool) -> list[str]:
    flags = ["-DLLTM_WITH_CUDA", "--expt-relaxed-constexpr", "-lineinfo"]
    flags += ["-O0", "-G"] if debug else ["-O3"]
    return flags
