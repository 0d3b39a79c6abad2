"""Loss curves of `lltm train` runs, from their JSON-lines metrics, against steps and wall-clock."""

from __future__ import annotations

import json


def plot_available() -> bool:
    """matplotlib is an optional dependency (the "plot" extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def read_metrics(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_runs(runs: dict[str, str], out_png: str, title: str | None = None, ylabel: str = "loss") -> str:
    """One figure, two panels (loss vs step, loss vs training seconds); for each
    run (label -> metrics path) the training loss as a line and the held-out loss
    as dots of the same colour. Returns out_png."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for i, (label, path) in enumerate(runs.items()):
        rows = read_metrics(path)
        color = f"C{i}"
        train = [r for r in rows if r.get("kind") == "train"]
        held = [r for r in rows if r.get("kind") == "eval"]
        for ax, x in zip(axes, ("step", "time")):
            ax.plot([r[x] for r in train], [r["loss"] for r in train], color=color, lw=1.2, label=f"{label} train")
            ax.plot(
                [r[x] for r in held],
                [r["loss"] for r in held],
                "o--",
                color=color,
                ms=3.5,
                lw=0.8,
                label=f"{label} held-out",
            )
    axes[0].set_xlabel("step")
    axes[1].set_xlabel("training time (s)")
    axes[0].set_ylabel(ylabel)
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out_png, dpi=90)
    plt.close(fig)
    return out_png
