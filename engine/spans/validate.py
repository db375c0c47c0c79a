"""Syntax validation and truncation of a fill candidate.

A candidate is accepted when prefix + fill + suffix has no more syntax errors (ERROR and
MISSING nodes) than prefix + suffix alone, and no error that starts on the fill's first
line or later touches the fill or the line after it. So a file that is already broken elsewhere (an unclosed
bracket above) is judged by whether the fill makes it worse, while the statement being
completed at the cursor must parse: it is an error before the fill, and a fill cannot
pass by trading that error for one of its own. Otherwise the fill is cut at the last line
boundary, then the last token boundary, at which it passes (the syntax-aware truncation of the SAFIM benchmark); when nothing but the empty fill is
left, the candidate is rejected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from engine.spans.document import Document

Status = Literal["ok", "truncated", "rejected", "unchecked"]
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
MAX_CUTS = 12  # truncation attempts (one incremental parse each) before rejecting
_TOKEN_END = re.compile(r"\w+|[^\w\s]")  # a cut is tried after each word and symbol


@dataclass(frozen=True)
class Verdict:
    status: Status
    fill: str  # the fill to use: the candidate, cut, or "" when rejected
    errors_before: int
    errors_after: int


def count_errors(tree: Any) -> int:
    """ERROR and MISSING nodes, visiting only subtrees that hold an error."""
    count = 0
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            count += 1
        if node.has_error:
            stack.extend(node.children)
    return count


def first_error_at_fill(tree: Any, line_start: int, lo: int, hi: int) -> int | None:
    """Start byte of the first ERROR or MISSING node that overlaps or touches the fill's
    bytes [lo, hi] and starts on the fill's first line or later; None when there is none.
    An error that starts on an earlier line (an unclosed bracket above) was there before
    the fill and is not held against it."""
    first: int | None = None
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.end_byte < lo or node.start_byte > hi:
            continue
        if (node.type == "ERROR" or node.is_missing) and node.start_byte >= line_start:
            first = node.start_byte if first is None else min(first, node.start_byte)
        if node.has_error:
            stack.extend(node.children)
    return first


def _next_line_bytes(text: str, offset: int) -> int:
    """Bytes from `offset` to the end of the line after the one holding it (lines end at
    \\n, \\r\\n or \\r)."""
    end = offset
    m = None
    for _ in range(2):
        m = _LINE_BREAK.search(text, end)
        if m is None:
            return len(text[offset:].encode("utf-8"))
        end = m.end()
    assert m is not None
    return len(text[offset : m.start()].encode("utf-8"))


def _cuts(fill: str, limit: int) -> list[int]:
    """Lengths to try, up to `limit`: whole lines longest first, then words and symbols
    of the first line longest first."""
    lines = [i + 1 for i, ch in enumerate(fill) if ch == "\n" and i + 1 <= limit]
    first_line = fill.split("\n", 1)[0][:limit]
    tokens = [m.end() for m in _TOKEN_END.finditer(first_line)]
    return sorted({n for n in lines if n < len(fill)}, reverse=True) + sorted(
        {n for n in tokens if 0 < n < len(fill)} - set(lines), reverse=True
    )


def validate_fill(doc: Document, cursor: int, fill: str, start: int | None = None) -> Verdict:
    """Judge `fill` replacing doc.text[start:cursor] (an insertion at `cursor` when start
    is None)."""
    if doc.tree is None:
        return Verdict("unchecked", fill, 0, 0)
    before = count_errors(doc.tree)
    begin = cursor if start is None else start
    lo = len(doc.text[:begin].encode("utf-8"))
    line = max(doc.text.rfind("\n", 0, begin), doc.text.rfind("\r", 0, begin)) + 1
    line_start = len(doc.text[:line].encode("utf-8"))

    def judge(candidate: str) -> tuple[bool, int, int | None]:
        tree = doc.with_insert(cursor, candidate, start)
        total = count_errors(tree)
        # a fill's damage shows at the fill or on the line after it (`x +` makes the
        # next line's `return` the error)
        hi = lo + len(candidate.encode("utf-8")) + _next_line_bytes(doc.text, cursor)
        first = first_error_at_fill(tree, line_start, lo, hi)
        return total <= before and first is None, total, first

    good, after, first = judge(fill)
    if good:
        return Verdict("ok", fill, before, after)
    # cut before the first error the fill made (when it is inside the fill), longest first
    inside = first is not None and lo < first < lo + len(fill.encode("utf-8"))
    limit = len(fill.encode("utf-8")[: first - lo].decode("utf-8", "ignore")) if inside and first else len(fill)
    cuts = _cuts(fill, limit)
    nl = fill.find("\n")
    if 0 <= nl < limit and nl + 1 < len(fill) and fill[: nl + 1].strip() and not judge(fill[: nl + 1])[0]:
        cuts = [n for n in cuts if n <= nl]  # the first line alone fails: cut inside it
    for n in cuts[:MAX_CUTS]:
        cut = fill[:n]
        if cut.strip():
            ok, total, _ = judge(cut)
            if ok:
                return Verdict("truncated", cut, before, total)
    return Verdict("rejected", "", before, after)
