"""The fill's span through tree-sitter, before and after sampling.

Before: `plan_fill` decides what the fill at the cursor completes (the span: one line or
many, and its canvas budget), so that infill sizes the canvas from it.
After: `check_candidates` cuts candidates to the span's line mode, validates them, truncates
or drops them, and ranks them (fills that parse before fills that had to be cut).

Used by infill when the request names a language; without a grammar candidates pass
through marked "unchecked".
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace

from engine.candidate import Candidate, rewritten
from engine.models.tokenizer import Tokenizer
from engine.spans import Document, Span, language_for, select_span, validate_fill
from engine.spans.select import MULTI_LINE_BUDGET

_RANK = {"ok": 0, "truncated": 1, "unchecked": 2}


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def reindented(fill: str, prefix: str, suffix: str) -> list[str]:
    """`fill` (whole lines) shifted so that its first line starts at the indentation of
    the line after it, then of the last line with code before it; its other lines keep
    their indentation relative to the first. A small model gets a line's indentation
    wrong more often than its code, and a line inserted between two lines of code is at
    one of theirs far more often than not."""
    lines = fill.splitlines(keepends=True)
    if not lines or not fill.strip():
        return []
    nxt = suffix.split("\n", 1)[0]
    before = [ln for ln in prefix.splitlines() if ln.strip()]
    targets = [_indent(nxt) if nxt.strip() else None, _indent(before[-1]) if before else None]
    first = _indent(lines[0])
    out: list[str] = []
    for target in targets:
        if target is None or target == first:
            continue
        moved = "".join(target + ln[len(first) :] if ln.startswith(first) and ln.strip() else ln for ln in lines)
        if moved not in out:
            out.append(moved)
    return out


@dataclass(frozen=True)
class FillPlan:
    """What a fill completes, decided before sampling."""

    span: Span  # where it ends, one line or many, and its canvas budget
    document: Document | None  # prefix + suffix parsed (None without a grammar)


def plan_fill(
    prefix: str, suffix: str, language: str | None, document: Document | None = None, replaced: str = ""
) -> FillPlan | None:
    """The span of a fill between prefix and suffix; None without a language.

    `document`: the caller's parsed document, used when its text is prefix + suffix.
    `replaced`: the text the fill takes the place of (a hole marker, a selection): a
    fill in place of several lines may run to several lines whatever the cursor's span."""
    if not language:
        return None
    lang = language_for(language)
    text = prefix + suffix
    doc = None
    if lang.grammar:
        doc = document if document is not None and document.text == text else Document(text, lang)
    span = select_span(text, len(prefix), lang, doc.tree if doc is not None else None)
    if "\n" in replaced.strip() and not span.multiline:
        span = replace(span, multiline=True, budget=max(span.budget, MULTI_LINE_BUDGET))
    return FillPlan(span, doc)


def check_candidates(
    tok: Tokenizer | None,
    candidates: list[Candidate],
    prefix: str,
    suffix: str,
    language: str | None,
    document: Document | None = None,
    replaced: str = "",
    span: Span | None = None,
    open_end: bool = False,
) -> list[Candidate]:
    """Candidates that keep the file parsing no worse, cut where needed, best first.

    `document`: the caller's incrementally parsed document, used when its text is
    prefix + suffix (else the text is parsed here). `replaced`: the text the fill takes
    the place of (a hole marker, a selection; nothing at a cursor). For Python, whose
    tree-sitter grammar accepts wrong indentation, a fill must also leave the file
    compiling when prefix + replaced + suffix did. `span`: the span planned before
    sampling (`plan_fill`), else it is selected here. `open_end`: the fill is the first
    line of more to come (ghost text while typing, InfillRequest.one_line), so it may end
    with a block opener (`for x in xs:`, `if (x) {`): such a fill is judged with the block
    closed (`closed_block`), and kept without the closing.
    """
    lang = language_for(language)
    if not lang.grammar or not candidates:
        return candidates
    text = prefix + suffix
    doc = document if document is not None and document.text == text else Document(text, lang)
    if doc.tree is None:
        return candidates
    if span is None:
        span = select_span(text, len(prefix), lang, doc.tree)
    judge = _Judge(doc, prefix, suffix, replaced, python=lang.name == "python", open_end=open_end)
    kept = [c for cand in candidates if (c := _checked(tok, judge, cand, span)) is not None]
    return _ranked(kept)


