"""argparse pieces shared by every lltm command (lltm, bench, check, train).

This module sits below all of them and imports none: a bad value ends in one
line on stderr and exit status 2 before any work, never in a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, NoReturn

import torch

from lltm import _registry


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line: `<prog>: error: <message>`.

    Subcommands' parsers are made with the parent's class, so the rule holds
    for every subcommand."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def fail(prog: str, message: str) -> int:
    """A usage error found after parsing (a combination of arguments, a file):
    the same one line as the parser's; returns the exit status, 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def _named(parse: Callable, name: str) -> Callable:
    parse.__name__ = name  # argparse names the type in its messages
    return parse


def int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return _named(parse, f"integer >= {low}")


def float_in(low: float, high: float = float("inf"), *, open_low: bool = False) -> Callable[[str], float]:
    """A number in [low, high] (or (low, high] with open_low)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if open_low and not value > low:
            raise argparse.ArgumentTypeError(f"must be greater than {low:g}, got {text}")
        if not low <= value <= high:
            bound = f"at least {low:g}" if high == float("inf") else f"in [{low:g}, {high:g}]"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    return _named(parse, "number")


positive_float = float_in(0.0, open_low=True)


def _check_cuda(device: torch.device, text: str) -> None:
    if not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r} asked for, but torch sees no CUDA device (use cpu)")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise argparse.ArgumentTypeError(f"{text!r} asked for, but torch sees {count} CUDA device(s)")


def device_arg(text: str) -> torch.device:
    """cpu, cuda or cuda:N, and only a CUDA device torch can use."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"not a device: {text!r} (cpu, cuda or cuda:N)") from None
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    if device.type == "cuda":
        _check_cuda(device, text)
    return device


def device_or_auto(text: str) -> str:
    """device_arg, or "auto" (CUDA when there is one); returned as text for
    the caller to resolve (torchrun gives each rank its own GPU)."""
    if text != "auto":
        device_arg(text)
    return text


def backend_arg(text: str) -> str:
    """A backend name of lltm/_registry.py, or "auto". Whether it runs on the
    device is known only once the device is: callers check that before work."""
    if text != "auto" and text not in _registry.NAMES:
        raise argparse.ArgumentTypeError(f"unknown backend {text!r}; {_registry.choose_hint(text)}")
    return text


def _nearest_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def output_dir(text: str) -> str:
    """A folder that exists or can be created, and can be written to."""
    existing = _nearest_existing(text)
    if not os.path.isdir(existing):
        raise argparse.ArgumentTypeError(f"{existing} is not a folder, so {text} cannot be created in it")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"folder {existing} is not writable")
    return text


def output_file(text: str) -> str:
    """A file in an existing, writable folder."""
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"folder {folder} does not exist (create it first)")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"folder {folder} is not writable")
    return text
