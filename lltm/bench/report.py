"""What `lltm bench` prints and writes: the table, the JSON, the plot.

Every derived number (medians, speed-ups, ratios to a peer) is computed once,
in :func:`results`, and the table, the JSON and the plot read it from there.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from typing import Optional

from lltm.bench.cases import Case
from lltm.bench.timing import Measurement

US = 1e6


@dataclass
class Result:
    name: str
    fwd_median_us: float
    fwd_min_us: float
    bwd_median_us: float
    bwd_min_us: float
    timer_fwd_us: float
    timer_bwd_us: float
    note: str = ""
    speedup_fwd: Optional[float] = None  # over the python row, Timer medians
    speedup_bwd: Optional[float] = None
    speedup_total: Optional[float] = None
    saved_bytes: Optional[int] = None  # saved for backward, parameters left out
    peak_bytes: Optional[int] = None  # CUDA: peak of one forward + backward
    extra: dict = field(default_factory=dict)

    @property
    def timer_total_us(self) -> float:
        return self.timer_fwd_us + self.timer_bwd_us


def _ratio(num: float, den: float) -> Optional[float]:
    return num / den if den > 0 else None


def results(cases: list[Case], measured: list[Measurement]) -> list[Result]:
    out = []
    for case, m in zip(cases, measured):
        rounds = [(f * US, b * US) for f, b in m.timer_rounds_s]
        out.append(
            Result(
                name=case.name,
                fwd_median_us=statistics.median(m.fwd_s) * US,
                fwd_min_us=min(m.fwd_s) * US,
                bwd_median_us=statistics.median(m.bwd_s) * US,
                bwd_min_us=min(m.bwd_s) * US,
                timer_fwd_us=statistics.median(f for f, _ in rounds),
                timer_bwd_us=statistics.median(b for _, b in rounds),
                note=case.note,
                saved_bytes=m.saved_bytes,
                peak_bytes=m.peak_bytes,
                extra={"timer_rounds_us": [[round(f, 2), round(b, 2)] for f, b in rounds]},
            )
        )
    base = next((r for r in out if r.name == "python"), None)
    if base is not None:
        for r in out:
            r.speedup_fwd = _ratio(base.timer_fwd_us, r.timer_fwd_us)
            r.speedup_bwd = _ratio(base.timer_bwd_us, r.timer_bwd_us)
            r.speedup_total = _ratio(base.timer_total_us, r.timer_total_us)
    return out


def _fmt(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.2f}"


def _bytes(n: Optional[int]) -> str:
    if n is None:
        return "-"
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def format_table(rows: list[Result], meta: dict, skipped: dict[str, str]) -> str:
    seq = meta.get("seq")
    head = (
        f"LLTM {'sequence T=' + str(seq) if seq else 'cell'}: "
        f"batch {meta['batch_size']}, features {meta['features']}, state {meta['state_size']}, "
        f"{meta['dtype']} on {meta['device_name']}; torch {meta['torch']}; {meta['date']}\n"
        f"runs {meta['runs']} (host clock, synchronised) + torch.utils.benchmark blocked_autorange, "
        f"median of {meta['rounds']} interleaved rounds; gradients: {meta['gradients']}\n"
    )
    cols = ("row", "fwd med", "fwd min", "bwd med", "bwd min", "fwd Timer", "bwd Timer", "fwd x", "bwd x", "f+b x")
    lines = [" | ".join(f"{c:>10}" for c in cols)]
    lines.append("-" * len(lines[0]))
    for r in rows:
        vals = (
            r.name,
            *(f"{v:.1f}" for v in (r.fwd_median_us, r.fwd_min_us, r.bwd_median_us, r.bwd_min_us)),
            *(f"{v:.1f}" for v in (r.timer_fwd_us, r.timer_bwd_us)),
            *(_fmt(v) for v in (r.speedup_fwd, r.speedup_bwd, r.speedup_total)),
        )
        lines.append(" | ".join(f"{v:>10}" for v in vals))
    foot = ["times in µs; x = speed-up over python (Timer medians), higher is faster"]
    # The peer every row is measured against: the GEMM floor of a cell step,
    # nn.LSTM for a layer.
    peer = next((r for r in rows if r.name == ("lstm" if seq else "gemm")), None)
    if peer is not None:
        foot.append(
            f"time / {peer.name} (Timer medians): "
            + ", ".join(
                f"{r.name} fwd {_fmt(_ratio(r.timer_fwd_us, peer.timer_fwd_us))} "
                f"bwd {_fmt(_ratio(r.timer_bwd_us, peer.timer_bwd_us))} "
                f"f+b {_fmt(_ratio(r.timer_total_us, peer.timer_total_us))}"
                for r in rows
                if r is not peer
            )
        )
    if any(r.saved_bytes is not None or r.peak_bytes is not None for r in rows):
        foot.append(
            "memory (saved for backward, parameters left out"
            + ("; peak of one forward+backward" if meta["device"].startswith("cuda") else "")
            + "): "
            + ", ".join(
                f"{r.name} {_bytes(r.saved_bytes)}" + (f" / {_bytes(r.peak_bytes)}" if r.peak_bytes is not None else "")
                for r in rows
            )
        )
    for name, why in skipped.items():
        foot.append(f"skipped {name}: {why}")
    return head + "\n".join(lines) + "\n" + "\n".join(foot)


def write_json(path: str, rows: list[Result], meta: dict, skipped: dict[str, str]) -> None:
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": [asdict(r) for r in rows], "skipped": skipped}, f, indent=2)


def plot(rows: list[Result], meta: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.name for r in rows]
    xs = range(len(names))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(names)), 4))
    width = 0.4
    ax.bar([x - width / 2 for x in xs], [r.timer_fwd_us for r in rows], width, label="forward")
    ax.bar([x + width / 2 for x in xs], [r.timer_bwd_us for r in rows], width, label="backward")
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("µs (torch.utils.benchmark median)")
    what = f"T={meta['seq']} " if meta.get("seq") else ""
    ax.set_title(
        f"LLTM {what}{meta['batch_size']}x{meta['features']}x{meta['state_size']} {meta['dtype']}, "
        f"{meta['device_name']}",
        fontsize=9,
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
