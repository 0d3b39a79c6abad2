# The two commands of the README:
#   make bench   set up, then print the benchmark table (lltm bench)
#   make test    set up, then run the tests (what .ci/run calls)
#
# `setup` installs torch only when none is importable (TORCH_SPEC pins the
# CPU wheel of these machines; an existing CUDA build of torch is kept), the
# build and test tools at the versions of requirements/dev.txt (one lock file
# for every machine; `make test-latest` tries the newest releases), lltm itself
# in editable mode without compiling (once per Python environment; again only
# when pyproject.toml or setup.py change), and then compiles lltm._C in place:
# build_ext skips the build when no source or header is newer than the
# library, and otherwise ninja recompiles only the changed objects (kept in
# build/), so the extension is compiled once on a fresh clone and a second
# `make test` compiles nothing.

PYTHON ?= python3
PIP := $(PYTHON) -m pip --disable-pip-version-check
TORCH_SPEC ?= torch==2.13.0
# What `deps` installs: the lock file, or (test-latest) the unpinned names.
DEPS_FILE ?= requirements/dev.txt
export MAX_JOBS ?= 2
# pytest-xdist workers of `make test` (auto: one per core)
PYTEST_WORKERS ?= auto
BENCH_ARGS ?=
# One stamp per Python environment (a fresh venv installs lltm again).
ENV_ID := $(shell $(PYTHON) -c "import hashlib, sys; print(hashlib.sha1(sys.prefix.encode()).hexdigest()[:12])")
INSTALL_STAMP := build/.editable-install-$(ENV_ID)
LATEST_VENV := build/venv-latest

.PHONY: setup deps build bench test test-fast test-latest lint format check-cuda-compile gpu-check clean

deps:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install "$(TORCH_SPEC)"
	$(PIP) install -q -r $(DEPS_FILE)

# The editable install registers the package only (LLTM_NO_EXTENSION=1): lltm._C
# is compiled by `build`, once, with its objects in build/ for the next time.
$(INSTALL_STAMP): pyproject.toml setup.py
	LLTM_NO_EXTENSION=1 $(PIP) install -q --no-build-isolation --no-deps -e .
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
	$(PYTHON) -m pytest tests -q -rs -n $(PYTEST_WORKERS)

# `make test` in a fresh virtual environment with the newest release of every
# tool of requirements/dev.in (torch as TORCH_SPEC): dependency drift shows here
# first. When it passes, requirements/dev.txt may take its versions.
test-latest:
	rm -rf $(LATEST_VENV)
	$(PYTHON) -m venv $(LATEST_VENV)
	$(MAKE) test PYTHON=$(CURDIR)/$(LATEST_VENV)/bin/python DEPS_FILE=requirements/dev.in
	$(LATEST_VENV)/bin/python -m pip freeze --all

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
