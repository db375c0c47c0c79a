"""Loading a transformers checkpoint for a backend: the device and dtype (hf_device), the
memory check before anything loads and the weight quantization (quant), one way for every
transformers backend.

Only safetensors are read, only from the directory (no hub, no remote code), and every
weight of the architecture must be found. Quantized, the checkpoint is loaded on the host in
its stored dtype, quantized there (each full-precision weight freed as it is replaced), its
kept parameters cast to the compute dtype, and then moved to the device.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.denoisers import quant
from engine.denoisers.hf_device import compute_dtype, resolve_device, stored_dtype
from engine.errors import ModelLoadError

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
# The fields of a Qwen2 or Qwen3 configuration that a checkpoint's own config.json (the Dream
# family's, Fast-dLLM v2's, SDAR's) carries under the same names; the rotary fields under their
# older names too (the configuration maps them). Nothing else is read: not the sliding-window
# fields (these backends attend under their own masks, and every release of these families
# sets use_sliding_window false), nor the remote code's own fields.
QWEN_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "initializer_range",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "attention_bias",
    "tie_word_embeddings",
    "attention_dropout",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)


def qwen_config(cls: Any, cfg: dict[str, Any]) -> Any:
    """config.json as the transformers configuration `cls` (Qwen2Config, Qwen3Config) of the
    same layers: the fields of `QWEN_FIELDS` it has."""
    return cls(**{k: cfg[k] for k in QWEN_FIELDS if k in cfg})


def load_pretrained(
    path: Path,
    cls: Any,
    config: Any,
    cfg: dict[str, Any],
    *,
    device: str,
    quantization: str = "none",
    dtype: torch.dtype | None = None,
    build: Callable[[Any], nn.Module] | None = None,
) -> Any:
    """`cls.from_pretrained(path, config=config)` on `device`, at `quantization`, after the
    memory check (quant.check_before_loading); `build(config)` builds the architecture for
    that check (default: `cls(config)`), `cfg` is config.json (its stored dtype). Returns
    the model in eval mode, or raises a ModelLoadError that names the problem."""
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise ModelLoadError(f"no safetensors weights ({' or '.join(WEIGHT_FILES)}) in {path}")
    if quantization not in quant.QUANTIZATIONS:
        raise ModelLoadError(f"unknown quantization {quantization!r}; choose one of {', '.join(quant.QUANTIZATIONS)}")
    device = resolve_device(device, path)
    stored = stored_dtype(cfg)
    compute = dtype if dtype is not None else compute_dtype(device, stored)
    meta = quant.meta_model(build or cls, config)
    quant.check_before_loading(meta, quantization, compute, stored, device, path)  # type: ignore[arg-type]
    del meta
    quantized = quantization != "none"
    kwargs: dict[str, Any] = {
        "config": config,
        "local_files_only": True,
        "trust_remote_code": False,
        "use_safetensors": True,
        "dtype": stored if quantized else compute,
        "output_loading_info": True,
    }
    if device.startswith("cuda") and not quantized:
        kwargs["device_map"] = device
    try:
        model, info = cls.from_pretrained(str(path), **kwargs)
        _check_complete(path, model, info)
        if quantized:
            quant.quantize_model(model, quantization)  # type: ignore[arg-type]
            quant.cast_kept(model, compute)
        if device != "cpu" and (quantized or not device.startswith("cuda")):
            model.to(device)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"could not load the checkpoint in {path}: {exc}") from exc
    model.eval()
    return model


def _check_complete(path: Path, model: Any, info: dict[str, Any]) -> None:
    """Every tensor of the architecture came from the checkpoint (a tied head may not)."""
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    missing = [k for k in info.get("missing_keys", ()) if k != "lm_head.weight" or not tied]
    if missing:
        raise ModelLoadError(
            f"{path}: the weights lack {len(missing)} tensors of the architecture (e.g. {missing[0]}): "
            "not a checkpoint of the architecture its config.json names"
        )
