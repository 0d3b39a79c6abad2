"""Fixtures shared by the LLTM tests."""

import os

import pytest
import torch

from tests import _state

# `pytester` runs a test file in a pytest of its own (tests/test_state.py).
pytest_plugins = ["pytester"]


def pytest_configure(config):
    """Under pytest-xdist, each of N workers takes 1/N of torch's default intra-op threads (at least
    one). The default, every core in every worker, oversubscribes the machine: the workers' OpenMP
    threads then spin against each other. A test that needs more sets them."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        torch.set_num_threads(max(1, torch.get_num_threads() // workers))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def torch_settings():
    """Global torch switches for one test (tests/_state.py): `torch_settings.set(matmul_tf32=True)`;
    what it changed is put back when the test ends."""
    settings = _state.Settings()
    yield settings
    settings.restore()


@pytest.fixture(autouse=True)
def _torch_state_unchanged():
    """Fails the test after which a global torch switch differs from what it was before (the
    `torch_settings` fixture puts back what it set), and puts it back so later tests run as usual."""
    before = _state.snapshot()
    yield
    after = _state.snapshot()
    if after != before:
        _state.restore(before)
        pytest.fail(
            f"the test left global torch state changed ({_state.differences(before, after)}); "
            "set switches through the torch_settings fixture (tests/_state.py)",
            pytrace=False,
        )
