"""`lltm train` on several ranks: DDP against one process, checkpoints across rank counts, faults
(a killed rank, a rank killed while writing a checkpoint, a hung rank) and two torchrun launchers.

Each test runs on gloo with 2 CPU ranks (`make test`) and, marked cuda, on NCCL with 2 or 4 GPUs
(skipped without them; scripts/multigpu_check.sh runs them). With LLTM_DDP_REPORT=FILE the
measured differences and their bounds are appended to FILE as Markdown lines.

Why the runs can be compared exactly. Every global batch is a function of the step, and with
`--accumulate k` one process cuts its rows into k micro-batches, each backpropagated with its loss
over k. N ranks compute, per rank, the gradient g_r of its shard; DDP scales it by 1/N and
all-reduces the sum. One process with --accumulate N computes the same g_r for the same rows (the
same kernels on the same shapes), scaled by 1/N (a power of two: exact), summed in order. The two
differ only in the order in which the all-reduce adds the N terms: with 2 ranks there is only one
sum, so the parameters are bit-identical, SGD or Adam. With N ranks the difference of each gradient
element is at most 2 gamma_{N-1} sum_r |g_r| / N (Higham: a float32 sum of m terms is within
gamma_m = m u / (1 - m u) times the sum of their absolute values, u = 2^-24).

Against one process on the whole batch at once (the issue's comparison) the gradients are the same
float32 sums of the B T per-row-and-step terms, grouped differently; each is within gamma_n of the
sum of the terms' absolute values (n = B T). We measure that sum at the row level, sum_b |g_b| / B
(g_b: the gradient of row b alone), so each SGD step moves a parameter by at most
lr * 2 gamma_n sum_b |g_b| / B more in one run than in the other, plus one rounding of the
parameter's own update in each run (2 u |p|).

Adam divides each gradient element by its own magnitude: at the first step the update is
lr * g / (|g| + eps), about lr * sign(g). Where |g| is well above the rounding bound delta the two
runs' updates differ by at most lr * delta * eps / (|g| - delta + eps)^2 (the derivative of
g / (|g| + eps) is eps / (|g| + eps)^2); where |g| <= delta the sign itself may differ and the
update by up to 2 lr, whatever the size of the rounding. So Adam turns gradient elements that
are zero up to rounding into steps of +-lr: the 2e-2 (relative to the tensors' largest entries)
seen after 4 Adam steps on 2 H200s, while the losses agree to 4 digits. After K steps every
element stays within 2 lr sum_t sqrt(r_t) of the other run (r_t: the largest ratio of Adam's two
moving-average weights at step t, about 1.16 at t = 4; |m| <= sqrt(r_t v) by Cauchy-Schwarz).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest
import torch

import lltm
from lltm import cli
from lltm.train import checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
U32 = 2.0**-24  # float32's unit roundoff
ADAM_EPS, BETA1, BETA2 = 1e-8, 0.9, 0.999


def _gpus(n: int):
    return [
        pytest.mark.cuda,
        pytest.mark.skipif(torch.cuda.device_count() < n, reason=f"needs {n} CUDA devices"),
    ]


# (device, ranks): gloo on the CPU in `make test`; NCCL where there are GPUs.
SETUPS = [
    pytest.param(("cpu", 2), id="gloo-2"),
    pytest.param(("cuda", 2), id="nccl-2", marks=_gpus(2)),
    pytest.param(("cuda", 4), id="nccl-4", marks=_gpus(4)),
]
SETUPS_2 = SETUPS[:2]
# The size of the issue's 2-GPU observation (charlm, hidden 512, global batch 256, sequence 128, 4 Adam
# steps at lr 3e-3): the DDP comparisons only.
ISSUE_SIZE = pytest.param(("cuda", 2, "h512"), id="nccl-2-h512", marks=_gpus(2))
REPORT_SETUPS = [*SETUPS, ISSUE_SIZE]


def _env(**extra: str) -> dict:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
        # NVLink multicast (NVLS) off: what these machines allow
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
        **extra,
    }


def _torchrun(*args: str, nproc: int, timeout: float = 240, env: dict | None = None, **kw):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    return subprocess.run(
        cmd, cwd=ROOT, env=env or _env(), capture_output=True, text=True, timeout=timeout, check=False, **kw
    )


def _report(line: str) -> None:
    path = os.environ.get("LLTM_DDP_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
    print(line)


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> str:
    """A small charlm text (reading the default corpus would cost every rank a second)."""
    path = tmp_path_factory.mktemp("text") / "text.txt"
    words = [f"{w}{i % 7}" for i, w in enumerate("the quick brown fox jumps over a lazy dog".split() * 300)]
    path.write_text(" ".join(words))
    return str(path)


def _train_args(text: str, device: str, ckpt=None) -> list[str]:
    """A tiny charlm run; with ckpt, a checkpoint every 2 steps into it, all kept."""
    return [
        "--task", "charlm", "--text", text, "--seq-len", "12", "--hidden", "16", "--embed", "8", "--batch", "8",
        "--quiet", "--device", device, "--no-plot", "--log-every", "2", "--eval-every", "4", "--eval-batches", "1",
        *(("--ckpt", str(ckpt), "--ckpt-every", "2", "--keep", "0") if ckpt is not None else ()),
    ]  # fmt: skip


def _one_process(text: str, device: str, ckpt, *args: str) -> int:
    """lltm train in this process (one rank), one thread, like the ranks."""
    threads = torch.get_num_threads()
    try:
        return cli.main(["train", *_train_args(text, device, ckpt), "--threads", "1", *args])
    finally:
        torch.set_num_threads(threads)


def _state(directory, step: int) -> dict:
    return torch.load(checkpoint.path_for(str(directory), step), weights_only=True, map_location="cpu")


def _max_diff(a: dict, b: dict) -> float:
    return max((a["model"][k] - b["model"][k]).abs().max().item() for k in a["model"])


def _assert_bit_identical(a: dict, b: dict) -> None:
    assert a["step"] == b["step"]
    diff = _max_diff(a, b)
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), f"{k}: largest difference {diff:.3e}"
    for idx, sa in a["optimizer"]["state"].items():
        for key, va in sa.items():
            assert torch.equal(va, b["optimizer"]["state"][idx][key]), (idx, key)


# --- DDP against one process (one torchrun launch per setup, many configurations) ------------


def _configs(device: str) -> list[str]:
    """backend:dtype:optimizer for every backend that runs on the device, float32 and bfloat16 autocast."""
    names = [n for n, ok in lltm.backends(device).items() if ok]
    return [f"{b}:{d}:{o}" for b in names for d in ("float32", "bfloat16") for o in ("sgd", "adam")]


_REPORTS: dict = {}


@pytest.fixture
def ddp_report(request, text, tmp_path_factory):
    """The worker's results for this setup, computed once per test session."""
    device, world, *size = request.param
    key = request.param
    if key not in _REPORTS:
        out = tmp_path_factory.mktemp("ddp") / "report.pt"
        configs = _configs(device)
        sizes: tuple = ("--batch", "16", "--steps", "4") if device == "cuda" else ()
        if device == "cpu":  # keep `make test` short: bfloat16 on the fused CPU kernels only
            configs = [c for c in configs if "bfloat16" not in c or c.startswith("fused:")]
        if size:
            configs = ["fused:float32:sgd", "fused:float32:adam", "fused:bfloat16:adam"]
            sizes = ("--hidden", "512", "--embed", "32", "--batch", "256", "--seq-len", "128", "--steps", "4")
            sizes += ("--lr", "3e-3")
        proc = _torchrun(
            "tests/_ddp_worker.py",
            *("--device", device, "--text", text, "--out", str(out), "--configs", ",".join(configs)),
            *sizes,
            nproc=world,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
        _REPORTS[key] = torch.load(out, weights_only=False)
    return _REPORTS[key]


def _gamma(m: int) -> float:
    return m * U32 / (1 - m * U32)


def _adam_ratio_bound(t: int) -> float:
    """max over i <= t of Adam's (bias-corrected) first-moment weight over its second-moment weight."""
    w = [(1 - BETA1) * BETA1 ** (t - i) / (1 - BETA1**t) for i in range(1, t + 1)]
    v = [(1 - BETA2) * BETA2 ** (t - i) / (1 - BETA2**t) for i in range(1, t + 1)]
    return max(a / b for a, b in zip(w, v))


def _setup_id(report: dict) -> str:
    m = report["meta"]
    return f"{'nccl' if m['device'].startswith('cuda') else 'gloo'}-{m['world']} hidden {m.get('hidden', 16)}"


@pytest.mark.parametrize("ddp_report", REPORT_SETUPS, indirect=True)
def test_ddp_equals_one_process_of_the_same_micro_batches(ddp_report):
    """N ranks == one process with --accumulate N: bit for bit with 2 ranks (one sum), else within
    the all-reduce's order (2 gamma_{N-1} sum_r |g_r| / N per gradient element and step, and one
    rounding of each update). Every backend on the device, float32 and bfloat16 autocast, SGD and Adam."""
    meta, world = ddp_report["meta"], ddp_report["meta"]["world"]
    lr = meta["lr"]
    for item, res in ddp_report["results"].items():
        assert "error" not in res, f"{item} failed in the worker:\n{res['error']}"
        d, m = res["ddp"], res["micro"]
        exact = all(torch.equal(d["last"][k], m["last"][k]) for k in d["last"])
        worst = 0.0
        if not (world == 2 and exact):
            for k in d["last"]:
                diff = (d["last"][k] - m["last"][k]).abs()
                p = torch.maximum(d["last"][k].abs(), m["last"][k].abs())
                if item.endswith(":sgd"):
                    tol = lr * sum(2 * _gamma(world - 1) * a[k] for a in m["micro"]) + meta["steps"] * 2 * U32 * p
                else:  # Adam: the first step's bound (see the module docstring), then the envelope
                    tol = 2 * lr * sum(math.sqrt(_adam_ratio_bound(t)) for t in range(1, meta["steps"] + 1))
                    tol = torch.full_like(diff, tol)
                worst = max(worst, (diff / tol.clamp_min(1e-30)).max().item())
        _report(
            f"{_setup_id(ddp_report)} {item}: DDP vs one process of the same micro-batches: "
            f"{'bit-identical' if exact else f'largest difference {max(_max_diff_p(d, m)):.2e}'}"
            + ("" if exact else f" ({worst:.2f} of the bound)")
        )
        if meta["device"] == "cpu" and world == 2:
            assert exact, f"{item}: 2 gloo ranks differ from one process with --accumulate 2"
        assert worst <= 1.0, f"{item}: beyond the all-reduce order's bound ({worst:.2f} of it)"
        if exact:
            assert d["losses"] == pytest.approx(m["losses"], rel=1e-6), item  # the mean over ranks rounds
        else:  # Adam may step +-lr on gradient elements that are zero up to rounding: the loss barely moves
            assert d["losses"] == pytest.approx(m["losses"], rel=1e-4), item


def _max_diff_p(a: dict, b: dict) -> list[float]:
    return [(a["last"][k] - b["last"][k]).abs().max().item() for k in a["last"]]


@pytest.mark.parametrize("ddp_report", REPORT_SETUPS, indirect=True)
def test_ddp_sgd_matches_the_whole_batch_within_the_reduction_order(ddp_report):
    """SGD in float32, N ranks against one process on the whole batch at once: every parameter
    within lr * sum_steps 2 gamma_{BT} sum_b |g_b| / B (the reduction-order bound of each step's
    gradient) plus one rounding of each step's update in each run."""
    meta = ddp_report["meta"]
    lr, steps, n = meta["lr"], meta["steps"], meta["batch"] * meta["seq_len"]
    for item, res in ddp_report["results"].items():
        if not item.endswith("float32:sgd") or "error" in res:
            continue
        d, w = res["ddp"], res["whole"]
        ratios, rel = [], []
        for k in d["last"]:
            diff = (d["last"][k] - w["last"][k]).abs()
            p = torch.maximum(d["last"][k].abs(), w["last"][k].abs())
            tol = lr * sum(2 * _gamma(n) * a[k] for a in w["rows"]) + steps * 2 * U32 * p
            assert not ((tol == 0) & (diff > 0)).any(), f"{item} {k}: differs where no term could round"
            ratios.append((diff / tol.clamp_min(1e-30)).max().item())
            rel.append(diff.max().item() / max(w["last"][k].abs().max().item(), 1e-30))
            # a fault (a shard trained twice, the mean taken over the wrong count) moves the
            # parameters by lr times a gradient: far beyond this bound
        _report(
            f"{_setup_id(ddp_report)} {item}: DDP vs the whole batch after {steps} SGD steps: largest difference "
            f"{max(rel):.1e} of a tensor's largest entry, {max(ratios):.2f} of the reduction-order bound"
        )
        assert max(ratios) <= 1.0, f"{item}: {max(ratios):.2f} of the reduction-order bound"
        assert d["losses"] == pytest.approx(w["losses"], rel=1e-5), item


@pytest.mark.parametrize("ddp_report", REPORT_SETUPS, indirect=True)
def test_ddp_adam_difference_is_rounding_amplified(ddp_report):
    """Adam in float32, N ranks against the whole batch: after the first step each element is within
    lr * delta * eps / (|g| - delta + eps)^2 of the other run (capped at 2 lr where |g| <= delta, the
    gradient's reduction-order bound), i.e. large differences only where the gradient is zero up to
    rounding; after K steps within Adam's envelope 2 lr sum_t sqrt(r_t)."""
    meta = ddp_report["meta"]
    lr, steps, n = meta["lr"], meta["steps"], meta["batch"] * meta["seq_len"]
    envelope = 2 * lr * sum(math.sqrt(_adam_ratio_bound(t)) for t in range(1, steps + 1))
    for item, res in ddp_report["results"].items():
        if not item.endswith("float32:adam") or "error" in res:
            continue
        d, w = res["ddp"], res["whole"]
        worst, near_zero, elements, big, rel = 0.0, 0, 0, 0, []
        for k in d["first"]:
            g = w["grad0"][k].abs()
            delta = 2 * _gamma(n) * w["rows"][0][k]
            step_bound = lr * torch.clamp(delta * ADAM_EPS / ((g - delta).clamp_min(0) + ADAM_EPS) ** 2, max=2.0)
            p = torch.maximum(d["first"][k].abs(), w["first"][k].abs())
            bound = step_bound + 2 * U32 * p + 16 * U32 * lr  # Adam's own arithmetic rounds in each run
            diff = (d["first"][k] - w["first"][k]).abs()
            worst = max(worst, (diff / bound).max().item())
            near_zero += int(((g > 0) & (g <= delta)).sum())
            big += int((diff > lr / 2).sum())
            elements += g.numel()
            last = (d["last"][k] - w["last"][k]).abs()
            assert last.max().item() <= envelope, f"{item} {k}: beyond Adam's envelope"
            rel.append(last.max().item() / max(w["last"][k].abs().max().item(), 1e-30))
        _report(
            f"{_setup_id(ddp_report)} {item}: DDP vs the whole batch: step 1 within {worst:.2f} of the bound; "
            f"{near_zero} of {elements} gradient elements nonzero but within rounding (their sign may flip), "
            f"{big} moved by more than lr/2; after {steps} steps largest difference {max(rel):.1e} of a "
            f"tensor's largest entry (envelope {envelope:.1e})"
        )
        assert worst <= 1.0, f"{item}: the first Adam step differs beyond what rounding explains ({worst:.2f})"
        assert big <= near_zero, f"{item}: elements moved by more than lr/2 where the gradient is not zero"


@pytest.mark.parametrize("ddp_report", REPORT_SETUPS, indirect=True)
def test_ddp_bfloat16_autocast_losses_agree(ddp_report):
    """bfloat16 autocast: the DDP losses equal the whole-batch run's within bfloat16's resolution
    (per-row products in bfloat16 depend on the micro-batch's shape, so the parameters are compared
    exactly only against the same micro-batches, above)."""
    meta = ddp_report["meta"]
    checked = 0
    for item, res in ddp_report["results"].items():
        if ":bfloat16:" not in item or "error" in res:
            continue
        d, w = res["ddp"], res["whole"]
        rel = max(
            (d["last"][k] - w["last"][k]).abs().max().item() / max(w["last"][k].abs().max().item(), 1e-30)
            for k in d["last"]
        )
        _report(f"{_setup_id(ddp_report)} {item}: DDP vs the whole batch: largest difference {rel:.1e}")
        assert d["losses"] == pytest.approx(w["losses"], rel=2.0**-7), item
        checked += 1
    assert checked or meta["device"] == "cpu" and not lltm.backends("cpu")["fused"]


def test_adam_turns_rounding_into_lr_sized_steps():
    """The mechanism behind the Adam differences, alone: two gradients that differ by rounding
    (1e-7 relative to the largest element) give the same first Adam step where |g| is large, and
    steps 2 lr apart where the element is zero up to that rounding."""
    g = torch.tensor([1.0, 1e-3, 3e-8, -2e-8, 0.0])
    noise = torch.tensor([0.0, 1e-10, -6e-8, 5e-8, 0.0])
    steps = []
    for grad in (g, g + noise):
        p = torch.zeros(5, requires_grad=True)
        opt = torch.optim.Adam([p], lr=1e-2)
        p.grad = grad.clone()
        opt.step()
        steps.append(p.detach())
    diff = (steps[0] - steps[1]).abs()
    assert diff[0] == 0 and diff[1] < 1e-9 and diff[4] == 0
    assert diff[2] > 1e-2 and diff[3] > 1e-2  # a sign flipped: a whole step each way


# --- faults, restarts and rank counts (the command line under torchrun) ------------------------


@pytest.fixture(scope="module")
def faulted(request, text, tmp_path_factory):
    """One process trains to step 2 (--accumulate N); then `torchrun --max-restarts 2` continues on N
    ranks with --auto-resume to step 8 while two faults strike: rank 1 is SIGKILLed as step 6 begins
    (attempt 0), and rank 0 is SIGKILLed halfway through writing the checkpoint of step 6 (attempt
    1). Every step's checkpoint is kept."""
    device, world = request.param
    base = tmp_path_factory.mktemp(f"faults-{device}")
    ck = base / "ck"
    acc = ["--accumulate", str(world)]
    assert _one_process(text, device, ck, "--steps", "2", *acc, "--out", str(base / "o")) == 0
    t0 = time.monotonic()
    proc = _torchrun(
        "--max-restarts",
        "2",
        "tests/_ddp_fault.py",
        "train",
        *_train_args(text, device, ck),
        *("--steps", "8", "--out", str(base / "o"), "--auto-resume"),
        nproc=world,
        timeout=400,
        env=_env(LLTM_TEST_FAULTS="kill:1:6:0,savekill:0:6:1"),
    )
    return {"device": device, "world": world, "proc": proc, "ck": ck, "base": base, "seconds": time.monotonic() - t0}


@pytest.mark.parametrize("faulted", SETUPS_2, indirect=True)
def test_killed_ranks_restart_with_nothing_lost(faulted, text):
    """Both faults cost only the steps since the last checkpoint (4): each restart resumes from step 4,
    the half-written checkpoint is ignored and replaced, and the final parameters and Adam state equal
    an uninterrupted run's bit for bit (one process with the same micro-batches)."""
    proc, ck, device, world = faulted["proc"], faulted["ck"], faulted["device"], faulted["world"]
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "fault: rank 1 killed at step 6" in out and "fault: killed halfway through the checkpoint of step 6" in out
    resumed = [line for line in out.splitlines() if line.startswith("lltm train: resumed lltm")]
    assert resumed == [
        f"lltm train: resumed lltm from {checkpoint.path_for(str(ck), 2)} (step 2, 1 rank(s) then, {world} now)",
        f"lltm train: resumed lltm from {checkpoint.path_for(str(ck), 4)} (step 4, {world} rank(s) then, {world} now)",
        f"lltm train: resumed lltm from {checkpoint.path_for(str(ck), 4)} (step 4, {world} rank(s) then, {world} now)",
    ]
    assert sorted(os.listdir(ck)) == [f"ckpt-0000000{s}.pt" for s in (2, 4, 6, 8)]  # the partial file is gone
    straight = faulted["base"] / "straight"
    acc = ["--accumulate", str(world)]
    assert _one_process(text, device, straight, "--steps", "8", *acc, "--out", str(straight)) == 0
    _report(
        f"{'nccl' if device == 'cuda' else 'gloo'}-{world} faults: rank 1 SIGKILLed at step 6, rank 0 SIGKILLed "
        f"writing checkpoint 6; both restarts resumed at step 4; final vs uninterrupted: largest difference "
        f"{_max_diff(_state(ck, 8), _state(straight, 8)):.1e}; {faulted['seconds']:.0f} s with 2 restarts"
    )
    _assert_bit_identical(_state(ck, 8), _state(straight, 8))
    rows = [r for r in _rows(faulted["base"] / "o" / "lltm.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [2, 4, 6, 8]  # the metrics read as one run


def _rows(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("faulted", SETUPS_2, indirect=True)
def test_resume_across_rank_counts(faulted, text, tmp_path):
    """1 rank -> N ranks happened in the fault run (its first resume); N -> 1: one process resumes the
    N-rank checkpoint of step 4 with --accumulate N and ends bit-identical to the straight run; a
    checkpoint resumed by the same rank count ends bit-identical too (the restarts above)."""
    device, world = faulted["device"], faulted["world"]
    assert faulted["proc"].returncode == 0
    ck = tmp_path / "ck"
    ck.mkdir()
    shutil.copy(checkpoint.path_for(str(faulted["ck"]), 4), ck)
    assert _state(ck, 4)["world"] == world
    acc = ["--accumulate", str(world)]
    assert _one_process(text, device, ck, "--steps", "8", *acc, "--resume", "--out", str(tmp_path)) == 0
    _assert_bit_identical(_state(ck, 8), _state(faulted["ck"], 8))


@pytest.mark.parametrize("setup", SETUPS_2)
def test_hung_rank_ends_the_job(setup, text, tmp_path):
    """Rank 1 hangs as step 3 begins; rank 0 waits in the gradient all-reduce. With
    --collective-timeout 5 both ranks end within seconds with one line saying why, and torchrun
    ends the job (exit status 1) instead of stalling."""
    device, world = setup
    t0 = time.monotonic()
    proc = _torchrun(
        "tests/_ddp_fault.py",
        "train",
        *_train_args(text, device),
        *("--steps", "8", "--out", str(tmp_path), "--collective-timeout", "5"),
        nproc=world,
        timeout=240,
        env=_env(LLTM_TEST_FAULTS="hang:1:3"),
    )
    elapsed = time.monotonic() - t0
    err = proc.stderr
    assert proc.returncode == 1, err[-3000:]
    assert "fault: rank 1 hangs at step 3" in err
    # on the CPU rank 0 waits inside step 3's backward; NCCL's all-reduce lets the host run on to the
    # next value read back (the loss logged at step 4)
    assert re.search(
        r"lltm train: rank 0 on \S+: no progress for 5 s \(--collective-timeout 5\) since step [234]:", err
    )
    _report(f"{'nccl' if device == 'cuda' else 'gloo'}-{world} hung rank: the job ended after {elapsed:.0f} s")
    assert elapsed < 120, f"the job took {elapsed:.0f} s to end"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("setup", SETUPS_2)
def test_two_launchers_on_one_machine(setup, text, tmp_path):
    """`torchrun --nnodes 2 --rdzv-backend c10d`, twice on this machine (each launcher stands for a
    host, one rank each): rank 0 alone writes checkpoints and metrics, the run prints each rank's
    throughput and the scaling it saw, and the result equals one process with --accumulate 2 bit for bit."""
    device, _ = setup
    port = _free_port()
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"lltm-{port}",
        "-m", "lltm", "train", *_train_args(text, device, tmp_path / "ck"), "--steps", "8",
        "--out", str(tmp_path / "o"), "--warmup-steps", "1", "--scaling-probe", "1",
    ]  # fmt: skip
    procs = [
        subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=_env(**({"CUDA_VISIBLE_DEVICES": str(i)} if device == "cuda" else {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=300))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out[-3000:] + err[-3000:]
    printed = "".join(out for out, _ in outs)
    assert printed.count("per-rank throughput (steady state, tokens/s, 4 rows each): rank 0 ") == 1
    assert printed.count("scaling seen (2 ranks, ") == 1 and "weak-scaling efficiency" in printed
    rows = _rows(tmp_path / "o" / "lltm.jsonl")
    assert [r["kind"] for r in rows].count("config") == 1 and rows[0]["world"] == 2
    assert [r["step"] for r in rows if r["kind"] == "train"] == [2, 4, 6, 8]
    scaling = [r for r in rows if r["kind"] == "scaling"]
    assert len(scaling) == 1 and len(scaling[0]["per_rank"]) == 2
    one = tmp_path / "one"
    assert _one_process(text, device, one, "--steps", "8", "--accumulate", "2", "--out", str(one)) == 0
    _assert_bit_identical(_state(tmp_path / "ck", 8), _state(one, 8))


def test_four_gloo_ranks_resume_bit_identical(text, tmp_path):
    """4 ranks resuming their own step-2 checkpoint end bit-identical to the straight run. With
    more than 2 ranks a ring all-reduce's sum depends on where a gradient sits in its bucket, so
    this holds only because the bucket layout is fixed before the first step (ddp.fix_bucket_layout;
    with DDP's layout rebuilt after the first step the weights differed by 1.5e-8)."""

    def run(ck, steps: int, *extra: str) -> None:
        proc = _torchrun(
            "-m", "lltm", "train", *_train_args(text, "cpu", ck), "--steps", str(steps), "--out", str(ck), *extra,
            nproc=4,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    run(tmp_path / "straight", 4)
    again = tmp_path / "again"
    again.mkdir()
    shutil.copy(checkpoint.path_for(str(tmp_path / "straight"), 2), again)
    run(again, 4, "--resume")
    _assert_bit_identical(_state(again, 4), _state(tmp_path / "straight", 4))


# --- CUDA checkpoints across rank counts: 4 -> 2 -> 1 -----------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 4, reason="needs 4 CUDA devices")
def test_cuda_checkpoints_across_rank_counts(text, tmp_path, capsys):
    """CUDA checkpoints written by rank 0: 4 ranks to step 4; 4 ranks resuming its step-2 checkpoint end
    bit-identical to it; 2 ranks resume its step 4 to step 6, one process resumes that to step 8."""

    def run(nproc: int, ck, steps: int, *extra: str) -> str:
        proc = _torchrun(
            "-m",
            "lltm",
            *("train", *_train_args(text, "cuda", ck), "--steps", str(steps), "--out", str(ck)),
            *extra,
            nproc=nproc,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    run(4, tmp_path / "four", 4)
    again = tmp_path / "again"
    again.mkdir()
    shutil.copy(checkpoint.path_for(str(tmp_path / "four"), 2), again)
    assert "(step 2, 4 rank(s) then, 4 now)" in run(4, again, 4, "--resume")
    _assert_bit_identical(_state(again, 4), _state(tmp_path / "four", 4))
    two = tmp_path / "two"
    two.mkdir()
    shutil.copy(checkpoint.path_for(str(tmp_path / "four"), 4), two)
    assert "(step 4, 4 rank(s) then, 2 now)" in run(2, two, 6, "--resume", "--accumulate", "2")
    one = tmp_path / "one"
    one.mkdir()
    shutil.copy(checkpoint.path_for(str(two), 6), one)
    assert _one_process(text, "cuda", one, "--steps", "8", "--accumulate", "4", "--resume", "--out", str(one)) == 0
    assert "(step 6, 2 rank(s) then, 1 now)" in capsys.readouterr().out
    state = _state(one, 8)
    assert state["world"] == 1 and all(torch.isfinite(v).all() for v in state["model"].values())
    _report(
        "nccl 4 -> 2 -> 1: CUDA checkpoints resumed across rank counts; 4 -> 4 bit-identical; "
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    )
