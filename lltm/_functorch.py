"""torch.func (vmap, grad, vjp, jacrev) over the compiled operators.

The compiled backends' autograd formulas are C++ autograd Functions, which
functorch's transforms refuse ("cannot use C++ torch::autograd::Function
with functorch transforms"). This module gives every forward/backward
operator pair, described once by an :class:`OpPair`:

- a vmap rule for each of the two operators (``torch.library.register_vmap``):
  a vmapped dimension is folded into the operator's own batch dimension
  (one call for the whole vmapped batch) where the arguments shared by the
  batch (the weights) are not vmapped and no result is a sum over the batch
  (the weight gradients); otherwise the operator is called once per vmapped
  entry;
- a Python ``torch.autograd.Function`` over the same two operators (its
  backward is the backward operator, its vmap rule derived from the
  operators' rules), which lltm.functional uses instead of the C++ autograd
  only while a functorch transform is active (:func:`active`).

Per-sample gradients (``vmap(grad(loss))`` through
``torch.func.functional_call``), grad, vjp and jacrev then run on the
compiled kernels. Not supported (an error names backend="python", which
supports them): forward-mode AD (jvp, jacfwd, hessian) and a gradient of a
gradient (nested grad / vjp / jacrev), since the backward operators are
hand-derived formulas, not differentiable themselves.

Adding an operator pair (a new cell): describe it with an OpPair and call
:func:`register` once per backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor

__all__ = ["OpPair", "PAIRS", "active", "apply", "check_transforms", "register"]

MASK = "output_mask"  # the backward operator's list[bool] of the gradients to compute


@dataclass(frozen=True)
class OpPair:
    """A forward operator ``lltm::<backend>_<family>_forward`` and its
    backward ``lltm::<backend>_<family>_backward``, by argument names.

    inputs:  the forward operator's arguments, in order.
    outputs: its results, in order.
    nondifferentiable: results that get no gradient (saved activations).
    backward_args: the backward operator's arguments, in order: "grad:<result>"
        for the gradient of a result, the name of a forward argument or
        result (saved by the forward), or MASK.
    gradients: the forward arguments the backward returns gradients for,
        in the order of its results (and of MASK).
    optional_grads: the backward takes None for a result's gradient that
        is not needed (else zeros are passed).
    batch_dims: the dimension of the operator's batch in each tensor
        argument and result (by name); None for a tensor shared by the
        whole batch (weights, bias): the gradient of such an argument is a
        sum over the batch.
    """

    family: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nondifferentiable: tuple[str, ...]
    backward_args: tuple[str, ...]
    gradients: tuple[str, ...]
    optional_grads: bool
    batch_dims: dict[str, Optional[int]]

    def forward_op(self, backend: str) -> Any:
        return getattr(torch.ops.lltm, f"{backend}_{self.family}_forward").default

    def backward_op(self, backend: str) -> Any:
        return getattr(torch.ops.lltm, f"{backend}_{self.family}_backward").default

    def backward_arg_dims(self) -> tuple[Any, ...]:
        """Batch dimension of each backward argument (STATIC for MASK)."""
        return tuple(_STATIC if a == MASK else self.batch_dims[a.removeprefix("grad:")] for a in self.backward_args)


CELL = OpPair(
    family="cell",
    inputs=("input", "weights", "bias", "old_h", "old_cell"),
    outputs=("new_h", "new_cell", "gates"),
    nondifferentiable=("gates",),
    backward_args=("grad:new_h", "grad:new_cell", "new_cell", "gates", "input", "weights", "old_h", MASK),
    gradients=("input", "weights", "bias", "old_h", "old_cell"),
    optional_grads=False,
    batch_dims={
        "input": 0,
        "weights": None,
        "bias": None,
        "old_h": 0,
        "old_cell": 0,
        "new_h": 0,
        "new_cell": 0,
        "gates": 0,
    },
)

SEQ = OpPair(
    family="seq",
    inputs=("input", "weights", "bias", "h0", "c0", "lengths"),
    outputs=("output", "h_n", "c_n", "gates"),
    nondifferentiable=("gates",),
    backward_args=(
        "grad:output",
        "grad:h_n",
        "grad:c_n",
        "input",
        "weights",
        "h0",
        "c0",
        "output",
        "gates",
        "lengths",
        MASK,
    ),
    gradients=("input", "weights", "bias", "h0", "c0"),
    optional_grads=True,
    batch_dims={
        "input": 1,
        "weights": None,
        "bias": None,
        "h0": 0,
        "c0": 0,
        "lengths": 0,
        "output": 1,
        "h_n": 0,
        "c_n": 0,
        "gates": 1,
    },
)

PAIRS: dict[str, OpPair] = {"cell": CELL, "seq": SEQ}


# ---------------------------------------------------------------------------
# vmap rules of the operators

_STATIC = object()  # a non-tensor argument (MASK)
_SUM = object()  # a result summed over the operator's batch


def vmap_rule(op: Any, arg_dims: tuple[Any, ...], out_dims: tuple[Any, ...]) -> Callable:
    """The vmap rule of `op` (register_vmap's signature): arg_dims and
    out_dims give the operator's batch dimension per argument and result
    (None: an argument shared by the batch; _SUM: a result summed over it;
    _STATIC: not a tensor)."""
    mask_at = next((i for i, d in enumerate(arg_dims) if d is _STATIC), None)

    def rule(info: Any, in_dims: tuple, *args: Any) -> tuple[tuple, tuple]:
        wanted = list(args[mask_at]) if mask_at is not None else [True] * len(out_dims)
        vmapped = [isinstance(a, Tensor) and d is not None for a, d in zip(args, in_dims)]
        shared_vmapped = any(v and d is None for v, d in zip(vmapped, arg_dims))
        sums_wanted = any(d is _SUM and w for d, w in zip(out_dims, wanted))
        if shared_vmapped or sums_wanted:
            return _loop(op, info.batch_size, in_dims, args, wanted)
        return _fold(op, info.batch_size, in_dims, args, arg_dims, out_dims, wanted)

    return rule


def _fold(op, n, in_dims, args, arg_dims, out_dims, wanted):
    """One call: the vmapped dimension n merged into the operator's batch
    dimension of every batched argument (unvmapped ones expanded)."""
    batch = next(
        (a.shape[d] if i is None else a.movedim(i, 0).shape[d + 1])
        for a, d, i in zip(args, arg_dims, in_dims)
        if isinstance(a, Tensor) and isinstance(d, int)
    )
    folded = []
    for a, d, i in zip(args, arg_dims, in_dims):
        if isinstance(a, Tensor) and isinstance(d, int):
            a = a.movedim(i, d) if i is not None else a.unsqueeze(d).expand(*a.shape[:d], n, *a.shape[d:])
            a = a.flatten(d, d + 1)
        folded.append(a)
    results = op(*folded)
    outs, dims = [], []
    for r, d, w in zip(results, out_dims, wanted):
        if w and isinstance(d, int):
            outs.append(r.unflatten(d, (n, batch)))
            dims.append(d)
        else:  # an empty placeholder (not asked for): the same for every entry
            outs.append(r)
            dims.append(None)
    return tuple(outs), tuple(dims)


def _loop(op, n, in_dims, args, wanted):
    """One call per vmapped entry, results stacked on dimension 0."""
    calls = [
        op(*(a.select(i, k) if isinstance(a, Tensor) and i is not None else a for a, i in zip(args, in_dims)))
        for k in range(n)
    ]
    outs, dims = [], []
    for j, w in enumerate(wanted):
        if w:
            outs.append(torch.stack([c[j] for c in calls]))
            dims.append(0)
        else:
            outs.append(calls[0][j])
            dims.append(None)
    return tuple(outs), tuple(dims)


# ---------------------------------------------------------------------------
# the autograd Function used under functorch transforms

_FUNCTIONS: dict[tuple[str, str], type] = {}


def _function(pair: OpPair, backend: str) -> type:
    """A torch.autograd.Function over the pair's two operators."""
    forward_op, backward_op = pair.forward_op(backend), pair.backward_op(backend)
    saved = [a for a in pair.backward_args if a != MASK and not a.startswith("grad:")]
    grad_index = [pair.inputs.index(g) for g in pair.gradients]
    nondiff = [pair.outputs.index(o) for o in pair.nondifferentiable]

    class Function(torch.autograd.Function):
        generate_vmap_rule = True  # from the operators' vmap rules

        @staticmethod
        def forward(*args: Any) -> tuple[Tensor, ...]:
            # No graph below this Function (the C++ autograd would record one
            # for tensors that also require grad outside the transform).
            with torch.no_grad():
                return tuple(forward_op(*args))

        @staticmethod
        def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
            values = dict(zip(pair.inputs, inputs)) | dict(zip(pair.outputs, output))
            ctx.save_for_backward(*(values[name] for name in saved))
            ctx.mark_non_differentiable(*(output[i] for i in nondiff))
            ctx.set_materialize_grads(not pair.optional_grads)

        @staticmethod
        def backward(ctx: Any, *grads: Optional[Tensor]) -> tuple[Optional[Tensor], ...]:
            values = dict(zip(saved, ctx.saved_tensors))
            mask = [bool(ctx.needs_input_grad[i]) for i in grad_index]
            args = []
            for a in pair.backward_args:
                if a == MASK:
                    args.append(mask)
                elif a.startswith("grad:"):
                    args.append(grads[pair.outputs.index(a[5:])])
                else:
                    args.append(values[a])
            with torch.no_grad():  # the gradients are not differentiable (check_transforms)
                results = backward_op(*args)
            out: list[Optional[Tensor]] = [None] * len(pair.inputs)
            for i, r, w in zip(grad_index, results, mask):
                out[i] = r if w else None
            return tuple(out)

    Function.__name__ = Function.__qualname__ = f"{backend}_{pair.family}"
    return Function


def register(pair: OpPair, backend: str) -> None:
    """The vmap rules of the pair's two operators for `backend`, and its
    autograd Function for apply()."""
    forward_op, backward_op = pair.forward_op(backend), pair.backward_op(backend)
    in_dims = tuple(pair.batch_dims[a] for a in pair.inputs)
    out_dims = tuple(pair.batch_dims[o] for o in pair.outputs)
    grad_dims = tuple(_SUM if pair.batch_dims[g] is None else pair.batch_dims[g] for g in pair.gradients)
    torch.library.register_vmap(forward_op, vmap_rule(forward_op, in_dims, out_dims))
    torch.library.register_vmap(backward_op, vmap_rule(backward_op, pair.backward_arg_dims(), grad_dims))
    _FUNCTIONS[(pair.family, backend)] = _function(pair, backend)


def active() -> bool:
    """Whether a functorch transform (vmap, grad, vjp, jacrev, ...) is active."""
    return torch._C._are_functorch_transforms_active()


def check_transforms(op: str, backend: str) -> None:
    """Refuses, naming backend="python", the transforms the operators cannot
    serve: forward-mode AD, and a gradient of a gradient."""
    kinds = [i.key() for i in torch._C._functorch.get_interpreter_stack() or ()]
    types = torch._C._functorch.TransformType
    if types.Jvp in kinds:
        raise RuntimeError(
            f"{op}: backend {backend!r} has no forward-mode derivative (torch.func.jvp, jacfwd, hessian); "
            "use backend='python' for that"
        )
    if kinds.count(types.Grad) > 1:
        raise RuntimeError(
            f"{op}: backend {backend!r} does not support a gradient of a gradient (nested torch.func.grad, "
            "vjp or jacrev): its backward is a hand-derived formula, not differentiable; "
            "use backend='python' for that"
        )


def apply(family: str, backend: str, *args: Any) -> tuple[Tensor, ...]:
    """The forward operator of (family, backend) through its Python autograd
    Function: what lltm.functional calls while a functorch transform is active."""
    return _FUNCTIONS[(family, backend)].apply(*args)


def register_all(backends: tuple[str, ...]) -> None:
    for backend in backends:
        for pair in PAIRS.values():
            register(pair, backend)
