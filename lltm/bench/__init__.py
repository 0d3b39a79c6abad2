"""Measurement of lltm, in one place (`lltm bench` and the GPU scripts).

`lltm bench` (lltm.bench.cli) times the forward and the backward of every
backend side by side with peers (torch.compile of the python cell, nn.LSTMCell,
the bare GEMMs), or with --seq T one lltm.LLTM layer against nn.LSTM, with
memory. One job per module:

    cases.py            the rows: what is timed, or why a row cannot run here
    timing.py           how: host clock per synchronised pass, torch.utils.benchmark
                        rounds, saved-for-backward bytes and CUDA peak memory
    report.py           the table, JSON and plot; every derived number computed once
    cli.py              the arguments of `lltm bench` and the run

Backward is `torch.autograd.backward(outputs, fixed output gradients)`, so it
times the backward pass alone (the tutorial summed the outputs first, which
adds three eager ops). By default every input needs a gradient (input, state
and parameters, as inside an unrolled sequence); --param-grads-only reproduces
the tutorial's setting. Each backward starts from `.grad = None` on every
leaf, as after `optimizer.zero_grad()`; --accumulate-grads keeps the
tutorial's loop, which adds into `.grad` on every pass.

Scripts run as modules (`python -m lltm.bench.<name> --help`):

    cuda_profile.py     host cost per call and GPU time per kernel of the fused CUDA cell
    cuda_path_sweep.py  the fused CUDA backend's two paths against each other and the GEMMs
    conv_bn_memory.py   memory and time of lltm.extending's fused Conv2d+BatchNorm2d
    plan_fit.py         the fused CUDA planner's cost model fitted to the tuner's trial times
"""

from lltm.bench.cli import add_arguments, run

__all__ = ["add_arguments", "run"]
