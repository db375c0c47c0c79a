"""Span selection, table-driven: every case in fixtures/spans/<language>/cases.txt."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from engine.spans import language_for, select_span

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "spans"
CURSOR, OPEN, CLOSE, TAB = "‸", "⟨", "⟩", "⇥"


@dataclass
class Case:
    language: str
    name: str
    text: str
    cursor: int
    start: int
    end: int
    kind: str
    multiline: bool


def parse_cases(language: str, source: str) -> list[Case]:
    cases: list[Case] = []
    blocks = source.split("\n### ")
    if blocks[0].startswith("### "):
        blocks[0] = blocks[0][4:]
    for block in blocks:
        if not block.strip():
            continue
        lines = block.split("\n")
        name, header, body = lines[0].strip(), lines[1].split(), lines[2:]
        opts = dict(w.split("=", 1) for w in header if "=" in w)
        flags = {w for w in header if "=" not in w}
        while body and not body[-1].strip():
            body.pop()
        text = "\n".join(body) + ("" if "noeol" in flags else "\n")
        text = text.replace(TAB, "\t")
        if "crlf" in flags:
            text = text.replace("\n", "\r\n")
        if text.count(CURSOR) != 1:
            raise ValueError(f"{language}: {name!r} needs exactly one cursor marker")
        plain: list[str] = []
        marks: dict[str, int] = {}
        for ch in text:  # marker positions in the text without markers
            if ch in (CURSOR, OPEN, CLOSE):
                marks[ch] = len(plain)
            else:
                plain.append(ch)
        cursor = marks[CURSOR]
        start, end = marks.get(OPEN, cursor), marks.get(CLOSE, cursor)
        cases.append(Case(language, name, "".join(plain), cursor, start, end, opts["kind"], opts["lines"] == "multi"))
    return cases


def all_cases() -> list[Case]:
    out: list[Case] = []
    for path in sorted(FIXTURES.glob("*/cases.txt")):
        out += parse_cases(path.parent.name, path.read_text(encoding="utf-8"))
    return out


CASES = all_cases()


@pytest.mark.parametrize("case", CASES, ids=[f"{c.language}: {c.name}" for c in CASES])
def test_span_selection(case: Case) -> None:
    span = select_span(case.text, case.cursor, language_for(case.language))
    got = (span.kind, span.multiline, span.start, span.end)
    assert got == (case.kind, case.multiline, case.start, case.end), case.text


def test_the_table_is_large_and_varied() -> None:
    languages = {c.language for c in CASES}
    assert len(CASES) >= 150 and len(languages) >= 6, (len(CASES), languages)
    texts = [c.text for c in CASES]
    assert any("\r\n" in t for t in texts) and any("\t" in t for t in texts)
    assert any(t == "" for t in texts)  # an empty file
    assert any(not t.isascii() for t in texts)  # unicode identifiers
