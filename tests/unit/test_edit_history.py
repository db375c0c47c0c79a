"""lsp_server.history: a document's newest edit, from the texts before and after each change."""

from __future__ import annotations

import pytest

from lsp_server.history import Change, EditHistory, changed


@pytest.mark.parametrize(
    ("before", "after", "want"),
    [
        ("abc", "abc", None),
        ("count = 1", "total = 1", Change(0, "count", "total")),
        ("x = a + b", "x = a - b", Change(6, "+", "-")),
        ("f(a, b)", "f(a, b, c)", Change(6, "", ", c")),  # an insertion: the common start and end kept
        ("aaa", "aa", Change(2, "a", "")),
        ("", "x", Change(0, "", "x")),
    ],
)
def test_changed(before: str, after: str, want: Change | None) -> None:
    assert changed(before, after) == want


def typed(history: EditHistory, *texts: str) -> None:
    for t in texts:
        history.update(t)


def test_a_name_typed_over_key_by_key_is_one_edit() -> None:
    h = EditHistory("count = 1\nprint(count)\n")
    typed(h, "coun = 1\nprint(count)\n", "cou = 1\nprint(count)\n", "co = 1\nprint(count)\n")
    typed(h, "c = 1\nprint(count)\n", " = 1\nprint(count)\n", "t = 1\nprint(count)\n", "to = 1\nprint(count)\n")
    typed(h, "tot = 1\nprint(count)\n", "tota = 1\nprint(count)\n", "total = 1\nprint(count)\n")
    assert h.last == Change(0, "count", "total")
    assert h.text == "total = 1\nprint(count)\n"


def test_an_edit_elsewhere_starts_a_new_one() -> None:
    h = EditHistory("count = 1\nprint(count)\nx = 2\n")
    typed(h, "total = 1\nprint(count)\nx = 2\n")
    assert h.last == Change(0, "count", "total")
    typed(h, "total = 1\nprint(count)\nx = 3\n")  # another line: its own edit
    assert h.last == Change(27, "2", "3")


def test_the_edit_is_whole_words() -> None:
    h = EditHistory("count = 1\n")
    typed(h, "count_all = 1\n")
    assert h.last == Change(0, "count", "count_all")  # the name replaced, not "_all" added
    h = EditHistory("x = a + b\n")
    typed(h, "x = a - b\n")
    assert h.last == Change(6, "+", "-")  # no word touched


def test_no_change_keeps_the_last_edit() -> None:
    h = EditHistory("a = 1\n")
    typed(h, "a = 2\n", "a = 2\n")
    assert h.last == Change(4, "1", "2")


def test_an_edit_undone_leaves_no_edit() -> None:
    h = EditHistory("a = 1\n")
    typed(h, "a = 12\n", "a = 1\n")
    assert h.last is None
