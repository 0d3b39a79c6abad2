"""Loads the compiled extension: the prebuilt lltm._C, or a just-in-time build.

Ahead of time, `pip install --no-build-isolation .` compiles lltm._C and
`import lltm` loads it. When it is absent (or LLTM_JIT=1), the first use of a
compiled backend compiles the same sources with torch.utils.cpp_extension.load,
cached under TORCH_EXTENSIONS_DIR, and logs one line saying whether it
compiled or loaded the cached build. A lock file left by a killed build and a
damaged cached library are repaired instead of hanging or crashing.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Optional

import torch

from lltm import _registry, _sources

log = logging.getLogger("lltm")

_mode: Optional[str] = None  # "aot" | "jit" once loaded
_error: Optional[str] = None  # why loading failed, once tried
_jit_build: Optional[_JitBuild] = None  # the just-in-time build this process configured, once tried

BUILD_HINT = (
    "build it ahead of time with `pip install --no-build-isolation .` "
    "(needs a C++ compiler; nvcc for the CUDA kernels), or let lltm build it "
    "just in time (needs a C++ compiler and ninja)"
)


def _elf_intact(path: str) -> bool:
    """True when `path` looks like a whole ELF shared library: the magic,
    and every program segment and the section header table inside the
    file. A truncated library would otherwise be mapped by dlopen and kill
    the process with SIGBUS on first touch of a missing page."""
    import struct

    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit ELF only
                return False
            endian = "<" if head[5] == 1 else ">"
            (phoff, shoff) = struct.unpack_from(endian + "QQ", head, 32)
            (phentsize, phnum, shentsize, shnum) = struct.unpack_from(endian + "HHHH", head, 54)
            if shoff + shentsize * shnum > size or phoff + phentsize * phnum > size:
                return False
            f.seek(phoff)
            table = f.read(phentsize * phnum)
        for i in range(phnum):
            (offset,) = struct.unpack_from(endian + "Q", table, i * phentsize + 8)
            (filesz,) = struct.unpack_from(endian + "Q", table, i * phentsize + 32)
            if offset + filesz > size:
                return False
        return True
    except (OSError, struct.error):
        return False


def _remove_stale_lock(build_dir: str) -> None:
    """torch's JIT build marks a build in progress with a file `lock` that a
    killed build leaves behind, and then every later load waits on it for
    ever. Called while holding lltm's own flock on the folder: no live lltm
    process is building there, so the file is stale and is removed."""
    lock = os.path.join(build_dir, "lock")
    if os.path.exists(lock):
        log.warning("lltm: removing %s, left by a just-in-time build that did not finish", lock)
        try:
            os.remove(lock)
        except FileNotFoundError:
            pass


class _BuildLock:
    """An exclusive flock on <build dir>/lltm.flock for the whole build and
    load. The kernel releases it when its holder dies, so, unlike torch's
    lock file, it can never be left stale; while it is held, torch's lock file
    is either ours or stale. Where flock is missing (Windows) it does nothing
    and the stale file is reported instead of removed."""

    def __init__(self, build_dir: str) -> None:
        self.path = os.path.join(build_dir, "lltm.flock")
        self.file = None

    def __enter__(self) -> bool:
        try:
            import fcntl
        except ImportError:
            return False
        self.file = open(self.path, "a")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning(
                "lltm: waiting for another process that builds lltm just in time in %s", os.path.dirname(self.path)
            )
            fcntl.flock(self.file, fcntl.LOCK_EX)
        return True

    def __exit__(self, *exc) -> None:
        if self.file is not None:
            self.file.close()  # releases the flock


def _newest_source_mtime(paths: list[str]) -> float:
    return max(os.path.getmtime(p) for p in paths + _sources.headers())


@dataclass(frozen=True)
class _JitBuild:
    """What a just-in-time build compiles, with which flags, and where."""

    name: str
    sources: list[str]
    with_cuda: bool
    debug: bool
    opt: int  # the C++ -O (LLTM_JIT_OPT)
    build_dir: str

    @property
    def library(self) -> str:
        return os.path.join(self.build_dir, self.name + ".so")

    @property
    def what(self) -> str:
        return "C++ and CUDA sources" if self.with_cuda else "C++ sources"

    @staticmethod
    def configure() -> _JitBuild:
        from torch.utils import cpp_extension

        with_cuda = _sources.want_cuda()
        name = "lltm_jit_cuda" if with_cuda else "lltm_jit_cpu"
        return _JitBuild(
            name=name,
            sources=_sources.sources(with_cuda),
            with_cuda=with_cuda,
            debug=os.environ.get("DEBUG", "0") == "1",
            opt=_sources.jit_opt_level(),
            build_dir=cpp_extension._get_build_directory(name, False),
        )

    def compile_and_load(self) -> None:
        """torch's JIT build: ninja recompiles what is older than its sources
        (or whose flags changed), then the library is loaded."""
        from torch.utils import cpp_extension

        cpp_extension.load(
            name=self.name,
            sources=self.sources,
            extra_cflags=_sources.cxx_flags(self.with_cuda, self.debug, self.opt),
            extra_cuda_cflags=_sources.nvcc_flags(self.debug) if self.with_cuda else None,
            extra_ldflags=_sources.link_flags(),
            with_cuda=self.with_cuda,
            is_python_module=False,
            build_directory=self.build_dir,
            verbose=os.environ.get("LLTM_JIT_VERBOSE") == "1",
        )


def _repair_cache(build: _JitBuild, locked: bool) -> None:
    """What a killed build or a damaged file left in the cache: torch's stale
    lock file (removed only while holding our flock) and a library that is
    not a whole shared library."""
    lock = os.path.join(build.build_dir, "lock")
    if locked:
        _remove_stale_lock(build.build_dir)
    elif os.path.exists(lock):
        log.warning("lltm: %s exists; if no build is running, remove it (a killed build left it)", lock)
    if os.path.exists(build.library) and not _elf_intact(build.library):
        log.warning(
            "lltm: the cached library %s is damaged (truncated or not a shared library); rebuilding", build.library
        )
        os.remove(build.library)


def _compile_and_load_once_more_if_refused(build: _JitBuild) -> None:
    try:
        build.compile_and_load()
    except OSError as exc:  # dlopen refused the cached library: rebuild it once
        if not os.path.exists(build.library):
            raise
        log.warning("lltm: the cached library %s could not be loaded (%s); rebuilding", build.library, exc)
        os.remove(build.library)
        build.compile_and_load()


def _load_jit() -> None:
    """Compiles (when needed) and loads the just-in-time build, saying once
    whether it compiled or loaded the cached library."""
    global _jit_build
    build = _jit_build = _JitBuild.configure()
    why = "ignored (LLTM_JIT=1)" if os.environ.get("LLTM_JIT") == "1" else "not found"
    with _BuildLock(build.build_dir) as locked:
        _repair_cache(build, locked)
        before = os.path.getmtime(build.library) if os.path.exists(build.library) else None
        # ninja rebuilds when a source is newer than the library (or flags changed).
        announced = before is None or before < _newest_source_mtime(build.sources)
        if announced:
            log.warning(
                "lltm: prebuilt extension lltm._C %s; compiling %s just in time with "
                "torch.utils.cpp_extension.load (cached under %s)",
                why,
                build.what,
                build.build_dir,
            )
        start = time.perf_counter()
        _compile_and_load_once_more_if_refused(build)
        seconds = time.perf_counter() - start
        after = os.path.getmtime(build.library)
    if before is not None and after == before:
        log.warning(
            "lltm: prebuilt extension lltm._C %s; loaded the just-in-time build cached under %s (%.1f s)",
            why,
            build.build_dir,
            seconds,
        )
    elif announced:
        log.warning("lltm: built %s in %.0f s", build.library, seconds)
    else:  # only the flags changed
        log.warning(
            "lltm: prebuilt extension lltm._C %s; compiled %s just in time in %.0f s (cached under %s)",
            why,
            build.what,
            seconds,
            build.build_dir,
        )


def _check_backends() -> None:
    """The loaded library registered the backends lltm/_registry.py lists
    (a library built from other sources, say an old lltm._C, may not)."""
    built = tuple(torch.ops.lltm._compiled_backends())
    if built != _registry.COMPILED:
        raise RuntimeError(
            f"the loaded library was built for the compiled backends {', '.join(built)}, but this lltm lists "
            f"{', '.join(_registry.COMPILED)} (lltm/_registry.py); rebuild it"
        )


def load() -> str:
    """Loads the operators (once) and returns the build mode, "aot" or "jit".

    Raises RuntimeError, saying how to build, when neither mode works.
    """
    global _mode, _error
    if _mode is not None:
        return _mode
    if _error is not None:
        raise RuntimeError(_error)
    try:
        if os.environ.get("LLTM_JIT") != "1":
            try:
                import lltm._C  # noqa: F401  (registers the operators)

                _mode = "aot"
            except ImportError:
                pass
        if _mode is None:
            _load_jit()
            _mode = "jit"
        _check_backends()
    except Exception as exc:  # compiler missing, build error, another list of backends, ...
        _mode = None
        _error = f"lltm: the compiled extension is not available ({exc}); {BUILD_HINT}"
        raise RuntimeError(_error) from exc
    from lltm import (
        _meta,  # noqa: F401  (fake kernels need the schemas)
        precision,
    )

    precision._push()  # lltm's float32 mode, if set before the library loaded
    return _mode


def try_load() -> Optional[str]:
    """Like load(), but returns None instead of raising."""
    try:
        return load()
    except RuntimeError:
        return None


def load_error() -> Optional[str]:
    return _error


def loaded_mode() -> Optional[str]:
    return _mode


def jit_cxx_level() -> Optional[str]:
    """The C++ -O the loaded just-in-time build was compiled at (LLTM_JIT_OPT, or DEBUG=1's
    "-O0 -g"); None for the ahead-of-time build."""
    if _mode != "jit":
        return None
    return "-O0 -g" if _jit_build.debug else f"-O{_jit_build.opt}"


def library_path() -> str:
    """The file of the loaded extension library (loading it first): lltm._C's,
    or the just-in-time build's. A cell of lltm.cells.define links against it."""
    mode = load()
    if mode == "aot":
        import lltm._C

        return os.path.abspath(lltm._C.__file__)
    return _jit_build.library


def build_info() -> dict[str, str]:
    """Key/value pairs the C++ side reports about how it was compiled."""
    load()
    pairs = (item.split("=", 1) for item in torch.ops.lltm._build_info().split())
    return dict(pairs)


def preload_prebuilt() -> None:
    """At import: load lltm._C if it is there (cheap), never compile."""
    global _mode, _error
    if os.environ.get("LLTM_JIT") == "1" or _mode is not None:
        return
    try:
        import lltm._C  # noqa: F401
    except ImportError:
        return
    try:
        _check_backends()
    except (RuntimeError, AttributeError) as exc:  # import lltm still works, without the compiled backends
        _error = f"lltm: the compiled extension is not available ({exc}); {BUILD_HINT}"
        return
    _mode = "aot"
    from lltm import (
        _meta,  # noqa: F401
        precision,
    )

    precision._push()
