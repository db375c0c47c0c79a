"""Syntax validation and truncation of a fill candidate.

A candidate is accepted when prefix + fill + suffix has no more syntax errors (ERROR and
MISSING nodes) than prefix + suffix alone, and no more of them touch the fill than
touched the cursor before: a file that is already broken elsewhere is judged by whether
the fill makes it worse, and a fill cannot pass by trading the error of the incomplete
statement at the cursor for one of its own. Otherwise the fill is cut at
the last line boundary, then the last token boundary, at which it parses no worse (the
syntax-aware truncation of the SAFIM benchmark); when nothing but the empty fill is
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


def errors_touching(tree: Any, lo: int, hi: int) -> int:
    """ERROR and MISSING nodes that overlap or touch bytes [lo, hi]."""
    count = 0
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.end_byte < lo or node.start_byte > hi:
            continue
        if node.type == "ERROR" or node.is_missing:
            count += 1
        if node.has_error:
            stack.extend(node.children)
    return count


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
    replaced = len(doc.text[first:cursor].encode("utf-8"))
    near_before = errors_touching(doc.tree, lo, lo + replaced)

    def judge(candidate: str) -> tuple[bool, int]:
        tree = doc.with_insert(cursor, candidate, start)
        total = count_errors(tree)
        near = errors_touching(tree, lo, lo + len(candidate.encode("utf-8")))
        return total <= before and near <= near_before, total

    good, after = judge(fill)
    if good:
        return Verdict("ok", fill, before, after)
    for n in _cuts(fill)[:MAX_CUTS]:
        cut = fill[:n]
        if cut.strip() and judge(cut)[0]:
            return Verdict("truncated", cut, before, after)
    return Verdict("rejected", "", before, after)
