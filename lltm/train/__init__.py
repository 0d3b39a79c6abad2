"""`lltm train`: LLTM (or nn.LSTM) sequence models on copy, adding and charlm tasks.

tasks.py      data generated on the fly, a function of (seed, step)
model.py      embedding/linear in, lltm.LLTM or nn.LSTM, linear out; equal-parameter matching
loop.py       the training loop: progress, metrics, held-out evaluation, the resume decision,
              gradient accumulation, per-rank throughput and the scaling probe
checkpoint.py atomic checkpoints, the last k kept, damaged ones put aside
ddp.py        torchrun process groups (gloo on CPU, NCCL on CUDA), DDP options, the watchdog
plot.py       loss curves against steps and wall-clock
cli.py        the command's arguments and run function
"""
