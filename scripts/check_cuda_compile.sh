#!/usr/bin/env bash
# Compile-only check of every CUDA source of the build (lltm/_sources.py: the
# .cu files and the .cpp files of lltm/csrc/cuda/) with nvcc against the
# installed torch's headers, for sm_80 and sm_90 (the oldest supported
# architecture, and the one with thread-block clusters), with the flags
# torch.utils.cpp_extension uses. Needs no GPU and no CUDA build of torch, so
# CI catches a kernel that does not compile for either.
#
#   scripts/check_cuda_compile.sh [--release] [--resource-usage] [FILE.cu ...]
#
# The device code's optimisers run at -O1 (cicc and ptxas): every stage that
# can reject a kernel still runs (the front end on every instantiation, PTX
# generation, ptxas on the inline assembly of both architectures), in 0.54x
# the time of the build's -O3 (persistent_lltm_backward.cu, one core: 108 s
# against 200). --release compiles at the build's -O3 (the machine code a
# user gets); --resource-usage implies it and prints ptxas's registers /
# shared memory / spills per kernel.
#
# Environment: NVCC (compiler), PYTHON (the python with torch),
# JOBS (parallel compiles, default: number of cores), CUDA_ARCH (space-separated
# architectures, default "80 90"), NVCC_EXTRA (more nvcc flags, e.g.
# -DLLTM_STEP_CLOCKS for the profiling build),
# STAMPS (folder of the per-file "compiled" stamps, default build/cuda-compile-check).
#
# torch's CUDA headers include cuBLAS/cuSPARSE/cuSOLVER headers. A toolkit
# without them gets them from NVIDIA's wheels (headers only, extracted once
# into ~/.cache/lltm/cuda-headers); a CPU-only torch lacks one generated
# header (c10/cuda/impl/cuda_cmake_macros.h), which is stubbed here.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
ARCHS=${CUDA_ARCH:-80 90}
RESOURCE_USAGE=0
DEVICE_OPT=1
files=()
for arg in "$@"; do
  case "$arg" in
    --release) DEVICE_OPT=3 ;;
    --resource-usage) RESOURCE_USAGE=1 DEVICE_OPT=3 ;;
    *) files+=("$arg") ;;
  esac
