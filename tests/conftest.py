"""Shared fixtures: a tiny random model directory (real tokenizer, real ONNX graphs)."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_CODE = ROOT / "fixtures" / "code"
# the language server's default model comes from the models folder (engine/models/folder.py):
# the tests, and the servers and editors they start, see an empty one, not the developer's
os.environ["DIFFUSION_LSP_MODELS"] = tempfile.mkdtemp(prefix="diffusion-lsp-test-models-")


@pytest.fixture(autouse=True)
def _loggers_as_they_were() -> Iterator[None]:
    """A CLI command run in-process (`main([...])`) sets its loggers up for a terminal: its
    own stderr handler and no propagation, which would hide later tests' records from
    caplog. Each test leaves the loggers as it found them."""
    names = ("engine", "diffusion_infill", "fill_server")
    saved = {n: (lg.handlers[:], lg.level, lg.propagate) for n in names for lg in [logging.getLogger(n)]}
    yield
    for n, (handlers, level, propagate) in saved.items():
        lg = logging.getLogger(n)
        lg.handlers, lg.level, lg.propagate = handlers, level, propagate


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly built model directory of the embedded architecture with random weights."""
    torch = pytest.importorskip("torch")
    from engine.models.embedded import DiffusionCoder, ModelConfig
    from engine.models.tokenizer import train_tokenizer
    from engine.training.save import save_model_dir

    texts = [p.read_text(encoding="utf-8") for p in sorted(FIXTURE_CODE.glob("*.py"))] * 4
    tok = train_tokenizer(texts, vocab_size=400)
    torch.manual_seed(0)
    model = DiffusionCoder(
        ModelConfig(
            vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_positions=1024, length_classes=24
        )
    )
    assert model.length_head is not None
    torch.nn.init.normal_(model.length_head.weight)  # a head that starts at zero would predict nothing
    out = tmp_path_factory.mktemp("tiny-model")
    save_model_dir(
        out,
        model,
        tok,
        "absorbing",
        {"canvas_tokens": 16, "context_tokens": 256, "max_steps": 16},
        "# tiny test model\n",
        autoregressive=True,  # random weights: the mode's mechanics, not its quality
    )
    return out


@pytest.fixture(scope="session")
def real_engine(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """llama.cpp's server (xllamacpp, a dev dependency) with 3 slots on the tiny GGUF of
    tests/real_engine.py, for the whole session: every fill is a string of x and y."""
    pytest.importorskip("xllamacpp")
    from tests.real_engine import llama_server, write_gguf

    with llama_server(write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf"), slots=3) as engine:
        yield engine
