"""A Qwen2 or Llama checkpoint that is diffusion-trained (config.json is_causal false, a
mask token in generation_config.json or the tokenizer, a diffusion model's decoding
fields) goes on the canvas path; a plain one, and a converted GGUF with the mask row
that `adapt` trains, stay one token at a time; config.json's own say wins."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine.denoisers.loading import load_model  # noqa: E402
from engine.fill import FillOptions, InfillRequest  # noqa: E402
from engine.local.generator import local_engine  # noqa: E402
from engine.models.directory import GENERATION_FILE, diffusion_signal  # noqa: E402
from tests import dream_checkpoint  # noqa: E402


def _edit(root: Path, **fields: Any) -> None:
    cfg = json.loads((root / "config.json").read_text())
    cfg.update(fields)
    (root / "config.json").write_text(json.dumps(cfg))


def _mask_id(root: Path) -> int:
    """A row past the tokenizer (the tiny checkpoint has 8): where a mask lives in a
    tokenizer that does not name it."""
    cfg = json.loads((root / "config.json").read_text())
    return int(cfg["vocab_size"]) - 1


@pytest.mark.parametrize("signal", ["tokenizer", "generation_mask", "generation_fields", "is_causal"])
@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_a_diffusion_trained_checkpoint_goes_on_the_canvas(tmp_path: Path, model_type: str, signal: str) -> None:
    root = dream_checkpoint.write(tmp_path / "m", model_type, mask=signal == "tokenizer")
    if signal == "generation_mask":
        (root / GENERATION_FILE).write_text(json.dumps({"mask_token_id": _mask_id(root), "eos_token_id": 0}))
    elif signal == "generation_fields":
        (root / GENERATION_FILE).write_text(json.dumps({"steps": 4, "alg": "entropy", "temperature": 0.6}))
    elif signal == "is_causal":
        _edit(root, is_causal=False)
    model = load_model(root)
    den = model.denoiser
    assert model.backend == "dream" and not den.info.autoregressive
    assert model.defaults.get("strategy") != "autoregressive"
    if signal == "generation_mask":
        assert den.info.mask_id == _mask_id(root)  # the mask comes from generation_config.json
    r = local_engine(model, FillOptions(canvas_tokens=6, use_drafter=False)).fill(
        InfillRequest(prefix="def add(a, b):\n    return ", suffix="\n")
    )
    assert r.steps >= 1 and not any("no autoregressive mode" in w for w in r.warnings)


def test_plain_and_converted_checkpoints_stay_one_token_at_a_time(tmp_path: Path) -> None:
    plain = dream_checkpoint.write(tmp_path / "plain", "qwen2", mask=False)
    (plain / GENERATION_FILE).write_text(json.dumps({"temperature": 0.7, "top_p": 0.8, "eos_token_id": 0}))
    converted = dream_checkpoint.write(tmp_path / "converted", "qwen2", mask=False)
    _edit(converted, mask_token_id=_mask_id(converted))  # convert-gguf's row for adapt to train
    for root in (plain, converted):
        model = load_model(root)
        assert model.denoiser.info.autoregressive and model.defaults == {"strategy": "autoregressive"}


def test_the_checkpoints_own_config_wins(tmp_path: Path) -> None:
    root = dream_checkpoint.write(tmp_path / "m", "qwen2", autoregressive=True)  # its tokenizer has <|mask|>
    assert load_model(root).denoiser.info.autoregressive


def test_the_signal_names_its_reason(tmp_path: Path) -> None:
    root = tmp_path / "x"
    root.mkdir()
    names = {"<|mdm_mask|>": 7}
    assert diffusion_signal(root, {}, names.get) == "the tokenizer has the mask token <|mdm_mask|>"
    assert diffusion_signal(root, {}, {}.get) is None
    assert diffusion_signal(root, {"is_causal": False}, {}.get) == "config.json says is_causal: false"
    (root / GENERATION_FILE).write_text(json.dumps({"mask_token_id": True}))  # not an id
    assert diffusion_signal(root, {}, {}.get) is None
