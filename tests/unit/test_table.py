"""The backend table (engine/models/table.py): one row a backend, the row chosen by the
checkpoint's model_type, and errors that say what to choose instead."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from engine.denoisers import loading
from engine.denoisers.loading import LoadedModel, load_model
from engine.errors import ModelLoadError
from engine.models import table


def test_auto_takes_the_first_row_that_loads_the_model_type() -> None:
    assert table.choose("diffusion_coder").name == "onnx"  # before torch: the base install runs it
    assert table.choose("diffusion_coder", "torch").name == "torch"
    assert table.choose("diffusion_gemma", quantization="4bit").name == "diffusion_gemma"
    assert {table.choose(t).name for t in ("Dream", "qwen2", "llama")} == {"dream"}
    assert table.choose("llada", quantization="int8").name == "llada"
    assert {table.choose(t, quantization="4bit").name for t in ("Fast_dLLM_Qwen", "sdar")} == {"block_causal"}
    assert table.BACKENDS == ("auto", "onnx", "torch", "diffusion_gemma", "dream", "llada", "block_causal")
    assert set(table.QUANTIZATIONS) == {"none", "int8", "4bit"}


@pytest.mark.parametrize(
    ("model_type", "backend", "quantization", "says"),
    [
        ("qwen2", "onnx", "none", "is not an embedded-architecture checkpoint but a Dream, Qwen2 or Llama one"),
        ("qwen2", "onnx", "none", "use backend dream"),
        ("diffusion_coder", "dream", "none", "use backend onnx"),
        ("bert", "dream", "none", "is not a Dream, Qwen2 or Llama checkpoint"),
        ("bert", "auto", "none", "unknown model_type 'bert'"),
        (None, "auto", "none", "unknown model_type None"),
        (
            "diffusion_coder",
            "auto",
            "4bit",
            "quantization '4bit' is for these checkpoints: DiffusionGemma (diffusion_gemma); Dream, Qwen2 or Llama (dream); "
            "LLaDA (llada); Fast-dLLM v2 or SDAR (block_causal). DIR is an embedded-architecture checkpoint",
        ),
        ("qwen2", "auto", "2bit", "unknown quantization '2bit'"),
        ("qwen2", "gguf", "none", "unknown backend 'gguf'"),
    ],
)
def test_a_wrong_choice_says_what_to_choose(model_type: Any, backend: str, quantization: str, says: str) -> None:
    with pytest.raises(ModelLoadError, match=re.escape(says)):
        table.choose(model_type, backend, quantization, where="DIR")


def _load_fake(path: Path, cfg: dict[str, Any], *, device: str, quantization: str) -> LoadedModel:
    """A backend's loader, for the test below: it records what it was given."""
    return LoadedModel(path=path, tokenizer=None, denoiser=None, backend="fake", defaults={"device": device})  # type: ignore[arg-type]


def test_a_new_backend_is_one_module_and_one_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the dream backend took: its module (engine/denoisers/dream.py with load_dir)
    and its row. Here a row for a new model type names this module's loader."""
    row = table.Backend("fake", f"{__name__}:_load_fake", ("fake_type",), "fake")
    monkeypatch.setattr(table, "TABLE", (*table.TABLE, row))
    monkeypatch.setattr(table, "LOADERS", {**table.LOADERS, "fake_type": row})
    monkeypatch.setattr(table, "BACKENDS", (*table.BACKENDS, "fake"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "fake_type"}))
    loaded = load_model(tmp_path, device="cuda:1")
    assert loaded.backend == "fake" and loaded.path == tmp_path and loaded.defaults == {"device": "cuda:1"}
    with pytest.raises(ModelLoadError, match="use backend fake"):
        load_model(tmp_path, backend="onnx")


def test_a_backend_whose_module_does_not_import_says_what_to_install() -> None:
    broken = replace(table.row("dream"), loader="engine.denoisers.no_such_backend:load_dir")
    with pytest.raises(ModelLoadError, match=r"the dream backend needs torch and transformers: pip install"):
        loading.loader(broken)


def test_every_row_names_a_loader_that_exists() -> None:
    for row in table.TABLE:
        assert callable(loading.loader(row)), row.name
