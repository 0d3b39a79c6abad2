"""The docs a user reads first: the examples of docs/extending.md and the
README's torch.func example run as written; docs/benchmarks.md is a short
page whose every table says its device, torch version and date; the README
links both docs pages and the history."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def test_extending_examples_run():
    blocks = _python_blocks(ROOT / "docs" / "extending.md")
    assert len(blocks) >= 6
    scope: dict = {}
    for block in blocks:
        exec(compile(block, "docs/extending.md", "exec"), scope)  # noqa: S102


def test_readme_per_sample_gradient_example_runs():
    import lltm

    block = next(b for b in _python_blocks(ROOT / "README.md") if "per_sample" in b)
    scope = {"torch": torch, "lltm": lltm}
    exec(compile(block, "README.md", "exec"), scope)  # noqa: S102
    shapes = {k: tuple(v.shape) for k, v in scope["per_sample"].items()}
    assert shapes == {
        "weights_l0": (8, 384, 160),
        "bias_l0": (8, 384),
        "weights_l1": (8, 384, 256),
        "bias_l1": (8, 384),
    }


def test_benchmarks_page_is_short_and_every_table_is_dated():
    """Each table has its device's torch version and date in its heading or in its own rows."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    assert len(text.splitlines()) < 250
    assert "benchmarks-history.md" in text.split("\n## ")[0]  # linked before the first table
    tables, heading, current = [], "", None
    for line in text.splitlines():
        if line.startswith("#"):
            heading = line
        if line.startswith("|"):
            if current is None:
                current = [heading]
                tables.append(current)
            current.append(line)
        else:
            current = None
    assert len(tables) >= 5
    for table in tables:
        where = "\n".join(table)
        assert re.search(r"torch \d+\.\d+\.\d+", where) and re.search(r"20\d\d-\d\d-\d\d", where), table[0]


@pytest.mark.parametrize("target", ["docs/benchmarks.md", "docs/benchmarks-history.md", "docs/extending.md"])
def test_readme_links_the_docs(target):
    assert f"]({target})" in (ROOT / "README.md").read_text()
    assert (ROOT / target).exists()


def test_one_name_for_the_cpu_of_the_cpu_tables():
    """Every CPU table names its machine in its heading (the 2-core AMD EPYC, or the 2-core Intel Xeon of
    history section 20); no line starts with a bare CPU name."""
    for name in ("benchmarks.md", "benchmarks-history.md"):
        for line in (ROOT / "docs" / name).read_text().splitlines():
            assert not line.startswith("Intel Xeon"), (name, line)
