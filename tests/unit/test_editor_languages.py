"""The editors attach the server to the languages it parses (engine/spans/languages.py), no
more and no fewer: Neovim's default filetypes and Emacs's default major modes are checked
against the language table, so a language added there is added to both clients."""

from __future__ import annotations

import re
from pathlib import Path

from engine.spans.languages import LANGUAGE_IDS, LANGUAGES, language_for

ROOT = Path(__file__).resolve().parents[2]
# Emacs modes whose language is not their name's start (the rest: `<language>-mode`, `<language>-ts-mode`)
EMACS_NAMES = {"js": "javascript", "c++": "cpp"}


def _nvim_filetypes() -> list[str]:
    text = (ROOT / "editors/nvim/lua/diffusion_lsp/config.lua").read_text(encoding="utf-8")
    block = re.search(r"filetypes = \{(.*?)\}", text, re.S)
    assert block, "config.lua: no default filetypes"
    return re.findall(r"'([^']+)'", block.group(1))


def _emacs_languages() -> list[str]:
    """The language each default major mode is served as: its :language-id, else its name."""
    text = (ROOT / "editors/emacs/diffusion-lsp.el").read_text(encoding="utf-8")
    block = re.search(r"\(defcustom diffusion-lsp-major-modes\s+'\((.*?)\)\s+\"", text, re.S)
    assert block, "diffusion-lsp.el: no default major modes"
    out = []
    for entry in re.finditer(r"\((\S+) :language-id \"([^\"]+)\"\)|([\w+-]+-mode)", block.group(1)):
        if entry.group(2):
            out.append(entry.group(2))
        else:
            name = re.sub(r"(-ts)?-mode$", "", entry.group(3))
            out.append(EMACS_NAMES.get(name, name))
    return out


def test_neovim_attaches_to_every_language_the_server_parses_and_no_other() -> None:
    filetypes = _nvim_filetypes()
    assert {language_for(f).name for f in filetypes} == set(LANGUAGES)
    assert all(language_for(f).grammar for f in filetypes)


def test_emacs_attaches_to_every_language_the_server_parses_and_no_other() -> None:
    ids = _emacs_languages()
    assert {language_for(i).name for i in ids} == set(LANGUAGES)
    assert all(language_for(i).grammar for i in ids), ids


def test_every_language_id_the_table_maps_is_one_it_parses() -> None:
    assert set(LANGUAGE_IDS.values()) <= set(LANGUAGES)
