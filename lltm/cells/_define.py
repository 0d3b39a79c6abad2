"""lltm.cells.define: a recurrent cell of the user's, compiled just in time
into the seam's kernels.

The user gives the cell's pointwise step twice: as C++ bodies (forward,
backward, optionally recompute) with the seam's signature (csrc/cells/cell.h),
and as a PyTorch function (the reference and the "python" backend). define()
writes a traits struct around the bodies, compiles it with the fused CPU
kernels and the ATen backend's templates, and on a GPU with the fused CUDA
kernels (cuda/rnn_cuda.cuh, the persistent kernels, for that GPU's
architecture only, in several files compiled in parallel), into a library of
its own (linked against lltm's, whose shared host code it reuses: cuBLAS
calls, graph replay, the planner), registers the cell's operators
lltm::fused_<name>_seq_* (CPU, and CUDA where built) and
lltm::aten_<name>_seq_* (any device) with fake kernels and autograd, and
returns the cell with its module classes. The build is cached under TORCH_EXTENSIONS_DIR, keyed by a hash of
everything it is built from, and guarded by a file lock, so that several
processes (torchrun ranks) starting at once compile it once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from lltm.cells import BUILT_IN, Cell

log = logging.getLogger("lltm")

__all__ = ["CellCompileError", "UserCell", "define", "defined"]

_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}\Z")
_STATE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# The cells defined in this process, by name (their operators cannot be registered twice).
_DEFINED: dict[str, "UserCell"] = {}
# Bumped when the generated source's contract changes (part of the cache key).
_SOURCE_VERSION = 4


class CellCompileError(RuntimeError):
    """The C++ body of a cell of lltm.cells.define did not compile: the compiler's messages
    about the user's lines, located as <cell>.<part>:<line> (forward, backward, recompute)."""


@dataclass(frozen=True, eq=False)
class UserCell(Cell):
    """A cell of lltm.cells.define: the seam's Cell plus what it was made from.

    step: the pointwise reference, step(zx, zh, state) -> next states (lists of (B, S) tensors:
    zx[g] = x W_ih[g]^T + b_ih[g], zh[g] = h W_hh[g]^T + b_hh[g]); source: the generated C++ (CPU
    and ATen operators); cuda_sources: the generated CUDA files by name (fused CUDA operators);
    built: whether its compiled operators are loaded (False: backend="python" only); cuda_arch:
    the GPU architecture its CUDA kernels were built for ("90"), None when they were not.
    Layer and Cell: its module classes, like torch.nn.LSTM / nn.LSTMCell.
    """

    step: Optional[Callable[..., Sequence[Tensor]]] = None
    source: str = ""
    built: bool = False
    cuda_sources: dict = field(default_factory=dict, repr=False)
    cuda_arch: Optional[str] = None

    @property
    def Layer(self) -> type:  # noqa: N802  (a class, named like one)
        from lltm.modules import layer_class

        return layer_class(self)

    @property
    def Cell(self) -> type:  # noqa: N802
        from lltm.modules import cell_class

        return cell_class(self)


def _same_function(a: Callable, b: Callable) -> bool:
    """The same reference: the object, or the same code (its file executed again, e.g. by
    lltm.cells.load in another part of a program)."""
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    return a is b or (code_a is not None and code_a == code_b and a.__qualname__ == b.__qualname__)


def defined() -> dict[str, UserCell]:
    """The cells defined in this process, by name."""
    return dict(_DEFINED)


def _full_step(step: Callable[..., Sequence[Tensor]], name: str, gates: int, num_states: int):
    """The seam's reference signature (input, state, weight_ih, weight_hh, bias_ih, bias_hh) around
    the user's pointwise step."""

    def reference(input, state, weight_ih, weight_hh, bias_ih, bias_hh):
        zx = F.linear(input, weight_ih, bias_ih).chunk(gates, dim=-1)
        zh = F.linear(state[0], weight_hh, bias_hh).chunk(gates, dim=-1)
        out = step(list(zx), list(zh), list(state))
        if isinstance(out, Tensor):
            out = (out,)
        out = tuple(out)
        if len(out) != num_states or not all(isinstance(t, Tensor) for t in out):
            raise TypeError(
                f"lltm.cells.define({name!r}): reference must return the {num_states} next state(s) as "
                f"tensors, h first, but returned {type(out).__name__} of length {len(out)}"
            )
        return out

    return reference


