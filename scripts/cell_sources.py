"""Writes the sources lltm.cells.define compiles for a cell into a folder, to read them or to
compile them by hand (no build, no GPU needed):

    python scripts/cell_sources.py examples/cells/mgu.py OUT [--arch 90]

FILE.py is an example cell's file (its define(**kwargs) function is called with build=False).
Prints each file with the flags define() passes beyond torch's own; compile-check the CUDA ones
with lltm's check script, e.g.

    NVCC_EXTRA="-I$PWD/lltm/csrc" CUDA_ARCH=90 STAMPS=OUT/stamps scripts/check_cuda_compile.sh OUT/*.cu
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cell", help="FILE.py with a define(**kwargs) function (examples/cells/*.py)")
    parser.add_argument("out", help="folder to write the sources into")
    parser.add_argument("--arch", default="90", help="GPU architecture of the CUDA flags (default 90)")
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    from lltm.cells import _define

    spec = importlib.util.spec_from_file_location("cell_file", args.cell)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cell = module.define(build=False)
    os.makedirs(args.out, exist_ok=True)
    for file, (text, flags) in _define.cell_sources(cell, args.arch).items():
        with open(os.path.join(args.out, file), "w") as f:
            f.write(text)
        print(f"{os.path.join(args.out, file)}  {' '.join(flags)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
