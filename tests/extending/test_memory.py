"""saved_tensors_report: bytes autograd keeps for backward."""

import torch

from lltm.extending import saved_tensors_report


def test_each_storage_is_counted_once():
    x = torch.randn(10, 10, requires_grad=True)
    report = saved_tensors_report(lambda: x * x)  # mul saves both operands: the same storage twice
    assert report.count == 2
    assert report.total_bytes == report.activation_bytes == 10 * 10 * 4


def test_views_count_their_whole_storage():
    x = torch.randn(8, 8, requires_grad=True)
    report = saved_tensors_report(lambda: x[:2].exp())  # exp saves its output, a fresh (2, 8) tensor
    assert report.total_bytes == 2 * 8 * 4
    report = saved_tensors_report(lambda: x[:2] * x[:2])  # saves two views of x: all of x is kept
    assert report.count == 2 and report.total_bytes == 8 * 8 * 4


def test_excluded_tensors_leave_activation_bytes():
    lin = torch.nn.Linear(16, 32)
    x = torch.randn(4, 16, requires_grad=True)
    report = saved_tensors_report(lambda: torch.relu(lin(x)), exclude=lin.parameters())
    param_bytes = lin.weight.numel() * 4
    # linear saves x and weight (each operand for the other's gradient); relu saves its output.
    assert report.activation_bytes == (4 * 16 + 4 * 32) * 4
    assert report.total_bytes == report.activation_bytes + param_bytes


def test_output_is_returned_and_backward_still_works():
    x = torch.randn(5, requires_grad=True)
    report = saved_tensors_report(lambda: (x.sin() * 2).sum())
    report.output.backward()
    torch.testing.assert_close(x.grad, 2 * x.cos())


def test_nothing_saved_without_grad():
    x = torch.randn(5)
    assert saved_tensors_report(lambda: x.sin()).total_bytes == 0
