"""Training tasks, generated on the fly: copy memory, the adding problem, a character LM.

Every global batch is a pure function of (seed, step): each rank builds the same
global batch and keeps its own rows (see `shard`). So the data stream does not
depend on the number of ranks, and a resumed run (with any number of ranks) sees
exactly the batches a straight run would have seen.
"""

from __future__ import annotations

import hashlib
import math
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["AddingTask", "CharLMTask", "CopyTask", "Task", "default_corpus", "generator", "make_task", "shard"]

TRAIN, EVAL = 0, 1  # random streams: training batches and held-out batches never share a seed


def generator(seed: int, stream: int, index: int) -> torch.Generator:
    """A CPU generator seeded from (seed, stream, index), independent of any global RNG state."""
    digest = hashlib.blake2b(f"{seed}:{stream}:{index}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))


def shard(t: Tensor, rank: int, world: int) -> Tensor:
    """Rows [rank * B / world, (rank + 1) * B / world) of a global batch t: (B, ...)."""
    if t.shape[0] % world:
        raise ValueError(f"lltm train: --batch {t.shape[0]} must be divisible by the number of ranks ({world})")
    n = t.shape[0] // world
    return t[rank * n : (rank + 1) * n]


@dataclass
class Stats:
    """Sums over held-out batches: loss * count, correct predictions, count."""

    loss: float = 0.0
    correct: float = 0.0
    count: int = 0

    def add(self, loss: Tensor, correct: Tensor, count: int) -> None:
        self.loss += float(loss) * count
        self.correct += float(correct)
        self.count += count

    def result(self) -> dict[str, float]:
        return {"loss": self.loss / max(self.count, 1), "acc": self.correct / max(self.count, 1)}


class Task:
    """A sequence task. Inputs are token ids (B, T) when `tokens` (the model
    embeds them), else features (B, T, n_in). The model's output is
    (B, T, n_out) when readout == "all", (B, n_out) when "last"."""

    name: str = ""
    n_in: int = 0
    n_out: int = 0
    tokens: bool = True
    readout: str = "all"
    baseline: str = ""  # what a model that learned nothing scores, for the docs and the summary
    loss_name: str = "loss"

    def __init__(self, *, seed: int, batch: int, seq_len: int, eval_batches: int) -> None:
        if batch < 1 or seq_len < 1:
            raise ValueError(f"lltm train: --batch and --seq-len must be positive, got {batch} and {seq_len}")
        self.seed, self.batch, self.seq_len, self.eval_batches = seed, batch, seq_len, eval_batches

    def sample(self, gen: torch.Generator, batch: int) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def train_batch(self, step: int) -> tuple[Tensor, Tensor]:
        """The global training batch of `step` (0-based), on the CPU."""
        return self.sample(generator(self.seed, TRAIN, step), self.batch)

    def held_out(self) -> Iterator[tuple[Tensor, Tensor]]:
        """The same `eval_batches` held-out batches at every evaluation."""
        for i in range(self.eval_batches):
            yield self.sample(generator(self.seed, EVAL, i), self.batch)

    def loss(self, out: Tensor, y: Tensor) -> Tensor:
        raise NotImplementedError

    def score(self, out: Tensor, y: Tensor) -> tuple[Tensor, Tensor, int]:
        """(mean loss, number correct, number scored) of one batch."""
        raise NotImplementedError

    def tokens_per_batch(self) -> int:
        return self.batch * self.seq_len

    def describe(self) -> dict:
        """What a checkpoint records of the task (the model's shapes depend on it)."""
        return {"task": self.name, "n_in": self.n_in, "n_out": self.n_out}


class CopyTask(Task):
    """Copy memory: K symbols from {1..8}, blanks (0), a delimiter (9), then K
    blanks during which the model must replay the K symbols. Only the K recall
    positions are scored; guessing scores ln 8 = 2.08 nats and 1/8 accuracy."""

    name, n_in, n_out, tokens, readout = "copy", 10, 10, True, "all"
    baseline = "loss ln 8 = 2.079, accuracy 0.125"
    loss_name = "cross-entropy at the recall steps"
    BLANK, DELIM, SYMBOLS = 0, 9, 8

    def __init__(self, *, copy_len: int, **kw) -> None:
        super().__init__(**kw)
        if copy_len < 1 or self.seq_len < 2 * copy_len + 1:
            raise ValueError(
                f"lltm train: the copy task needs --seq-len >= 2 * --copy-len + 1 = {2 * copy_len + 1} "
                f"(got --seq-len {self.seq_len}, --copy-len {copy_len})"
            )
        self.copy_len = copy_len

    def sample(self, gen: torch.Generator, batch: int) -> tuple[Tensor, Tensor]:
        T, K = self.seq_len, self.copy_len
        symbols = torch.randint(1, self.SYMBOLS + 1, (batch, K), generator=gen)
        x = torch.full((batch, T), self.BLANK, dtype=torch.long)
        x[:, :K] = symbols
        x[:, T - K - 1] = self.DELIM
        y = torch.full((batch, T), -100, dtype=torch.long)  # -100: not scored (cross_entropy's ignore_index)
        y[:, T - K :] = symbols
        return x, y

    def loss(self, out: Tensor, y: Tensor) -> Tensor:
        K = self.copy_len
        return F.cross_entropy(out[:, -K:].float().flatten(0, 1), y[:, -K:].flatten())

    def score(self, out: Tensor, y: Tensor) -> tuple[Tensor, Tensor, int]:
        K = self.copy_len
        correct = (out[:, -K:].argmax(-1) == y[:, -K:]).sum()
        return self.loss(out, y), correct, y.shape[0] * K

    def describe(self) -> dict:
        return {**super().describe(), "copy_len": self.copy_len}


class AddingTask(Task):
    """The adding problem: features (value in [0, 1), marker in {0, 1}); two
    markers, one in each half of the sequence; the target is the sum of the two
    marked values, read out at the last step. Predicting 1 scores MSE 1/6 = 0.167;
    `acc` is the fraction within 0.04 of the target."""

    name, n_in, n_out, tokens, readout = "adding", 2, 1, False, "last"
    baseline = "MSE 0.167, accuracy 0.078 (always 1.0)"
    loss_name = "mean squared error"
    TOLERANCE = 0.04

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        if self.seq_len < 2:
            raise ValueError(f"lltm train: the adding task needs --seq-len >= 2, got {self.seq_len}")

    def sample(self, gen: torch.Generator, batch: int) -> tuple[Tensor, Tensor]:
        T, half = self.seq_len, self.seq_len // 2
        values = torch.rand((batch, T), generator=gen)
        first = torch.randint(0, half, (batch,), generator=gen)
        second = torch.randint(half, T, (batch,), generator=gen)
        rows = torch.arange(batch)
        markers = torch.zeros((batch, T))
        markers[rows, first] = 1.0
        markers[rows, second] = 1.0
        y = values[rows, first] + values[rows, second]
        return torch.stack([values, markers], dim=-1), y.unsqueeze(-1)

    def loss(self, out: Tensor, y: Tensor) -> Tensor:
        return F.mse_loss(out.float(), y)

    def score(self, out: Tensor, y: Tensor) -> tuple[Tensor, Tensor, int]:
        correct = ((out.float() - y).abs() < self.TOLERANCE).sum()
        return self.loss(out, y), correct, y.shape[0]


def default_corpus(max_bytes: int = 2_000_000) -> bytes:
    """The standard library's Python sources (sorted paths, site-packages left
    out), concatenated up to max_bytes: text every Python install has, so charlm
    runs offline. The exact corpus depends on the Python version."""
    root = sysconfig.get_paths()["stdlib"]
    chunks, size = [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "__pycache__", "dist-packages"))
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            try:
                with open(os.path.join(dirpath, name), "rb") as f:
                    data = f.read()
            except OSError:
                continue
            chunks.append(data)
            size += len(data)
            if size >= max_bytes:
                return b"".join(chunks)[:max_bytes]
    if size == 0:
        raise RuntimeError(f"lltm train: no Python sources found under {root}; pass a text file with --text FILE")
    return b"".join(chunks)