def _mask(name: str, what: str, value: Optional[Sequence[str]], states: tuple[str, ...]) -> int:
    if value is None:
        return (1 << len(states)) - 1
    bits = 0
    for s in value:
        if s not in states:
            raise ValueError(f"lltm.cells.define({name!r}): {what} names {s!r}, which is not a state {states}")
        bits |= 1 << states.index(s)
    return bits


def _body(name: str, part: str, text: str) -> str:
    """The user's body, with #line so the compiler names their own lines: <name>.<part>:<line>."""
    if not isinstance(text, str) or not text.strip():
        raise TypeError(f"lltm.cells.define({name!r}): {part} must be a non-empty string of C++ statements")
    return f'#line 1 "{name}.{part}"\n{text.rstrip()}\n'


def _cell_struct(
    name: str,
    gates: int,
    states: tuple[str, ...],
    user_saved: int,
    split: bool,
    old_read: int,
    new_read: int,
    forward: str,
    backward: str,
    recompute: Optional[str],
) -> str:
    """The cell's traits struct (cells/cell.h) around the user's bodies: the same text in every
    file of its library."""
    ns = len(states)
    # Without a recompute body, the states other than h are saved after the user's values.
    saved = user_saved + (ns - 1 if recompute is None else 0)
    keep = "".join(f"    saved[{user_saved + k - 1}] = next[{k}];\n" for k in range(1, ns))
    if recompute is None:
        recompute_body = "".join(f"    next[{k}] = saved[{user_saved + k - 1}];\n" for k in range(1, ns))
        fwd_tail = keep
    else:
        recompute_body = _body(name, "recompute", recompute) + '#line 1 "<generated>"\n'
        fwd_tail = ""
    struct = _struct_name(name)
    line = '#line 1 "<generated>"\n'
    return f"""namespace lltm {{
namespace cells {{
namespace user {{

struct {struct} {{
  static constexpr const char* kName = "{name}";
  static constexpr int kGates = {gates};
  static constexpr int kStates = {ns};
  static constexpr int kSaved = {max(saved, 1)};
  static constexpr bool kSplit = {"true" if split else "false"};
  static constexpr unsigned kOldRead = {old_read}u;
  static constexpr unsigned kNewRead = {new_read}u;

  template <typename M, typename T>
  LLTM_CELL_FN void forward(const T (&zx)[kGates], const T (&zh)[kGates], const T (&s)[kStates],
                            T (&next)[kStates], T (&saved)[kSaved]) {{
    (void)zx; (void)zh; (void)s; (void)saved;
{_body(name, "forward", forward)}{line}{fwd_tail}  }}

  template <typename M, typename T>
  LLTM_CELL_FN void recompute(const T (&s)[kStates], const T (&saved)[kSaved], T (&next)[kStates]) {{
    (void)s; (void)saved; (void)next;
{recompute_body}  }}

  template <typename M, typename T>
  LLTM_CELL_FN void backward(const T (&dnext)[kStates], const T (&s)[kStates], const T (&next)[kStates],
                             const T (&saved)[kSaved], T (&dzx)[kGates], T (&dzh)[kGates], T (&ds)[kStates]) {{
    (void)dnext; (void)s; (void)next; (void)saved; (void)dzh;
{_body(name, "backward", backward)}{line}  }}
}};

}}  // namespace user
}}  // namespace cells
}}  // namespace lltm
"""


def _struct_name(name: str) -> str:
    return f"User_{name}"


