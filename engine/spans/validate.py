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


def errors_at_fill(tree: Any, line_start: int, lo: int, hi: int) -> int:
    """ERROR and MISSING nodes that overlap or touch the fill's bytes [lo, hi] and start
    on the fill's first line or later. An error that starts on an earlier line (an
    unclosed bracket above) was there before the fill and is not held against it."""
    count = 0
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.end_byte < lo or node.start_byte > hi:
            continue
        if (node.type == "ERROR" or node.is_missing) and node.start_byte >= line_start:
            count += 1
        if node.has_error:
            stack.extend(node.children)
    return count


def _next_line_bytes(text: str, offset: int) -> int:
    """Bytes from `offset` to the end of the line after the one holding it."""
    end = offset
    for _ in range(2):
        nl = text.find("\n", end)
        if nl == -1:
            return len(text[offset:].encode("utf-8"))
        end = nl + 1
    return len(text[offset : end - 1].encode("utf-8"))


def _cuts(fill: str) -> list[int]:
    """Lengths to try, longest first: line ends, then token ends on the first line."""
    lines = [i + 1 for i, ch in enumerate(fill) if ch == "\n"]
    first_line = fill.split("\n", 1)[0]
    tokens = [m.end() for m in _TOKEN_END.finditer(first_line)]
    return sorted({n for n in lines + tokens if 0 < n < len(fill)}, reverse=True)


def validate_fill(doc: Document, cursor: int, fill: str, start: int | None = None) -> Verdict:
    """Judge `fill` replacing doc.text[start:cursor] (an insertion at `cursor` when start
    is None)."""
    if doc.tree is None:
        return Verdict("unchecked", fill, 0, 0)
    before = count_errors(doc.tree)
    first = cursor if start is None else start
    lo = len(doc.text[:first].encode("utf-8"))
    line = max(doc.text.rfind("\n", 0, first), doc.text.rfind("\r", 0, first)) + 1
    line_start = len(doc.text[:line].encode("utf-8"))

    def judge(candidate: str) -> tuple[bool, int]:
        tree = doc.with_insert(cursor, candidate, start)
        total = count_errors(tree)
        # a fill's damage shows at the fill or on the line after it (`x +` makes the
        # next line's `return` the error)
        hi = lo + len(candidate.encode("utf-8")) + _next_line_bytes(doc.text, cursor)
        return total <= before and errors_at_fill(tree, line_start, lo, hi) == 0, total

    good, after = judge(fill)
    if good:
        return Verdict("ok", fill, before, after)
    for n in _cuts(fill)[:MAX_CUTS]:
        cut = fill[:n]
        if cut.strip() and judge(cut)[0]:
            return Verdict("truncated", cut, before, after)
    return Verdict("rejected", "", before, after)
