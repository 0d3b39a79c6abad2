"""The sequence model that `lltm train` trains: input layer, recurrent layers, linear head.

The recurrent part is lltm's (`kind="lltm"`: lltm.LLTM, or another cell on
lltm's kernels, `cell`: lltm.LSTM, lltm.GRU or one of lltm.cells.define) or
torch.nn.LSTM (`kind="lstm"`), all batch-first, so the two can be compared at equal parameter count
(`matched_hidden`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

import lltm

__all__ = ["ModelConfig", "SequenceModel", "count_parameters", "matched_hidden"]

KINDS = ("lltm", "lstm")


@dataclass(frozen=True)
class ModelConfig:
    """Everything the model's parameter shapes depend on (a checkpoint must match it)."""

    kind: str  # "lltm" or "lstm"
    n_in: int  # vocabulary size when tokens, else input features
    n_out: int  # classes (or regression outputs)
    hidden: int
    layers: int
    embed: int  # embedding width when tokens (unused otherwise)
    tokens: bool
    readout: str  # "all": an output per step; "last": one per sequence
    cell: str = "lltm"  # kind "lltm": the cell on lltm's kernels (lltm.cells.load: a name or FILE.py:FUNCTION)

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def label(self) -> str:
        """The model's name in tables and logs: lltm, lstm (torch.nn.LSTM), or lltm[<cell>] for lltm's
        layer of another cell."""
        if self.kind != "lltm" or self.cell == "lltm":
            return self.kind
        return f"lltm[{os.path.basename(self.cell)}]"


# the built-in cells' layers on lltm's kernels (other cells: lltm.cells.load(name).Layer)
_CELL_LAYERS = {"lstm": lltm.LSTM, "gru": lltm.GRU}


class SequenceModel(nn.Module):
    """tokens (B, T) -> embedding (B, T, E), or features (B, T, n_in) as they are;
    -> recurrent layers (B, T, H) -> head: (B, T, n_out) when readout == "all",
    (B, n_out) from the last step when "last"."""

    def __init__(self, cfg: ModelConfig, *, dropout: float = 0.0, backend: str = "auto") -> None:
        super().__init__()
        if cfg.kind not in KINDS:
            raise ValueError(f"lltm train: unknown --model {cfg.kind!r}; choose one of {', '.join(KINDS)}")
        self.cfg = cfg
        features = cfg.embed if cfg.tokens else cfg.n_in
        self.embed = nn.Embedding(cfg.n_in, cfg.embed) if cfg.tokens else None
        # Dropout acts between recurrent layers only (nn.LSTM's rule), so none with one layer.
        p = dropout if cfg.layers > 1 else 0.0
        if cfg.kind == "lltm" and cfg.cell == "lltm":
            self.rnn = lltm.LLTM(features, cfg.hidden, cfg.layers, batch_first=True, dropout=p, backend=backend)
        elif cfg.kind == "lltm":
            layer = _CELL_LAYERS.get(cfg.cell) or lltm.cells.load(cfg.cell).Layer
            self.rnn = layer(features, cfg.hidden, cfg.layers, batch_first=True, dropout=p, backend=backend)
        else:
            self.rnn = nn.LSTM(features, cfg.hidden, cfg.layers, batch_first=True, dropout=p)
        self.head = nn.Linear(cfg.hidden, cfg.n_out)

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x) if self.embed is not None else x
        out, _ = self.rnn(h)
        if self.cfg.readout == "last":
            out = out[:, -1]
        return self.head(out)


def count_parameters(cfg: ModelConfig) -> int:
    """Exact parameter count, from a model built on the meta device (no memory, no init cost)."""
    with torch.device("meta"):
        model = SequenceModel(cfg, backend="python")
    return sum(p.numel() for p in model.parameters())


def matched_hidden(cfg: ModelConfig, other_kind: str) -> int:
    """The hidden size for `other_kind` whose model has the parameter count closest
    to `cfg`'s (ties go to the smaller size)."""
    target = count_parameters(cfg)

    def count(h: int) -> int:
        return count_parameters(ModelConfig(**{**cfg.as_dict(), "kind": other_kind, "hidden": h}))

    # The count grows with the hidden size: bisect for the first size at or above the target.
    lo, hi = 1, max(2, cfg.hidden)
    while count(hi) < target:
        hi *= 2
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if count(mid) < target else (lo, mid)
    if lo > 1 and target - count(lo - 1) <= count(lo) - target:
        return lo - 1
    return lo
