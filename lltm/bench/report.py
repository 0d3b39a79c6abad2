"""What `lltm bench` prints and writes: the table, the JSON, the plot.

Every derived number (medians, speed-ups, ratios to a peer, the agreement of
the two clocks) is computed once, in :func:`results`, and the table, the
JSON and the plot read it from there.

The two methods time the same passes, so their medians agree on a quiet
machine. A row whose Timer and host-clock medians differ by more than
DISAGREEMENT times (another process took the cores during one of them) is
marked `!` in the table and `"clocks_disagree": true` in the JSON, and so is
every ratio taken from it: such a number says more about the machine than
about the row. On a GPU the two differ by design where launches dominate:
the Timer synchronises once per block of passes, whose launches overlap the
previous pass's kernels, while the host clock synchronises every pass; there
only a Timer median above DISAGREEMENT times the host clock's is marked
(and a Timer backward of 0, the step's median below the forward's, is
marked everywhere).

The ratios (speed-ups over python, times over the peer, like with like)
come from one measurement for the whole table, the one it trusts: the
Timer medians when the two clocks agree on every row; otherwise (the
machine was busy) the host-clock minima, each row's least disturbed pass,
which another process can only have made slower. The table's verdict line
says which, and why.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from typing import Optional

from lltm.bench.cases import HALF_PEERS, LIKE_PAIRS, Case
from lltm.bench.timing import Measurement

US = 1e6
DISAGREEMENT = 2.0  # Timer vs host-clock median, either way, forward or backward
MARK = "!"


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
    precision: str = ""  # "fp32", "TF32" or the dtype: what the row's products run in
    speedup_fwd: Optional[float] = None  # over the python row, from `ratio_basis`
    speedup_bwd: Optional[float] = None
    speedup_total: Optional[float] = None
    # time over the peer row's (gemm in cell mode, lstm with --seq), from `ratio_basis`
    peer: Optional[str] = None
    peer_ratio_fwd: Optional[float] = None
    peer_ratio_bwd: Optional[float] = None
    peer_ratio_total: Optional[float] = None
    # Timer median over host-clock median (forward, backward), and whether one is off by > DISAGREEMENT
    clock_ratio_fwd: Optional[float] = None
    clock_ratio_bwd: Optional[float] = None
    clocks_disagree: bool = False
    # what the ratios are taken from: TIMER (Timer medians) or HOST_MIN (host-clock minima)
    ratio_basis: str = ""
    saved_bytes: Optional[int] = None  # saved for backward, parameters left out
    peak_bytes: Optional[int] = None  # CUDA: peak of one forward + backward
    extra: dict = field(default_factory=dict)

    @property
    def timer_total_us(self) -> float:
        return self.timer_fwd_us + self.timer_bwd_us

    def trusted_us(self) -> tuple[float, float]:
        """(forward, backward) µs from the table's ratio basis."""
        if self.ratio_basis == HOST_MIN:
            return self.fwd_min_us, self.bwd_min_us
        return self.timer_fwd_us, self.timer_bwd_us


TIMER = "Timer medians"
HOST_MIN = "host-clock minima"


def _ratio(num: float, den: float) -> Optional[float]:
    return num / den if den > 0 else None


def _disagree(ratio: Optional[float], pipelined: bool) -> bool:
    # A ratio of 0 (the Timer's backward, step minus forward, came out <= 0) is noise on any device.
    if pipelined:
        return ratio is None or not 0.0 < ratio <= DISAGREEMENT
    return ratio is None or not 1 / DISAGREEMENT <= ratio <= DISAGREEMENT


def _compare_clocks(r: Result, pipelined: bool) -> None:
    r.clock_ratio_fwd = _ratio(r.timer_fwd_us, r.fwd_median_us)
    r.clock_ratio_bwd = _ratio(r.timer_bwd_us, r.bwd_median_us)
    r.clocks_disagree = _disagree(r.clock_ratio_fwd, pipelined) or _disagree(r.clock_ratio_bwd, pipelined)


def results(
    cases: list[Case], measured: list[Measurement], peer: Optional[str] = None, pipelined: bool = False
) -> list[Result]:
    """One Result per case, with every derived number; `peer` names the row
    the others are measured against (gemm in cell mode, lstm with --seq);
    `pipelined`: the passes ran on an asynchronous device (CUDA), where the
    Timer may be faster than the host clock."""
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
                precision=case.precision,
                saved_bytes=m.saved_bytes,
                peak_bytes=m.peak_bytes,
                extra={"timer_rounds_us": [[round(f, 2), round(b, 2)] for f, b in rounds]},
            )
        )
    for r in out:
        _compare_clocks(r, pipelined)
    basis = HOST_MIN if any(r.clocks_disagree for r in out) else TIMER
    for r in out:
        r.ratio_basis = basis

    def total(r: Result) -> float:
        return sum(r.trusted_us())

    base = next((r for r in out if r.name == "python"), None)
    if base is not None:
        (base_fwd, base_bwd) = base.trusted_us()
        for r in out:
            fwd, bwd = r.trusted_us()
            r.speedup_fwd = _ratio(base_fwd, fwd)
            r.speedup_bwd = _ratio(base_bwd, bwd)
            r.speedup_total = _ratio(total(base), total(r))
    ref = next((r for r in out if r.name == peer), None)
    if ref is not None:
        ref_fwd, ref_bwd = ref.trusted_us()
        for r in out:
            if r is ref:
                continue
            fwd, bwd = r.trusted_us()
            r.peer = ref.name
            r.peer_ratio_fwd = _ratio(fwd, ref_fwd)
            r.peer_ratio_bwd = _ratio(bwd, ref_bwd)
            r.peer_ratio_total = _ratio(total(r), total(ref))
    return out


