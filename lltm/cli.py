"""The `lltm` command (also `python -m lltm`): bench, check, info, train."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Optional, Sequence

import torch


# argparse types shared by the subcommands: bad values end in usage + message, exit 2, before any work.
def int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"  # argparse names the type in its messages
    return parse


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def device_arg(text: str) -> torch.device:
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"not a device: {text!r} (cpu, cuda or cuda:N)") from None
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    return device


def output_file(text: str) -> str:
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"folder {folder} does not exist (create it first)")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"folder {folder} is not writable")
    return text


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
        print(f"build mode: {how}, {built}")
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

    parser = argparse.ArgumentParser(prog="lltm", description="The LLTM cell as a PyTorch extension.")
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
