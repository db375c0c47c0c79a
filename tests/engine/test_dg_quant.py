"""Quantized DiffusionGemma loading (engine/denoisers/quant.py) on a tiny random
checkpoint on the CPU: the weights shrink as the estimate says, fills come out, the
denoising step stays close to the full-precision one, and a device too small for a
setting gets a message naming one that fits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers.models.diffusion_gemma")

from transformers import DiffusionGemmaForBlockDiffusion  # noqa: E402

from engine.denoisers import quant as dg_quant  # noqa: E402
from engine.denoisers.loading import load_model  # noqa: E402
from engine.errors import ModelLoadError  # noqa: E402
from engine.fill import FillOptions, InfillRequest  # noqa: E402
from engine.local.generator import local_engine  # noqa: E402
from engine.models.table import TABLE  # noqa: E402
from tests.dg_checkpoint import CANVAS, checkpoint_dir, tiny_config  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(tiny_config()).eval()
    return checkpoint_dir(model, tmp_path_factory.mktemp("dg-quant"))


@pytest.mark.parametrize(("q", "tolerance"), [("int8", 0.01), ("4bit", 0.15)])
def test_weights_come_back_close_from_their_quantized_form(q: Any, tolerance: float) -> None:
    w = torch.randn(3, 40, 64)
    packed, scale = dg_quant.quantize(w, q)
    assert packed.dtype == (torch.int8 if q == "int8" else torch.uint8)
    assert packed.numel() == (w.numel() if q == "int8" else w.numel() // 2)
    back = dg_quant.dequantize(packed, scale, torch.float32)
    assert back.shape == w.shape
    assert float((back - w).norm() / w.norm()) < tolerance


@pytest.mark.parametrize("q", ["int8", "4bit"])
def test_a_quantized_checkpoint_fills_and_holds_what_the_estimate_says(checkpoint: Path, q: str) -> None:
    full = load_model(checkpoint)
    small = load_model(checkpoint, quantization=q)
    model = small.denoiser.model  # type: ignore[attr-defined]
    experts = [m for m in model.modules() if hasattr(m, "gate_up_proj_packed")]
    assert experts and all(isinstance(m.gate_up_proj, dg_quant.QuantExperts) for m in experts)
    assert any(isinstance(m, dg_quant.QuantLinear) for m in model.modules())
    held, before = dg_quant.held_bytes(model), dg_quant.held_bytes(full.denoiser.model)  # type: ignore[attr-defined]
    assert held < before
    meta = dg_quant.meta_model(DiffusionGemmaForBlockDiffusion, model.config)
    est = dg_quant.estimate(meta, q, torch.float32)  # type: ignore[arg-type]
    assert abs(est.weights - held) <= 0.2 * held, (est.describe(), held)
    assert est.kept["embeddings"] > 0 and "kept as they are" in est.describe()
    # the denoising step runs and stays close to the full-precision one
    ids = small.tokenizer.encode("def f(x):\n    return x + 1\n")
    state_q, state_f = small.denoiser.prefill(ids), full.denoiser.prefill(ids)
    canvas = torch.randint(0, 100, (1, CANVAS))
    got, want = small.denoiser.denoise(state_q, canvas), full.denoiser.denoise(state_f, canvas)
    assert got.shape == want.shape and torch.isfinite(got).all()
    # closer to the full-precision logits than another context's logits are (a random tiny
    # model amplifies weight error through its layers: the bar is relative to that)
    other = full.denoiser.denoise(full.denoiser.prefill(small.tokenizer.encode("class A:\n    pass\n")), canvas)
    err, apart = float((got - want).norm()), float((other - want).norm())
    assert err < (0.2 if q == "int8" else 0.9) * apart  # measured: 0.11 and 0.71
    # and fills come out of the engine
    engine = local_engine(small, FillOptions(canvas_tokens=CANVAS))
    r = engine.configured(seed=1).fill(InfillRequest(prefix="def f(x):\n    return ", suffix="\n"))
    assert r.steps >= 1 and r.candidates and r.candidates[0].token_ids


def test_a_device_too_small_gets_a_setting_that_fits(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = DiffusionGemmaForBlockDiffusion.config_class.from_pretrained(str(checkpoint))  # type: ignore[union-attr]
    meta = dg_quant.meta_model(DiffusionGemmaForBlockDiffusion, cfg)
    sizes = {q: dg_quant.estimate(meta, q, torch.float32).runtime for q in ("none", "int8", "4bit")}  # type: ignore[arg-type]
    assert sizes["none"] > sizes["int8"] > sizes["4bit"]
    monkeypatch.setattr(dg_quant, "free_memory", lambda device: (sizes["int8"] + sizes["4bit"]) // 2)
    with pytest.raises(ModelLoadError, match="set quantization to '4bit'") as err:
        load_model(checkpoint, quantization="int8")
    assert "iB is free" in str(err.value) and "Traceback" not in str(err.value)
    monkeypatch.setattr(dg_quant, "free_memory", lambda device: sizes["4bit"] // 2)
    with pytest.raises(ModelLoadError, match="no setting fits"):
        load_model(checkpoint)


def test_quantization_is_refused_where_it_does_not_apply(checkpoint: Path, tiny_model_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="unknown quantization"):
        load_model(checkpoint, quantization="2bit")
    with pytest.raises(ModelLoadError, match="is for these checkpoints: ") as refused:
        load_model(tiny_model_dir, quantization="4bit")
    message = str(refused.value)
    takers = [r for r in TABLE if "4bit" in r.quantizations]
    assert len(takers) >= 2 and all(f"{r.kind} ({r.name})" in message for r in takers)
    assert "embedded-architecture (onnx)" not in message  # the shipped model's kind takes none
    assert "backend onnx takes: none" in message


def test_the_cli_fills_with_a_quantized_checkpoint(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from engine.commands.cli import main

    code = main(
        ["fill", "--model", str(checkpoint), "--quantization", "4bit", "--canvas-tokens", str(CANVAS), "--json",
         "--prefix-file", str(_write(checkpoint.parent / "p.txt", "def f(x):\n    return ")),
         "--suffix-file", str(_write(checkpoint.parent / "s.txt", "\n"))]
    )  # fmt: skip
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] >= 1 and "candidates" in out


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_server_setting_loads_a_quantized_checkpoint_or_says_why_not(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lsp_server.service import FillService
    from lsp_server.settings import parse_settings

    settings, problems = parse_settings({"model": str(checkpoint), "quantization": "4bit"})
    assert problems == [] and settings.quantization == "4bit"
    fills = FillService()
    assert fills.load(settings) is None and fills.engine is not None
    model = fills.engine.generator.model.denoiser.model  # type: ignore[attr-defined]
    assert any(isinstance(m, dg_quant.QuantLinear) for m in model.modules())
    _, bad = parse_settings({"quantization": "3bit"})
    assert bad and "quantization" in bad[0]
    monkeypatch.setattr(dg_quant, "free_memory", lambda device: 1024)
    error = fills.load(settings)
    assert error is not None and "iB is free" in error and fills.engine is None
