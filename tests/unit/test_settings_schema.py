"""The settings are described once (lsp_server.settings.OPTIONS); every client and doc that
repeats them must agree with that description."""

from __future__ import annotations

import json
import re
from dataclasses import fields

import pytest

from lsp_server.settings import OPTIONS, Settings, parse_settings, settings_schema

from ..conftest import ROOT

KEYS = [o.key for o in OPTIONS]
# defaults a client chooses for its own users, on purpose (VS Code shows drafts as faded text)
CLIENT_DEFAULTS = {"vscode": {"drafts": True}}


def test_every_setting_has_one_description() -> None:
    assert {o.name for o in OPTIONS} == {f.name for f in fields(Settings)}
    assert len(set(KEYS)) == len(KEYS)


def test_validation_follows_the_description() -> None:
    s, problems = parse_settings({"diffusionLsp": {"deadlineMs": 500, "maxFillTokens": 64, "strategy": None}})
    assert (s.deadline_ms, s.max_fill_tokens, s.strategy, problems) == (500, 64, None, [])
    bad = {"deadlineMs": 10, "maxFillTokens": 0, "backend": "cuda", "drafts": "yes", "languages": "python", "device": 3}
    s, problems = parse_settings(bad)
    assert s == Settings()
    assert sorted(p.split(" ")[0] for p in problems) == sorted(f"diffusionLsp.{k}" for k in bad)
    assert any("deadlineMs must be an integer in 50..60000" in p for p in problems)
    assert parse_settings({"debounceMs": True})[1]  # a bool is not an integer here


def test_vscode_package_json_declares_each_setting_as_the_server_reads_it() -> None:
    props = json.loads((ROOT / "editors/vscode/package.json").read_text())["contributes"]["configuration"]["properties"]
    for key, want in settings_schema().items():
        got = props.get(f"diffusionLsp.{key}")
        assert got is not None, f"package.json lacks diffusionLsp.{key}"
        for attr in ("type", "minimum", "maximum", "enum", "items"):
            assert got.get(attr) == want.get(attr), (key, attr, got.get(attr), want.get(attr))
        default = CLIENT_DEFAULTS["vscode"].get(key, want["default"])
        assert got["default"] == default, (key, got["default"], default)


def test_vscode_sends_exactly_the_server_settings() -> None:
    src = (ROOT / "editors/vscode/src/config.ts").read_text()
    block = re.search(r"const SERVER_KEYS = \[(.*?)\] as const", src, re.S)
    assert block is not None
    assert re.findall(r'"(\w+)"', block.group(1)) == KEYS


def test_emacs_has_a_defcustom_for_each_setting_and_sends_it() -> None:
    el = (ROOT / "editors/emacs/diffusion-lsp.el").read_text()
    body = el[el.index("(defun diffusion-lsp-settings ()") :]
    body = body[: body.index("\n(cl-defmethod")]
    assert sorted(set(re.findall(r"\(?:?:(\w+) ", body)) & set(KEYS)) == sorted(KEYS)
    for key in KEYS:
        kebab = re.sub(r"(?<!^)([A-Z])", r"-\1", key).lower()
        assert f"(defcustom diffusion-lsp-{kebab} " in el, f"no defcustom for {key}"


@pytest.mark.parametrize(
    ("path", "pattern"),
    [
        ("docs/server.md", "| `{key}` |"),
        ("editors/vscode/README.md", "| `diffusionLsp.{key}` |"),
        ("editors/emacs/README.md", "| `{key}` |"),
        ("editors/nvim/README.md", "{key} ="),
        ("editors/nvim/lua/diffusion_lsp/config.lua", "{key}"),
    ],
)
def test_the_docs_name_every_setting(path: str, pattern: str) -> None:
    text = (ROOT / path).read_text()
    missing = [k for k in KEYS if pattern.format(key=k) not in text]
    assert not missing, f"{path} does not document {missing}"
