"""Two seq_sweep JSON files of the same grid side by side: the planner's pick ("auto", and "auto-tf32"
where present) of one against the other's, point by point, raw and with each run's time divided by its
own nn.LSTM (cuDNN, strict) row of the same point, which takes out a drift of the device between the two
runs.

    python -m lltm.bench.compare_sweeps OLD.json NEW.json [--label-old landed --label-new seam]
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Optional


def _total(v: Optional[list]) -> Optional[float]:
    return None if v is None else v[0] + v[1]


def compare(old: dict, new: dict, rows: tuple[str, ...] = ("auto", "auto-tf32")) -> tuple[list[str], dict]:
    """Markdown lines and {row: [new / old per point, anchored]}."""
    key = lambda p: (p["T"], p["B"], p["S"])  # noqa: E731
    old_points = {key(p): p for p in old["points"]}
    lines = [
        f"{new.get('dtype')}: new / old, raw and anchored (each run's time over its own nn.LSTM strict row)",
        "| T x B x S | row | old µs | new µs | new / old | anchored |",
        "|---|---|---|---|---|---|",
    ]
    ratios: dict = {r: [] for r in rows}
    for p in new["points"]:
        q = old_points.get(key(p))
        if q is None:
            continue
        for row in rows:
            a, b = _total(q["times"].get(row)), _total(p["times"].get(row))
            la, lb = _total(q["times"].get("lstm-notf32")), _total(p["times"].get("lstm-notf32"))
            if a is None or b is None:
                continue
            anchored = (b / lb) / (a / la) if la and lb else float("nan")
            ratios[row].append(anchored)
            lines.append(f"| {p['T']}x{p['B']}x{p['S']} | {row} | {a:.0f} | {b:.0f} | {b / a:.3f} | {anchored:.3f} |")
    for row, values in ratios.items():
        if values:
            lines.append(
                f"{row}: anchored new / old max {max(values):.3f}, median {statistics.median(values):.3f}, "
                f"within 1.05 at {sum(v <= 1.05 for v in values)} of {len(values)} points"
            )
    return lines, ratios


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lltm.bench.compare_sweeps", description=__doc__.split("\n\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    opts = parser.parse_args(argv)
    with open(opts.old) as f:
        old = json.load(f)
    with open(opts.new) as f:
        new = json.load(f)
    lines, _ = compare(old, new)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
