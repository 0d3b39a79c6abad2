"""Types that take part in ``torch.*`` calls through ``__torch_function__``.

When a ``torch`` function (``torch.add``, ``torch.nn.functional.relu``,
``Tensor.__add__``, ...) receives an argument whose type defines
``__torch_function__``, PyTorch calls that method instead of its own kernel.
This lets a type that is not a tensor, or a tensor subclass, define what
every ``torch`` function means for it.

Three patterns:

* :class:`ScalarTensor` -- a tensor-*like* type (not a ``torch.Tensor``)
  with a compact representation. A dispatch table (``HANDLED_FUNCTIONS``,
  filled with the :func:`implements` decorator) gives the functions it can
  answer cheaply; everything else densifies it and calls the real function.
* :class:`LoggingTensor` -- a ``torch.Tensor`` subclass that records every
  call and defers to ``super().__torch_function__``, which runs the function
  and keeps the subclass on the results.
* :class:`MetadataTensor` -- a wrapper holding a tensor plus a metadata dict
  that travels through every ``torch`` call.

Dispatch rules, when several arguments define ``__torch_function__``: each
distinct type is asked once, subclasses before their superclasses, otherwise
left to right; the first answer that is not ``NotImplemented`` is the result;
if every one returns ``NotImplemented``, PyTorch raises ``TypeError``. For
tensor subclasses, the result takes the lowest subclass among the arguments;
two unrelated subclasses give a ``TypeError``.

When *not* to use ``__torch_function__``: it works at the Python API level
only (code compiled into C++ never sees it) and must cover the whole API to
behave predictably; to change what happens below autograd (e.g. a new
storage format), ``__torch_dispatch__`` is the right hook; for one custom
operation, a function or an autograd Function is simpler.
:func:`override_coverage` reports how much of the overridable API a type
handles.
"""

from __future__ import annotations

import contextlib
import logging
import math
import numbers
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor
from torch.overrides import get_overridable_functions, resolve_name

__all__ = [
    "ScalarTensor",
    "implements",
    "LoggingTensor",
    "MetadataTensor",
    "OverrideCoverage",
    "override_coverage",
]

_log = logging.getLogger(__name__)


def _map_structure(fn: Callable[[Any], Any], obj: Any) -> Any:
    """Apply ``fn`` to every leaf of nested lists, tuples and dicts (``torch.cat([a, b])``)."""
    if isinstance(obj, list):
        return [_map_structure(fn, o) for o in obj]
    if isinstance(obj, tuple):
        mapped = [_map_structure(fn, o) for o in obj]
        if type(obj) is tuple:
            return tuple(mapped)
        if hasattr(type(obj), "_fields"):  # namedtuple
            return type(obj)(*mapped)
        return type(obj)(mapped)  # torch.return_types.* structseq
    if isinstance(obj, dict):
        return {k: _map_structure(fn, v) for k, v in obj.items()}
    return fn(obj)


