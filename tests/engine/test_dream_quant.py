"""Quantized Dream-family, Qwen2 and Llama loading through the shared weight quantization
(engine/denoisers/quant.py, engine/denoisers/hf_load.py) on tiny random checkpoints on the
CPU: the weights shrink as the estimate says (within 20%), the step stays close to the
full-precision one, fills come out of the engine, the command line and the server, and a
device or host too small for a setting is refused before loading with a setting that fits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForCausalLM, Qwen2ForCausalLM  # noqa: E402

from engine.denoisers import quant  # noqa: E402
from engine.denoisers.dream import qwen2_config  # noqa: E402
from engine.denoisers.loading import load_model  # noqa: E402
from engine.errors import ModelLoadError  # noqa: E402
from engine.fill import FillOptions, InfillRequest  # noqa: E402
from engine.local.generator import local_engine  # noqa: E402
from tests import dream_checkpoint  # noqa: E402

PREFIX = "def add(a, b):\n    return "
SUFFIX = "\n\nfor i in range(10):\n    print(i)\n"
CANVAS = 8


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def dream_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dream_checkpoint.write(tmp_path_factory.mktemp("dq") / "tiny-dream")


def _meta(root: Path) -> Any:
    cfg = json.loads((root / "config.json").read_text())
    if cfg["model_type"] != "Dream":
        return quant.meta_model(AutoModelForCausalLM.from_config, AutoConfig.from_pretrained(root))
    return quant.meta_model(Qwen2ForCausalLM, qwen2_config(cfg))


def _step(model: Any, canvas: Any) -> Any:
    den = model.denoiser
    return den.denoise(den.prefill(_prompt(model)), canvas)


def _prompt(model: Any, prefix: str = PREFIX) -> Any:
    from engine.denoisers.base import Prompt

    tok = model.tokenizer
    return Prompt(prefix=tuple(tok.encode(prefix)), suffix=tuple(tok.encode(SUFFIX)))


@pytest.mark.parametrize(
    ("model_type", "q"), [("Dream", "int8"), ("Dream", "4bit"), ("qwen2", "int8"), ("llama", "4bit")]
)
def test_a_quantized_checkpoint_holds_what_the_estimate_says_and_fills(tmp_path: Path, model_type: str, q: str) -> None:
    root = dream_checkpoint.write(tmp_path / model_type, model_type, mask=model_type == "Dream")
    full, small = load_model(root), load_model(root, quantization=q)
    model = small.denoiser.model  # type: ignore[attr-defined]
    layers = [m for m in model.modules() if isinstance(m, quant.QuantLinear)]
    assert len(layers) == 2 * 7  # every projection of both blocks (q, k, v, o, gate, up, down)
    assert not isinstance(model.lm_head, quant.QuantLinear)  # the head stays as it is
    held, before = quant.held_bytes(model), quant.held_bytes(full.denoiser.model)  # type: ignore[attr-defined]
    assert held < before
    est = quant.estimate(_meta(root), q, torch.float32)  # type: ignore[arg-type]
    assert abs(est.weights - held) <= 0.2 * held, (est.describe(), held)
    assert est.kept["embeddings"] > 0 and est.kept["output head"] > 0
    assert est.runtime > est.weights
    none = quant.estimate(_meta(root), "none", torch.float32)
    assert abs(none.weights - before) <= 0.2 * before and none.quantized_params == 0
    # the step stays closer to the float32 step than another context's step is
    canvas = torch.full((1, CANVAS), small.denoiser.info.mask_id)
    got, want = _step(small, canvas), _step(full, canvas)
    assert got.shape == want.shape and torch.isfinite(got).all()
    den = full.denoiser
    other = den.denoise(den.prefill(_prompt(full, "class Point:\n    def ")), canvas)
    assert float((got - want).norm()) < (0.2 if q == "int8" else 0.9) * float((other - want).norm())
    r = local_engine(small, FillOptions(canvas_tokens=CANVAS, use_drafter=False)).fill(
        InfillRequest(prefix=PREFIX, suffix=SUFFIX)
    )
    assert r.steps >= 1 and r.candidates


def test_the_estimate_counts_the_working_copy_of_the_largest_weight(dream_dir: Path) -> None:
    meta = _meta(dream_dir)
    est = quant.estimate(meta, "int8", torch.bfloat16)
    largest = max(p.numel() for n, p in meta.named_parameters() if ".layers." in n and p.dim() == 2)
    assert est.runtime == int(est.weights * (1 + quant.RUNTIME_MARGIN)) + largest * (4 + 2)


def test_dequantizing_in_place_gives_the_same_weights() -> None:
    w = torch.randn(6, 128)
    for q in ("int8", "4bit"):
        packed, scale = quant.quantize(w, q)  # type: ignore[arg-type]
        back = quant.dequantize(packed, scale, torch.float32)
        if q == "int8":
            want = packed.float() * scale[:, None]
        else:
            ints = torch.stack((packed & 15, packed >> 4), dim=-1).reshape(6, 128).float() - 8.0
            want = (ints.reshape(6, 2, 64) * scale.float()[..., None]).reshape(6, 128)
        assert torch.equal(back, want)
        assert quant.dequantize(packed, scale, torch.bfloat16).dtype == torch.bfloat16


def test_a_device_too_small_gets_a_setting_that_fits(dream_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    meta = _meta(dream_dir)
    sizes = {q: quant.estimate(meta, q, torch.float32).runtime for q in ("none", "int8", "4bit")}  # type: ignore[arg-type]
    assert sizes["none"] > sizes["int8"] > sizes["4bit"]
    monkeypatch.setattr(quant, "free_memory", lambda device: (sizes["int8"] + sizes["4bit"]) // 2)
    with pytest.raises(ModelLoadError, match="set quantization to '4bit'") as err:
        load_model(dream_dir)
    assert "iB is free" in str(err.value) and str(dream_dir) in str(err.value)
    monkeypatch.setattr(quant, "free_memory", lambda device: sizes["4bit"] // 2)
    with pytest.raises(ModelLoadError, match="no setting fits"):
        load_model(dream_dir, quantization="4bit")


def test_quantizing_needs_the_checkpoint_once_on_the_host(dream_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    meta = _meta(dream_dir)
    full = quant.estimate(meta, "none", torch.float32).runtime
    small = quant.estimate(meta, "4bit", torch.float32).runtime
    free = {"cuda": small * 2, "cpu": full}
    monkeypatch.setattr(quant, "free_memory", lambda device: free[device])
    assert quant.check_before_loading(meta, "4bit", torch.float32, torch.float32, "cuda", dream_dir).weights > 0
    free["cpu"] = full // 2
    with pytest.raises(ModelLoadError, match="on cpu with quantization 'none'"):
        quant.check_before_loading(meta, "4bit", torch.float32, torch.float32, "cuda", dream_dir)


def test_the_cli_and_the_server_fill_with_a_quantized_dream_checkpoint(
    dream_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.commands.cli import main
    from lsp_server.service import FillService
    from lsp_server.settings import parse_settings

    (tmp_path / "p.py").write_text(PREFIX)
    (tmp_path / "s.py").write_text(SUFFIX)
    argv = ["fill", "--model", str(dream_dir), "--quantization", "int8", "--prefix-file", str(tmp_path / "p.py")]
    argv += ["--suffix-file", str(tmp_path / "s.py"), "--canvas-tokens", str(CANVAS), "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["steps"] >= 1
    settings, problems = parse_settings({"model": str(dream_dir), "quantization": "4bit"})
    assert problems == []
    fills = FillService()
    assert fills.load(settings) is None and fills.engine is not None
    model = fills.engine.generator.model.denoiser.model  # type: ignore[attr-defined]
    assert any(isinstance(m, quant.QuantLinear) for m in model.modules())
