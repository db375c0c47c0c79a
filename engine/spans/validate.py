"""Syntax validation and truncation of a fill candidate.

A candidate is accepted when prefix + fill + suffix has no more syntax errors (ERROR and
MISSING nodes) than prefix + suffix alone, and no error that starts on the fill's first
line or later touches the fill or the line after it. So a file that is already broken elsewhere (an unclosed
bracket above) is judged by whether the fill makes it worse, while the statement being
completed at the cursor must parse: it is an error before the fill, and a fill cannot
pass by trading that error for one of its own. Otherwise the fill is cut at the last line
boundary, then the last token boundary, at which it passes (the syntax-aware truncation of
the SAFIM benchmark); when nothing but the empty fill is left, the candidate is rejected.

A fill that ends at column 0 of a line holding code (whole lines inserted before an
existing line, the usual fill-in-the-middle shape) is whole lines: it ends with a line
break, added when it has none (and every cut gets one), so that it never runs into the
line after it; and since most grammars read on across a line break that cannot end a
statement (`x =` before `y = 1` parses as `x = y = 1`), the line after it must also parse as
the same node, over the same text, as it did without the fill.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from engine.spans.document import Document
from engine.spans.lines import BREAKS, LINE_BREAK, at_line_start, line_break, line_end, line_start, next_line_start

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
    """Bytes from `offset` to the end of the line after the one holding it."""
    return len(text[offset : line_end(text, next_line_start(text, offset))].encode("utf-8"))


def whole_lines_break(text: str, cursor: int) -> str:
    """The line break a fill ending at `cursor` must end with: the document's (the one
    before the cursor, else the one after its line, else `\\n`) when the cursor is at column
    0 of a line holding code; "" elsewhere."""
    if not at_line_start(text, cursor) or not text[cursor : line_end(text, cursor)].strip():
        return ""
    before = next((b for b in BREAKS if text.endswith(b, 0, cursor)), "")
    return before or line_break(text, cursor) or "\n"


def as_whole_lines(fill: str, brk: str) -> str:
    """`fill` ending with a line break: blanks after its last line are dropped and `brk`
    is added when its last line has none. A blank fill stays as it is (nothing to insert)."""
    if not fill.strip():
        return fill
    fill = fill.rstrip(" \t")
    return fill if fill.endswith(BREAKS) else fill + brk


def _cuts(fill: str, limit: int) -> list[int]:
    """Lengths to try, up to `limit`: whole lines longest first, then words and symbols
    of the first line longest first."""
    lines = [m.end() for m in LINE_BREAK.finditer(fill) if m.end() <= limit]
    first_line = fill[: line_end(fill, 0)][:limit]
    tokens = [m.end() for m in _TOKEN_END.finditer(first_line)]
    return sorted({n for n in lines if n < len(fill)}, reverse=True) + sorted(
        {n for n in tokens if 0 < n < len(fill)} - set(lines), reverse=True
    )


# node types (by their endings) that hold a sequence of statements: two lines in one are
# two statements
CONTAINER_TYPES = (
    "block",
    "statement_list",
    "body",
    "module",
    "program",
    "source_file",
    "translation_unit",
    "chunk",
    "declaration_list",
)
# ... that are statements, or the body of one (an opener's block, a decorated definition)
STATEMENT_TYPES = ("statement", "definition", "declaration", "block", "clause", "body", "item")


def runs_on(tree: Any, lo: int, last: int, nxt: int) -> bool:
    """Whether the fill starting at byte `lo`, whose last code is the byte `last`, runs on
    into the line whose code starts at byte `nxt`: the smallest node holding both starts
    in the fill, holds no sequence of statements, and the next line is not a statement
    of it (an opener's body) but a part (`x =` before `y = 1` parses as `x = y = 1`,
    `int` before `x = 2;` as `int x = 2;`)."""
    node = tree.root_node.descendant_for_byte_range(last, nxt + 1)
    if node is None or node.start_byte < lo or str(node.type).endswith(CONTAINER_TYPES):
        return False
    child = next((c for c in node.children if c.start_byte <= nxt < c.end_byte), None)
    return child is None or not str(child.type).endswith(STATEMENT_TYPES)


def validate_fill(doc: Document, cursor: int, fill: str, start: int | None = None) -> Verdict:
    """Judge `fill` replacing doc.text[start:cursor] (an insertion at `cursor` when start
    is None). At column 0 of a line holding code the fill is whole lines (see the module
    docstring): the verdict's fill ends with a line break."""
    if doc.tree is None:
        return Verdict("unchecked", fill, 0, 0)
    before = count_errors(doc.tree)
    begin = cursor if start is None else start
    lo = len(doc.text[:begin].encode("utf-8"))
    first_line_start = len(doc.text[: line_start(doc.text, begin)].encode("utf-8"))
    brk = whole_lines_break(doc.text, cursor)
    fill = as_whole_lines(fill, brk) if brk else fill
    # the next line's code, in bytes after the fill (a fill may run on into it only when
    # that removes errors: a bracket it opens is the one the next line closes)
    rest = doc.text[cursor:]
    code = len(rest.encode("utf-8")) - len(rest.lstrip().encode("utf-8"))

    def judge(candidate: str) -> tuple[bool, int, int | None]:
        tree = doc.with_insert(cursor, candidate, start)
        total = count_errors(tree)
        # a fill's damage shows at the fill or on the line after it (`x +` makes the
        # next line's `return` the error)
        size = len(candidate.encode("utf-8"))
        hi = lo + size + _next_line_bytes(doc.text, cursor)
        first = first_error_at_fill(tree, first_line_start, lo, hi)
        body = candidate.rstrip().encode("utf-8")
        joined = bool(brk and body) and total >= before and runs_on(tree, lo, lo + len(body) - 1, lo + size + code)
        return total <= before and first is None and not joined, total, first

    good, after, first = judge(fill)
    if good:
        return Verdict("ok", fill, before, after)
    # cut before the first error the fill made (when it is inside the fill), longest first
    inside = first is not None and lo < first < lo + len(fill.encode("utf-8"))
    limit = len(fill.encode("utf-8")[: first - lo].decode("utf-8", "ignore")) if inside and first else len(fill)
    cuts = _cuts(fill, limit)
    end, nxt = line_end(fill, 0), next_line_start(fill, 0)  # the first line's break, the line after it
    if end < limit and nxt < len(fill) and fill[:nxt].strip() and not judge(fill[:nxt])[0]:
        cuts = [n for n in cuts if n <= end]  # the first line alone fails: cut inside it
    for n in cuts[:MAX_CUTS]:
        cut = as_whole_lines(fill[:n], brk) if brk else fill[:n]
        if cut.strip():
            ok, total, _ = judge(cut)
            if ok:
                return Verdict("truncated", cut, before, total)
    return Verdict("rejected", "", before, after)
