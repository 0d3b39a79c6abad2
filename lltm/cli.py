"""The `lltm` command (also `python -m lltm`): bench, check, info, train."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

import torch

from lltm._argtypes import Parser


def _info(args: argparse.Namespace) -> int:
    import lltm
    from lltm import _backends, _extension

    print(f"lltm {lltm.__version__}")
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    mode = _extension.try_load()
    if mode is None:
        print(f"build mode: none ({_extension.load_error()})")
    else:
        info = _extension.build_info()
        built = "C++ and CUDA" if info.get("cuda") == "1" else "C++ only"
        how = "ahead of time (lltm._C)" if mode == "aot" else "just in time (torch.utils.cpp_extension.load)"
        level = _extension.jit_cxx_level()  # a low LLTM_JIT_OPT runs the CPU kernels many times slower
        print(f"build mode: {how}, {built}" + (f", C++ {level}" if level else ""))
        if info.get("cuda") == "1":
            print(f"extension CUDA archs (__CUDA_ARCH_LIST__): {info.get('arch', '?')}")
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for dev in devices:
        avail = _backends.backends(dev)
        print(f"backends on {dev}: " + ", ".join(f"{n} {'yes' if ok else 'no'}" for n, ok in avail.items()))
    if _extension.loaded_mode() is not None and hasattr(torch.ops.lltm, "_fused_cpu_capability"):
        # which build of the fused CPU pass runs here (follows ATEN_CPU_CAPABILITY)
        print(f"fused CPU kernels: {torch.ops.lltm._fused_cpu_capability()}")
    if torch.cuda.is_available():
        print(f"CUDA devices: {', '.join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))}")
        print(f"torch CUDA arch list: {' '.join(torch.cuda.get_arch_list())}")
    else:
        print("CUDA devices: none")
    return 0


def _version() -> str:
    import lltm

    return f"lltm {lltm.__version__} (torch {torch.__version__})"


def main(argv: Optional[Sequence[str]] = None) -> int:
    from lltm import bench, check

    # Parser: a usage error is one line, in every subcommand.
    parser = Parser(prog="lltm", description="The LLTM cell as a PyTorch extension.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    p_bench = sub.add_parser("bench", help="forward/backward time of every backend, with peers")
    bench.add_arguments(p_bench)
    p_bench.set_defaults(func=bench.run)
    p_check = sub.add_parser("check", help="every backend vs the reference in float64, then gradcheck")
    check.add_arguments(p_check)
    p_check.set_defaults(func=check.run)
    from lltm.train import cli as train_cli

    p_train = sub.add_parser("train", help="train an LLTM or nn.LSTM sequence model (also under torchrun)")
    train_cli.add_arguments(p_train)
    p_train.set_defaults(func=train_cli.run)
    p_info = sub.add_parser("info", help="versions, build mode, compiled backends per device")
    p_info.set_defaults(func=_info)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
