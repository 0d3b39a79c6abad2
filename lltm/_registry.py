"""The backends of lltm, written once.

Everything else derives from BACKENDS: the names (lltm.backends(), the
`backend=` argument, the command lines' choices and help), the order "auto"
tries them in, how availability is decided, the tests' parameters, the
benchmark's rows, and the build: the C++/CUDA source folders of each
compiled backend (lltm/_sources.py) and the list of compiled backends the C++
side registers schemas, autograd and autocast rules for, which the build
passes as -DLLTM_COMPILED_BACKENDS=aten:fused (lltm/csrc/backends.h) and
lltm/_extension.py checks against the loaded library.

Adding a backend: one entry here, and its kernel folder under lltm/csrc.

Imports nothing but the standard library: setup.py reads it (through
lltm/_sources.py) before lltm itself can be imported.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backend:
    name: str
    tutorial_name: str  # what PyTorch's extension tutorial (extension-cpp) calls it
    summary: str  # one line, for help texts
    # How lltm.backends() decides whether it runs on a device:
    #   "python"     always (pure PyTorch)
    #   "composite"  a CompositeExplicitAutograd kernel: every device torch supports
    #   "device"     a kernel registered for the device's dispatch key
    kernels: str
    auto_rank: int  # "auto" takes the first available, lowest rank first (fastest first)
    cpu_sources: tuple[str, ...] = ()  # globs under lltm/csrc, compiled in every build
    cuda_sources: tuple[str, ...] = ()  # globs under lltm/csrc, compiled in CUDA builds

    @property
    def compiled(self) -> bool:
        return self.kernels != "python"

    @property
    def devices(self) -> tuple[str, ...]:
        """Device types it has kernels for ("any" for ATen ops)."""
        if self.kernels != "device":
            return ("any",)
        return ("cpu",) * bool(self.cpu_sources) + ("cuda",) * bool(self.cuda_sources)


BACKENDS: tuple[Backend, ...] = (
    Backend(
        "python",
        "py",
        "pure PyTorch ops (lltm.reference); autograd derives backward",
        kernels="python",
        auto_rank=2,
    ),
    Backend(
        "aten",
        "cpp",
        "C++ forward and backward written with ATen ops, any device",
        kernels="composite",
        auto_rank=1,
        cpu_sources=("aten/*.cpp",),
    ),
    Backend(
        "fused",
        "cuda",
        "hand-written fused kernels: CUDA on GPU, vectorised C++ on CPU",
        kernels="device",
        auto_rank=0,
        cpu_sources=("cpu/*.cpp",),
        # kernels, and the host-only planner and graph cache beside them
        cuda_sources=("cuda/*.cu", "cuda/*.cpp"),
    ),
)

BY_NAME: dict[str, Backend] = {b.name: b for b in BACKENDS}
NAMES: tuple[str, ...] = tuple(BY_NAME)
COMPILED: tuple[str, ...] = tuple(b.name for b in BACKENDS if b.compiled)
AUTO_ORDER: tuple[str, ...] = tuple(b.name for b in sorted(BACKENDS, key=lambda b: b.auto_rank))
TUTORIAL_NAMES: dict[str, str] = {b.tutorial_name: b.name for b in BACKENDS}

# Sources every build compiles besides the backends' folders: the schemas,
# argument checks, autograd and autocast of csrc/*.cpp (csrc/*.cu in CUDA builds).
COMMON_CPU_SOURCES = ("*.cpp",)
COMMON_CUDA_SOURCES = ("*.cu",)


def choose_hint(name: str, available: str = "") -> str:
    """The end of an unknown-backend message: the choices (then `available`,
    if given), and what the tutorial's name means here when `name` is one of
    the tutorial's."""
    hint = f"choose 'auto' or one of {', '.join(map(repr, NAMES))}{available}"
    if name in TUTORIAL_NAMES:
        hint += f". The tutorial's {name!r} backend is lltm's {TUTORIAL_NAMES[name]!r}"
    return hint


def help_text() -> str:
    """One line per backend, for --help."""
    return "; ".join(f"{b.name}: {b.summary}" for b in BACKENDS)


def compiled_define() -> str:
    """The compile definition that gives the C++ side its list (backends.h)."""
    return "-DLLTM_COMPILED_BACKENDS=" + ":".join(COMPILED)
