"""clang-format over the C++ and CUDA sources (lltm/csrc, .clang-format at
the root), from the pinned `clang-format` wheel, so that every machine
formats alike.

    python scripts/format_cpp.py --check    exit 1 and name the files that differ
    python scripts/format_cpp.py            reformat them in place
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SUFFIXES = {".h", ".cpp", ".cu", ".cuh"}


def sources() -> list[pathlib.Path]:
    return sorted(p for p in (ROOT / "lltm" / "csrc").rglob("*") if p.suffix in SUFFIXES)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="report, change nothing")
    args = parser.parse_args()
    try:
        import clang_format
    except ImportError:
        print("format_cpp.py: pip install clang-format (make deps installs it)", file=sys.stderr)
        return 2
    exe = clang_format.get_executable("clang-format")
    files = [str(p) for p in sources()]
    if not args.check:
        return subprocess.call([exe, "-i", *files])
    differ = []
    for f in files:
        formatted = subprocess.run([exe, f], capture_output=True, text=True, check=True).stdout
        if formatted != pathlib.Path(f).read_text():
            differ.append(f)
    for f in differ:
        print(f"clang-format: {pathlib.Path(f).relative_to(ROOT)} is not formatted (make format)")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
