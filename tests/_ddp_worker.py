"""torchrun entry point of tests/test_ddp.py: DDP against one process, for several configurations
in one process group (one launch, whatever the number of configurations).

    torchrun --nproc_per_node N tests/_ddp_worker.py --device cpu --text F --out R.pt \
        --configs fused:float32:sgd,fused:float32:adam,...

For each configuration (backend:dtype:optimizer) every rank trains `--steps` DDP steps with
lltm.train's own step (lltm.train.loop.step_on) on its shard of each global batch; then rank 0
alone trains the same model, from the same weights on the same global batches, twice: on the
whole batch at once, and with the batch cut into N micro-batches (--accumulate N: each is one
rank's shard). Rank 0 saves, per configuration: the parameters after the first and the last
step of the three runs, the losses, the whole-batch gradient of the first step, and per step
the sums of absolute values the tests' tolerances are made of: over the rows of the batch
(sum_b |g_b| / B, g_b the gradient of row b alone) and over the micro-batches
(sum_r |g_r| / N).
"""

from __future__ import annotations

import argparse
import sys
import traceback

import torch

from lltm.train import ddp
from lltm.train.loop import Options, build, step_on
from lltm.train.model import ModelConfig
from lltm.train.tasks import make_task, shard


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.named_parameters()}


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.grad.detach().cpu().clone() for k, v in model.named_parameters()}


def _abs_sum(model, task, ctx, opts, x, y, parts: int) -> dict[str, torch.Tensor]:
    """sum over the `parts` contiguous pieces of (x, y) of |gradient of that piece's loss| / parts,
    at the model's current parameters (no step taken)."""
    total = {k: torch.zeros_like(p, device="cpu") for k, p in model.named_parameters()}
    for xi, yi in zip(x.chunk(parts), y.chunk(parts)):
        model.zero_grad(set_to_none=True)
        with torch.autocast(ctx.device.type, torch.bfloat16, enabled=opts.bf16):
            out = model(xi.to(ctx.device))
        task.loss(out, yi.to(ctx.device)).backward()
        for k, p in model.named_parameters():
            total[k] += p.grad.detach().cpu().abs()
    model.zero_grad(set_to_none=True)
    return {k: v / parts for k, v in total.items()}


def _reference(opts, cfg, task, device, steps: int, world: int, accumulate: int) -> dict:
    """One process, the whole global batch per step (in `accumulate` micro-batches)."""
    alone = ddp.Context(rank=0, world=1, local_rank=0, device=device)
    o = Options(**{**opts.__dict__, "accumulate": accumulate})
    model, optimizer = build(o, alone, cfg)
    out: dict = {"losses": [], "rows": [], "micro": []}
    for step in range(steps):
        x, y = task.train_batch(step)
        out["rows"].append(_abs_sum(model, task, alone, o, x, y, x.shape[0]))
        out["micro"].append(_abs_sum(model, task, alone, o, x, y, world))
        out["losses"].append(step_on(model, model, optimizer, task, alone, o, x, y).item())
        if step == 0:
            out["grad0"], out["first"] = _grads(model), _params(model)
    out["last"] = _params(model)
    return out


def _compare(item: str, args, ctx, task, cfg) -> dict:
    backend, dtype, optimizer = item.split(":")
    opts = Options(optimizer=optimizer, lr=args.lr, clip=0.0, backend=backend, bf16=dtype == "bfloat16", progress=False)
    model, opt = build(opts, ctx, cfg)
    net = ctx.wrap(model)
    run: dict = {"losses": []}
    for step in range(args.steps):
        x, y = task.train_batch(step)
        loss = step_on(net, model, opt, task, ctx, opts, shard(x, ctx.rank, ctx.world), shard(y, ctx.rank, ctx.world))
        run["losses"].append(ctx.mean(loss).item())
        ctx.beat(f"{item} step {step + 1}")
        if step == 0:
            run["first"] = _params(model)
    run["last"] = _params(model)
    del net
    if not ctx.is_main:
        return {}
    return {
        "ddp": run,
        "whole": _reference(opts, cfg, task, ctx.device, args.steps, ctx.world, 1),
        "micro": _reference(opts, cfg, task, ctx.device, args.steps, ctx.world, ctx.world),
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--text", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--configs", required=True, help="backend:dtype:optimizer,...")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=12)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--embed", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-2)
    args = p.parse_args()
    torch.set_num_threads(1)
    ctx = ddp.setup(args.device, collective_timeout=300)
    task = make_task("charlm", seed=0, batch=args.batch, seq_len=args.seq_len, eval_batches=1, text=args.text)
    cfg = ModelConfig("lltm", task.n_in, task.n_out, args.hidden, 1, args.embed, task.tokens, task.readout)
    results = {}
    for item in args.configs.split(","):
        try:
            result = _compare(item, args, ctx, task, cfg)
        except Exception:  # the same on every rank (the same code fails the same way): keep going
            result = {"error": traceback.format_exc()}
        if ctx.is_main:
            results[item] = result
        ctx.beat(f"{item} done")
        ctx.barrier()
    if ctx.is_main:
        meta = {"world": ctx.world, "device": str(ctx.device), "batch": args.batch, "seq_len": args.seq_len}
        meta.update(hidden=args.hidden)
        meta.update(lr=args.lr, steps=args.steps, torch=torch.__version__)
        if ctx.device.type == "cuda":
            meta["gpu"] = torch.cuda.get_device_name(ctx.device)
        torch.save({"meta": meta, "results": results}, args.out)
    ddp.teardown(ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
