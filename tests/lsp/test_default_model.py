"""The server's default model: with the `model` setting left empty, the largest model in
the models folder measured on this machine within the deadline (engine/models/folder.py),
else the shipped one. A real server over stdio, on a copy of the shipped weights."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine.models.directory import DEFAULT_MODEL_DIR
from engine.models.folder import Timing, machine_key, write_timing
from lsp_server.client import StdioClient
from tests.lsp.helpers import REAL_SERVER, SAMPLE, answered, inline_params
from tests.lsp.helpers import SAMPLE_URI as URI


def serving(settings: dict[str, object]) -> str:
    """Where the server's fills come from (diffusion.stats), once it answered a request."""
    c = StdioClient(REAL_SERVER)
    try:
        c.initialize(settings)
        c.open(URI, SAMPLE)
        assert answered(c.request_raw("textDocument/inlineCompletion", inline_params(URI, 26, 0), timeout=120))
        stats = c.request_raw("workspace/executeCommand", {"command": "diffusion.stats"})["result"]
        assert stats["model_loaded"] is True, stats
        return str(stats["model"])
    finally:
        assert c.close() == 0


def test_the_best_measured_model_is_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "measured-copy"
    shutil.copytree(DEFAULT_MODEL_DIR, copy)
    monkeypatch.setenv("DIFFUSION_LSP_MODELS", str(tmp_path))
    assert str(DEFAULT_MODEL_DIR) in serving({})  # not measured here: the shipped model
    write_timing(copy, machine_key("cpu"), Timing(keystroke_p50_ms=3000, cold_p50_ms=9000, load_s=1, when="x"))
    assert str(DEFAULT_MODEL_DIR) in serving({})  # too slow for the default deadline (2,000 ms)
    where = serving({"deadlineMs": 4000})
    assert str(copy) in where and "3000 ms a keystroke" in where
    assert str(DEFAULT_MODEL_DIR) in serving({"deadlineMs": 4000, "backend": "onnx"})  # a backend chosen: as before


def test_a_measured_model_that_no_longer_loads_gives_way_to_the_shipped_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(DEFAULT_MODEL_DIR, broken)
    write_timing(broken, machine_key("cpu"), Timing(keystroke_p50_ms=100, cold_p50_ms=300, load_s=1, when="x"))
    (broken / "denoise.onnx").write_bytes(b"not a graph")  # measured, then spoiled
    monkeypatch.setenv("DIFFUSION_LSP_MODELS", str(tmp_path))
    assert str(DEFAULT_MODEL_DIR) in serving({})
