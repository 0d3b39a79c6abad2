"""__torch_function__ types and the dispatch rules of the protocol."""

import logging

import pytest
import torch

from lltm.extending import LoggingTensor, MetadataTensor, ScalarTensor, implements, override_coverage

# ---------------------------------------------------------------------------
# ScalarTensor
# ---------------------------------------------------------------------------


def test_plain_class_is_rejected_by_torch():
    class NotATensor:
        pass

    with pytest.raises(TypeError, match="must be Tensor"):
        torch.mean(NotATensor())


def test_scalar_tensor_dense_form():
    torch.testing.assert_close(ScalarTensor(3, 2.0).tensor(), 2.0 * torch.eye(3))


def test_mean_is_answered_from_the_table():
    s = ScalarTensor(5, 2)
    torch.testing.assert_close(torch.mean(s), torch.tensor(0.4))
    torch.testing.assert_close(torch.mean(s), torch.mean(s.tensor()))


def test_mean_with_dim_densifies():
    s = ScalarTensor(3, 3.0)
    torch.testing.assert_close(torch.mean(s, dim=0), torch.full((3,), 1.0))


def test_add_two_scalar_tensors_stays_compact():
    s = ScalarTensor(2, 3.0)
    assert torch.add(s, s) == ScalarTensor(2, 6.0)


def test_add_supports_alpha():
    a, b = ScalarTensor(2, 1.0), ScalarTensor(2, 3.0)
    assert torch.add(a, b, alpha=2) == ScalarTensor(2, 7.0)
    t = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    torch.testing.assert_close(torch.add(a, t, alpha=2), a.tensor() + 2 * t)
    torch.testing.assert_close(torch.add(t, a, alpha=2), t + 2 * a.tensor())


def test_add_scalar_tensor_and_dense_tensor():
    s = ScalarTensor(2, 3.14)
    t = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    torch.testing.assert_close(torch.add(s, t), torch.tensor([[4.14, 2.0], [3.0, 7.14]]))


def test_add_with_out_argument_densifies():
    out = torch.empty(2, 2)
    r = torch.add(ScalarTensor(2, 1.0), ScalarTensor(2, 2.0), out=out)
    assert r is out
    torch.testing.assert_close(out, 3.0 * torch.eye(2))


def test_mul_and_matmul_stay_compact():
    s = ScalarTensor(3, 2.0)
    assert torch.mul(s, 4) == ScalarTensor(3, 8.0)
    assert torch.mul(4, s) == ScalarTensor(3, 8.0)
    assert torch.matmul(s, ScalarTensor(3, 5.0)) == ScalarTensor(3, 10.0)
    x = torch.randn(3, 4)
    torch.testing.assert_close(torch.matmul(s, x), s.tensor() @ x)
    torch.testing.assert_close(torch.matmul(x.t(), s), x.t() @ s.tensor())


def test_unhandled_function_falls_back_to_dense():
    s = ScalarTensor(2, 3.14)
    assert torch.exp not in ScalarTensor.HANDLED_FUNCTIONS
    torch.testing.assert_close(torch.mul(s, s.tensor()), s.tensor() * s.tensor())
    torch.testing.assert_close(torch.exp(s), torch.exp(s.tensor()))
    # Nested arguments are densified too.
    torch.testing.assert_close(torch.cat([s, torch.zeros(1, 2)]), torch.cat([s.tensor(), torch.zeros(1, 2)]))


def test_implements_registers_an_override():
    @implements(torch.trace)
    def trace(s):
        return torch.tensor(float(s.N * s.value))

    try:
        assert ScalarTensor.HANDLED_FUNCTIONS[torch.trace] is trace
        torch.testing.assert_close(torch.trace(ScalarTensor(4, 2.5)), torch.tensor(10.0))
    finally:
        del ScalarTensor.HANDLED_FUNCTIONS[torch.trace]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: torch.add(ScalarTensor(2, 1.0), ScalarTensor(3, 1.0)), r"ScalarTensor sizes differ: N=2 and N=3"),
        (lambda: torch.mul(ScalarTensor(2, 1.0), ScalarTensor(3, 1.0)), r"ScalarTensor sizes differ"),
        (
            lambda: torch.add(ScalarTensor(2, 1.0), torch.ones(2, 3)),
            r"is a 2x2 matrix and does not broadcast with a tensor of shape \(2, 3\)",
        ),
        (
            lambda: torch.matmul(ScalarTensor(3, 1.0), torch.ones(4, 2)),
            r"ScalarTensor\(N=3, value=1.0\) is 3x3; it cannot multiply a tensor of shape \(4, 2\)",
        ),
        (lambda: torch.matmul(torch.ones(2, 4), ScalarTensor(3, 1.0)), r"needs 3 columns"),
    ],
    ids=["add-size-mismatch", "mul-size-mismatch", "add-non-square-dense", "matmul-rows", "matmul-cols"],
)
def test_scalar_tensor_shape_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("N", [0, -2, 2.0, True], ids=["zero", "negative", "float", "bool"])
def test_scalar_tensor_bad_size(N):
    with pytest.raises(ValueError, match="N \\(the matrix size\\) must be a positive int"):
        ScalarTensor(N, 1.0)


