"""What a document's earlier fills still give while the developer types: the fills it has
seen (`Recall`) and the fill running for it (`Job`).

One rule decides both, `engine.candidate.Shown.rest_after`'s: a fill made at a place
(prefix, suffix) still answers once the user has typed a start of it there (the suffix the
same, the prefix grown by that start); what it answers is the rest.

- `Recall`: the last RECALL_SIZE fills answered in a document, newest first. A request
  whose text extends one of them by a start of its fill is answered with the rest
  (type-through); one at exactly the place of an earlier fill gets that fill again
  (backspace and retyping); one where the suggestion on screen was accepted gets the fill
  made ahead for that moment.
- `Job`: the fill running for a document. It is kept while the user types into it: while
  the text typed since its place agrees with what it has written so far; an edit that
  disagrees stops it. A job made ahead (`lead`: the suggestion on screen, as if accepted)
  is also kept while the user types through that suggestion towards its place.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from engine.candidate import Shown
from engine.fill import InfillRequest

RECALL_SIZE = 16  # fills a document remembers (llama.vim keeps 250 over all files; a document needs few)
# ... and the characters of text around them it keeps at most (each fill keeps its own copy of
# the document); the newest fill is kept whatever its size, as the one shown last always was
RECALL_CHARS = 8_000_000

# where an answer came from (diffusion.stats' `answers`)
MODEL = "model"  # a fill run for this request
KEPT = "kept"  # the fill that was running when the request came, which the user had typed into
TYPE_THROUGH = "type_through"  # the rest of an earlier fill whose start the user typed
RECALLED = "recalled"  # an earlier fill at exactly this place
AHEAD = "ahead"  # a fill made ahead, as if the suggestion on screen had been accepted (it was)


@dataclass(frozen=True)
class Remembered:
    """A fill at its place. One made ahead is kept from the place of the suggestion it
    follows: `shown.text` is that suggestion (`after` characters), the line break the user
    is expected to type after it (the two: `lead` characters), and the fill."""

    shown: Shown
    after: int = 0
    lead: int = 0
    shape: tuple[bool, ...] = ()  # what kind of request it was made for (Job.shape): at its place it answers only such

    @property
    def place(self) -> str:
        """The prefix where the fill itself was made."""
        return self.shown.prefix + self.shown.text[: self.lead]


class Recall:
    """A document's recent fills, newest first."""

    def __init__(self, size: int = RECALL_SIZE) -> None:
        self.size = size
        self._fills: list[Remembered] = []
        self._lock = threading.Lock()

    def remember(self, shown: Shown, after: int = 0, lead: int = 0, shape: tuple[bool, ...] = ()) -> None:
        """Keep a fill answered at its place, or made ahead (`Remembered`); a newer one
        made at the same place replaces it."""
        new = Remembered(shown, after, max(lead, after), shape)
        if not shown.text[new.lead :].strip():
            return
        with self._lock:
            kept = [r for r in self._fills if (r.place, r.shown.suffix) != (new.place, shown.suffix)]
            fills, chars = [new], _chars(new)
            for r in kept[: self.size - 1]:
                chars += _chars(r)
                if chars > RECALL_CHARS:
                    break
                fills.append(r)
            self._fills = fills

    def answer(self, prefix: str, suffix: str, shape: tuple[bool, ...] | None = ()) -> tuple[str, str] | None:
        """(the text, where it came from) that an earlier fill gives at (prefix, suffix), or
        None: the rest of one whose start the user typed, or one made at exactly this place
        for a request of this `shape` (None: none; a request for alternatives wants a fresh
        fill, and ghost text shown unasked is not a fill that was asked for, nor one line a
        whole fill). A fill made ahead answers once its suggestion is accepted or typed
        through."""
        with self._lock:
            fills = list(self._fills)
        for r in fills:
            s = r.shown
            rest = s.rest_after(prefix, suffix)  # the one rule of type-through
            if rest is not None:
                typed = len(s.text) - len(rest)
                if typed < r.after:
                    continue  # still typing through the suggestion this fill was made after
                return rest, AHEAD if r.after and typed == r.after else TYPE_THROUGH
            if not r.after and shape is not None and r.shape == shape and (prefix, suffix) == (s.prefix, s.suffix):
                return s.text, RECALLED
        return None

    def has(self, prefix: str, suffix: str) -> bool:
        """Whether a fill made at exactly this place is remembered."""
        with self._lock:
            return any(r.place == prefix and r.shown.suffix == suffix for r in self._fills)

    def clear(self) -> None:
        with self._lock:
            self._fills = []


