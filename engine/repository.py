"""Repository context: which pieces of the developer's other files go into a fill (issue 43;
docs/server.md, Repository context).

The server hands over whole files (other open documents, the files the current one
imports, the regions edited lately); `select` cuts them into windows of CHUNK_LINES lines
and keeps the ones most like the code around the cursor, within a character budget:

- likeness is the Jaccard index of the two sets of identifiers (as Copilot's neighbouring
  tabs and Cody's local context measure it), with a bonus for a window that defines a name
  used near the cursor (`def`/`class`/`function`/`func`/a top-level assignment of it): the
  definition is what a fill that calls it needs; and one for a window that holds a line
  the developer edited lately, in any open document (what they are working on);
- windows that repeat the code around the cursor are left out (a model shown the text it
  is writing copies it: llama.vim's finding), and windows of the current file too;
- a window that overlaps one already kept adds only its new lines (to the budget, too), and
  windows that touch are merged, so that a file is never cut where two windows meet;
- the kept pieces come back in a fixed order (by path, then line), whatever their scores,
  so that the same set is the same sequence of tokens, and the cached keys and values of a
  prompt that starts with it stay valid across keystrokes.

Everything here is text: no LSP, no tokenizer (budgets are in characters; the generator
turns them into tokens when it lays the prompt out).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

CHUNK_LINES = 30  # a window of this many lines
CHUNK_STEP = 15  # windows start this many lines apart (they overlap by half)
AROUND_LINES = 20  # the lines before the cursor (and after it, half as many) a window is compared with
DEFINITION_BONUS = 0.25  # added to the likeness of a window that defines a name used near the cursor
RECENT_BONUS = 0.25  # ... and of a window holding a line the developer edited lately
REPEATS = 0.8  # a window this like the code around the cursor repeats it: left out
MIN_LIKENESS = 0.02  # a window less like it than this is no help
KEYWORDS = frozenset(
    [
        "and",
        "as",
        "assert",
        "async",
        "await",
        "break",
        "case",
        "catch",
        "class",
        "const",
        "continue",
        "def",
        "default",
        "del",
        "elif",
        "else",
        "except",
        "export",
        "extends",
        "false",
        "finally",
        "for",
        "from",
        "func",
        "function",
        "go",
        "if",
        "import",
        "in",
        "interface",
        "is",
        "let",
        "new",
        "nil",
        "none",
        "not",
        "null",
        "or",
        "package",
        "pass",
        "raise",
        "range",
        "return",
        "self",
        "static",
        "struct",
        "switch",
        "this",
        "throw",
        "true",
        "try",
        "type",
        "typeof",
        "var",
        "while",
        "with",
        "yield",
        "None",
        "True",
        "False",
    ]
)
_IDENT = re.compile(r"[A-Za-z_$][\w$]*")
_DEFINES = re.compile(
    r"^\s*(?:(?:export\s+)?(?:async\s+)?(?:def|class|function|func|type|const|let|var)\s+(?:\([^)]*\)\s*)?"
    r"([A-Za-z_$][\w$]*)|([A-Za-z_$][\w$]*)\s*(?::[^=]*)?=[^=])",
    re.M,
)


@dataclass(frozen=True)
class Chunk:
    """Lines [line, line + n) of the file at `path`."""

    path: str
    line: int
    text: str


def chunks_of(path: str, text: str) -> list[Chunk]:
    """The file's windows of CHUNK_LINES lines, CHUNK_STEP apart (a short file: one)."""
    lines = text.splitlines(keepends=True)
    starts = range(0, max(1, len(lines) - CHUNK_LINES + CHUNK_STEP), CHUNK_STEP)
    out = [Chunk(path, s, "".join(lines[s : s + CHUNK_LINES])) for s in starts]
    return [c for c in out if c.text.strip()]


def identifiers(text: str) -> set[str]:
    """The names in `text` (keywords and one-letter names left out)."""
    return {m.group() for m in _IDENT.finditer(text) if len(m.group()) > 1} - KEYWORDS


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def around(prefix: str, suffix: str) -> str:
    """The code around the cursor that windows are compared with."""
    before = "".join(prefix.splitlines(keepends=True)[-AROUND_LINES:])
    after = "".join(suffix.splitlines(keepends=True)[: AROUND_LINES // 2])
    return before + after


def select(
    files: Sequence[tuple[str, str]],
    prefix: str,
    suffix: str,
    budget_chars: int,
    current: str | None = None,
    recent: Sequence[tuple[str, int]] = (),
) -> list[tuple[str, str]]:
    """(path, text) windows of `files` for a fill between `prefix` and `suffix`: the most
    like the code around the cursor first, until `budget_chars`; returned by path and line
    (see the module). `current`: the current file's path (its own windows are not context).
    `recent`: (path, line) of lines edited lately: their windows get RECENT_BONUS."""
    near = around(prefix, suffix)
    near_ids = identifiers(near)
    used = identifiers(prefix[-2000:]) | identifiers(suffix[:500])
    scored: list[tuple[float, Chunk]] = []
    seen: set[tuple[str, int]] = set()
    for path, text in files:
        if path == current:
            continue
        for chunk in chunks_of(path, text):
            if (chunk.path, chunk.line) in seen:
                continue
            seen.add((chunk.path, chunk.line))
            ids = identifiers(chunk.text)
            likeness = jaccard(ids, near_ids)
            if likeness >= REPEATS or (chunk.text.strip() and chunk.text.strip() in near):
                continue
            defined = {m.group(1) or m.group(2) for m in _DEFINES.finditer(chunk.text)}
            if defined & used:
                likeness += DEFINITION_BONUS
            if any(p == chunk.path and chunk.line <= n < chunk.line + CHUNK_LINES for p, n in recent):
                likeness += RECENT_BONUS
            if likeness >= MIN_LIKENESS:  # (a recent edit alone is enough)
                scored.append((likeness, chunk))
    scored.sort(key=lambda s: (-s[0], s[1].path, s[1].line))
    lines_of = {path: text.splitlines(keepends=True) for path, text in files}
    taken: dict[str, set[int]] = {}  # the lines of each file chosen so far
    room = budget_chars
    for _, chunk in scored:
        lines = lines_of[chunk.path]
        have = taken.setdefault(chunk.path, set())
        new = [i for i in range(chunk.line, min(chunk.line + CHUNK_LINES, len(lines))) if i not in have]
        cost = sum(len(lines[i]) for i in new)
        if not new or cost > room:
            continue
        have.update(new)
        room -= cost
    out = []
    for path in sorted(taken):
        for start, end in _runs(sorted(taken[path])):  # overlapping windows merged: each line once
            out.append((path, "".join(lines_of[path][start:end])))
    return out


def _runs(lines: list[int]) -> list[tuple[int, int]]:
    """[start, end) ranges of consecutive line numbers."""
    runs: list[tuple[int, int]] = []
    for i in lines:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs
