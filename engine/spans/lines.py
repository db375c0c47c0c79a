"""Lines in text: where the line holding an offset starts and ends.

A line ends at `\\n`, `\\r\\n` or `\\r` (a break of two characters counts once: an offset
between its `\\r` and its `\\n` is inside the break of the line before it). Offsets are
Python string (code point) offsets. Searches stay within the line, so each call costs the
length of the line, not of the text. Use these instead of `rfind("\\n")` and the like,
which miss the `\\r` endings.
"""

from __future__ import annotations

import re

LINE_BREAK = re.compile(r"\r\n|\r|\n")
BREAKS = ("\r\n", "\r", "\n")  # for str.endswith / startswith


def _inside_crlf(text: str, pos: int) -> bool:
    """`pos` lies between the `\\r` and the `\\n` of a `\\r\\n`."""
    return 0 < pos < len(text) and text[pos - 1] == "\r" and text[pos] == "\n"


def line_start(text: str, pos: int) -> int:
    """The offset where the line holding `pos` starts (after the previous line break)."""
    pos = max(0, min(pos, len(text)))
    if _inside_crlf(text, pos):
        pos -= 1
    nl = text.rfind("\n", 0, pos)
    return max(nl, text.rfind("\r", nl + 1, pos)) + 1


def line_end(text: str, pos: int) -> int:
    """The offset where the line holding `pos` ends: its line break, or the end of the text."""
    pos = max(0, min(pos, len(text)))
    if _inside_crlf(text, pos):
        return pos - 1
    nl = text.find("\n", pos)
    nl = len(text) if nl == -1 else nl
    cr = text.find("\r", pos, nl)
    return nl if cr == -1 else cr


def line_break(text: str, pos: int) -> str:
    """The line break that ends the line holding `pos`: `\\r\\n`, `\\r`, `\\n`, or "" for a
    last line without one."""
    end = line_end(text, pos)
    return next((b for b in BREAKS if text.startswith(b, end)), "")


def next_line_start(text: str, pos: int) -> int:
    """The offset where the line after the one holding `pos` starts (past its line
    break); the end of the text on the last line."""
    end = line_end(text, pos)
    return end + len(line_break(text, end))


def at_line_start(text: str, pos: int) -> bool:
    """`pos` is at column 0: the start of the text or right after a line break."""
    return 0 <= pos <= len(text) and line_start(text, pos) == pos and not _inside_crlf(text, pos)