def test_scalar_tensor_bad_value():
    with pytest.raises(TypeError, match="value must be a Python number, got str"):
        ScalarTensor(2, "1")


# ---------------------------------------------------------------------------
# Coverage helper
# ---------------------------------------------------------------------------


def test_override_coverage_of_scalar_tensor():
    cov = override_coverage(ScalarTensor)
    assert cov.handled == {"torch": ["torch.add", "torch.matmul", "torch.mean", "torch.mul"]}
    assert cov.not_overridable == []
    assert cov.handled_count == 4
    assert cov.total > 1000  # PyTorch overrides many functions
    assert cov.fraction == pytest.approx(4 / cov.total)


def test_override_coverage_groups_by_namespace_and_reports_dead_entries():
    cov = override_coverage([torch.add, torch.Tensor.add, torch.nn.functional.relu, torch.get_default_dtype])
    assert cov.handled == {
        "torch": ["torch.add"],
        "torch.Tensor": ["torch.Tensor.add"],
        "torch.nn.functional": ["torch.nn.functional.relu"],
    }
    # Never dispatched to __torch_function__: a table entry for it is dead code.
    assert cov.not_overridable == ["torch.get_default_dtype"]


def test_override_coverage_needs_a_table():
    with pytest.raises(TypeError, match="has no HANDLED_FUNCTIONS table"):
        override_coverage(int)


# ---------------------------------------------------------------------------
# Dispatch rules between several __torch_function__ types
# ---------------------------------------------------------------------------


def _recording_types(log):
    """Types whose __torch_function__ logs its class name and declines."""

    class Base:
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            log.append(cls.__name__)
            return NotImplemented

    class Sub(Base):
        pass

    class Other:
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            log.append(cls.__name__)
            return NotImplemented

    return Base, Sub, Other


def test_dispatch_all_not_implemented_raises_type_error():
    log = []
    Base, _, Other = _recording_types(log)
    with pytest.raises(TypeError, match="torch.add"):
        torch.add(Base(), Other())
    assert log == ["Base", "Other"]  # each was asked once before the error


def test_dispatch_subclass_before_superclass():
    log = []
    Base, Sub, _ = _recording_types(log)
    with pytest.raises(TypeError):
        torch.add(Base(), Sub())  # Base is leftmost, yet Sub is asked first
    assert log == ["Sub", "Base"]


@pytest.mark.parametrize("order", ["base-first", "other-first"])
def test_dispatch_left_to_right_for_unrelated_types(order):
    log = []
    Base, _, Other = _recording_types(log)
    args = (Base(), Other()) if order == "base-first" else (Other(), Base())
    with pytest.raises(TypeError):
        torch.add(*args)
    assert log == [type(a).__name__ for a in args]


def test_dispatch_first_answer_wins():
    log = []

    class Declines:
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            log.append("Declines")
            return NotImplemented

    class Answers:
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            log.append("Answers")
            return "answered"

    class NeverAsked(Answers):
        pass

    assert torch.add(Declines(), Answers()) == "answered"
    assert log == ["Declines", "Answers"]
    log.clear()
    assert torch.add(Answers(), Declines()) == "answered"
    assert log == ["Answers"]  # Declines is never consulted


def test_dispatch_each_type_asked_once():
    log = []
    Base, _, _ = _recording_types(log)
    with pytest.raises(TypeError):
        torch.add(Base(), Base())
    assert log == ["Base"]


# ---------------------------------------------------------------------------
# Tensor subclasses: propagation
# ---------------------------------------------------------------------------


class SubTensor(torch.Tensor):
    pass


