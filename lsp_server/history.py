"""A document's recent edits, from the text it had before each didChange and after it.

Keystrokes next to one another make one edit (a burst): typing a new name over an old one
is one edit, `old` -> `new`, however many didChange notifications it took. An edit that
starts away from the running one ends it. `last` is the newest edit, grown to whole words, in the
offsets of the document as it is now (engine.edits.implied reads what it implies elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.edits import difference, grown

TOUCHING_CHARS = 1  # a change this close to the running edit continues it


@dataclass(frozen=True)
class Change:
    """At `start`, `old` became `new` (`start` and the new text in the document's offsets
    now; `old` is what stood there before)."""

    start: int
    old: str
    new: str


def changed(before: str, after: str) -> Change | None:
    """The one span where `after` differs from `before` (their common start and end kept);
    None when they are the same."""
    if before == after:
        return None
    start, end, new = difference(before, after)
    return Change(start, before[start:end], new)


def _whole_words(before: str, change: Change | None) -> Change | None:
    """The change grown to whole words (engine.edits.grown): `count` -> `count_all` is the
    name replaced, not `_all` added."""
    if change is None:
        return None
    lo, hi, new = grown(before, change.start, change.start + len(change.old), change.new)
    return Change(lo, before[lo:hi], new)


class EditHistory:
    """The running edit of one document (`last`), grown keystroke by keystroke."""

    def __init__(self, text: str) -> None:
        self.text = text  # the document now
        self._base = text  # the document before the running edit
        self._span: tuple[int, int] | None = None  # the running edit's new text, in `text`'s offsets
        self.last: Change | None = None

    def update(self, text: str) -> None:
        """The document is now `text`."""
        step = changed(self.text, text)
        if step is None:
            return
        end = step.start + len(step.old)  # in the old text's offsets
        span = self._span
        if span is None or step.start > span[1] + TOUCHING_CHARS or end < span[0] - TOUCHING_CHARS:
            self._base = self.text  # a new edit, away from the running one
        self.text = text
        self.last = _whole_words(self._base, changed(self._base, text))
        self._span = None if self.last is None else (self.last.start, self.last.start + len(self.last.new))
