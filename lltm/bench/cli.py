"""`lltm bench`: the arguments (validated before any work) and the run."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys

import torch

from lltm import cells as lltm_cells
from lltm._argtypes import device_arg, fail, int_at_least, output_file, positive_float
from lltm.bench import cases as rows_mod
from lltm.bench import report, timing

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}


def writable_file(text: str) -> str:
    """An output file that can really be created or overwritten, tried now
    (an empty probe file is removed again): a path like /proc/x.json, whose
    folder looks writable to root, is refused before the run, not after it."""
    path = output_file(text)
    existed = os.path.exists(path)
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot write {text}: {exc.strerror or exc}") from None
    if not existed:
        os.remove(path)
    return path


def _rows(text: str) -> list[str]:
    try:
        return rows_mod.parse_rows(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cell_arg(value: str) -> str:
    """--cell: a built-in cell's name, or FILE.py:FUNCTION / module:FUNCTION (loaded when the rows are built)."""
    if value in lltm_cells.BUILT_IN or ":" in value:
        return value
    raise argparse.ArgumentTypeError(
        f"unknown cell {value!r}; choose {', '.join(sorted(lltm_cells.BUILT_IN))} or FILE.py:FUNCTION"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Forward and backward time of every lltm backend beside its peers, by the tutorial's host-clock method "
        "and by torch.utils.benchmark; --seq T times one lltm.LLTM layer over T steps against nn.LSTM and "
        "reports memory. Rows that cannot run here are listed as skipped, with the reason; the exit status is "
        "1 when no row ran."
    )
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = "rows (one vocabulary for both modes):\n" + "\n".join(
        f"  {name:<12} {what}" for name, what in rows_mod.ROWS.items()
    )
    p.epilog += (
        f"\ndefault rows: {','.join(rows_mod.CELL_DEFAULT)} (cell mode), {','.join(rows_mod.SEQ_DEFAULT)} (--seq)"
    )
    p.add_argument("-b", "--batch-size", type=int_at_least(1), default=16)
    p.add_argument("-f", "--features", type=int_at_least(1), default=32, help="input features")
    p.add_argument("-s", "--state-size", type=int_at_least(1), default=128)
    p.add_argument("-r", "--runs", type=int_at_least(1), default=100, help="timed passes of the host-clock method")
    p.add_argument("--warmup", type=int_at_least(0), default=5, help="untimed passes before timing each row")
    p.add_argument("--min-run-time", type=positive_float, default=0.5, help="seconds per blocked_autorange")
    p.add_argument(
        "--rounds",
        type=int_at_least(1),
        default=3,
        help="Timer measurements per row, rows interleaved; the median is reported",
    )
    p.add_argument("--device", type=device_arg, default=torch.device("cpu"), help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="parameters and inputs (default: float32)")
    p.add_argument("-d", "--double", action="store_true", help="shorthand for --dtype float64")
    p.add_argument(
        "--autocast",
        choices=("bfloat16", "float16"),
        help="forward under torch.autocast(device, dtype=AUTOCAST); parameters and inputs stay --dtype",
    )
    p.add_argument(
        "--rows",
        "--backends",
        dest="rows",
        type=_rows,
        default=None,
        help="comma-separated rows (default: those of the mode, see below)",
    )
    p.add_argument(
        "--seq",
        type=int_at_least(0),
        default=0,
        metavar="T",
        help="time one lltm.LLTM layer over T steps (time-major) against nn.LSTM, with memory; 0: one cell step",
    )
    p.add_argument(
        "--cell",
        default="lltm",
        type=_cell_arg,
        metavar="CELL",
        help="the layer's cell with --seq: lltm, lstm or gru (lltm.LLTM, lltm.LSTM, lltm.GRU; the peer is nn.GRU "
        "for gru, else nn.LSTM), or a cell of lltm.cells.define as FILE.py:FUNCTION or module:FUNCTION "
        "(docs/cells.md)",
    )
    p.add_argument(
        "--param-grads-only", action="store_true", help="only parameters need gradients (the tutorial's setting)"
    )
    p.add_argument(
        "--accumulate-grads",
        action="store_true",
        help="add into .grad on every pass (the tutorial's loop) instead of starting each backward from .grad = None",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=writable_file, help="write the results as JSON here")
    p.add_argument("--plot", type=writable_file, help="write a PNG bar chart here (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def cpu_name() -> str:
    """The CPU's model and vendor, as the OS reports them (timings depend on them)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    model = fields.get("model name") or platform.processor() or platform.machine() or "unknown CPU"
    vendor = fields.get("vendor_id")
    return f"{model} ({vendor})" if vendor and vendor not in model else model


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_name()}, {torch.get_num_threads()} threads"


def _device(device: torch.device) -> torch.device:
    """The device to time on (args.device is one torch can use: device_arg)."""
    if device.type == "cuda":
        if device.index is None:  # "cuda" means the current device
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    return device


def conflicts(args: argparse.Namespace) -> str | None:
    """Options that contradict each other or would be silently ignored: the
    message of the first, or None. Checked before any work."""
    if args.double and args.dtype not in (None, "float64"):
        return f"-d/--double means --dtype float64, but --dtype {args.dtype} was given too: give one of them"
    dtype = "float64" if args.double else args.dtype or "float32"
    if args.autocast and dtype == "float64":
        return "--autocast has no effect on float64 (autocast leaves float64 alone): drop --autocast or -d/--dtype"
    if args.autocast and dtype == args.autocast:
        return f"--autocast {args.autocast} with --dtype {dtype} changes nothing: drop --autocast"
    if args.json and args.plot and os.path.abspath(args.json) == os.path.abspath(args.plot):
        return f"--json and --plot name the same file {args.json}: give them different paths"
    return None


def _config(args: argparse.Namespace, device: torch.device) -> rows_mod.Config:
    return rows_mod.Config(
        batch_size=args.batch_size,
        features=args.features,
        state_size=args.state_size,
        seq=args.seq,
        device=device,
        dtype=torch.float64 if args.double else DTYPES[args.dtype or "float32"],
        seed=args.seed,
        param_grads_only=args.param_grads_only,
        accumulate_grads=args.accumulate_grads,
        autocast=DTYPES[args.autocast] if args.autocast else None,
        cell=args.cell,
    )


def _measure(
    cases: list[rows_mod.Case], args: argparse.Namespace, device: torch.device
) -> tuple[list[rows_mod.Case], list[timing.Measurement], dict[str, str]]:
    """Both timing methods and the memory of every case, with a progress bar
    on stderr; the rows that failed, with the reason (timing.measure)."""
    from tqdm import tqdm

    total = (args.runs + args.rounds) * len(cases)
    with tqdm(total=total, desc="lltm bench", unit="pass", disable=args.no_progress or None, file=sys.stderr) as bar:

        def tick(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)

        return timing.measure(
            cases,
            runs=args.runs,
            warmup=args.warmup,
            rounds=args.rounds,
            min_run_time=args.min_run_time,
            device=device,
            tick=tick,
        )


def _meta(args: argparse.Namespace, cfg: rows_mod.Config) -> dict:
    """The run's settings and environment, as the table's header and the JSON give them."""
    return {
        "batch_size": cfg.batch_size,
        "features": cfg.features,
        "state_size": cfg.state_size,
        "seq": cfg.seq,
        "cell": cfg.cell,
        "dtype": str(cfg.dtype).replace("torch.", "") + (f" under autocast({args.autocast})" if args.autocast else ""),
        "device": str(cfg.device),
        "device_name": device_name(cfg.device),
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "runs": args.runs,
        "rounds": args.rounds,
        "gradients": ("parameters only" if args.param_grads_only else "input, state and parameters")
        + (", accumulated into .grad" if args.accumulate_grads else ", .grad reset to None per step"),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
    }


def run(args: argparse.Namespace) -> int:
    problem = conflicts(args)
    if problem:
        return fail("lltm bench", problem)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return fail("lltm bench", '--plot needs matplotlib (pip install "lltm[plot]")')
    if args.cell != "lltm" and not args.seq:
        return fail("lltm bench", f"--cell {args.cell} times a layer: it needs --seq T")
    cfg = _config(args, _device(args.device))
    names = args.rows or list(rows_mod.SEQ_DEFAULT if cfg.seq else rows_mod.CELL_DEFAULT)
    cases, skipped = rows_mod.build(names, cfg)
    for name, why in skipped.items():
        print(f"lltm bench: skipping {name}: {why}", file=sys.stderr)
    if not cases:
        print("lltm bench: no row can run here; nothing measured", file=sys.stderr)
        return 1
    cases, measured, failed = _measure(cases, args, cfg.device)
    for name, why in failed.items():
        print(f"lltm bench: {name} is not available here: {why}", file=sys.stderr)
    skipped.update(failed)
    if not cases:
        print("lltm bench: no row could run here; nothing measured", file=sys.stderr)
        return 1
    # The peer every row is measured against: the GEMM floor of a cell step, nn.LSTM (nn.GRU for the
    # gru cell) for a layer.
    peer = ("gru" if cfg.cell == "gru" else "lstm") if cfg.seq else "gemm"
    rows = report.results(cases, measured, peer=peer, pipelined=cfg.device.type == "cuda")
    meta = _meta(args, cfg)
    print(report.format_table(rows, meta, skipped))
    if args.json:
        report.write_json(args.json, rows, meta, skipped)
    if args.plot:
        report.plot(rows, meta, args.plot)
    return 0
