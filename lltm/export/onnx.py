"""ONNX export of the LLTM: the sequence operators as ONNX ops.

torch.onnx's exporter (the dynamo-based one, ``dynamo=True``) translates an
exported program node by node; the lltm operators are not ONNX operators,
so :data:`TRANSLATIONS` (the exporter's ``custom_translation_table``) says
how to write them in ONNX: the input projection of all T steps as one
MatMul, then a ``Scan`` over time whose body is one step of the cell
(MatMul with the recurrent weights, Sigmoid, Tanh, and elu as Where/Exp), with the states
as its loop-carried values and the output and gates as its scan outputs.
A PackedSequence's lengths become a (T, B, 1) mask the body selects with
(Where): a row past its length keeps its state and outputs 0, as the
operators do. T and B stay symbolic.

    import lltm, torch
    from lltm.export.onnx import export

    model = lltm.LLTM(32, 128, num_layers=2).eval()
    program = export(model, torch.randn(10, 4, 32))   # a torch.onnx.ONNXProgram
    program.save("lltm.onnx")                           # runs in onnxruntime, any T and B

Needs the onnx and onnxscript packages (and onnxruntime to run the model).
"""

from __future__ import annotations

from typing import Any, Optional, TypeVar, Union

import torch
from onnxscript import BFLOAT16, DOUBLE, FLOAT, FLOAT16, INT64, graph, script
from onnxscript import opset18 as op

__all__ = ["TRANSLATIONS", "cell_forward", "export", "seq_forward", "translations"]

TFloat = TypeVar("TFloat", bound=Union[FLOAT16, FLOAT, DOUBLE, BFLOAT16])


@script()
def _layer(
    input: TFloat, weights: TFloat, bias: TFloat, h0: TFloat, c0: TFloat
) -> tuple[TFloat, TFloat, TFloat, TFloat]:
    """One LLTM layer: output (T, B, S), h_n, c_n (B, S), gates (T, B, 3S)."""
    state = op.Shape(h0, start=1, end=2)
    one = op.Constant(value_ints=[1])
    w_h = op.Slice(weights, op.Constant(value_ints=[0]), state, one, one)  # (3S, S)
    w_x = op.Slice(weights, state, op.Constant(value_ints=[9223372036854775807]), one, one)  # (3S, I)
    projected = op.Add(op.MatMul(input, op.Transpose(w_x, perm=[1, 0])), bias)  # (T, B, 3S)
    w_h_t = op.Transpose(w_h, perm=[1, 0])
    zero = op.CastLike(op.Constant(value_float=0.0), h0)
    one_like = op.CastLike(op.Constant(value_float=1.0), h0)

    @graph()
    def step(h, c, projected_t):
        pre = op.Add(projected_t, op.MatMul(h, w_h_t))
        i, o, z = op.Split(pre, axis=1, num_outputs=3)
        input_gate = op.Sigmoid(i)
        output_gate = op.Sigmoid(o)
        # elu(z) = z if z > 0 else exp(z) - 1 (onnxruntime's Elu has no float64 kernel)
        candidate = op.Where(op.Greater(z, zero), z, op.Sub(op.Exp(z), one_like))
        new_c = op.Add(c, op.Mul(candidate, input_gate))
        new_h = op.Mul(op.Tanh(new_c), output_gate)
        return new_h, new_c, op.Identity(new_h), op.Concat(input_gate, output_gate, candidate, axis=1)

    h_n, c_n, output, gates = op.Scan(h0, c0, projected, body=step, num_scan_inputs=1)
    return output, h_n, c_n, gates


@script()
def _masked_layer(
    input: TFloat, weights: TFloat, bias: TFloat, h0: TFloat, c0: TFloat, lengths: INT64
) -> tuple[TFloat, TFloat, TFloat, TFloat]:
    """_layer where row b takes only its first lengths[b] steps."""
    state = op.Shape(h0, start=1, end=2)
    one = op.Constant(value_ints=[1])
    w_h = op.Slice(weights, op.Constant(value_ints=[0]), state, one, one)
    w_x = op.Slice(weights, state, op.Constant(value_ints=[9223372036854775807]), one, one)
    projected = op.Add(op.MatMul(input, op.Transpose(w_x, perm=[1, 0])), bias)
    w_h_t = op.Transpose(w_h, perm=[1, 0])
    steps = op.Squeeze(op.Shape(input, start=0, end=1))
    t = op.Range(op.Constant(value_int=0), steps, op.Constant(value_int=1))
    # (T, B, 1): step t of row b is inside its sequence
    inside = op.Unsqueeze(op.Less(op.Unsqueeze(t, [1]), op.Unsqueeze(lengths, [0])), [2])
    zero = op.CastLike(op.Constant(value_float=0.0), h0)
    one_like = op.CastLike(op.Constant(value_float=1.0), h0)

    @graph()
    def step(h, c, projected_t, inside_t):
        pre = op.Add(projected_t, op.MatMul(h, w_h_t))
        i, o, z = op.Split(pre, axis=1, num_outputs=3)
        input_gate = op.Sigmoid(i)
        output_gate = op.Sigmoid(o)
        # elu(z) = z if z > 0 else exp(z) - 1 (onnxruntime's Elu has no float64 kernel)
        candidate = op.Where(op.Greater(z, zero), z, op.Sub(op.Exp(z), one_like))
        new_c = op.Add(c, op.Mul(candidate, input_gate))
        new_h = op.Mul(op.Tanh(new_c), output_gate)
        gates = op.Concat(input_gate, output_gate, candidate, axis=1)
        return (
            op.Where(inside_t, new_h, h),
            op.Where(inside_t, new_c, c),
            op.Where(inside_t, new_h, zero),
            op.Where(inside_t, gates, zero),
        )

    h_n, c_n, output, gates = op.Scan(h0, c0, projected, inside, body=step, num_scan_inputs=2)
    return output, h_n, c_n, gates


