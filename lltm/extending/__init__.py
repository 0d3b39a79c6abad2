"""lltm.extending: the other ways to extend PyTorch, as tested, importable code.

Pure Python on top of PyTorch: importing this package never needs the
compiled LLTM extension (the ``load_inline`` examples compile their own,
on first use).

Modules, one per technique:

* :mod:`~lltm.extending.autograd_functions` -- custom ``autograd.Function``:
  :class:`LinearFunction` / :func:`linear`, :class:`MulConstant`,
  :class:`CubeFunction` / :func:`cube`, :class:`SigmoidFunction`,
  once_differentiable, mark_dirty, mark_non_differentiable, setup_context
  with vmap.
* :mod:`~lltm.extending.modules` -- :class:`DnnLayer`, an ``nn.Module`` on
  :class:`LinearFunction`.
* :mod:`~lltm.extending.torch_function` -- ``__torch_function__`` types:
  :class:`ScalarTensor`, :class:`LoggingTensor`, :class:`MetadataTensor`,
  and :func:`override_coverage`.
* :mod:`~lltm.extending.conv_bn` -- :class:`FusedConvBN2d`, a memory-saving
  Conv2d + BatchNorm2d training layer, and its Functions.
* :mod:`~lltm.extending.memory` -- :func:`saved_tensors_report`, bytes saved
  for backward.
* :mod:`~lltm.extending.inline` -- operators compiled with
  ``torch.utils.cpp_extension.load_inline``.
"""

from .autograd_functions import (
    CubeFunction,
    CubeFunctionNaive,
    InplaceReLUFunction,
    LinearFunction,
    MulConstant,
    SigmoidFunction,
    SoftplusFunction,
    SoftsignFunction,
    SortFunction,
    cube,
    linear,
    mul_constant,
)
from .conv_bn import BatchNorm2dFunction, Conv2dFunction, FusedConvBN2d, FusedConvBN2dFunction, fused_conv_bn2d
from .inline import (
    ThreeXMinusYFunction,
    inline_build_available,
    load_sin_add_extension,
    load_three_x_minus_y_extension,
    sin_add,
    three_x_minus_y,
)
from .memory import SavedTensorsReport, saved_tensors_report
from .modules import DnnLayer
from .torch_function import (
    LoggingTensor,
    MetadataTensor,
    OverrideCoverage,
    ScalarTensor,
    implements,
    override_coverage,
)

__all__ = [
    # autograd Functions
    "LinearFunction",
    "linear",
    "MulConstant",
    "mul_constant",
    "CubeFunction",
    "CubeFunctionNaive",
    "cube",
    "SigmoidFunction",
    "SoftplusFunction",
    "InplaceReLUFunction",
    "SortFunction",
    "SoftsignFunction",
    # nn.Module
    "DnnLayer",
    # __torch_function__
    "ScalarTensor",
    "implements",
    "LoggingTensor",
    "MetadataTensor",
    "OverrideCoverage",
    "override_coverage",
    # fused Conv2d + BatchNorm2d
    "Conv2dFunction",
    "BatchNorm2dFunction",
    "FusedConvBN2dFunction",
    "fused_conv_bn2d",
    "FusedConvBN2d",
    # memory measurement
    "SavedTensorsReport",
    "saved_tensors_report",
    # load_inline
    "inline_build_available",
    "load_sin_add_extension",
    "load_three_x_minus_y_extension",
    "sin_add",
    "ThreeXMinusYFunction",
    "three_x_minus_y",
]
