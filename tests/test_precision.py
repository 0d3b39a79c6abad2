"""lltm's float32 precision modes (lltm.precision, docs/precision.md): the knob on any machine, and
on a GPU the accurate mode's errors of output and every gradient within 2x of strict fp32's."""

import pytest
import torch

import lltm
from lltm import _extension
from lltm.bench import precision as bench

from ._helpers import env_in_backward

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_default_follows_torch(torch_settings):
    assert lltm.get_fp32_precision() is None
    torch_settings.set(float32_matmul_precision="highest")
    assert lltm.fp32_mode() == "ieee"
    torch_settings.set(float32_matmul_precision="high")
    assert lltm.fp32_mode() == "tf32"
    torch_settings.set(float32_matmul_precision="medium")
    assert lltm.fp32_mode() == "tf32"


@pytest.mark.parametrize("mode", ["ieee", "tf32", "accurate"])
def test_set_and_context_manager_restore(torch_settings, mode):
    torch_settings.set(lltm_fp32_precision="ieee")
    with lltm.fp32_precision(mode):
        assert lltm.get_fp32_precision() == mode and lltm.fp32_mode() == mode
        with lltm.fp32_precision(None):
            assert lltm.get_fp32_precision() is None
        assert lltm.get_fp32_precision() == mode
    assert lltm.get_fp32_precision() == "ieee"
    with pytest.raises(KeyError):
        with lltm.fp32_precision(mode):
            raise KeyError("inside")
    assert lltm.get_fp32_precision() == "ieee"


@pytest.mark.parametrize("bad", ["TF32", "highest", "high", "3xtf32", "", 1])
def test_bad_mode_raises_and_changes_nothing(torch_settings, bad):
    torch_settings.set(lltm_fp32_precision="accurate")
    with pytest.raises(ValueError, match="not one of 'ieee', 'tf32', 'accurate'"):
        lltm.set_fp32_precision(bad)
    with pytest.raises(ValueError, match="not one of"):
        with lltm.fp32_precision(bad):
            pass
    assert lltm.get_fp32_precision() == "accurate"


@pytest.mark.skipif(_extension.try_load() is None, reason="extension not built")
def test_the_operator_holds_the_setting(torch_settings):
    """The compiled operators read the setting of lltm._C: lltm.set_fp32_precision writes it there."""
    codes = {None: -1, "ieee": 0, "tf32": 1, "accurate": 2}
    for mode, code in codes.items():
        torch_settings.set(lltm_fp32_precision=mode)
        assert torch.ops.lltm._fp32_precision_setting() == code
    with pytest.raises((ValueError, RuntimeError), match="is not one of"):
        torch.ops.lltm._set_fp32_precision("bf16")


def test_bench_restores_switches(torch_settings):
    """The benchmark's mode switch puts back torch's and lltm's switches (the autouse check of
    conftest.py fails the test otherwise)."""
    torch_settings.set(lltm_fp32_precision="tf32")
    for mode in bench.MODES:
        with bench.precision_mode(mode):
            pass
    with pytest.raises(RuntimeError):
        with bench.precision_mode("accurate"):
            assert lltm.get_fp32_precision() == "accurate"
            raise RuntimeError("inside")
    assert lltm.get_fp32_precision() == "tf32"


def test_bench_cpu_rows():
    """The benchmark on CPU, strict only, a short sequence: every error small (each model against its
    cell's float64 run: the python LLTM's, nn.LSTM's, nn.GRU's), a GRU without cell-state columns, and
    the rows named."""
    models = ["python", "lstm", "gru", "lstm-aten", "gru-aten"]
    rows = bench.measure([5], [(2, 3, 4)], models, ["strict", "tf32"], torch.device("cpu"), timed=False)
    by = {(r["model"], r["mode"]): r for r in rows}
    assert by[("python", "tf32")]["skipped"] == "TF32 is a CUDA matter"
    for model in models:
        errors = by[(model, "strict")]["errors"]
        want = set(bench.COLUMNS) - (set(bench.NO_CELL_STATE) if model.startswith("gru") else set())
        assert set(errors) == want, model
        assert max(errors.values()) < 1e-5, (model, errors)
    text = bench.table(rows)
    for name in ("lltm python", "nn.LSTM", "nn.GRU", "lltm.LSTM aten", "lltm.GRU aten"):
        assert f"| {name} | strict |" in text
    with pytest.raises(ValueError, match="unknown model 'rnn'"):
        bench.Problem("rnn", 2, 1, 1, 1, torch.device("cpu"))