@script()
def _cell(
    input: TFloat, weights: TFloat, bias: TFloat, old_h: TFloat, old_cell: TFloat
) -> tuple[TFloat, TFloat, TFloat]:
    """One LLTM step: new_h, new_cell (B, S), gates (B, 3S)."""
    pre = op.Add(op.MatMul(op.Concat(old_h, input, axis=1), op.Transpose(weights, perm=[1, 0])), bias)
    i, o, z = op.Split(pre, axis=1, num_outputs=3)
    input_gate = op.Sigmoid(i)
    output_gate = op.Sigmoid(o)
    zero = op.CastLike(op.Constant(value_float=0.0), z)
    candidate = op.Where(op.Greater(z, zero), z, op.Sub(op.Exp(z), op.CastLike(op.Constant(value_float=1.0), z)))
    new_cell = op.Add(old_cell, op.Mul(candidate, input_gate))
    new_h = op.Mul(op.Tanh(new_cell), output_gate)
    return new_h, new_cell, op.Concat(input_gate, output_gate, candidate, axis=1)


def _bias_or_zeros(bias: Optional[Any], weights: Any) -> Any:
    if bias is not None:
        return bias
    # (3S,) zeros: the number of rows of weights, in its dtype
    return op.CastLike(op.ConstantOfShape(op.Shape(weights, start=0, end=1)), weights)


def cell_forward(input: Any, weights: Any, bias: Optional[Any], old_h: Any, old_cell: Any) -> tuple[Any, Any, Any]:
    """The ONNX translation of lltm::<backend>_cell_forward: (new_h, new_cell, gates)."""
    return _cell(input, weights, _bias_or_zeros(bias, weights), old_h, old_cell)


def seq_forward(
    input: Any, weights: Any, bias: Optional[Any], h0: Any, c0: Any, lengths: Optional[Any] = None
) -> tuple[Any, Any, Any, Any]:
    """The ONNX translation of lltm::<backend>_seq_forward (every backend
    computes the same function): (output, h_n, c_n, gates)."""
    bias = _bias_or_zeros(bias, weights)
    if lengths is None:
        return _layer(input, weights, bias, h0, c0)
    return _masked_layer(input, weights, bias, h0, c0, lengths)


# operator family -> its ONNX translation (every backend computes the same function)
FAMILIES = {"cell_forward": cell_forward, "seq_forward": seq_forward}


def translations() -> dict[Any, Any]:
    """torch.onnx.export's custom_translation_table for the lltm forward
    operators of every compiled backend."""
    from lltm import _extension
    from lltm._meta import COMPILED_BACKENDS

    _extension.load()
    return {
        getattr(torch.ops.lltm, f"{backend}_{family}").default: translate
        for backend in COMPILED_BACKENDS
        for family, translate in FAMILIES.items()
    }


TRANSLATIONS = translations()


def export(model: torch.nn.Module, *args: Any, dynamic: bool = True, **kwargs: Any) -> Any:
    """torch.onnx.export(model, args, dynamo=True) with the lltm translations;
    dynamic=True makes T and B of a time-major (T, B, I) input symbolic
    (batch_first: (B, T, I)). Other keyword arguments go to torch.onnx.export.
    Returns its ONNXProgram (``.save(path)``)."""
    if dynamic and "dynamic_shapes" not in kwargs and len(args) == 1 and isinstance(args[0], torch.Tensor):
        kwargs["dynamic_shapes"] = ({0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC},)
    table = {**TRANSLATIONS, **kwargs.pop("custom_translation_table", {})}
    kwargs.setdefault("verbose", False)
    return torch.onnx.export(model, args, dynamo=True, custom_translation_table=table, **kwargs)
