"""The settings are described once (lsp_server.settings.OPTIONS); every client and doc that
repeats them is generated from that description (lsp_server.gen_settings) and must be fresh."""

from __future__ import annotations

import json
import re
from dataclasses import fields, replace
from pathlib import Path

import pytest

from lsp_server import gen_settings
from lsp_server.settings import OPTIONS, SCHEMA, Settings, parse_settings

from ..conftest import ROOT

KEYS = [o.key for o in OPTIONS]
GENERATED = [t.path for t in gen_settings.TARGETS if t.path != "README.md"]  # README's region: the backend table


def test_every_setting_has_one_description() -> None:
    assert {o.name for o in OPTIONS} == {f.name for f in fields(Settings)}
    assert len(set(KEYS)) == len(KEYS)
    for o in OPTIONS:
        assert o.description, o.key
        assert bool(o.unset) == o.nullable, f"{o.key}: say what unset means exactly when it may be unset"


def test_validation_follows_the_description() -> None:
    s, problems = parse_settings({"diffusionLsp": {"deadlineMs": 500, "maxFillTokens": 64, "strategy": None}})
    assert (s.deadline_ms, s.max_fill_tokens, s.strategy, problems) == (500, 64, None, [])
    bad = {"deadlineMs": 10, "maxFillTokens": 0, "backend": "cuda", "drafts": "yes", "languages": "python", "device": 3}
    s, problems = parse_settings(bad)
    assert s == Settings()
    assert sorted(p.split(" ")[0] for p in problems) == sorted(f"diffusionLsp.{k}" for k in bad)
    assert any("deadlineMs must be an integer in 50..60000" in p for p in problems)
    assert parse_settings({"debounceMs": True})[1]  # a bool is not an integer here


def test_the_generated_files_are_fresh() -> None:
    assert gen_settings.stale() == [], "run `python -m lsp_server.gen_settings` and commit what it writes"


def test_a_changed_description_makes_the_generated_files_stale() -> None:
    """The freshness check can fail: a setting renamed, re-ranged or re-described in OPTIONS
    changes every file that shows that part of it."""
    renamed = tuple(replace(o, key="tlsVerification") if o.key == "tlsVerify" else o for o in OPTIONS)
    assert gen_settings.stale(options=renamed) == GENERATED
    reranged = tuple(replace(o, maximum=512) if o.key == "maxSteps" else o for o in OPTIONS)
    assert set(gen_settings.stale(options=reranged)) == set(GENERATED) - {
        "editors/vscode/src/config.ts",
        "editors/emacs/README.md",
        "docs/remote.md",
    }
    removed = tuple(o for o in OPTIONS if o.key != "apiKeyEnv")
    assert gen_settings.stale(options=removed) == GENERATED


def test_main_check_names_each_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path in [t.path for t in gen_settings.TARGETS]:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text((ROOT / path).read_text(encoding="utf-8"), encoding="utf-8")
    assert gen_settings.main(["--check", "--root", str(tmp_path)]) == 0
    readme = tmp_path / "docs/server.md"
    readme.write_text(readme.read_text().replace("| `deadlineMs` | 2000 |", "| `deadlineMs` | 1000 |"))
    assert gen_settings.main(["--check", "--root", str(tmp_path)]) == 1
    assert "docs/server.md" in capsys.readouterr().err
    assert gen_settings.main(["--root", str(tmp_path)]) == 0
    assert gen_settings.main(["--check", "--root", str(tmp_path)]) == 0
    assert readme.read_text() == (ROOT / "docs/server.md").read_text()


def test_vscode_package_json_declares_each_setting_as_the_server_reads_it() -> None:
    props = json.loads((ROOT / "editors/vscode/package.json").read_text())["contributes"]["configuration"]["properties"]
    vscode_defaults = {"drafts": True}  # VS Code shows drafts as faded text, on purpose
    for key, want in SCHEMA.items():
        got = props.get(f"diffusionLsp.{key}")
        assert got is not None, f"package.json lacks diffusionLsp.{key}"
        for attr in ("type", "minimum", "maximum", "enum", "items"):
            assert got.get(attr) == want.get(attr), (key, attr, got.get(attr), want.get(attr))
        assert got["default"] == vscode_defaults.get(key, want["default"]), key
        assert got.get("description") or got.get("markdownDescription"), key
    # the client's own settings are kept
    assert {"diffusionLsp.server.python", "diffusionLsp.server.command", "diffusionLsp.trace.file"} <= set(props)


def test_vscode_sends_exactly_the_server_settings() -> None:
    src = (ROOT / "editors/vscode/src/config.ts").read_text()
    block = re.search(r"const SERVER_KEYS = \[(.*?)\] as const", src, re.S)
    assert block is not None
    assert re.findall(r'"(\w+)"', block.group(1)) == KEYS


def test_emacs_has_a_defcustom_for_each_setting_and_sends_it() -> None:
    el = (ROOT / "editors/emacs/diffusion-lsp.el").read_text()
    body = el[el.index("(defun diffusion-lsp-settings ()") :]
    body = body[: body.index(";; settings:end")]
    assert re.findall(r"\(:(\w+) \. ", body) == KEYS
    for key in KEYS:
        kebab = re.sub(r"(?<!^)([A-Z])", r"-\1", key).lower()
        assert f"(defcustom diffusion-lsp-{kebab} " in el, f"no defcustom for {key}"
        assert f"diffusion-lsp-{kebab}" in body, f"diffusion-lsp-settings does not send {key}"
    region = el[el.index(";; settings:begin") : el.index(";; settings:end")]
    code = re.sub(r'"(?:[^"\\]|\\.)*"', '""', region)  # parentheses outside strings balance
    assert code.count("(") == code.count(")")