class SubTensor2(SubTensor):
    pass


class SubTensor3(SubTensor):
    pass


def test_subclass_is_kept_through_torch_functions():
    for result in (
        torch.add(SubTensor([1.0]), SubTensor([2.0])),
        torch.add(SubTensor([1.0]), torch.tensor([2.0])),
        SubTensor([1.0]) + torch.tensor([2.0]),
    ):
        assert type(result) is SubTensor


def test_lowest_subclass_wins():
    assert type(torch.add(SubTensor2([1.0]), SubTensor([1.0]))) is SubTensor2
    assert type(torch.add(SubTensor([1.0]), SubTensor2([1.0]))) is SubTensor2
    assert type(torch.add(SubTensor2([1.0]), torch.tensor([1.0]))) is SubTensor2


def test_unrelated_subclasses_raise_type_error():
    with pytest.raises(TypeError, match="torch.add"):
        torch.add(SubTensor2([1.0]), SubTensor3([1.0]))


# ---------------------------------------------------------------------------
# LoggingTensor
# ---------------------------------------------------------------------------


def test_logging_tensor_records_calls_and_propagates():
    x = torch.ones(2).as_subclass(LoggingTensor)
    with LoggingTensor.record() as calls:
        y = torch.add(x, 1)
        z = y.sum()
    assert calls == ["torch.add", "torch.Tensor.sum"]
    assert type(y) is LoggingTensor and type(z) is LoggingTensor
    torch.testing.assert_close(z.as_subclass(torch.Tensor), torch.tensor(4.0))


def test_logging_tensor_repr_does_not_recurse_and_is_not_recorded():
    x = torch.arange(3.0).as_subclass(LoggingTensor)
    with LoggingTensor.record() as calls:
        text = repr(x)
    assert "LoggingTensor" in text and "0., 1., 2." in text
    assert calls == []


def test_logging_tensor_records_operators_and_autograd():
    x = torch.ones(3).as_subclass(LoggingTensor).requires_grad_()
    with LoggingTensor.record() as calls:
        y = (x * 2).sum()
        y.backward()
    assert "torch.Tensor.mul" in calls and "torch.Tensor.sum" in calls and "torch.Tensor.backward" in calls
    torch.testing.assert_close(x.grad.as_subclass(torch.Tensor), torch.full((3,), 2.0))


def test_logging_tensor_logs_to_module_logger(caplog):
    x = torch.ones(2).as_subclass(LoggingTensor)
    with caplog.at_level(logging.DEBUG, logger="lltm.extending.torch_function"):
        torch.neg(x)
    assert "torch call: torch.neg" in caplog.text


def test_logging_tensor_recorders_are_scoped():
    x = torch.ones(2).as_subclass(LoggingTensor)
    with LoggingTensor.record() as outer:
        torch.neg(x)
        with LoggingTensor.record() as inner:
            torch.abs(x)
    torch.exp(x)  # outside both: recorded nowhere
    assert outer == ["torch.neg", "torch.abs"]
    assert inner == ["torch.abs"]


# ---------------------------------------------------------------------------
# MetadataTensor
# ---------------------------------------------------------------------------


def test_metadata_tensor_carries_metadata_through_torch_functions():
    m = MetadataTensor([1, 2, 3, 4], metadata={"owner": "lltm"})
    t = torch.tensor([5, 6, 7, 8])
    for result, expected in ((torch.add(m, t), [6, 8, 10, 12]), (torch.mul(t, m), [5, 12, 21, 32])):
        assert isinstance(result, MetadataTensor)
        assert result.metadata == {"owner": "lltm"}
        assert result.tensor.tolist() == expected


def test_metadata_merges_left_to_right():
    a = MetadataTensor([1.0], metadata={"unit": "m", "src": "a"})
    b = MetadataTensor([2.0], metadata={"unit": "s", "batch": 3})
    r = torch.add(a, b)
    assert r.metadata == {"unit": "m", "src": "a", "batch": 3}
    assert r.tensor.tolist() == [3.0]


def test_metadata_result_is_a_copy():
    m = MetadataTensor([1.0], metadata={"k": 1})
    r = torch.neg(m)
    r.metadata["k"] = 2
    assert m.metadata == {"k": 1}