class CharLMTask(Task):
    """Character (byte) level language model: windows of seq_len + 1 bytes; the
    model predicts every next byte. The last `held_out_frac` of the text is held
    out for evaluation. Uniform guessing over 256 bytes scores ln 256 = 5.55."""

    name, n_in, n_out, tokens, readout = "charlm", 256, 256, True, "all"
    baseline = "loss ln 256 = 5.545 (8 bits/char)"
    loss_name = "cross-entropy (nats per byte)"

    def __init__(self, *, text: str | None, held_out_frac: float = 0.05, **kw) -> None:
        super().__init__(**kw)
        if text is None:
            data, self.source = default_corpus(), "python-stdlib"
        else:
            try:
                with open(text, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise ValueError(f"lltm train: cannot read --text {text!r}: {e.strerror}") from None
            self.source = os.path.basename(text)
            if not data:
                raise ValueError(f"lltm train: --text {text} is empty; give charlm a text to model")
        self.data = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        split = int(len(data) * (1 - held_out_frac))
        self.train_data, self.eval_data = self.data[:split], self.data[split:]
        need = self.seq_len + 2
        if len(self.eval_data) < need:
            raise ValueError(
                f"lltm train: --text has {len(data)} bytes; its held-out part ({len(self.eval_data)} bytes) "
                f"must hold one window of --seq-len + 1 = {self.seq_len + 1}; use a longer text or a shorter --seq-len"
            )
        self.digest = hashlib.blake2b(data, digest_size=8).hexdigest()

    def _windows(self, data: Tensor, gen: torch.Generator, batch: int) -> tuple[Tensor, Tensor]:
        starts = torch.randint(0, len(data) - self.seq_len - 1, (batch,), generator=gen)
        # rows of the view of every window (data[idx] with a (B, L + 1) index
        # costs ~4 ms per batch of 64 x 129 on a 5 MB text, this ~10 us)
        w = data.unfold(0, self.seq_len + 1, 1)[starts].long()
        return w[:, :-1], w[:, 1:]

    def sample(self, gen: torch.Generator, batch: int) -> tuple[Tensor, Tensor]:
        return self._windows(self.train_data, gen, batch)

    def held_out(self) -> Iterator[tuple[Tensor, Tensor]]:
        for i in range(self.eval_batches):
            yield self._windows(self.eval_data, generator(self.seed, EVAL, i), self.batch)

    def loss(self, out: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(out.float().flatten(0, 1), y.flatten())

    def score(self, out: Tensor, y: Tensor) -> tuple[Tensor, Tensor, int]:
        return self.loss(out, y), (out.argmax(-1) == y).sum(), y.numel()

    def describe(self) -> dict:
        return {**super().describe(), "text": self.source, "text_digest": self.digest}


TASKS = ("copy", "adding", "charlm")
DEFAULT_SEQ_LEN = {"copy": 20, "adding": 30, "charlm": 64}


def make_task(
    name: str,
    *,
    seed: int,
    batch: int,
    seq_len: int | None = None,
    eval_batches: int = 4,
    copy_len: int = 5,
    text: str | None = None,
) -> Task:
    """Build a task by name; seq_len None takes the task's default."""
    kw = {"seed": seed, "batch": batch, "seq_len": seq_len or DEFAULT_SEQ_LEN[name], "eval_batches": eval_batches}
    if name == "copy":
        return CopyTask(copy_len=copy_len, **kw)
    if name == "adding":
        return AddingTask(**kw)
    if name == "charlm":
        return CharLMTask(text=text, **kw)
    raise ValueError(f"lltm train: unknown --task {name!r}; choose one of {', '.join(TASKS)}")


def bits_per_char(loss: float) -> float:
    return loss / math.log(2)
