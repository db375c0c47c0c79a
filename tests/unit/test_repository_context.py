"""engine/repository.py (which pieces of other files a fill gets) and the layouts' repository
format (engine/denoisers/layouts.py): table-driven, on text written here."""

from __future__ import annotations

import pytest

from engine.denoisers.base import Prompt
from engine.denoisers.layouts import DreamLayout, Plain, Specials, SuffixFirst
from engine.denoisers.llada import LLaDALayout
from engine.repository import CHUNK_LINES, CHUNK_STEP, chunks_of, select

LIBRARY = (
    "SHRINK_LIMIT = 3\n\n\n"
    "def write_off_value(line, keep_fraction, round_down=True):\n"
    "    lost = max(0, line.ledger_qty - line.shelf_qty)\n"
    "    return lost * keep_fraction\n"
)
UNRELATED = "def render_banner(title):\n    return '*' * 40 + title\n"
PREFIX = "from stock import write_off_value\n\n\ndef loss(lines):\n    return sum(write_off_value(line, "
SUFFIX = ") for line in lines)\n"


def test_a_file_that_defines_a_name_used_at_the_cursor_is_chosen_over_an_unrelated_one() -> None:
    got = select([("banner.py", UNRELATED), ("stock.py", LIBRARY)], PREFIX, SUFFIX, 10_000)
    assert [p for p, _ in got] == ["stock.py"]
    assert "def write_off_value(line, keep_fraction" in got[0][1]


@pytest.mark.parametrize(
    ("files", "current", "budget", "want"),
    [
        ([("stock.py", LIBRARY)], "stock.py", 10_000, []),  # the current file's own text is not context
        ([("stock.py", LIBRARY)], None, 10, []),  # over the budget: nothing
        ([("copy.py", PREFIX + SUFFIX)], None, 10_000, []),  # the code around the cursor again: left out
        ([("banner.py", UNRELATED)], None, 10_000, []),  # nothing in common
    ],
)
def test_what_is_left_out(files: list[tuple[str, str]], current: str | None, budget: int, want: list[str]) -> None:
    assert [p for p, _ in select(files, PREFIX, SUFFIX, budget, current)] == want


def test_a_window_edited_lately_is_chosen_even_when_it_is_unlike_the_cursor_s_code() -> None:
    assert select([("banner.py", UNRELATED)], PREFIX, SUFFIX, 10_000) == []
    got = select([("banner.py", UNRELATED)], PREFIX, SUFFIX, 10_000, recent=[("banner.py", 1)])
    assert got == [("banner.py", UNRELATED)]


def test_the_chosen_pieces_come_by_path_and_line_whatever_their_scores() -> None:
    """The same set of pieces is the same sequence of tokens (the cache stays valid)."""
    weak = "def loss_total(lines):\n    return len(lines)\n"  # a little like the cursor's code
    got = select([("z_stock.py", LIBRARY), ("a_weak.py", weak)], PREFIX, SUFFIX, 10_000)
    assert [p for p, _ in got] == ["a_weak.py", "z_stock.py"]
    assert select([("a_weak.py", weak), ("z_stock.py", LIBRARY)], PREFIX, SUFFIX, 10_000) == got


def test_the_budget_keeps_the_likest_pieces() -> None:
    weak = "def loss_total(lines):\n    return len(lines)\n"
    got = select([("z_stock.py", LIBRARY), ("a_weak.py", weak)], PREFIX, SUFFIX, len(LIBRARY) + 5)
    assert [p for p, _ in got] == ["z_stock.py"]


def test_overlapping_windows_of_a_file_are_merged_into_one_piece() -> None:
    """A file of 40 lines is two windows that overlap: kept both, it is one piece, each
    line once (never cut where two windows meet)."""
    text = LIBRARY + "".join(f"keep_fraction_{i} = write_off_value\n" for i in range(34))
    assert text.count("\n") > CHUNK_LINES
    (piece,) = select([("stock.py", text)], PREFIX, SUFFIX, 10_000)
    assert piece == ("stock.py", text)


def test_chunks_are_overlapping_windows_of_a_few_dozen_lines() -> None:
    text = "".join(f"line_{i} = {i}\n" for i in range(70))
    chunks = chunks_of("big.py", text)
    assert [c.line for c in chunks] == list(range(0, 70 - CHUNK_LINES + CHUNK_STEP, CHUNK_STEP))
    assert all(c.text.count("\n") <= CHUNK_LINES for c in chunks)
    assert chunks_of("small.py", "x = 1\n")[0].text == "x = 1\n"


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


SPECIALS = Specials(mask=1, eof=2, pad=3, start=4, fim_prefix=5, fim_suffix=6, fim_middle=7, repo_name=8, file_sep=9)


def test_qwen_s_repository_layout() -> None:
    layout = DreamLayout(SPECIALS)
    block = layout.repository(encode, [("a.py", "x = 1\n"), ("b.py", "y = 2")], "proj", "c.py")
    want = [8, *encode("proj\n"), 9, *encode("a.py\nx = 1\n"), 9, *encode("b.py\ny = 2\n"), 9, *encode("c.py\n")]
    assert list(block) == want
    prompt = Prompt(prefix=(100,), suffix=(101,), context=block)
    assert layout.ids(prompt) == (*block, 5, 100, 6, 101, 7)  # the block first, then the FIM prompt
    no_markers = DreamLayout(Specials(mask=1, eof=2, pad=3, start=4, fim_prefix=5, fim_suffix=6, fim_middle=7))
    assert no_markers.repository(encode, [("a.py", "x")], "proj", "c.py") == ()


@pytest.mark.parametrize(
    "layout", [SuffixFirst(suffix=10, prefix=11, middle=12), Plain(), LLaDALayout(start=None)], ids=repr
)
def test_layouts_without_a_format_take_none_and_put_a_given_block_first(layout: object) -> None:
    assert layout.repository(encode, [("a.py", "x")], "proj", "c.py") == ()  # type: ignore[attr-defined]
    ids = layout.ids(Prompt(prefix=(100,), suffix=(101,), context=(55, 56)))  # type: ignore[attr-defined]
    assert list(ids).index(55) < list(ids).index(100) and ids[ids.index(55) + 1] == 56