def _chars(r: Remembered) -> int:
    return len(r.shown.prefix) + len(r.shown.suffix) + len(r.shown.text)


@dataclass
class Job:
    """A fill running for a document: its request, its cancel flag, and what it has
    written so far (`written`, the first candidate's text at its last step). A job made
    ahead has a `lead`: it fills at `base` + `lead`, as if the suggestion on screen at
    `base` had been accepted (and the line it ends, ended)."""

    request: InfillRequest
    flag: threading.Event = field(default_factory=threading.Event)
    base: str = ""  # the prefix the user's typing is measured from (the request's own, without a lead)
    lead: str = ""  # the suggestion this fill is made after, and the line break expected after it
    after: int = 0  # the suggestion's length in `lead`
    kind: Any = None  # the service's FillKind it runs as
    future: asyncio.Future[Any] | None = None  # its result, once it runs on the worker
    written: str = ""
    typed: str | None = ""  # what the user has typed since `base`, at the last edit (None: left its place)

    @classmethod
    def at(cls, request: InfillRequest, kind: Any, lead: str = "", after: int = 0) -> Job:
        base = request.prefix[: len(request.prefix) - len(lead)] if lead else request.prefix
        return cls(request=request, base=base, lead=lead, after=after, kind=kind)

    @property
    def shape(self) -> tuple[bool, ...]:
        """What kind of request this fill answers: shown unasked (held to minConfidence), one line."""
        return (bool(getattr(self.kind, "gated", False)), self.request.one_line)

    def remembered(self, text: str) -> tuple[Shown, int, int, tuple[bool, ...]]:
        """What `Recall.remember` keeps of this job's fill `text`."""
        return Shown(self.base, self.request.suffix, self.lead + text), self.after, len(self.lead), self.shape

    def typed_at(self, prefix: str, suffix: str) -> str | None:
        """What the user typed since the job's base to reach (prefix, suffix), or None
        when that text is not a continuation of it."""
        if suffix != self.request.suffix or not prefix.startswith(self.base):
            return None
        return prefix[len(self.base) :]

    def agrees(self, typed: str | None) -> bool:
        """Whether typing `typed` since the base keeps this job worth running: it is a
        start of the lead and what the fill has written so far, or goes on from them
        where the fill has not written yet."""
        if typed is None:
            return False
        ahead = self.lead + self.written
        return ahead.startswith(typed) or (typed.startswith(ahead) and typed.startswith(self.lead))

    def follows(self, prefix: str, suffix: str) -> bool:
        """Whether this job still runs and a request at (prefix, suffix) may wait for it."""
        return not self.flag.is_set() and self.future is not None and self.agrees(self.typed_at(prefix, suffix))

    def edited(self, text: str) -> None:
        """The document is now `text`: stop the job if the user's typing disagrees with it."""
        suffix = self.request.suffix
        cut = len(text) - len(suffix)
        self.typed = self.typed_at(text[:cut], text[cut:]) if cut >= len(self.base) else None
        if not self.agrees(self.typed):
            self.flag.set()

    def wrote(self, text: str) -> None:
        """The fill has written `text` so far: stop it if the user already typed otherwise."""
        self.written = text
        if not self.agrees(self.typed):
            self.flag.set()
