"""A fill that writes the code after the cursor again.

A model that does not end its fill where the code already goes on (Qwen2.5-Coder-Instruct
at the end of a complete line, measured in docs/models.md) writes the suffix again, line
by line, for as long as the canvas lets it, and the span check then refuses the whole
fill. The one-token loops ask `Echo` after each token with a line break: once the fill so
far ends with the suffix's first whole line(s), the row ends, keeping what came before
(the fill followed by the suffix would hold those lines twice, so nothing is lost).
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
        return n
