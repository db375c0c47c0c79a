"""Line starts and ends under the three line endings (engine.spans.lines)."""

from __future__ import annotations

import pytest

from engine.spans.lines import at_line_start, line_break, line_end, line_start, next_line_start


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
@pytest.mark.parametrize(
    ("where", "start", "end", "brk", "nxt"),
    [
        # (position in "ab" EOL "cd" EOL "ef", as (line, column)), the line's start and end
        # (line, column), its break, the next line's start
        ((0, 0), (0, 0), (0, 2), True, (1, 0)),
        ((0, 1), (0, 0), (0, 2), True, (1, 0)),
        ((0, 2), (0, 0), (0, 2), True, (1, 0)),  # at the break: still the first line
        ((1, 0), (1, 0), (1, 2), True, (2, 0)),
        ((1, 2), (1, 0), (1, 2), True, (2, 0)),
        ((2, 1), (2, 0), (2, 2), False, (2, 2)),  # the last line has no break
        ((2, 2), (2, 0), (2, 2), False, (2, 2)),
    ],
)
def test_line_bounds(
    eol: str, where: tuple[int, int], start: tuple[int, int], end: tuple[int, int], brk: bool, nxt: tuple[int, int]
) -> None:
    text = eol.join(["ab", "cd", "ef"])

    def off(lc: tuple[int, int]) -> int:
        return lc[0] * (2 + len(eol)) + lc[1]

    pos = off(where)
    assert (line_start(text, pos), line_end(text, pos)) == (off(start), off(end))
    assert line_break(text, pos) == (eol if brk else "")
    assert next_line_start(text, pos) == off(nxt)
    assert at_line_start(text, pos) == (where[1] == 0)


@pytest.mark.parametrize(
    ("text", "pos", "start", "end", "nxt"),
    [
        ("", 0, 0, 0, 0),
        ("\n", 0, 0, 0, 1),
        ("\n", 1, 1, 1, 1),  # the empty line after a final break
        ("a\r\nb", 2, 0, 1, 3),  # between \r and \n: inside the first line's break
        ("a\n\rb", 2, 2, 2, 3),  # \n then \r: two breaks, an empty line between them
        ("a\r\rb", 2, 2, 2, 3),
        ("ab", -5, 0, 2, 2),  # offsets are clamped
        ("ab", 99, 0, 2, 2),
    ],
)
def test_edge_cases(text: str, pos: int, start: int, end: int, nxt: int) -> None:
    assert (line_start(text, pos), line_end(text, pos), next_line_start(text, pos)) == (start, end, nxt)