def _generate(name: str, cell: str, capability: str) -> str:
    """The C++ source of the cell's CPU and ATen operators (and of its operators' schemas)."""
    struct = _struct_name(name)
    target = {"avx512": '#include "cpu/target_avx512.h"\n', "avx2": '#include "cpu/target_avx2.h"\n'}.get(
        capability, ""
    )
    return f"""// Generated by lltm.cells.define for the cell {name!r} (source version {_SOURCE_VERSION}).
#include "cpu/baseline_headers.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include "aten/rnn_aten.h"
#include "autograd_rnn.h"
#include "cells/cell.h"
#include "cpu/register.h"
#include "cpu/rnn_cpu.h"
#include "rnn.h"
#include "rnn_schema.h"

// The fused CPU kernels of this cell, for the CPU capability torch runs with ({capability}); the
// host code above keeps the baseline instruction set.
#define LLTM_ONE_CELL_BUILD 1
{target}#ifndef CPU_CAPABILITY
#define CPU_CAPABILITY DEFAULT
#endif
#include "cpu/step_kernels.h"

// The cell, after the instruction set switch: its code is inlined into the kernels.
{cell}
namespace lltm {{
namespace cpu {{
template <>
struct CellKernels<cells::user::{struct}> {{
  static Kernels get(c10::ScalarType dtype) {{ return CPU_CAPABILITY::kernels_of_cell<cells::user::{struct}>(dtype); }}
}};
}}  // namespace cpu
}}  // namespace lltm

namespace {{
using Cell = lltm::cells::user::{struct};

void register_fused(torch::Library& m) {{ lltm::register_rnn_ops<lltm::cpu::FusedCpu, Cell>(m); }}
}}  // namespace

TORCH_LIBRARY_FRAGMENT(lltm, m) {{
  lltm::define_rnn_ops(m, "fused", "{name}");
  lltm::define_rnn_ops(m, "aten", "{name}");
}}

TORCH_LIBRARY_IMPL(lltm, CompositeExplicitAutograd, m) {{ lltm::register_rnn_ops<lltm::aten_rnn::Aten, Cell>(m); }}

TORCH_LIBRARY_IMPL(lltm, Autograd, m) {{
  lltm::register_rnn_autograd<lltm::cpu::FusedCpu, Cell>(m);
  lltm::register_rnn_autograd<lltm::aten_rnn::Aten, Cell>(m);
}}

LLTM_REGISTER_CPU_KERNELS(register_fused)
"""


# The persistent kernels' dtypes: (file name part, C++ type), one file per direction and dtype.
_CUDA_DTYPES = (("double", "double"), ("float", "float"), ("half", "c10::Half"), ("bfloat16", "c10::BFloat16"))


def _generate_cuda(name: str, cell: str) -> dict[str, str]:
    """The CUDA sources of the cell's fused operators, by file name: a header with the cell (the
    same struct as the CPU source's), the host file (the layer code of cuda/rnn_cuda.cuh, the step
    loop's kernels, the persistent kernels' dispatch on the dtype, the registration of the CUDA
    operators and of the planner) and one file of persistent kernels per direction and dtype, so
    that the build compiles them in parallel (one file of them all takes 4 times as long)."""
    struct = f"lltm::cells::user::{_struct_name(name)}"
    head = f"// Generated by lltm.cells.define for the cell {name!r} (source version {_SOURCE_VERSION}).\n"
    header = f"{name}_cell.cuh"
    files = {header: head + '#pragma once\n\n#include "cells/cell.h"\n\n' + cell}
    files[f"{name}_cuda.cu"] = (
        head
        + f"""// The fused CUDA operators of the cell: the layer code (cuda/rnn_cuda.cuh) with the step
// loop's kernels, and the persistent kernels' dispatch on the dtype (their kernels are in
// {name}_persistent_<direction>_<dtype>.cu).
#include <torch/library.h>

#include "cuda/persistent_launch.cuh"
#include "cuda/rnn_cuda.cuh"
#include "cuda/seq_persistent.h"
#include "rnn_ops.h"
#include "{header}"

LLTM_PERSISTENT_EXTERN({struct})
LLTM_PERSISTENT_FORWARD({struct})
LLTM_PERSISTENT_BACKWARD({struct})

namespace {{
LLTM_REGISTER_CELL_PLAN({struct});
}}  // namespace

TORCH_LIBRARY_IMPL(lltm, CUDA, m) {{ lltm::register_rnn_ops<lltm::FusedCuda, {struct}>(m); }}
"""
    )
    for direction, backward in (("forward", "false"), ("backward", "true")):
        for dtype, scalar in _CUDA_DTYPES:
            files[f"{name}_persistent_{direction}_{dtype}.cu"] = (
                head
                + f"""// The {direction} persistent kernels of the cell in {dtype} (cuda/persistent_launch.cuh).
#include "cuda/persistent_launch.cuh"
#include "{header}"

LLTM_PERSISTENT_DTYPE({struct}, {backward}, {scalar})
"""
            )
    return files


def _cuda_arch() -> Optional[str]:
    """The architecture to compile a cell's CUDA kernels for ("90" on an H100), or None when they
    cannot be built here: no GPU, torch without CUDA, no CUDA toolkit, or lltm's library built
    without its CUDA kernels (whose host code the cell's link against)."""
    from torch.utils import cpp_extension

    if torch.version.cuda is None or cpp_extension.CUDA_HOME is None or not torch.cuda.is_available():
        return None
    try:
        has_cuda = torch._C._dispatch_has_kernel_for_dispatch_key("lltm::fused_lstm_seq_forward", "CUDA")
    except RuntimeError:
        return None
    if not has_cuda:
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"{major}{minor}"