done
# The build's own view: its CUDA sources and the list of compiled backends
# (lltm/_registry.py), read the way setup.py reads them.
read_sources() {
  "$PYTHON" - "$1" <<'EOF'
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("lltm_sources", "lltm/_sources.py")
src = importlib.util.module_from_spec(spec)
spec.loader.exec_module(src)
if sys.argv[1] == "files":
    cuda = os.path.join("lltm", "csrc", "cuda") + os.sep
    print("\n".join(r for r in map(os.path.relpath, src.sources(True)) if r.endswith(".cu") or r.startswith(cuda)))
else:
    print(src._registry.compiled_define())
EOF
}
if [ ${#files[@]} -eq 0 ]; then
  mapfile -t files < <(read_sources files)
fi
BACKENDS_DEFINE=$(read_sources define)

NVCC=${NVCC:-}
if [ -z "$NVCC" ]; then
  for cand in "$(command -v nvcc || true)" "${CUDA_HOME:-/nonexistent}/bin/nvcc" /usr/local/cuda/bin/nvcc; do
    if [ -n "$cand" ] && [ -x "$cand" ]; then NVCC=$cand; break; fi
  done
fi
if [ -z "$NVCC" ]; then
  echo "check_cuda_compile: no nvcc found (set NVCC or CUDA_HOME); skipped"
  exit 0
fi
cuda_include=$(cd "$(dirname "$NVCC")/.." && pwd)/include

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# torch's include paths, its C++ standard and ABI flag.
read -r STD ABI TORCH_INCLUDES < <("$PYTHON" - <<'EOF'
import inspect
import torch
from torch.utils import cpp_extension
std = "c++20" if "-std=c++20" in inspect.getsource(cpp_extension) else "c++17"
abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
print(std, abi, " ".join("-I" + p for p in cpp_extension.include_paths()))
EOF
)

extra_includes=()
torch_include=$("$PYTHON" -c "import torch.utils.cpp_extension as c; print(c.include_paths()[0])")
if [ ! -f "$torch_include/c10/cuda/impl/cuda_cmake_macros.h" ]; then
  mkdir -p "$work/stub/c10/cuda/impl"
  printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' \
    >"$work/stub/c10/cuda/impl/cuda_cmake_macros.h"
  extra_includes+=("-I$work/stub")
fi

# cuBLAS, cuSPARSE and cuSOLVER headers: the toolkit's, an installed nvidia
# wheel's, or extracted from the wheels into a cache.
need=(cublas_v2.h cusparse.h cusolverDn.h)
have_all() {
  local dir=$1
  for h in "${need[@]}"; do [ -f "$dir/$h" ] || return 1; done
}
if ! have_all "$cuda_include"; then
  found=""
  for dir in $("$PYTHON" - <<'EOF'
import glob, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for root in roots:
    for d in sorted(glob.glob(root + "/nvidia/*/include")) + sorted(glob.glob(root + "/nvidia/*/*/include")):
        print(d)
EOF
  ) "$HOME/.cache/lltm/cuda-headers/nvidia/cu13/include"; do
    if have_all "$dir"; then found=$dir; break; fi
  done
  if [ -z "$found" ]; then
    cache=$HOME/.cache/lltm/cuda-headers
    echo "check_cuda_compile: fetching cuBLAS/cuSPARSE/cuSOLVER headers into $cache"
    mkdir -p "$cache" "$work/wheels"
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$work/wheels" \
      nvidia-cublas==13.1.1.3 nvidia-cusparse==12.6.3.3 nvidia-cusolver==12.0.4.66 \
      || "$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$work/wheels" \
        nvidia-cublas nvidia-cusparse nvidia-cusolver
    "$PYTHON" - "$work/wheels" "$cache" <<'EOF'
import glob, sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
for wheel in glob.glob(src + "/*.whl"):
    with zipfile.ZipFile(wheel) as z:
        z.extractall(dst, [n for n in z.namelist() if "/include/" in n])
EOF
    for dir in "$cache"/nvidia/*/include; do
      if have_all "$dir"; then found=$dir; fi
    done
  fi
  [ -n "$found" ] || { echo "check_cuda_compile: cuBLAS headers not found" >&2; exit 1; }
  extra_includes+=("-I$found")
fi

flags=(
  -std="$STD" -c -O3 -lineinfo
  --expt-relaxed-constexpr
  -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__
  -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__
  -DLLTM_WITH_CUDA "$BACKENDS_DEFINE" -DTORCH_EXTENSION_NAME=_C -DTORCH_API_INCLUDE_EXTENSION_H
  "-D_GLIBCXX_USE_CXX11_ABI=$ABI"
  -Xcompiler -fPIC -diag-suppress 3306
  $TORCH_INCLUDES "${extra_includes[@]}"
  ${NVCC_EXTRA:-}
)
for arch in $ARCHS; do flags+=("-gencode=arch=compute_${arch},code=sm_${arch}"); done
if [ "$DEVICE_OPT" = 1 ]; then flags+=(-Xcicc -O1 -Xptxas -O1); fi  # cicc and ptxas default to -O3
# As lltm/_sources.py's nvcc_flags: ptxas from 12.8 advises sm_90a for the
# multicast copies once per kernel.
release=$("$NVCC" --version | sed -nE 's/.*release ([0-9]+)\.([0-9]+).*/\1 \2/p')
if [ -n "$release" ] && [ $(( ${release% *} * 100 + ${release#* } )) -ge 1208 ]; then
  flags+=(-Xptxas=--suppress-async-bulk-multicast-advisory-warning)
fi
if [ "$RESOURCE_USAGE" = 1 ]; then flags+=(--resource-usage); fi

versions="$("$NVCC" --version | tail -1), torch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
echo "check_cuda_compile: $versions, -std=$STD, sm_${ARCHS// /, sm_}, device code -O$DEVICE_OPT"
export NVCC work
export FLAGS="${flags[*]}"
# A file that compiled before with the same content, the same headers, flags
# (the temporary folder left out) and compilers is not compiled again (a stamp per file under build/, unless
# --resource-usage asks for ptxas's report).
STAMPS=${STAMPS:-build/cuda-compile-check}
mkdir -p "$STAMPS"
export STAMPS RESOURCE_USAGE
export CONTEXT_HASH=$( { echo "${FLAGS//$work/WORK} $versions"; cat lltm/csrc/*.h lltm/csrc/*/*.h lltm/csrc/*/*.cuh 2>/dev/null; } \
  | sha256sum | cut -c1-16)
status=0
printf '%s\n' "${files[@]}" | xargs -P "${JOBS:-$(nproc)}" -I{} bash -c '
  f={}; log="$work/$(basename "$f").log"
  stamp="$STAMPS/$(basename "$f").$( { echo "$CONTEXT_HASH"; cat "$f"; } | sha256sum | cut -c1-16).ok"
  if [ "$RESOURCE_USAGE" = 0 ] && [ -f "$stamp" ]; then
    echo "  ok    $f (unchanged since it last compiled)"
  elif "$NVCC" $FLAGS "$f" -o "$work/$(basename "$f").o" >"$log" 2>&1; then
    rm -f "$STAMPS/$(basename "$f")".*.ok; touch "$stamp"
    echo "  ok    $f"
  else
    echo "  FAIL  $f"; exit 1
  fi' || status=1
for log in "$work"/*.log; do
  [ -s "$log" ] || continue
  if [ "$RESOURCE_USAGE" = 1 ] || grep -qE "error|warning" "$log"; then
    echo "---- $(basename "$log" .log)"
    cat "$log"
  fi
done
if [ $status -ne 0 ]; then
  echo "check_cuda_compile: FAILED" >&2
  exit 1
fi
echo "check_cuda_compile: all ${#files[@]} CUDA sources compile"
