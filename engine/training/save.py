"""Writing a model directory (training's side of engine/models/directory.py, which reads one):
config.json, tokenizer.json, the weights once in model.safetensors, the ONNX graphs that
read them, and the model card."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.models.directory import CARD_FILE, CONFIG_FILE, FORMAT_VERSION, TOKENIZER_FILE, WEIGHTS_FILE
from engine.models.table import EMBEDDED_MODEL_TYPE as MODEL_TYPE
from engine.models.tokenizer import SPECIAL_TOKENS, Tokenizer


def save_model_dir(
    out: Path,
    model: Any,
    tokenizer: Tokenizer,
    regime: str,
    defaults: dict[str, Any],
    card: str,
    weights_dtype: str = "float16",
    autoregressive: bool = False,
    languages: list[str] | None = None,
) -> None:
    """Write a complete embedded-architecture model directory (weights, ONNX, config, card).

    The weights are stored once, in model.safetensors (`weights_dtype`: float16, half the
    bytes at no measurable cost in fills, or float32); the ONNX graphs read them from
    that file (engine.training.export.link_weights). `autoregressive`: the weights were trained
    with the next-token loss, so the backends offer the autoregressive mode. `languages`: what
    it was trained on (the engine offers no local fill in others unless asked to)."""
    import torch
    from safetensors.torch import save_file

    from engine.training.export import export_onnx

    out.mkdir(parents=True, exist_ok=True)
    sp = tokenizer.special
    cfg = {
        "format_version": FORMAT_VERSION,
        "model_type": MODEL_TYPE,
        "architecture": model.cfg.to_dict(),
        "regime": regime,
        "special_tokens": SPECIAL_TOKENS,
        "special_ids": {k: getattr(sp, k) for k in SPECIAL_TOKENS},
        "defaults": defaults,
        "autoregressive": autoregressive,
        **({"languages": languages} if languages else {}),
    }
    (out / CONFIG_FILE).write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    tokenizer.hf.save(str(out / TOKENIZER_FILE))
    dtypes = {"float16": torch.float16, "float32": torch.float32}
    if weights_dtype not in dtypes:
        raise ValueError(f"weights_dtype must be float16 or float32; got {weights_dtype!r}")
    save_file(
        {k: v.detach().to(dtypes[weights_dtype]).contiguous().cpu() for k, v in model.state_dict().items()},
        str(out / WEIGHTS_FILE),
    )
    export_onnx(model, out, out / WEIGHTS_FILE)
    (out / CARD_FILE).write_text(card, encoding="utf-8")
