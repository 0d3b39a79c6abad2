"""ONNX export of the LLTM (lltm.export.onnx): the lltm operators written as
ONNX ops (a Scan over time for a layer) through torch.onnx's dynamo
exporter, run in onnxruntime and compared with the model, for several T and
B than the ones exported with. Skipped where onnx, onnxscript or
onnxruntime is not installed (requirements/dev.txt pins them)."""

from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxscript")
ort = pytest.importorskip("onnxruntime")

import onnx  # noqa: E402

import lltm  # noqa: E402
from lltm import functional  # noqa: E402
from lltm.export.onnx import export  # noqa: E402
from tests._helpers import COMPILED  # noqa: E402

SHAPES = ((5, 2), (9, 3), (1, 1))  # (T, B) run after export


def _session(program, tmp_path):
    path = tmp_path / "model.onnx"
    program.save(str(path))
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    return ort.InferenceSession(str(path)), model


def _ops(model) -> set[str]:
    """Every op type of the model, inside its functions and subgraphs too."""
    types = set()

    def walk(nodes):
        for node in nodes:
            types.add(f"{node.domain}::{node.op_type}" if node.domain else node.op_type)
            for attr in node.attribute:
                if attr.g.node:
                    walk(attr.g.node)

    walk(model.graph.node)
    for function in model.functions:
        walk(function.node)
    return types


def _run(session, *arrays):
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, (a.numpy() for a in arrays))))


def _quiet_export(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return export(*args, **kwargs)


@pytest.mark.parametrize("backend", COMPILED)
@pytest.mark.parametrize(
    "options",
    [{}, {"num_layers": 2, "bidirectional": True}, {"bias": False}, {"batch_first": True}],
    ids=["one-layer", "two-layers-bidirectional", "no-bias", "batch-first"],
)
def test_layer_runs_in_onnxruntime(backend, options, tmp_path):
    torch.manual_seed(0)
    model = lltm.LLTM(3, 4, backend=backend, **options).eval()
    batch_first = options.get("batch_first", False)
    example = torch.randn(2, 5, 3) if batch_first else torch.randn(5, 2, 3)
    session, onnx_model = _session(_quiet_export(model, example), tmp_path)
    ops = _ops(onnx_model)
    assert "Scan" in ops and not any(o.startswith("lltm") for o in ops)
    for T, B in SHAPES:
        x = torch.randn(B, T, 3) if batch_first else torch.randn(T, B, 3)
        got = _run(session, x)
        out, (h_n, c_n) = model(x)
        for g, e in zip(got, (out, h_n, c_n)):
            torch.testing.assert_close(torch.from_numpy(g), e.detach(), atol=1e-6, rtol=1e-5)


class _Masked(torch.nn.Module):
    """One layer with per-row lengths (how lltm.LLTM runs a PackedSequence)."""

    def __init__(self, dtype):
        super().__init__()
        self.layer = lltm.LLTM(3, 4, dtype=dtype)

    def forward(self, x, lengths):
        h0 = x.new_zeros(x.shape[1], 4)
        out, (h, c) = functional.lltm(x, self.layer.weights_l0, self.layer.bias_l0, h0, h0, lengths=lengths)
        return out, h, c


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_lengths_run_in_onnxruntime(dtype, tmp_path):
    torch.manual_seed(0)
    model = _Masked(dtype).eval()
    T, B = torch.export.Dim.DYNAMIC, torch.export.Dim.DYNAMIC
    program = _quiet_export(
        model, torch.randn(5, 3, 3, dtype=dtype), torch.tensor([5, 0, 2]), dynamic_shapes=({0: T, 1: B}, {0: B})
    )
    session, _ = _session(program, tmp_path)
    for lengths in ([5, 0, 2], [1, 7, 3, 6], [0]):
        x = torch.randn(max(max(lengths), 1), len(lengths), 3, dtype=dtype)
        got = _run(session, x, torch.tensor(lengths))
        for g, e in zip(got, model(x, torch.tensor(lengths))):
            torch.testing.assert_close(torch.from_numpy(g), e.detach())


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_cell_runs_in_onnxruntime(bias, tmp_path):
    torch.manual_seed(0)
    cell = lltm.LLTMCell(3, 4, bias=bias).eval()
    B = torch.export.Dim.DYNAMIC
    example = (torch.randn(2, 3), (torch.randn(2, 4), torch.randn(2, 4)))
    program = _quiet_export(cell, *example, dynamic_shapes=({0: B}, ({0: B}, {0: B})))
    session, _ = _session(program, tmp_path)
    x, h, c = torch.randn(6, 3), torch.randn(6, 4), torch.randn(6, 4)
    for g, e in zip(_run(session, x, h, c), cell(x, (h, c))):
        torch.testing.assert_close(torch.from_numpy(g), e.detach(), atol=1e-6, rtol=1e-5)
