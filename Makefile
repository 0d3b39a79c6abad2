# The two commands of the README:
#   make bench   set up, then print the benchmark table (lltm bench)
#   make test    set up, then run the tests (what .ci/run calls)
#
# `setup` installs torch only when none is importable (TORCH_SPEC pins the
# CPU wheel of these machines; an existing CUDA build of torch is kept), the
# tools the build and the tests use, lltm itself in editable mode (once; again
# only when pyproject.toml or setup.py change), and then brings lltm._C up to
# date in place: build_ext skips the build when no source or header is newer
# than the library, and otherwise ninja recompiles only the changed objects
# (kept in build/), so a second `make test` does not recompile anything.

PYTHON ?= python3
PIP := $(PYTHON) -m pip
TORCH_SPEC ?= torch==2.13.0
# one clang-format for every machine (its output changes between versions)
CLANG_FORMAT_VERSION := 21.1.8
export MAX_JOBS ?= 2
BENCH_ARGS ?=
INSTALL_STAMP := build/.editable-install

.PHONY: setup deps build bench test test-fast lint format check-cuda-compile gpu-check clean

deps:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install "$(TORCH_SPEC)"
	@$(PYTHON) -c "import setuptools, wheel, ninja, tqdm, matplotlib, pytest, hypothesis, numpy, ruff, clang_format" \
		2>/dev/null || $(PIP) install -q setuptools wheel ninja tqdm matplotlib pytest hypothesis numpy ruff \
		"clang-format==$(CLANG_FORMAT_VERSION)"

# The editable install compiles lltm._C into lltm/ once; later builds are `build`'s.
$(INSTALL_STAMP): pyproject.toml setup.py
	$(PIP) install -q --no-build-isolation --no-deps -e .
	@mkdir -p $(dir $@) && touch $@

build: deps $(INSTALL_STAMP)
	$(PYTHON) setup.py -q build_ext --inplace

setup: build
	$(PYTHON) -m lltm info

bench: setup
	$(PYTHON) -m lltm bench $(BENCH_ARGS)

# lint (ruff and clang-format), then an nvcc compile-only check of the CUDA kernels against torch's
# headers (no GPU needed; skipped where there is no nvcc), then the whole suite.
test: setup lint check-cuda-compile
	$(PYTHON) -m pytest tests -q -rs

test-fast: setup
	$(PYTHON) -m pytest tests -q -rs -m "not slow"

# ruff (lint and format) for Python, clang-format for C++ and CUDA: checked
# by `make test`, applied by `make format`.
lint: deps
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) scripts/format_cpp.py --check

format: deps
	$(PYTHON) -m ruff format .
	$(PYTHON) scripts/format_cpp.py

check-cuda-compile:
	PYTHON=$(PYTHON) bash scripts/check_cuda_compile.sh

gpu-check:
	bash scripts/gpu_check.sh

clean:
	rm -rf build *.egg-info lltm/*.so
