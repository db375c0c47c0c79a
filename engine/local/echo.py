"""A fill that writes the code after the cursor again.

A model that does not end its fill where the code already goes on (Qwen2.5-Coder-Instruct
at the end of a complete line, measured in docs/models.md) writes the suffix again, line
by line, for as long as the canvas lets it, and the span check then refuses the whole
fill. The one-token loops ask `Echo` after each token with a line break: once the fill so
far ends with the suffix's first whole line(s), the row ends, keeping what came before
(the fill followed by the suffix would hold those lines twice, so nothing is lost).

Where one token wrote both the fill's last characters and the echo's first (Qwen's `:\n`
or `);\n` before a repeated line), the row keeps that token and `text_end` says where its
text ends, so that the candidate is cut there (engine.candidate.trimmed keeps a token that
wrote part of the kept text): the `:` is the fill's, the line break the suffix's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

ECHO_WINDOW = 2000  # characters of the suffix compared


class _Decoder(Protocol):
    @property
    def line_break_ids(self) -> frozenset[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class Echo:
    """Whether a one-token row repeats the start of `suffix` (see the module)."""

    def __init__(self, tok: _Decoder, suffix: str) -> None:
        self._tok = tok
        head = suffix[:ECHO_WINDOW]
        # the suffix's starts that end a line and hold text, longest first
        self._starts = [head[: i + 1] for i, ch in enumerate(head) if ch == "\n" and head[: i + 1].strip()][::-1]
        self._ends: dict[tuple[int, ...], int] = {}  # rows ended inside a token: their text's length

    def __call__(self, row: np.ndarray | Sequence[int]) -> int | None:
        """None: the row goes on; else how many of its tokens to keep (it ends there)."""
        ids = [int(t) for t in row]
        if not self._starts or not ids or ids[-1] not in self._tok.line_break_ids:
            return None
        text = self._tok.decode(ids)
        echoed = next((s for s in self._starts if text.endswith(s)), None)
        if echoed is None:
            return None
        kept = text[: len(text) - len(echoed)]
        n = len(ids) - 1
        while n > 0 and not kept.startswith(self._tok.decode(ids[:n])):
            n -= 1
        if self._tok.decode(ids[:n]) != kept:  # token n wrote the fill's end and the echo's start
            n += 1
            self._ends[tuple(ids[:n])] = len(kept)
        return n

    def text_end(self, ids: Sequence[int]) -> int | None:
        """Where the text of a row that this echo ended (its kept tokens `ids`) ends, when
        that is inside its last token; None: at its end."""
        return self._ends.get(tuple(int(t) for t in ids))
