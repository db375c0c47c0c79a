"""One engine opener (engine/opener.py): the language server's settings, `fill` and `serve`
pick the same model from the same models folder, and each opens it the same way."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine.commands.cli import build_parser
from engine.commands.engine_args import engine_source
from engine.models.directory import DEFAULT_MODEL_DIR
from engine.models.folder import Timing, machine_key, write_timing
from engine.opener import EngineSource, model_choice, open_engine
from lsp_server.service import engine_source as server_source
from lsp_server.settings import Settings

COMMANDS = {
    "fill": ["fill", "--file", "x.py", "--line", "1", "--col", "1"],
    "serve": ["serve"],
}


def sources(settings: Settings) -> dict[str, EngineSource]:
    """Where the language server and each command would take fills from."""
    out = {"server": server_source(settings)}
    for name, argv in COMMANDS.items():
        out[name] = engine_source(build_parser().parse_args(argv))
    return out


def test_the_server_fill_and_serve_pick_the_same_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIFFUSION_LSP_MODELS", str(tmp_path))
    assert {name: model_choice(s)[0] for name, s in sources(Settings()).items()} == dict.fromkeys(
        ("server", *COMMANDS), None
    )  # an empty folder: the shipped model for all three
    copy = tmp_path / "measured-copy"
    shutil.copytree(DEFAULT_MODEL_DIR, copy)
    write_timing(copy, machine_key("cpu"), Timing(keystroke_p50_ms=100, cold_p50_ms=300, load_s=1, when="x"))
    chosen = {name: model_choice(s)[0] for name, s in sources(Settings()).items()}
    assert chosen == dict.fromkeys(("server", *COMMANDS), copy)  # the folder's measured model for all three
    opened = open_engine(sources(Settings())["fill"])
    assert opened.where.startswith(str(copy)) and "the models folder's best here" in opened.where
    named = sources(Settings(model=str(DEFAULT_MODEL_DIR)))["server"]
    assert model_choice(named) == (DEFAULT_MODEL_DIR, "")  # a model the user names wins


def test_a_model_the_user_names_that_does_not_load_is_an_error_not_a_fallback(tmp_path: Path) -> None:
    from engine.errors import EngineError

    with pytest.raises(EngineError):
        open_engine(EngineSource(model=tmp_path / "missing"))
