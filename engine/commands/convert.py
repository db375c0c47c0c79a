"""convert-gguf: a GGUF file of an autoregressive Qwen2 or Llama model -> a checkpoint
directory the dream backend loads (and `adapt` trains).

transformers reads GGUF itself (the `gguf` package dequantizes the tensors with numpy):
the model is rebuilt as its transformers class in float32 and written as safetensors with
its config.json and tokenizer.json. Quantized weights come out as their dequantized
values; nothing is retrained. The file is only read: no code from it or its source runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from engine.errors import InputError, ModelLoadError
from engine.export.gguf_source import mask_row
from engine.models.table import GGUF_ARCHITECTURES

log = logging.getLogger(__name__)

SUPPORTED = GGUF_ARCHITECTURES


def sha256_of(path: Path, chunk: int = 1 << 24) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def convert(gguf: Path, out: Path, sha256: str | None = None) -> Path:
    """Write the checkpoint directory `out` from `gguf`; `sha256`, when given, must match
    the file's. Returns `out`."""
    if not gguf.is_file():
        raise InputError(f"GGUF file not found: {gguf}")
    digest = sha256_of(gguf)
    if sha256 is not None and digest != sha256.lower():
        raise InputError(f"{gguf}: sha256 is {digest}, not the expected {sha256}: refusing to convert it")
    try:
        import torch
        from safetensors.torch import save_model
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ModelLoadError(
            "convert-gguf needs torch, transformers and gguf: pip install 'diffusion-lsp[torch]'"
        ) from exc
    start = time.perf_counter()
    where: dict[str, Any] = {"gguf_file": gguf.name, "local_files_only": True}
    try:
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **where)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), **where)
    except ImportError as exc:
        raise ModelLoadError(
            f"reading GGUF needs the gguf package: pip install 'diffusion-lsp[torch]' ({exc})"
        ) from exc
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"cannot read {gguf} as a transformers model: {exc}") from exc
    model_type = model.config.model_type
    if model_type not in SUPPORTED:
        raise ModelLoadError(f"{gguf} holds a {model_type!r} model; convert-gguf supports {', '.join(SUPPORTED)}")
    mask = mask_row(tok.get_vocab(), int(model.config.vocab_size))
    if mask is None:  # every row is a token: one more row for the canvas's mask
        mask = int(model.config.vocab_size)
        model.resize_token_embeddings(mask + 1, mean_resizing=False)
    out.mkdir(parents=True, exist_ok=True)
    # transformers marks a model read from GGUF as quantized and will not save it: its
    # tensors are plain float32 by now, so they are written directly (a tied output
    # matrix once), and the config without the quantization entry
    save_model(model, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["dtype"] = "float32"
    cfg["diffusion_lsp"] = {"source": {"gguf": gguf.name, "sha256": digest}}
    cfg["mask_token_id"] = mask  # the canvas's mask token: untrained until `adapt` trains it
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    tok.save_pretrained(str(out))
    if not (out / "tokenizer.json").is_file():
        raise ModelLoadError(f"the tokenizer of {gguf} could not be written as tokenizer.json")
    params = sum(p.numel() for p in model.parameters())
    log.info(
        "converted %s (%s, %.0fM parameters) in %.0f s",
        gguf.name,
        model_type,
        params / 1e6,
        time.perf_counter() - start,
    )
    return out


def cmd_convert_gguf(args: argparse.Namespace) -> int:
    out = convert(args.gguf, args.out, args.sha256)
    sys.stdout.write(f"{out}\n")
    return 0
