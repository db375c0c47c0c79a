"""The scripted model behind the LSP tests (tests/lsp/scripted_server.py): the real
engine writes exactly the scripted fill with it, it reports the model directory's real
special ids and no autoregressive mode, and the server starts with a script file."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from engine.fill import Engine, InfillRequest
from engine.local.generator import local_engine
from engine.models.directory import DEFAULT_MODEL_DIR, read_config
from lsp_server.client import StdioClient
from tests.lsp.scripted_server import Script, scripted_loader

HERE = Path(__file__).resolve().parent

SCRIPT = Script.parse(
    {
        "rules": [
            {"after": "def area(w, h):\n    ", "contains": "perimeter", "fill": "return w * h"},
            {"after": "def area(w, h):\n    ", "fill": "return 0"},
            {"before": ")", "fill": ["w", "h"]},
        ],
        "default": "x = 1",
    }
)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return local_engine(scripted_loader(SCRIPT)())


def fill(engine: Engine, prefix: str, suffix: str, **kw: object) -> list[str]:
    req = InfillRequest(prefix=prefix, suffix=suffix, language="python", **kw)  # type: ignore[arg-type]
    return [c.text for c in engine.fill(req).candidates]


def test_the_engine_writes_the_fill_the_first_matching_rule_names(engine: Engine) -> None:
    assert fill(engine, "def area(w, h):\n    ", "\n\n\ndef perimeter(w, h):\n    pass\n") == ["return w * h"]
    assert fill(engine, "def area(w, h):\n    ", "\n") == ["return 0"]
    assert fill(engine, "", "\n") == ["x = 1"]  # no rule: the default


def test_each_candidate_row_gets_its_own_fill(engine: Engine) -> None:
    assert fill(engine, "print(", ")\n", candidates=3) == ["w", "h"]  # the last repeats (a duplicate: dropped)


def test_a_refinement_ends_at_the_scripted_fill_too(engine: Engine) -> None:
    prefix, suffix = "def area(w, h):\n    ", "\n"
    assert fill(engine, prefix, suffix, region="return w + h", refine=True) == ["return 0"]


def test_the_model_has_the_directory_s_special_ids_and_no_autoregressive_mode(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL_DIR, model_dir, ignore=shutil.ignore_patterns("*.onnx", "*.data", "*.safetensors"))
    cfg = read_config(model_dir)
    cfg["autoregressive"] = True  # as a model trained with the next-token loss says
    (model_dir / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    model = scripted_loader(SCRIPT)(model_dir)
    info, ids = model.denoiser.info, cfg["special_ids"]
    assert (info.eof_id, info.pad_id, info.mask_id) == (ids["eof"], ids["pad"], ids["mask"])
    assert info.vocab_size == cfg["architecture"]["vocab_size"] and info.regime == cfg["regime"]
    assert info.autoregressive is False
    sp = model.tokenizer.special
    assert (sp.eof, sp.pad, sp.prefix, sp.suffix, sp.middle) == tuple(
        ids[k] for k in ("eof", "pad", "prefix", "suffix", "middle")
    )


def test_the_server_runs_a_script_file(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"default": "    return len(self.items)"}), encoding="utf-8")
    client = StdioClient([sys.executable, str(HERE / "scripted_server.py"), "--script", str(script)])
    try:
        client.initialize()
        client.open("file:///work/a.py", "class A:\n    def size(self):\n\n")
        items = client.inline_completion("file:///work/a.py", 2, 0)
        assert [i["insertText"] for i in items] == ["    return len(self.items)"]
    finally:
        assert client.close() == 0
