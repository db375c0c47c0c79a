"""LSP positions (UTF-16 columns) <-> text offsets, as editors count lines."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from lsprotocol import types

from engine.fill import fit_indent
from lsp_server.convert import locate, position_at, word_before


def doc(text: str) -> SimpleNamespace:
    return SimpleNamespace(source=text)


@pytest.mark.parametrize(
    ("text", "line", "col", "offset", "clamped"),
    [
        ("ab\ncd", 1, 1, 4, (1, 1)),
        ("ab\ncd", 1, 99, 5, (1, 2)),  # past the end of the last line, no final newline
        ("ab\ncd\n", 9, 0, 6, (2, 0)),  # past the end of the document
        ("ab\ncd", 9, 0, 5, (1, 2)),
        ("", 0, 0, 0, (0, 0)),  # empty document
        ("", 3, 4, 0, (0, 0)),
        ("x😀y\n", 0, 3, 2, (0, 3)),  # 😀 is two UTF-16 units
        ("x😀y\n", 0, 2, 1, (0, 1)),  # inside the pair: before the emoji
        ("a\r\nb\rc", 2, 1, 6, (2, 1)),  # CRLF and a lone CR end lines
        ("f\x0cg\nh", 1, 0, 4, (1, 0)),  # a form feed does not
    ],
)
def test_locate_clamps_and_counts_utf16(text: str, line: int, col: int, offset: int, clamped: tuple[int, int]) -> None:
    pos = types.Position(line, col)
    where = locate(doc(text), pos)
    assert (where.offset, (where.position.line, where.position.character)) == (offset, clamped)
    assert (pos.line, pos.character) == (line, col)  # the caller's object is untouched


@pytest.mark.parametrize("text", ["", "ab\ncd", "ab\ncd\n", "x😀y\n😀\r\nz", "a\rb"])
def test_position_at_round_trips(text: str) -> None:
    for offset in range(len(text) + 1):
        if offset and text[offset - 1] == "\r" and text[offset : offset + 1] == "\n":
            continue  # between \r and \n: not a position an editor can name
        pos = position_at(doc(text), offset)
        assert locate(doc(text), pos).offset == offset, (text, offset, pos)


def test_word_before_grows_completion_items_over_the_typed_identifier() -> None:
    d = doc("x = 1\nresult = tot")
    grown = word_before(d, locate(d, types.Position(1, 12)))
    assert grown.lead == "tot" and grown.range == types.Range(types.Position(1, 9), types.Position(1, 12))
    after_space = word_before(d, locate(d, types.Position(1, 9)))
    assert after_space.lead == "" and after_space.range.start == after_space.range.end


def test_fit_indent_keeps_the_editors_indentation_only() -> None:
    assert fit_indent("def f():\n        ", "    return 1") == "return 1"
    assert fit_indent("def f():\n", "    return 1") == "    return 1"
    assert fit_indent("x = (a", " + b)") == " + b)"
    assert fit_indent("def f():\n    ", "\n    pass") == "\n    pass"
