"""`lltm train`: LLTM (or nn.LSTM) sequence models on copy, adding and charlm tasks.

tasks.py      data generated on the fly, a function of (seed, step)
model.py      embedding/linear in, lltm.LLTM or nn.LSTM, linear out; equal-parameter matching
loop.py       the training loop: progress, metrics, held-out evaluation
checkpoint.py atomic checkpoints, the last k kept, resume
ddp.py        torchrun process groups (gloo on CPU, NCCL on CUDA)
plot.py       loss curves against steps and wall-clock
cli.py        the command's arguments and run function
"""
