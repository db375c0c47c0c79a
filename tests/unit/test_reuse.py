"""What a document's earlier fills still give (lsp_server/reuse.py): the recall of fills by
the text around the cursor, and whether a running fill is kept while the user types."""

from __future__ import annotations

import pytest

from engine.candidate import Shown
from engine.fill import InfillRequest
from lsp_server.reuse import AHEAD, RECALL_CHARS, RECALLED, TYPE_THROUGH, Job, Recall

P, S = "def area(w, h):\n    ", "\n\nprint(area(2, 3))\n"


def test_recall_answers_the_rest_after_a_typed_start_and_the_whole_fill_at_its_place() -> None:
    recall = Recall()
    recall.remember(Shown(P, S, "return w * h"))
    assert recall.answer(P + "ret", S) == ("urn w * h", TYPE_THROUGH)
    assert recall.answer(P, S) == ("return w * h", RECALLED)  # backspaced back to its place
    assert recall.answer(P, S, shape=None) is None  # alternatives want a fresh fill
    assert recall.answer(P + "x", S) is None  # typed something else
    assert recall.answer(P + "return w * h", S) is None  # typed all of it
    assert recall.answer(P + "ret", S + " ") is None  # the suffix changed


def test_at_its_place_a_fill_answers_only_the_kind_of_request_it_was_made_for() -> None:
    asked, typing = (False, False), (True, True)  # Invoked; Automatic (held to minConfidence, one line)
    recall = Recall()
    recall.remember(Shown(P, S, "return w * h"), shape=asked)
    assert recall.answer(P, S, shape=typing) is None  # not shown unasked: it was not held to minConfidence
    assert recall.answer(P, S, shape=asked) == ("return w * h", RECALLED)  # asked for again: shown again
    assert recall.answer(P + "ret", S, shape=typing) == ("urn w * h", TYPE_THROUGH)  # typed through: as before


def test_recall_keeps_the_newest_fills_and_one_per_place() -> None:
    recall = Recall(size=2)
    recall.remember(Shown(P, S, "a = 1"))
    recall.remember(Shown(P, S, "b = 2"))  # the same place: replaces the first
    recall.remember(Shown(P + "x", S, "y"))
    assert recall.answer(P, S) == ("b = 2", RECALLED)
    recall.remember(Shown(P + "z", S, "w"))  # a third place: the oldest goes
    assert recall.answer(P, S) is None
    assert recall.has(P + "x", S) and recall.has(P + "z", S)


def test_recall_keeps_at_most_its_characters_of_text_but_always_the_newest_fill() -> None:
    big = "x = 1\n" * (RECALL_CHARS // 6 // 2 + 1)  # a document of a little over half the bound
    recall = Recall()
    recall.remember(Shown(big + P, S, "return w * h"))
    recall.remember(Shown(big + P + "x", S, "y"))  # the two would exceed it: the older goes
    assert recall.has(big + P + "x", S) and not recall.has(big + P, S)


def test_a_fill_made_ahead_answers_once_its_suggestion_is_accepted() -> None:
    recall = Recall()
    recall.remember(Shown(P, S, "return w * h"))
    # made ahead as if the suggestion were accepted and its line ended: "\n" then the fill
    recall.remember(Shown(P, S, "return w * h\n    # done"), after=len("return w * h"), lead=len("return w * h\n"))
    assert recall.answer(P + "ret", S) == ("urn w * h", TYPE_THROUGH)  # typing through the suggestion on screen
    assert recall.answer(P + "return w * h", S) == ("\n    # done", AHEAD)  # Tab: the next line
    assert recall.answer(P + "return w * h\n    ", S) == ("# done", TYPE_THROUGH)  # Enter instead
    assert recall.has(P + "return w * h\n", S) and not recall.has(P + "return w * h", S)
    recall.clear()
    assert recall.answer(P + "return w * h", S) is None


def job(lead: str = "", written: str = "") -> Job:
    j = Job.at(InfillRequest(prefix=P + lead, suffix=S), kind=None, lead=lead, after=len(lead))
    j.written = written
    return j


@pytest.mark.parametrize(
    ("lead", "written", "typed", "kept"),
    [
        ("", "", "r", True),  # nothing written yet: the fill may still write it
        ("", "return w", "ret", True),  # typed into what it wrote
        ("", "return w", "return w * h", True),  # past what it wrote, through it
        ("", "return w", "x", False),  # typed otherwise
        ("", "return w", "rex", False),
        ("return w * h", "", "ret", True),  # made ahead: typing through the suggestion on screen
        ("return w * h", "", "return w * h", True),  # Tab: at its place
        ("return w * h", "\n", "return w * h\n", True),  # and on into what it wrote
        ("return w * h", "", "rex", False),  # off the suggestion
        ("return w * h", "\n    y", "return w * h\n    x", False),
    ],
)
def test_a_running_fill_is_kept_while_the_typing_agrees_with_it(
    lead: str, written: str, typed: str, kept: bool
) -> None:
    j = job(lead, written)
    assert j.agrees(typed) is kept
    j.edited(P + typed + S)  # the same decision from the document's text after an edit
    assert j.flag.is_set() is not kept


def test_an_edit_elsewhere_stops_the_running_fill_and_so_does_writing_what_was_not_typed() -> None:
    moved = job()
    moved.edited("# a comment\n" + P + S)  # the text before the cursor changed
    assert moved.flag.is_set()
    suffix = job()
    suffix.edited(P + S + "more\n")  # the text after it changed
    assert suffix.flag.is_set()
    late = job()
    late.edited(P + "x" + S)  # typed before the fill wrote anything: kept
    assert not late.flag.is_set()
    late.wrote("return")  # then it writes something else
    assert late.flag.is_set()
