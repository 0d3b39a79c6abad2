"""torch.compile(fullgraph=True) of models using LLTMCell and LLTM matches
eager, forward and backward, for every backend."""

from __future__ import annotations

import pytest
import torch

import lltm

from ._helpers import backend_params


class TwoStepModel(torch.nn.Module):
    """A cell applied twice then a linear head: the cell ops sit inside a
    larger graph, as in real use."""

    def __init__(self, backend: str):
        super().__init__()
        self.cell = lltm.LLTMCell(6, 8, backend=backend, dtype=torch.float64)
        self.head = torch.nn.Linear(8, 2, dtype=torch.float64)

    def forward(self, x):
        h, c = self.cell(x)
        h, c = self.cell(x * 0.5, (h, c))
        return self.head(h) + c.sum(dim=1, keepdim=True)


def _grads(module):
    return [p.grad.clone() for p in module.parameters()]


@pytest.mark.parametrize("device,backend", backend_params())
def test_compile_cell_model_matches_eager(device, backend):
    torch._dynamo.reset()
    model = TwoStepModel(backend).to(device)
    x = torch.randn(5, 6, dtype=torch.float64, device=device)
    eager = model(x)
    eager.sum().backward()
    eager_grads = _grads(model)
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x)
    out.sum().backward()
    torch.testing.assert_close(out, eager)
    for g, e in zip(_grads(model), eager_grads):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("device,backend", backend_params())
def test_compile_sequence_model_matches_eager(device, backend):
    torch._dynamo.reset()
    model = lltm.LLTM(4, 6, num_layers=2, backend=backend, dtype=torch.float64).to(device)
    x = torch.randn(3, 2, 4, dtype=torch.float64, device=device, requires_grad=True)
    out, (h, c) = model(x)
    (out.sum() + c.sum()).backward()
    eager_grads = _grads(model) + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    compiled = torch.compile(model, fullgraph=True)
    out2, (h2, c2) = compiled(x)
    (out2.sum() + c2.sum()).backward()
    torch.testing.assert_close((out2, h2, c2), (out, h, c))
    for g, e in zip(_grads(model) + [x.grad], eager_grads):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("device,backend", backend_params(backends=("aten", "fused")))
def test_compiled_graph_calls_the_custom_ops(device, backend):
    """The op stays one node in the graph (not decomposed, no graph break)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    cell = lltm.LLTMCell(3, 4, backend=backend).to(device)
    fn = torch.compile(cell, backend=counter, fullgraph=True)
    fn(torch.randn(2, 3, device=device)).__getitem__(0).sum().backward()
    assert counter.frame_count == 1
    graph_text = "\n".join(str(g.graph) for g in counter.graphs)
    assert f"lltm.{backend}_cell_forward" in graph_text


def test_export_keeps_the_custom_op():
    if not lltm.backends("cpu")["aten"]:
        pytest.skip("aten not available")
    cell = lltm.LLTMCell(3, 4, backend="aten")
    ep = torch.export.export(cell, (torch.randn(2, 3),))
    assert "lltm.aten_cell_forward" in str(ep.graph)
    x = torch.randn(2, 3)
    torch.testing.assert_close(ep.module()(x), cell(x))


def test_one_graph_for_packed_input_and_for_sizes_from_two():
    """torch.compile(fullgraph=True, dynamic=True): PackedSequence input compiles without a graph break
    and one graph serves every batch of sequences; tensor input shares one graph for every T >= 2 and
    B >= 2 (torch specializes sizes 0 and 1, so those compile once more each, as the README says)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    layer = lltm.LLTM(4, 6, 2, bidirectional=True, backend="aten")
    counter = CompileCounter()
    model = torch.compile(layer, fullgraph=True, dynamic=True, backend=counter)
    for lengths in ((7, 3, 5), (9, 2, 5, 4), (3, 2)):
        packed = torch.nn.utils.rnn.pack_sequence([torch.randn(n, 4) for n in lengths], enforce_sorted=False)
        out, (h, _) = model(packed)
        ref, (h_ref, _) = layer(packed)
        torch.testing.assert_close(out.data, ref.data)
        torch.testing.assert_close(h, h_ref)
    assert counter.frame_count == 1
    counter = CompileCounter()
    model = torch.compile(layer, fullgraph=True, dynamic=True, backend=counter)
    for T, B in ((5, 3), (8, 2), (2, 7)):
        model(torch.randn(T, B, 4))
    assert counter.frame_count == 1