def _leaves(obj: Any) -> Iterator[Any]:
    if isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _leaves(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _leaves(o)
    else:
        yield obj


# ---------------------------------------------------------------------------
# ScalarTensor: tensor-like type with a dispatch table
# ---------------------------------------------------------------------------


class ScalarTensor:
    """An ``N x N`` identity matrix scaled by ``value``, stored as two numbers.

    ``torch`` functions in :attr:`HANDLED_FUNCTIONS` (``torch.mean``,
    ``torch.add`` with ``alpha=``, ``torch.mul``, ``torch.matmul``) are
    answered from ``(N, value)`` and return a ``ScalarTensor`` where the
    result is again a scaled identity. Any other ``torch`` function, or a
    handled one whose arguments leave the scaled-identity case, densifies
    each ``ScalarTensor`` argument with :meth:`tensor` and calls the real
    function.

    The contract: every call gives what the same call on the dense matrices
    (:meth:`tensor`, in torch's default dtype on the CPU) gives -- the same
    values up to floating-point rounding, the same dtype, the same errors.
    The shortcuts are taken only where that holds: values finite in the
    default dtype (``inf * I`` has NaN off its diagonal, so an infinite value
    goes the dense way), ``torch.mean`` only for a real value and a floating
    result dtype (``dtype=torch.int64`` raises, as it does for a dense
    tensor), ``torch.matmul`` with a tensor only for a real value and a CPU
    tensor of the default dtype.

    >>> s = ScalarTensor(3, 2.0)
    >>> torch.add(s, s, alpha=2)
    ScalarTensor(N=3, value=6.0)
    >>> torch.mean(s)
    tensor(0.6667)
    """

    HANDLED_FUNCTIONS: ClassVar[dict[Callable[..., Any], Callable[..., Any]]] = {}

    def __init__(self, N: int, value: numbers.Number) -> None:
        if isinstance(N, bool) or not isinstance(N, int) or N < 1:
            raise ValueError(f"ScalarTensor: N (the matrix size) must be a positive int, got {N!r}")
        if isinstance(value, bool) or not isinstance(value, numbers.Number):
            raise TypeError(f"ScalarTensor: value must be a Python number, got {type(value).__name__}")
        self._N = N
        self._value = value

    @property
    def N(self) -> int:
        return self._N

    @property
    def value(self) -> numbers.Number:
        return self._value

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self._N, self._N))

    def __repr__(self) -> str:
        return f"ScalarTensor(N={self._N}, value={self._value})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ScalarTensor):
            return NotImplemented
        return self._N == other._N and self._value == other._value

    __hash__ = None  # type: ignore[assignment]  # mutable-looking value type, like Tensor comparisons

    def tensor(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> Tensor:
        """The dense ``(N, N)`` matrix ``value * I``."""
        return self._value * torch.eye(self._N, dtype=dtype, device=device)

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Iterable[type],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        # Leave foreign types their turn: they may know how to combine with us.
        if not all(issubclass(t, (Tensor, ScalarTensor)) for t in types):
            return NotImplemented
        impl = cls.HANDLED_FUNCTIONS.get(func)
        if impl is not None:
            return impl(*args, **kwargs)
        return _dense_call(func, args, kwargs)


def _densify(obj: Any) -> Any:
    return obj.tensor() if isinstance(obj, ScalarTensor) else obj


def _dense_call(func: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """Fallback: replace every ScalarTensor by its dense matrix and call ``func``."""
    return func(*_map_structure(_densify, tuple(args)), **_map_structure(_densify, dict(kwargs)))


def implements(torch_function: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as ScalarTensor's override of ``torch_function``."""

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        ScalarTensor.HANDLED_FUNCTIONS[torch_function] = func
        return func

    return decorator


def _check_broadcast(op: str, scalar: ScalarTensor, other: Tensor) -> None:
    try:
        torch.broadcast_shapes(scalar.shape, other.shape)
    except RuntimeError:
        raise ValueError(
            f"{op}: {scalar!r} is a {scalar.N}x{scalar.N} matrix and does not broadcast with a "
            f"tensor of shape {tuple(other.shape)}"
        ) from None


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Number) and not isinstance(x, bool)


def _representable(x: Any) -> bool:
    """A number whose real and imaginary parts are finite in the default
    dtype, so that ``x * torch.eye(N)`` is exactly a scaled identity."""
    if not _is_number(x):
        return False
    limit = torch.finfo(torch.get_default_dtype()).max
    try:
        parts = (complex(x).real, complex(x).imag)
    except OverflowError:  # an int too large for a float
        return False
    return all(math.isfinite(p) and abs(p) <= limit for p in parts)


def _real(x: Any) -> bool:
    return _representable(x) and not isinstance(x, complex)


def _same_as_dense(other: Tensor) -> bool:
    """The shortcut with a tensor gives the dense result only where the dense
    call would run at all: a CPU tensor of the default dtype."""
    return other.device.type == "cpu" and other.dtype == torch.get_default_dtype()


@implements(torch.mean)
def _mean(input: ScalarTensor, dim: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Tensor:
    result = dtype or torch.get_default_dtype()
    if dim is not None or keepdim or not _real(input.value) or not result.is_floating_point:
        return _dense_call(torch.mean, (input, dim, keepdim), {"dtype": dtype})
    # N entries equal value among N*N; the value rounded to the matrix's dtype first.
    return torch.tensor(input.value, dtype=torch.get_default_dtype()).to(result) / input.N


@implements(torch.add)
def _add(input: Any, other: Any, *, alpha: numbers.Number = 1, out: Tensor | None = None) -> Any:
    if isinstance(input, ScalarTensor) and isinstance(other, ScalarTensor) and out is None:
        if input.N != other.N:
            raise ValueError(f"torch.add: ScalarTensor sizes differ: N={input.N} and N={other.N}")
        if all(map(_representable, (input.value, other.value, alpha))):
            value = input.value + alpha * other.value
            if _representable(value):
                return ScalarTensor(input.N, value)
    for a, b in ((input, other), (other, input)):
        if isinstance(a, ScalarTensor) and isinstance(b, Tensor):
            _check_broadcast("torch.add", a, b)
    kwargs: dict[str, Any] = {"alpha": alpha}
    if out is not None:
        kwargs["out"] = out
    return _dense_call(torch.add, (input, other), kwargs)


@implements(torch.mul)
def _mul(input: Any, other: Any, *, out: Tensor | None = None) -> Any:
    if isinstance(input, ScalarTensor) and isinstance(other, ScalarTensor) and input.N != other.N:
        raise ValueError(f"torch.mul: ScalarTensor sizes differ: N={input.N} and N={other.N}")
    if out is None:
        # number * value I, or the product of two diagonals
        a = input.value if isinstance(input, ScalarTensor) else input
        b = other.value if isinstance(other, ScalarTensor) else other
        n = input.N if isinstance(input, ScalarTensor) else other.N
        if _representable(a) and _representable(b) and _representable(a * b):
            return ScalarTensor(n, a * b)
    for a, b in ((input, other), (other, input)):
        if isinstance(a, ScalarTensor) and isinstance(b, Tensor):
            _check_broadcast("torch.mul", a, b)
    return _dense_call(torch.mul, (input, other), {} if out is None else {"out": out})


@implements(torch.matmul)
def _matmul(input: Any, other: Any, *, out: Tensor | None = None) -> Any:
    if out is not None:
        return _dense_call(torch.matmul, (input, other), {"out": out})
    if isinstance(input, ScalarTensor) and isinstance(other, ScalarTensor):
        if input.N != other.N:
            raise ValueError(f"torch.matmul: ScalarTensor sizes differ: N={input.N} and N={other.N}")
        # matmul needs one dtype: both real (default dtype) or both complex
        same = isinstance(input.value, complex) == isinstance(other.value, complex)
        if same and _representable(input.value) and _representable(other.value):
            value = input.value * other.value
            if _representable(value):
                return ScalarTensor(input.N, value)
        return _dense_call(torch.matmul, (input, other), {})
    if isinstance(input, ScalarTensor) and isinstance(other, Tensor):
        # (N, N) @ (..., N, k) or (N,): rows of other must number N.
        rows = other.shape[0] if other.dim() == 1 else other.shape[-2] if other.dim() >= 2 else None
        if rows != input.N:
            raise ValueError(
                f"torch.matmul: {input!r} is {input.N}x{input.N}; it cannot multiply a tensor of shape "
                f"{tuple(other.shape)} (needs {input.N} rows)"
            )
        if _real(input.value) and _same_as_dense(other):
            return other * input.value
    if isinstance(other, ScalarTensor) and isinstance(input, Tensor):
        cols = input.shape[-1] if input.dim() >= 1 else None
        if cols != other.N:
            raise ValueError(
                f"torch.matmul: a tensor of shape {tuple(input.shape)} cannot multiply {other!r} "
                f"(needs {other.N} columns)"
            )
        if _real(other.value) and _same_as_dense(input):
            return input * other.value
    return _dense_call(torch.matmul, (input, other), {})


# ---------------------------------------------------------------------------
# LoggingTensor: Tensor subclass that records calls
# ---------------------------------------------------------------------------


class LoggingTensor(Tensor):
    """A ``torch.Tensor`` subclass that records the name of every torch call on it.

    Make one with ``t.as_subclass(LoggingTensor)``. Results of torch calls
    stay ``LoggingTensor`` (``super().__torch_function__`` converts them), so
    the whole computation is recorded. Use :meth:`record` to collect names:

    >>> x = torch.ones(2).as_subclass(LoggingTensor)
    >>> with LoggingTensor.record() as calls:
    ...     y = torch.add(x, 1).sum()
    >>> calls
    ['torch.add', 'torch.Tensor.sum']

    Only the resolved function name is recorded (and logged at DEBUG level on
    this module's logger), never the arguments' ``repr``: formatting a
    ``LoggingTensor`` would call ``Tensor.__repr__``, itself a torch call,
    which is why ``__repr__`` is not recorded.

    Calls are forwarded with ``super().__torch_function__``, not by calling
    ``func`` again, which would re-enter this method forever.
    """

    _recorders: ClassVar[list[list[str]]] = []

    @classmethod
    @contextlib.contextmanager
    def record(cls) -> Iterator[list[str]]:
        """Context manager yielding a list that receives each call's name."""
        calls: list[str] = []
        cls._recorders.append(calls)
        try:
            yield calls
        finally:
            cls._recorders.remove(calls)

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Iterable[type],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        if func is not Tensor.__repr__:
            name = resolve_name(func) or getattr(func, "__name__", repr(func))
            for calls in cls._recorders:
                calls.append(name)
            _log.debug("torch call: %s", name)
        return super().__torch_function__(func, types, args, kwargs or {})


# ---------------------------------------------------------------------------
# MetadataTensor: wrapper that carries a dict through torch calls
# ---------------------------------------------------------------------------


class MetadataTensor:
    """A tensor plus a ``metadata`` dict that follows it through torch functions.

    Every torch function applied to a ``MetadataTensor`` runs on the wrapped
    tensor(s); each tensor in the result is wrapped again, carrying the
    metadata of the arguments merged left to right (on a key conflict the
    leftmost argument wins). Non-tensor results (``torch.numel``) come back
    unwrapped.

    >>> m = MetadataTensor([1, 2, 3], metadata={"unit": "m"})
    >>> r = torch.add(m, torch.tensor([1, 1, 1]))
    >>> r.metadata, r.tensor
    ({'unit': 'm'}, tensor([2, 3, 4]))

    data: anything ``torch.as_tensor`` accepts; metadata: a mapping (copied).
    """

    def __init__(self, data: Any, metadata: Mapping[str, Any] | None = None) -> None:
        if isinstance(data, MetadataTensor):
            raise TypeError("MetadataTensor: data is already a MetadataTensor; pass data.tensor")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TypeError(f"MetadataTensor: metadata must be a mapping, got {type(metadata).__name__}")
        self._t = torch.as_tensor(data)
        self._metadata = dict(metadata or {})

    @property
    def tensor(self) -> Tensor:
        return self._t

    @property
    def metadata(self) -> dict[str, Any]:
        return self._metadata

    def __repr__(self) -> str:
        return f"MetadataTensor({self._t!r}, metadata={self._metadata!r})"

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Iterable[type],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if not all(issubclass(t, (Tensor, MetadataTensor)) for t in types):
            return NotImplemented
        merged: dict[str, Any] = {}
        for leaf in _leaves((args, kwargs)):
            if isinstance(leaf, MetadataTensor):
                for key, value in leaf.metadata.items():
                    merged.setdefault(key, value)

        def unwrap(obj: Any) -> Any:
            return obj.tensor if isinstance(obj, MetadataTensor) else obj

        def wrap(obj: Any) -> Any:
            return MetadataTensor(obj, merged) if isinstance(obj, Tensor) else obj

        result = func(*_map_structure(unwrap, tuple(args)), **_map_structure(unwrap, kwargs))
        return _map_structure(wrap, result)


# ---------------------------------------------------------------------------
# Coverage of the overridable API
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OverrideCoverage:
    """What :func:`override_coverage` found.

    handled: names of overridable functions the type handles, grouped by
        namespace (``{"torch": ["torch.add", ...], "torch.Tensor": [...]}``),
        sorted.
    total: number of distinct overridable functions PyTorch reports.
    not_overridable: names of handled entries PyTorch never dispatches to
        ``__torch_function__`` (dead table entries).
    """

    handled: dict[str, list[str]]
    total: int
    not_overridable: list[str]

    @property
    def handled_count(self) -> int:
        return sum(len(v) for v in self.handled.values())

    @property
    def fraction(self) -> float:
        return self.handled_count / self.total if self.total else 0.0


def _name(func: Callable[..., Any]) -> str:
    return resolve_name(func) or getattr(func, "__qualname__", None) or repr(func)


def override_coverage(
    handled: type | Mapping[Callable[..., Any], Any] | Iterable[Callable[..., Any]],
) -> OverrideCoverage:
    """Report which overridable ``torch`` functions a ``__torch_function__`` type handles.

    ``handled`` is a class with a ``HANDLED_FUNCTIONS`` table (such as
    :class:`ScalarTensor`), the table itself, or an iterable of functions.
    The reference list is ``torch.overrides.get_overridable_functions()``;
    entries outside it (e.g. functions in ``get_ignored_functions()``) are
    reported in ``not_overridable``.
    """
    if isinstance(handled, type):
        table = getattr(handled, "HANDLED_FUNCTIONS", None)
        if table is None:
            raise TypeError(f"override_coverage: {handled.__name__} has no HANDLED_FUNCTIONS table")
        funcs = set(table)
    else:
        funcs = set(handled)
    # The table PyTorch returns lists some functions twice; count each once.
    overridable = {f for fs in get_overridable_functions().values() for f in fs}
    seen = funcs & overridable
    by_namespace: dict[str, list[str]] = {}
    for func in seen:
        name = _name(func)
        by_namespace.setdefault(name.rpartition(".")[0] or name, []).append(name)
    dead = sorted(_name(f) for f in funcs - seen)
    return OverrideCoverage(
        handled={k: sorted(v) for k, v in sorted(by_namespace.items())},
        total=len(overridable),
        not_overridable=dead,
    )
