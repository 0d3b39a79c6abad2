"""Shared fixtures for the lltm.extending tests."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    # Fixed seed per test: reproducible inputs, order-independent results.
    torch.manual_seed(0)
