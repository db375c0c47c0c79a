"""Loading a model directory: read its config, pick the backend from the table
(engine.models.table) and let that backend load itself (its `load_dir`).

Only the chosen backend's module is imported, so the base install (onnxruntime, no torch)
loads the shipped model, and a checkpoint that needs torch says what to install.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.denoisers.base import Denoiser
from engine.errors import ModelLoadError
from engine.models import table
from engine.models.directory import CONFIG_FILE, DEFAULT_MODEL_DIR, read_config
from engine.models.tokenizer import Tokenizer


@dataclass
class LoadedModel:
    """A ready-to-use model: tokenizer, denoiser and the directory's defaults."""

    path: Path
    tokenizer: Tokenizer
    denoiser: Denoiser
    backend: str
    defaults: dict[str, Any] = field(default_factory=dict)
    languages: frozenset[str] | None = None  # what it was trained on (config.json `languages`); None: any


Loader = Callable[..., LoadedModel]


def load_model(
    path: Path | None = None, backend: str = table.AUTO, device: str = "cpu", quantization: str = "none"
) -> LoadedModel:
    """Load a model directory with the chosen backend ("auto": the table's row for the
    checkpoint's model_type: onnx for the embedded architecture, diffusion_gemma for
    DiffusionGemma, dream for the Dream family and plain Qwen2/Llama checkpoints).
    `quantization` ("none", "int8", "4bit") where the backend takes it (docs/gpu.md)."""
    path = Path(path) if path is not None else DEFAULT_MODEL_DIR
    if backend not in table.BACKENDS:
        raise ModelLoadError(f"unknown backend {backend!r}; choose one of {', '.join(table.BACKENDS)}")
    cfg = read_config(path)
    where = str(path / CONFIG_FILE) if backend == table.AUTO else str(path)
    row = table.choose(cfg.get("model_type"), backend, quantization, where)
    return loader(row)(path, cfg, device=device, quantization=quantization)


def loader(row: table.Backend) -> Loader:
    """A row's `load_dir`, its module imported now; a missing dependency is a clear error."""
    module, _, name = row.loader.partition(":")
    try:
        found: Loader = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise ModelLoadError(f"the {row.name} backend needs {row.needs or 'a module that failed'}: {exc}") from exc
    return found
