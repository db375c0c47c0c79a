"""A document's text and syntax tree, kept up to date incrementally across edits.

`update(text, version)` finds what changed (common prefix and suffix of the old and new
text), tells tree-sitter through its edit API, and reparses reusing the old tree: a
keystroke in a 5,000-line file costs about a millisecond, not a full parse. `with_insert`
parses a candidate (the document with a fill inserted) the same way, for validation.
"""

from __future__ import annotations

import re
from typing import Any, AnyStr

from engine.spans.languages import Language, parser_for


def common_prefix(a: AnyStr, b: AnyStr) -> int:
    """The length of the common start of `a` and `b` (text or bytes)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # binary search over slice comparisons: memcmp speed
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def common_suffix(a: AnyStr, b: AnyStr, limit: int) -> int:
    """The length of the common end of `a` and `b`, leaving their first `limit` alone."""
    lo, hi = 0, min(len(a), len(b)) - limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid :] == b[len(b) - mid :]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def point(data: bytes, offset: int) -> tuple[int, int]:
    """tree-sitter's (row, byte column) of a byte offset."""
    row = data.count(b"\n", 0, offset)
    return row, offset - (data.rfind(b"\n", 0, offset) + 1)


def reparse(parser: Any, tree: Any, old: bytes, new: bytes, edit: tuple[int, int, int] | None = None) -> Any:
    """Parse `new` reusing `tree` (the tree of `old`), after telling it the single edit
    (start, old_end, new_end bytes) that turns `old` into `new`; found by diffing when
    not given."""
    if edit is None:
        start = common_prefix(old, new)
        tail = common_suffix(old, new, start)
        edit = (start, len(old) - tail, len(new) - tail)
    start, old_end, new_end = edit
    edited = tree.copy()
    edited.edit(
        start_byte=start,
        old_end_byte=old_end,
        new_end_byte=new_end,
        start_point=point(old, start),
        old_end_point=point(old, old_end),
        new_end_point=point(new, new_end),
    )
    return parser.parse(new, edited)


_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_unicode(text: str) -> str:
    """`text` with each lone surrogate (not valid Unicode: a JSON "\\ud800" escape from a
    broken client) replaced by U+FFFD, one for one, so that offsets stay where they were."""
    return _SURROGATE.sub("\ufffd", text)


class Document:
    """Text + tree for one language; the tree is None for languages without a grammar.
    Its text is `valid_unicode` of the text it is given."""

    def __init__(self, text: str, lang: Language, version: int = 0) -> None:
        text = valid_unicode(text)
        self.lang = lang
        self.parser = parser_for(lang.name) if lang.grammar else None
        self.version = version
        self.text = text
        self.data = text.encode("utf-8")
        self.tree = self.parser.parse(self.data) if self.parser is not None else None

    def update(self, text: str, version: int) -> None:
        """The document at a new version: reparsed incrementally from the old tree."""
        text = valid_unicode(text)
        data = text.encode("utf-8")
        if self.parser is not None and self.tree is not None:
            self.tree = reparse(self.parser, self.tree, self.data, data)
        self.text, self.data, self.version = text, data, version

    def with_insert(self, offset: int, fill: str, start: int | None = None) -> Any:
        """The tree of this document with text[start:offset] replaced by `fill`
        (an insertion when start is None); None without a grammar."""
        if self.parser is None or self.tree is None:
            return None
        start = offset if start is None else start
        head = self.text[:start].encode("utf-8")
        old_end = len(head) + len(self.text[start:offset].encode("utf-8"))
        body = fill.encode("utf-8")
        new = head + body + self.data[old_end:]
        return reparse(self.parser, self.tree, self.data, new, (len(head), old_end, len(head) + len(body)))