_nvcc_version: Optional[str] = None


def _nvcc_version_text() -> str:
    """nvcc --version's last line (part of the cache key), read once."""
    global _nvcc_version
    if _nvcc_version is None:
        import subprocess

        from torch.utils import cpp_extension

        nvcc = os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")
        try:
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
            _nvcc_version = out.strip().splitlines()[-1] if out.strip() else "unknown"
        except (OSError, subprocess.SubprocessError):
            _nvcc_version = "unknown"
    return _nvcc_version


def _cpu_flags(debug: bool) -> list[str]:
    """The host compiler's flags for a cell's C++ source: lltm's own, at LLTM_JIT_OPT's level."""
    from lltm import _sources

    return _sources.cxx_flags(False, debug, _sources.jit_opt_level()) + ["-I" + _sources.CSRC]


def _cuda_flags(arch: str, debug: bool) -> list[str]:
    """nvcc's flags for a cell's CUDA sources: lltm's own, for the one architecture given (its
    cubin only: a cell is built where it runs)."""
    from lltm import _sources

    return _sources.nvcc_flags(debug) + ["-I" + _sources.CSRC, f"-gencode=arch=compute_{arch},code=sm_{arch}"]


def _compile_error(name: str, output: str) -> CellCompileError:
    """The compiler's messages about the user's lines (<name>.<part>:<line>), or its first errors."""
    # g++: <cell>.forward:2:13: error: ...   nvcc: <cell>.forward(2): error: ... (said as g++ says it)
    mine = re.compile(
        rf"^({re.escape(name)}\.(?:forward|backward|recompute))(?::(\d+)(?::\d+)?|\((\d+)\)): (error|warning)"
    )
    lines = output.splitlines()
    picked: list[str] = []
    seen: set[str] = set()
    for i, text in enumerate(lines):
        found = mine.match(text)
        if found:
            if found.group(3) is not None:
                text = f"{found.group(1)}:{found.group(3)}{text[found.end(3) + 1 :]}"
            if text in seen:  # the same message from another file of the build (each includes the cell)
                continue
            seen.add(text)
            picked.extend([text, *lines[i + 1 : i + 3]])  # the message, the compiler's echo of the line, its caret
    if not picked:  # an error elsewhere (in the kernels the body is inlined into): the compiler's first ones
        picked = [t for t in lines if "error" in t][:10] or lines[-20:]
    body = "\n".join(picked[:40])
    return CellCompileError(
        f"lltm.cells.define({name!r}): the cell's C++ did not compile (lines as <cell>.<part>:<line> of "
        f"your bodies):\n{body}"
    )


def _capability() -> str:
    """The CPU capability of the fused kernels; loads the extension first (a just-in-time build is
    not loaded by `import lltm`), or raises its RuntimeError saying how to build it."""
    from lltm import _extension

    _extension.load()
    return str(torch.ops.lltm._fused_cpu_capability())


def _build(name: str, source: str, cuda: Optional[dict[str, str]], arch: Optional[str], verbose: bool) -> None:
    """Compiles (unless cached) and loads the cell's library: the CPU source, and the CUDA sources
    (for the GPU architecture `arch`) when given."""
    from torch.utils import cpp_extension

    from lltm import _extension, _sources

    library = _extension.library_path()
    headers = sorted(_sources.headers())
    debug = os.environ.get("DEBUG", "0") == "1"
    key = hashlib.sha256()
    for part in (source, torch.__version__, library, str(os.path.getmtime(library)), str(os.path.getsize(library))):
        key.update(part.encode())
    for path in headers:
        with open(path, "rb") as f:
            key.update(f.read())
    flags = _cpu_flags(debug)
    key.update(" ".join(flags).encode())
    cuda_flags: list[str] = []
    if cuda:
        cuda_flags = _cuda_flags(arch, debug)
        for part in (*sorted(cuda.items()), " ".join(cuda_flags), _nvcc_version_text(), str(torch.version.cuda)):
            key.update(str(part).encode())
    ext_name = f"lltm_cell_{name}_{key.hexdigest()[:16]}"
    build_dir = cpp_extension._get_build_directory(ext_name, verbose)
    files = {f"{name}.cpp": source, **(cuda or {})}
    sources = [os.path.join(build_dir, f) for f in files if not f.endswith(".cuh")]
    with _extension._BuildLock(build_dir) as locked:
        if locked:
            _extension._remove_stale_lock(build_dir)
        lib = os.path.join(build_dir, ext_name + ".so")
        if os.path.exists(lib) and _extension._elf_intact(lib):
            # The folder's name is the hash of everything the library is built from, so a library
            # in it is this cell's: load it without asking ninja, whose check of nvcc's dependency
            # files can find the objects out of date and compile every CUDA file again.
            torch.ops.load_library(lib)
            return
        if os.path.exists(lib):
            os.remove(lib)
        for file, text in files.items():  # the folder's name is the hash of the content: written once
            with open(os.path.join(build_dir, file), "w") as f:
                f.write(text)
        what = f"with its CUDA kernels for sm_{arch}, " if cuda else ""
        log.warning("lltm: compiling cell %r just in time (%scached under %s)", name, what, build_dir)
        start = time.perf_counter()
        try:
            cpp_extension.load(
                name=ext_name,
                sources=sources,
                extra_cflags=flags,
                extra_cuda_cflags=cuda_flags or None,
                extra_ldflags=_sources.link_flags() + [library, "-Wl,-rpath," + os.path.dirname(library)],
                is_python_module=False,
                build_directory=build_dir,
                verbose=verbose,
            )
        except RuntimeError as exc:
            if "Error building extension" in str(exc):
                raise _compile_error(name, _build_log(exc)) from None
            raise
        log.warning("lltm: built cell %r in %.0f s", name, time.perf_counter() - start)


