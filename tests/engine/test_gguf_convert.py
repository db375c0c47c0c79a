"""convert-gguf on a tiny llama GGUF written by the test (tests/real_engine.py's: only the
letters x and y have high logits, x the highest, whatever the prompt)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from engine.commands.cli import main  # noqa: E402
from engine.commands.convert import sha256_of  # noqa: E402
from engine.denoisers.loading import load_model  # noqa: E402
from engine.fill import FillOptions, InfillRequest  # noqa: E402
from engine.local.generator import local_engine  # noqa: E402
from tests.real_engine import write_gguf  # noqa: E402


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(path)
    return path


def test_converts_a_gguf_into_a_directory_the_dream_backend_runs(
    gguf_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tiny"
    assert main(["convert-gguf", str(gguf_file), "--out", str(out), "--sha256", sha256_of(gguf_file)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and "quantization_config" not in cfg
    assert cfg["diffusion_lsp"]["source"] == {"gguf": "tiny.gguf", "sha256": sha256_of(gguf_file)}
    model = load_model(out)
    assert model.backend == "dream" and model.defaults == {"strategy": "autoregressive"}
    # every row was a token: the mask got a row of its own
    assert model.denoiser.info.mask_id == cfg["mask_token_id"] == cfg["vocab_size"] - 1
    fill = local_engine(model, FillOptions(canvas_tokens=5)).fill(InfillRequest(prefix="a = ", suffix="\n"))
    assert fill.text == "xxxxx"  # the GGUF's weights, read right: x has the highest logit


def test_a_file_with_another_hash_is_refused(
    gguf_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["convert-gguf", str(gguf_file), "--out", str(tmp_path / "x"), "--sha256", "0" * 64]) == 2
    assert "refusing to convert it" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    assert main(["convert-gguf", str(tmp_path / "missing.gguf"), "--out", str(tmp_path / "y")]) == 2
    assert "GGUF file not found" in capsys.readouterr().err