def verdict(rows: list[Result]) -> str:
    """One line: whether the run can be trusted, and what the ratios are taken from."""
    busy = [r.name for r in rows if r.clocks_disagree]
    if not busy:
        return f"verdict: the two clocks agree on every row; ratios from the {TIMER}"
    return (
        f"verdict: THE MACHINE WAS BUSY: the Timer and host-clock medians disagree by more than {DISAGREEMENT:g}x "
        f"on {len(busy)} of {len(rows)} rows ({', '.join(busy)}, marked {MARK}); every ratio is taken from the "
        f"{HOST_MIN} (each row's least disturbed pass) and the medians are not to be trusted: rerun on a quiet machine"
    )


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
        f"{verdict(rows)}\n"
    )
    cols = ("row", "fwd med", "fwd min", "bwd med", "bwd min", "fwd Timer", "bwd Timer", "fwd x", "bwd x", "f+b x")
    lines = [" | ".join(f"{c:>10}" for c in cols)]
    lines.append("-" * len(lines[0]))
    for r in rows:
        # A busy row's medians (both clocks) are marked: one of them was disturbed.
        mark = MARK if r.clocks_disagree else ""
        vals = (
            r.name + mark,
            f"{r.fwd_median_us:.1f}{mark}",
            f"{r.fwd_min_us:.1f}",
            f"{r.bwd_median_us:.1f}{mark}",
            f"{r.bwd_min_us:.1f}",
            *(f"{v:.1f}{mark}" for v in (r.timer_fwd_us, r.timer_bwd_us)),
            *(_fmt(v) for v in (r.speedup_fwd, r.speedup_bwd, r.speedup_total)),
        )
        lines.append(" | ".join(f"{v:>10}" for v in vals))
    basis = rows[0].ratio_basis if rows else TIMER
    foot = [f"times in µs; x = speed-up over python ({basis}), higher is faster"]
    with_peer = [r for r in rows if r.peer is not None]
    if with_peer:
        foot.append(
            f"time / {with_peer[0].peer} ({basis}): "
            + ", ".join(
                f"{r.name} fwd {_fmt(r.peer_ratio_fwd)} bwd {_fmt(r.peer_ratio_bwd)} f+b {_fmt(r.peer_ratio_total)}"
                for r in with_peer
            )
        )
    if any(r.precision in ("TF32", "accurate") for r in rows):
        foot.append("precision: " + ", ".join(f"{r.name} {r.precision}" for r in rows if r.precision))
    by_name = {r.name: r for r in rows}
    like = [(by_name[a], by_name[b]) for a, b in LIKE_PAIRS if a in by_name and b in by_name]
    if like:
        pairs = []
        for a, b in like:
            ratio = _fmt(_ratio(sum(a.trusted_us()), sum(b.trusted_us())))
            pairs.append(f"{a.name} ({a.precision}) / {b.name} ({b.precision}) {ratio}")
        foot.append(f"like with like, f+b ({basis}): " + ", ".join(pairs))
    if "fused-accurate" in by_name and "fused-tf32" in by_name:  # what fp32's accuracy costs over TF32
        cost = _ratio(sum(by_name["fused-accurate"].trusted_us()), sum(by_name["fused-tf32"].trusted_us()))
        foot.append(f"accurate mode over TF32, f+b ({basis}): fused-accurate / fused-tf32 {_fmt(cost)}")
    for half_peer in HALF_PEERS:  # cuDNN's two half paths, and which the lltm rows should be held to
        base = half_peer.removesuffix("-fp16")
        if half_peer in by_name and base in by_name:
            fp16, other = sum(by_name[half_peer].trusted_us()), sum(by_name[base].trusted_us())
            fastest = half_peer if fp16 <= other else base
            ratios = ", ".join(
                f"{r.name} {_fmt(_ratio(sum(r.trusted_us()), min(fp16, other)))}"
                for r in rows
                if r.name in ("aten", "fused", "python", "compile", "compile-ro")
            )
            foot.append(
                f"cuDNN's half paths, f+b ({basis}): {half_peer} (float16) {fp16:.1f} µs, {base} "
                f"({by_name[base].precision}) {other:.1f} µs: {fastest} is faster by "
                f"{_fmt(max(fp16, other) / max(min(fp16, other), 1e-9))}x; time / {fastest}: {ratios}"
            )
    for r in rows:
        if r.clocks_disagree:
            foot.append(
                f"{MARK} {r.name}: the Timer and host-clock medians disagree by more than {DISAGREEMENT:g}x "
                f"(Timer / host clock: fwd {_fmt(r.clock_ratio_fwd)}, bwd {_fmt(r.clock_ratio_bwd)}): the machine "
                f"was busy during one of them; the medians marked {MARK} are not to be trusted (rerun)"
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
        meta = {**meta, "ratio_basis": rows[0].ratio_basis if rows else TIMER, "verdict": verdict(rows)}
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