def _errors_by_mode(monkeypatch, problem, ref, modes, forced):
    """{mode: relative errors against `ref`} of `problem` run in each of `modes`; `forced`: the accurate
    run's backward with its step products on the 3xTF32 MMA dot (the mode's forward has no MMA dot)."""
    errors = {}
    for mode in modes:
        with bench.precision_mode(mode) as dtype, monkeypatch.context() as m:
            hook = None
            if forced and mode == "accurate":
                hook = problem.module.register_forward_hook(
                    lambda _m, _args, out: env_in_backward(m, out, LLTM_SEQ_DOT="mma")
                )
            got, _ = problem.run(dtype)
            if hook is not None:
                hook.remove()
        errors[mode] = bench.relative_errors(got, ref)
    return errors


@cuda
@pytest.mark.parametrize("backend", ["fused", "fused-tensor-cores", "aten"])
@pytest.mark.parametrize("steps", [200, 1000])
def test_accurate_within_2x_of_strict(monkeypatch, steps, backend):
    """B=16, I=32, S=128: the accurate mode's relative error against float64 of the output, the final
    states and every gradient is at most 2x strict fp32's (plus 1e-7, a few float32 roundings, for
    entries where strict fp32 is exact to its last bits); plain TF32 loses the weight gradient at
    T=1000 (the reason for the mode). "fused-tensor-cores": every product the mode puts on tensor
    cores anywhere, whatever the size: the backward's step products on the 3xTF32 MMA dot."""
    device = torch.device("cuda")
    backend, _, forced = backend.partition("-")
    if not lltm.backends("cuda").get(backend):
        pytest.skip(f"{backend} not built for CUDA")
    if forced and torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("no tensor-core MMA before sm_80")
    ref_problem = bench.Problem("python", steps, 16, 32, 128, device)
    ref, _ = ref_problem.run(torch.float64)
    problem = bench.Problem(backend, steps, 16, 32, 128, device)
    errors = _errors_by_mode(monkeypatch, problem, ref, ("strict", "accurate", "tf32"), bool(forced))
    strict, accurate = errors["strict"], errors["accurate"]
    bad = {k: (accurate[k], strict[k]) for k in bench.COLUMNS if accurate[k] > 2 * strict[k] + 1e-7}
    assert not bad, f"accurate vs strict error (T={steps}, {backend}): {bad}"
    if steps == 1000:
        assert errors["tf32"]["d_weights"] > 10 * accurate["d_weights"], errors


@cuda
@pytest.mark.parametrize("forced", [False, True], ids=["planned", "tensor-cores"])
@pytest.mark.parametrize("steps,B,I,S", [(200, 16, 32, 128), (1000, 16, 32, 128), (100, 64, 512, 512)], ids=str)
@pytest.mark.parametrize("model", ["lstm-fused", "gru-fused"])
def test_accurate_within_2x_of_strict_seam_cells(monkeypatch, model, steps, B, I, S, forced):
    """lltm.LSTM and lltm.GRU on the fused backend against nn.LSTM's / nn.GRU's float64 run: the
    accurate mode's error of the output, the final states and every gradient is at most 2x strict
    fp32's (plus 1e-7), as the planner runs it and with the backward's step products forced onto the
    3xTF32 MMA dot. Their errors, unlike the LLTM's at long T, are float32's own, so these see a
    product that loses accuracy: at 64x512x512 cuBLAS's 3xTF32 GEMMs over T*B rows put the LSTM's
    input gradient at 8.8x strict's, which is why the mode runs them strict."""
    device = torch.device("cuda")
    if not lltm.backends("cuda").get("fused"):
        pytest.skip("fused not built for CUDA")
    if forced and torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("no tensor-core MMA before sm_80")
    cell = bench.cell_of(model)
    with bench.precision_mode("strict"):
        ref, _ = bench.Problem(cell, steps, B, I, S, device).run(torch.float64)
    problem = bench.Problem(model, steps, B, I, S, device)
    errors = _errors_by_mode(monkeypatch, problem, ref, ("strict", "accurate"), forced)
    strict, accurate = errors["strict"], errors["accurate"]
    bad = {k: (accurate[k], strict[k]) for k in strict if accurate[k] > 2 * strict[k] + 1e-7}
    assert not bad, f"accurate vs strict error (T={steps}, {B}x{I}x{S}, {model}): {bad}"


