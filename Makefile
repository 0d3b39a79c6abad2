# The two commands of the README:
#   make bench   set up, then print the benchmark table (lltm bench)
#   make test    set up, then run the tests (what .ci/run calls)
#
# `setup` installs torch only when none is importable (TORCH_SPEC pins the
# CPU wheel of these machines; an existing CUDA build of torch is kept), the
# tools the build and the tests use, and lltm itself, compiled ahead of time.

PYTHON ?= python3
PIP := $(PYTHON) -m pip
TORCH_SPEC ?= torch==2.13.0
export MAX_JOBS ?= 2
BENCH_ARGS ?=

.PHONY: setup bench test test-fast check-cuda-compile gpu-check clean

setup:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install "$(TORCH_SPEC)"
	$(PIP) install -q setuptools wheel ninja tqdm matplotlib pytest hypothesis numpy
	$(PIP) install -q --no-build-isolation --no-deps -e .
	$(PYTHON) -m lltm info

bench: setup
	$(PYTHON) -m lltm bench $(BENCH_ARGS)

# nvcc compile-only check of the CUDA kernels against torch's headers (no GPU
# needed; skipped where there is no nvcc), then the whole test suite.
test: setup check-cuda-compile
	$(PYTHON) -m pytest tests -q -rs

test-fast: setup
	$(PYTHON) -m pytest tests -q -rs -m "not slow"

check-cuda-compile:
	PYTHON=$(PYTHON) bash scripts/check_cuda_compile.sh

gpu-check:
	bash scripts/gpu_check.sh

clean:
	rm -rf build *.egg-info lltm/*.so
