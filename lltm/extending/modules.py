"""An ``nn.Module`` built on a custom autograd Function.

A Module is the place for state: trainable parameters and buffers, their
initialisation, device/dtype placement and ``state_dict`` round trips. The
math lives in a Function (here :class:`~lltm.extending.LinearFunction`); the
Module only owns the parameters and calls ``Function.apply``.

When *not* to write one: an operation without state belongs in a function
(``torch.nn.functional`` style); and a plain fully connected layer is already
``nn.Linear`` -- :class:`DnnLayer` exists to show the pattern, and it keeps
``nn.Linear``'s parameter names, shapes and initialisation so the two are
interchangeable.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .autograd_functions import LinearFunction

__all__ = ["DnnLayer"]


class DnnLayer(nn.Module):
    """Fully connected layer ``y = x @ weight.T + bias`` on :class:`LinearFunction`.

    Args:
        in_features: size of the last dimension of the input.
        out_features: size of the last dimension of the output.
        bias: if False, no bias; ``self.bias`` is registered as ``None`` so
            code that inspects it (and ``state_dict``) sees a consistent layer.

    Shapes: input (*, in_features) -> output (*, out_features).

    Attributes:
        weight: Parameter (out_features, in_features).
        bias: Parameter (out_features,) or None.

    Same parameter names, shapes and init distribution as ``nn.Linear``: a
    state_dict from one loads into the other and the outputs are equal.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"DnnLayer: {name} must be a positive int, got {value!r}")
        factory = {"device": device, "dtype": dtype}
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **factory))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise like ``nn.Linear``: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in))."""
        # kaiming_uniform_ with a=sqrt(5) is nn.Linear's choice; it reduces to U(±1/sqrt(fan_in)).
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_features)
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor) -> Tensor:
        """input: (*, in_features) -> (*, out_features)."""
        return LinearFunction.apply(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