@cuda
@pytest.mark.parametrize("path", ["auto", "loop"])
def test_a_change_of_mode_never_replays_a_stale_graph_or_plan(monkeypatch, path):
    """The same call (same tensors, so the same graph key but for the mode) in ieee, tf32, accurate and
    ieee again: the second ieee run is the first bit for bit (no TF32 graph or plan replayed), the
    TF32 one is not, and the accurate one is far closer to strict than TF32 is."""
    if not lltm.backends("cuda").get("fused"):
        pytest.skip("fused not built for CUDA")
    if path != "auto":
        monkeypatch.setenv("LLTM_SEQ_PATH", path)
    torch.manual_seed(0)
    layer = lltm.LLTM(32, 128, backend="fused").cuda()
    x = torch.randn(100, 16, 32, device="cuda")
    outputs = {}
    for mode in ("ieee", "tf32", "accurate", "ieee"):
        with lltm.fp32_precision(mode), torch.no_grad():
            for _ in range(3):  # the second call captures a graph, the third replays it
                out, _ = layer(x)
        outputs.setdefault(mode, []).append(out.clone())
    strict = outputs["ieee"][0]
    assert torch.equal(outputs["ieee"][1], strict)
    tf32_gap = (outputs["tf32"][0] - strict).abs().max().item()
    assert tf32_gap > 0
    assert (outputs["accurate"][0] - strict).abs().max().item() < tf32_gap / 10


@cuda
@pytest.mark.parametrize("asked", ["all", "weight_hh", "weight_ih", "input"])
def test_accurate_gradients_asked_alone(monkeypatch, asked):
    """lltm.LSTM (fused) in the accurate mode against nn.LSTM in float64, each of the input's and the
    weights' gradients asked alone and all at once, with its GEMMs over T*B rows as 3xTF32 (opt-in,
    LLTM_SPLIT_TF32_MACS; every size here): they read row blocks of one split of dz where several
    are asked, their own splits where one is. Errors stay near fp32's at this size, where plain
    TF32's are ~1e-3 (checked too, so the bound tells the modes apart)."""
    if not lltm.backends("cuda").get("fused"):
        pytest.skip("fused not built for CUDA")
    monkeypatch.setenv("LLTM_SPLIT_TF32_MACS", "0")
    torch.manual_seed(0)
    layer = lltm.LSTM(16, 64, backend="fused").cuda()
    ref = torch.nn.LSTM(16, 64).double()
    ref.load_state_dict({k: v.double().cpu() for k, v in layer.state_dict().items()})
    x = torch.randn(50, 8, 16, device="cuda")
    g = torch.randn(50, 8, 64, device="cuda")

    def grads(module, xx, gg):
        params = dict(module.named_parameters())
        names = [n for n in ("weight_ih_l0", "weight_hh_l0") if asked in ("all", n[: -len("_l0")])]
        for name, p in params.items():
            p.requires_grad_(name in names)
        xx = xx.detach().requires_grad_(asked in ("all", "input"))
        wants = ([xx] if xx.requires_grad else []) + [params[n] for n in names]
        out, _ = module(xx)
        return torch.autograd.grad(out, wants, gg)

    want = grads(ref, x.double().cpu(), g.double().cpu())
    errors = {}
    for mode in ("accurate", "tf32"):
        with lltm.fp32_precision(mode):
            got = grads(layer, x, g)
        errors[mode] = [((a.double().cpu() - b).norm() / b.norm()).item() for a, b in zip(got, want)]
    assert max(errors["accurate"]) < 2e-5, errors
    assert max(errors["tf32"]) > 1e-4, errors


@cuda
def test_bad_split_tf32_macs_setting_names_itself(monkeypatch):
    """LLTM_SPLIT_TF32_MACS (the accurate mode's size from which its backward GEMMs over T*B rows run
    as 3xTF32) that is not a count is an error naming the variable and its values, not a silent
    default."""
    if not lltm.backends("cuda").get("fused"):
        pytest.skip("fused not built for CUDA")
    monkeypatch.setenv("LLTM_SPLIT_TF32_MACS", "lots")
    layer = lltm.LLTM(8, 16, backend="fused").cuda()
    x = torch.randn(5, 3, 8, device="cuda", requires_grad=True)
    with lltm.fp32_precision("accurate"):
        out, _ = layer(x)
        with pytest.raises(RuntimeError, match="LLTM_SPLIT_TF32_MACS=lots must be a number of multiply-adds"):
            out.sum().backward()