def test_metadata_tensor_in_nested_and_keyword_arguments():
    a = MetadataTensor(torch.ones(2), metadata={"part": "a"})
    r = torch.cat([a, torch.zeros(2)])
    assert r.tensor.tolist() == [1.0, 1.0, 0.0, 0.0] and r.metadata == {"part": "a"}
    r = torch.add(torch.ones(2), other=a)
    assert r.tensor.tolist() == [2.0, 2.0] and r.metadata == {"part": "a"}


def test_metadata_tensor_structured_and_non_tensor_results():
    m = MetadataTensor([3.0, 1.0, 2.0], metadata={"k": "v"})
    values, indices = torch.sort(m)
    assert values.tensor.tolist() == [1.0, 2.0, 3.0] and indices.metadata == {"k": "v"}
    result = torch.max(m, dim=0)
    assert result.values.tensor.item() == 3.0 and result.indices.tensor.item() == 0
    assert torch.numel(m) == 3  # not a tensor: returned as is


def test_metadata_tensor_bad_arguments():
    with pytest.raises(TypeError, match="metadata must be a mapping, got list"):
        MetadataTensor([1], metadata=["a"])
    with pytest.raises(TypeError, match="already a MetadataTensor"):
        MetadataTensor(MetadataTensor([1]))


def test_docstring_examples_run():
    import doctest

    import lltm.extending.torch_function as module

    result = doctest.testmod(module)
    assert result.attempted >= 3 and result.failed == 0


# ScalarTensor's contract: every call gives what the dense matrices give
# (values up to rounding, dtype, errors), shortcuts included.

SCALAR_VALUES = [2.0, -3, 0.5, 1e-3, 1e39, float("inf"), -float("inf"), float("nan"), 2 + 1j, 10**400]
SCALAR_IDS = ["2.0", "-3", "0.5", "1e-3", "1e39", "inf", "-inf", "nan", "complex", "huge-int"]


def _dense(x):
    return x.tensor() if isinstance(x, ScalarTensor) else x


def _outcome(fn, *args, **kwargs):
    """('ok', dense result) or ('error', exception type) of fn on these args."""
    try:
        result = fn(*args, **kwargs)
    except (RuntimeError, TypeError, ValueError, OverflowError) as exc:
        return "error", type(exc)
    return "ok", _dense(result)


def _assert_like_dense(fn, *args, **kwargs):
    ours = _outcome(fn, *args, **kwargs)
    dense = _outcome(fn, *(_dense(a) for a in args), **kwargs)
    assert ours[0] == dense[0], f"ScalarTensor: {ours}, dense: {dense}"
    if ours[0] == "ok":
        assert ours[1].dtype == dense[1].dtype
        torch.testing.assert_close(ours[1], dense[1], equal_nan=True, rtol=1e-6, atol=0)


@pytest.mark.filterwarnings("ignore:Casting complex values to real discards the imaginary part")
@pytest.mark.parametrize("value", SCALAR_VALUES, ids=SCALAR_IDS)
def test_scalar_tensor_is_its_dense_matrix(value):
    try:
        s = ScalarTensor(3, value)
        s.tensor()
    except OverflowError:
        pytest.skip("no dense matrix to compare with")
    other = ScalarTensor(3, 1.5)
    t = torch.randn(3, 4)
    for dtype in (None, torch.float64, torch.int64, torch.complex64):
        _assert_like_dense(torch.mean, s, **({} if dtype is None else {"dtype": dtype}))
    _assert_like_dense(torch.add, s, other, alpha=2)
    _assert_like_dense(torch.add, s, s)
    _assert_like_dense(torch.mul, s, 4)
    _assert_like_dense(torch.mul, 1e38, s)
    _assert_like_dense(torch.mul, s, other)
    _assert_like_dense(torch.matmul, s, other)
    _assert_like_dense(torch.matmul, s, t)
    _assert_like_dense(torch.matmul, t.t(), s)
    _assert_like_dense(torch.matmul, s, t.double())  # dtype mix: an error, as for the dense matrix


def test_scalar_tensor_mean_examples_of_the_issue():
    with pytest.raises(RuntimeError):  # as torch.mean(3 * torch.eye(2), dtype=torch.int64)
        torch.mean(ScalarTensor(2, 3.0), dtype=torch.int64)
    assert torch.isnan(torch.mean(ScalarTensor(2, float("inf"))))
    torch.testing.assert_close(torch.mean(ScalarTensor(2, 2 + 2j)), torch.tensor(1 + 1j, dtype=torch.complex64))