def cell_sources(cell: "UserCell", arch: str = "90") -> dict[str, tuple[str, list[str]]]:
    """The files lltm.cells.define compiles for `cell`, by name: (text, the compiler's flags
    beyond torch's own: lltm's, the include folder, and for the CUDA files the architecture
    `arch`). For reading and for compiling by hand (scripts/cell_sources.py); define() itself
    builds them."""
    out = {f"{cell.name}.cpp": (cell.source, _cpu_flags(False))}
    for file, text in cell.cuda_sources.items():
        out[file] = (text, [] if file.endswith(".cuh") else _cuda_flags(arch, False))
    return out


def _build_log(exc: RuntimeError) -> str:
    """The compiler output torch's build error carries (its message, or the chained ninja error's)."""
    parts = [str(exc)]
    cause = exc.__cause__ or exc.__context__
    while cause is not None:
        parts.append(getattr(cause, "output", None) or str(cause))
        if isinstance(parts[-1], bytes):
            parts[-1] = parts[-1].decode(errors="replace")
        cause = cause.__cause__ or cause.__context__
    return "\n".join(parts)


def define(
    name: str,
    *,
    gates: int,
    states: Sequence[str],
    forward: str,
    backward: str,
    reference: Callable[..., Sequence[Tensor]],
    saved: int = 0,
    recompute: Optional[str] = None,
    split: bool = False,
    reads_old: Optional[Sequence[str]] = None,
    reads_new: Optional[Sequence[str]] = None,
    gate_names: Optional[Sequence[str]] = None,
    build: Union[bool, str] = True,
    verbose: bool = False,
) -> UserCell:
    """A recurrent cell of your own on lltm's kernels (see docs/cells.md for a walkthrough).

    name: lower-case identifier (its operators are lltm::<backend>_<name>_seq_*);
    gates: G, the blocks of G * hidden_size rows of weight_ih / weight_hh;
    states: the carried states' names, h first (the output is h);
    forward, backward (and recompute): C++ statements, the seam's pointwise step for one unit,
    one source for every backend (csrc/cells/cell.h). They see T (the value type: a float, a
    CPU vector or a tensor), M (math: M::sigmoid, M::tanh, M::exp, M::expm1, M::elu,
    M::where_gt(x, y, a, b), M::fma(a, b, c)) and T(c) for constants, and these arrays:
      forward:   zx[G], zh[G], s[NS] (previous states) -> next[NS], saved[saved]
      backward:  dnext[NS] (gradient of the next states; h's includes the output's), s, next,
                 saved -> dzx[G], dzh[G] (with split only), ds[NS] (the direct gradient of the
                 previous states: the kernels add dzh W_hh to ds[0] themselves)
      recompute: s, saved -> next[1:] (the states other than h from the previous states and
                 the saved values, rounded as forward rounds them). Without it, those states
                 are saved after your `saved` values and read back.
    split=False: the gates need only zx[g] + zh[g]: forward may read zh but the kernels may pass
    the sum in zx and 0 in zh; backward writes dzx only. split=True keeps them apart (GRU).
    reads_old / reads_new: the states backward reads in s / next (default: all).
    reference: the same step in PyTorch, reference(zx, zh, state) -> next states (lists of
    (B, S) tensors); it is the "python" backend and what lltm.cells.check compares with.
    build=True: compiles the CPU and ATen operators and, where a GPU, torch with CUDA and a CUDA
    toolkit (nvcc) are there and the cell carries at most 2 states, the fused CUDA kernels, for
    this GPU's architecture only (once: about a minute on 16 cores; cached; LLTM_JIT_OPT=1 or 0
    compiles the C++ in about a half or a quarter of the time, docs/cells.md). build="cpu": no CUDA
    kernels (on a GPU the ATen backend runs the cell). build=False: no compilation
    (backend="python" only).

    Returns the cell (lltm.cells.get(name) finds it too) with module classes `.Layer`
    (torch.nn.LSTM's conventions) and `.Cell` (torch.nn.LSTMCell's). Run lltm.cells.check
    on it before trusting its backward. Defining the same name again with the same
    arguments returns the same cell; with others, an error.
    """
    op = f"lltm.cells.define({name!r})"
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"lltm.cells.define: name must be a lower-case identifier of <= 32 characters, got {name!r}")
    if name in BUILT_IN:
        raise ValueError(f"{op}: {name!r} is a built-in cell; choose another name")
    if isinstance(gates, bool) or not isinstance(gates, int) or not 1 <= gates <= 16:
        raise ValueError(f"{op}: gates must be an int in [1, 16], got {gates!r}")
    if isinstance(states, str) or not isinstance(states, Sequence) or not 1 <= len(states) <= 8:
        raise ValueError(f"{op}: states must be a sequence of 1 to 8 state names, h first, got {states!r}")
    states = tuple(states)
    if not all(isinstance(s, str) and _STATE_NAME.match(s) for s in states) or len(set(states)) != len(states):
        raise ValueError(f"{op}: states must be distinct identifiers, got {states!r}")
    if isinstance(saved, bool) or not isinstance(saved, int) or not 0 <= saved <= 32:
        raise ValueError(f"{op}: saved must be an int in [0, 32], got {saved!r}")
    if not callable(reference):
        raise TypeError(f"{op}: reference must be a callable reference(zx, zh, state) -> next states")
    if gate_names is None:
        gate_names = tuple(f"g{g}" for g in range(gates))
    elif len(gate_names) != gates:
        raise ValueError(f"{op}: gate_names has {len(gate_names)} names for {gates} gates")
    old_read = _mask(name, "reads_old", reads_old, states)
    new_read = _mask(name, "reads_new", reads_new, states)
    for part, text in (("forward", forward), ("backward", backward), ("recompute", recompute)):
        if text is not None and (not isinstance(text, str) or not text.strip()):
            raise TypeError(f"{op}: {part} must be a non-empty string of C++ statements")
    if build not in (True, False, "cpu"):
        raise ValueError(f"{op}: build must be True, False or 'cpu', got {build!r}")
    capability = _capability() if build else "none"
    cell_text = _cell_struct(name, gates, states, saved, bool(split), old_read, new_read, forward, backward, recompute)
    source = _generate(name, cell_text, capability)
    cuda_sources = _generate_cuda(name, cell_text)
    # The CUDA kernels carry at most 2 states (cuda/persistent_params.cuh: kMaxStates).
    arch = _cuda_arch() if build is True and len(states) <= 2 else None
    total_saved = max(saved + (len(states) - 1 if recompute is None else 0), 1)
    previous = _DEFINED.get(name)
    if previous is not None:
        if previous.source == source and _same_function(previous.step, reference):
            return previous
        raise ValueError(
            f"{op}: a different cell {name!r} is already defined in this process (its operators cannot be "
            "replaced); give the new one another name"
        )
    if build:
        _build(name, source, cuda_sources if arch else None, arch, verbose)
    cell = UserCell(
        name=name,
        gates=gates,
        states=states,
        saved=total_saved,
        split=bool(split),
        reference=_full_step(reference, name, gates, len(states)),
        gate_names=tuple(gate_names),
        step=reference,
        source=source,
        built=bool(build),
        cuda_sources=cuda_sources,
        cuda_arch=arch if build else None,
    )
    if build:
        from lltm import _backends, _seam

        _seam.register_cell(cell, ("aten", "fused"))
        _backends.forget(f"{name}_seq")
    _DEFINED[name] = cell
    return cell