class _Judge:
    """Whether one fill at the cursor keeps the file parsing: validated (and cut where
    needed) by tree-sitter, and for Python also compiled within the top-level statement
    around it, when that statement compiled with the replaced text in place (decided once,
    at the first fill that gets that far)."""

    def __init__(
        self, doc: Document, prefix: str, suffix: str, replaced: str, python: bool, open_end: bool = False
    ) -> None:
        self.doc, self.prefix, self.suffix, self.replaced, self.python = doc, prefix, suffix, replaced, python
        self.open_end = open_end
        self._strict: bool | None = None
        self._before = self._after = ""

    def __call__(self, fill: str, cand: Candidate) -> tuple[str, str] | None:
        """(the fill to keep, its status: "ok" or "truncated"), or None: rejected, or cut
        to nothing from a candidate that was not blank. With `open_end`, a fill that
        fails only for the block it opens passes as it is."""
        got = self._judged(fill, cand)
        if got is not None and (got[1] == "ok" or not self.open_end):
            return got
        closing = closed_block(self.prefix + fill, self.python) if self.open_end else None
        if closing is not None:
            closed = self._judged(fill + closing, cand)
            if closed is not None and closed == (fill + closing, "ok"):
                return fill, "ok"
        return got

    def _judged(self, fill: str, cand: Candidate) -> tuple[str, str] | None:
        verdict = validate_fill(self.doc, len(self.prefix), fill)
        if verdict.status == "rejected" or (not verdict.fill.strip() and cand.text.strip()):
            return None
        if self._strict is None:
            if self.python:
                self._before, self._after = _top_level_chunk(self.prefix, self.suffix)
            self._strict = self.python and _python_compiles(self._before + self.replaced + self._after)
        if self._strict and not _python_compiles(self._before + verdict.fill + self._after):
            return None
        return verdict.fill, verdict.status


def closed_block(text: str, python: bool) -> str | None:
    """What closes the block that `text`'s last line opens, at that line's indentation
    plus one level: a `pass` body after Python's `:`, a `}` after `{`; None when the
    line opens none."""
    line = text[text.rfind("\n") + 1 :]
    code = line.rstrip()
    indent = line[: len(line) - len(line.lstrip(" \t"))]
    if python and code.endswith(":"):
        return "\n" + indent + ("\t" if indent.startswith("\t") else "    ") + "pass"
    if code.endswith("{"):
        return "\n" + indent + "}"
    return None


def _checked(tok: Tokenizer | None, judge: _Judge, cand: Candidate, span: Span) -> Candidate | None:
    """`cand` cut to the span's line mode and judged; a span of whole lines that fails as
    written is tried at a neighbour's indentation, and ranked after fills that parse as
    written ("truncated"). None when nothing of it passes."""
    fill = cand.text if span.multiline else cand.text.splitlines()[0] if cand.text else ""
    verdict = judge(fill, cand)
    if verdict is not None:
        # cut to parse, or given the line break a whole line needs
        return replace(rewritten(cand, verdict[0], tok), syntax=verdict[1])
    if span.kind != "lines":
        return None
    moved = reindented(fill, judge.prefix, judge.suffix)
    verdict = next((v for m in moved if (v := judge(m, cand)) is not None), None)
    if verdict is None:
        return None
    # changed to pass: ranked after fills that parse as written
    return replace(rewritten(cand, verdict[0], tok), syntax="truncated")


def _ranked(cands: list[Candidate]) -> list[Candidate]:
    """Fills that parse first, then those cut to parse, then unchecked ones (stable: the
    greedy fill first among equals), without the repeats that cutting made."""
    ranked = sorted(cands, key=lambda c: _RANK.get(c.syntax, 2))
    unique: dict[str, Candidate] = {}
    for c in ranked:
        unique.setdefault(c.text, c)
    return list(unique.values())


PYTHON_COMPILE_LIMIT = 500_000  # characters: past this, tree-sitter's verdict alone


# a line break before a line that starts a statement at column 0 (not a closing bracket,
# a comment, or the else/elif/except/finally of a statement already open)
_TOP_LEVEL = re.compile(r"\n(?=[^\s#)\]}])(?!(?:else|elif|except|finally)\b)")


def _top_level_chunk(prefix: str, suffix: str) -> tuple[str, str]:
    """The ends of prefix and suffix that make up the top-level statement around the
    fill (from the last line starting at column 0 before it to the next one after it):
    indentation errors are local to it, and compiling it costs far less than the file.
    A chunk that does not compile as written (a decorator cut off, a string spanning
    it) only turns the check off."""
    start = 0
    nl = prefix.rfind("\n")
    while nl != -1:  # walk back line by line, only as far as the statement's first line
        if _TOP_LEVEL.match(prefix, nl):
            start = nl + 1
            break
        nl = prefix.rfind("\n", 0, nl)
    m = _TOP_LEVEL.search(suffix)
    return prefix[start:], suffix[: m.start() + 1] if m else suffix


def _python_compiles(text: str) -> bool:
    """Whether CPython's parser accepts `text` (never run); False for long texts."""
    if len(text) > PYTHON_COMPILE_LIMIT:
        return False
    try:
        ast.parse(text)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True
