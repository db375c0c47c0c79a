"""The chat dialect's two halves without a wire: the question, and the answer taken apart
in the shapes chat models give it."""

from __future__ import annotations

import pytest

from engine.remote.chat import HOLE, extract_fill, messages

PREFIX = "def total(items):\n    count = 0\n    for item in items:\n        count += item\n    return "
SUFFIX = "\n\n\nprint(total([1, 2]))\n"


def test_the_question_holds_the_file_with_one_hole_and_the_span() -> None:
    msgs = messages(PREFIX, SUFFIX, "python", "line", True)
    assert [m["role"] for m in msgs] == ["system", "user"]
    user = msgs[1]["content"]
    assert f"{PREFIX}{HOLE}{SUFFIX}" in user and user.count(HOLE) == 1
    assert "the rest of the current line" in user and "single line" in user and "(python)" in user
    block = messages("def f():\n    ", "\n", None, "block", False)[1]["content"]
    assert "body of a block" in block and "as many lines" in block


@pytest.mark.parametrize(
    ("answer", "want"),
    [
        ("count", "count"),  # as asked
        ("```python\ncount\n```", "count"),  # fenced
        ("```\ncount\n```\n\nThis returns the running total.", "count"),  # fence, then an explanation
        ("Here is the missing code:\n```py\ncount\n```", "count"),  # a sentence, then a fence
        ("Sure! The missing code is:\ncount", "count"),  # a sentence without a fence
        ("```python\ncount", "count"),  # a fence that never closes (the budget ran out)
        ("    return count", "count"),  # the cursor's line written out again
        ("return count", "count"),  # ... without its indentation
        (f"{HOLE}count", "count"),  # the marker echoed
        (
            "def total(items):\n    count = 0\n    for item in items:\n        count += item\n    return count",
            "count",
        ),  # the whole function
        ("count\n\n\nprint(total([1, 2]))", "count"),  # the code after the hole too
        ("```python\n    return count\n\n\nprint(total([1, 2]))\n```", "count"),  # all of it, fenced
        ("", ""),  # nothing belongs there
    ],
)
def test_the_code_for_the_hole_is_taken_out_of_the_answer(answer: str, want: str) -> None:
    assert extract_fill(answer, PREFIX, SUFFIX) == want


def test_a_multi_line_fill_keeps_its_lines_and_indentation() -> None:
    prefix, suffix = "def total(items):\n    count = 0\n", "    return count\n"
    body = "    for item in items:\n        count += item\n"
    assert extract_fill(f"```python\n{body}```", prefix, suffix) == body
    assert extract_fill(f"Here you go:\n\n```python\n{body}```\nDone.", prefix, suffix) == body
    # the last line's break stays when the suffix is code at the start of a line (whole lines) ...
    assert extract_fill("y = 1\n", "x = 0\n", "z = 2\n") == "y = 1\n"
    # ... and code that merely starts like the cursor's line is kept when too short to be an echo
    assert extract_fill("i + 1", "x = i", "\n") == "i + 1"
