"""The global-state guard of conftest.py: a test that leaves a torch switch changed fails, and the
switch is put back; the torch_settings fixture restores what it set, whatever the pytest version.

Each case runs a small test file in a pytest of its own (a subprocess: an in-process pytest would
re-import torch's modules)."""

import os

import pytest
import torch

INNER_CONFTEST = "from tests.conftest import _torch_state_unchanged, torch_settings  # noqa: F401\n"
# The inner test file's first lines: its process's own thread count, read before any test runs
# (this process's may differ: conftest.py divides the cores among pytest-xdist's workers).
INNER_HEADER = "import torch\n\nTHREADS = torch.get_num_threads()\n\n"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LEAKS = {
    "matmul_tf32": "torch.backends.cuda.matmul.allow_tf32 = True",
    "cudnn_tf32": "torch.backends.cudnn.allow_tf32 = False",
    "float32_matmul_precision": "torch.set_float32_matmul_precision('high')",
    "default_dtype": "torch.set_default_dtype(torch.float64)",
    "num_threads": "torch.set_num_threads(torch.get_num_threads() + 1)",
    "deterministic_algorithms": "torch.use_deterministic_algorithms(True)",
}


@pytest.fixture
def inner(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    pytester.makeconftest(INNER_CONFTEST)
    return pytester


def _check(switch):
    """An inner test that asserts `switch` is at its default again."""
    return (
        f"def test_after_{switch}():\n"
        "    assert not torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32\n"
        "    assert torch.get_float32_matmul_precision() == 'highest'\n"
        "    assert torch.get_default_dtype() == torch.float32\n"
        "    assert not torch.are_deterministic_algorithms_enabled()\n"
        "    assert torch.get_num_threads() == THREADS\n"
    )


def test_a_test_that_leaves_a_switch_changed_fails_and_is_undone(inner):
    body = [INNER_HEADER]
    for switch, leak in LEAKS.items():
        body += [f"def test_leaks_{switch}():\n    {leak}\n", _check(switch)]
    inner.makepyfile("\n".join(body))
    result = inner.runpytest_subprocess("-p", "no:cacheprovider")
    # each leaking test errors at teardown, and the test after it sees the default again
    result.assert_outcomes(passed=2 * len(LEAKS), errors=len(LEAKS))
    for switch in LEAKS:
        result.stdout.fnmatch_lines([f"*ERROR at teardown of test_leaks_{switch}*"])
    result.stdout.fnmatch_lines(["*the test left global torch state changed (*matmul_tf32: False -> True*"])


def test_settings_fixture_restores_what_it_set(inner):
    inner.makepyfile(
        INNER_HEADER + "def test_sets(torch_settings):\n"
        "    torch_settings.set(matmul_tf32=True, cudnn_tf32=False, float32_matmul_precision='medium',\n"
        "                       default_dtype=torch.float64, deterministic_algorithms=(True, True))\n"
        "    assert torch.get_float32_matmul_precision() == 'medium'\n"
        "    assert torch.get_default_dtype() == torch.float64\n\n" + _check("sets")
    )
    inner.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"), reason="torch < 2.9")
def test_new_fp32_precision_api_is_caught_and_undone(inner):
    """TF32 switched on through torch's fp32_precision API makes the legacy getters raise; the guard
    reads that as a change and puts a consistent state back with the legacy setters."""
    inner.makepyfile(
        INNER_HEADER + "def test_leaks():\n    torch.backends.cuda.matmul.fp32_precision = 'tf32'\n\n" + _check("api")
    )
    result = inner.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*matmul_tf32: False -> '<set through the fp32_precision API>'*"])


def test_unknown_switch_is_a_clear_error(torch_settings):
    with pytest.raises(KeyError, match="unknown torch switch.*allow_tf32"):
        torch_settings.set(allow_tf32=True)
