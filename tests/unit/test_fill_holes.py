"""Joint hole filling (engine.spans.fill_holes_jointly) with a fake fill that records what
it was shown: the order of the passes, the text around each hole, and what is kept."""

from __future__ import annotations

from engine.spans import Document, fill_holes_jointly, find_holes, language_for

TEXT = "def a():\n    ...\n\n\ndef b():\n    ...\n\n\ndef c():\n    ...\n"


def holes_of(text: str):  # type: ignore[no-untyped-def]
    return find_holes(Document(text, language_for("python")))


def test_first_pass_last_to_first_then_each_fill_refined_with_all_others_in_place() -> None:
    holes = holes_of(TEXT)
    assert len(holes) == 3
    calls: list[tuple[str, str, str | None, str]] = []

    def fill(prefix: str, suffix: str, refine: str | None, replaced: str) -> str:
        calls.append((prefix, suffix, refine, replaced))
        k = prefix.count("def ") - 1  # which hole: the functions before it
        return f"return {k}" if refine is None else f"return {k} + 0"

    fills = fill_holes_jointly(TEXT, holes, fill)
    assert fills == ["return 0 + 0", "return 1 + 0", "return 2 + 0"]
    first, second = calls[:3], calls[3:]
    assert [c[0].count("def ") - 1 for c in first] == [2, 1, 0]  # last to first
    assert "return 2" in first[1][1] and "..." in first[1][0]  # later holes filled, earlier ones not yet
    assert all(c[2] is None and c[3].strip() == "..." for c in first)
    assert [c[2] for c in second] == ["return 0", "return 1", "return 2"]  # refining each fill
    assert "return 0 + 0" in second[2][0] and "return 2" in second[0][1]  # every other hole holds its fill


def test_a_blank_fill_leaves_its_hole_and_one_fill_is_not_refined() -> None:
    holes = holes_of(TEXT)
    calls: list[str | None] = []

    def fill(prefix: str, suffix: str, refine: str | None, replaced: str) -> str:
        calls.append(refine)
        return "pass" if prefix.count("def ") == 2 else "  \n"

    assert fill_holes_jointly(TEXT, holes, fill) == [None, "pass", None]
    assert calls == [None, None, None]  # a single fill has nothing to agree with: no second pass
