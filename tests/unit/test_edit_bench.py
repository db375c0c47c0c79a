"""bench/edits.py's cases and its judge: at least 40 faults cut from the held-out fixtures,
each differing from the real code only in its span, as many clean positions, and an answer
judged by what applying it does."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("edits_bench", ROOT / "bench" / "edits.py")
assert _spec is not None and _spec.loader is not None
edits = importlib.util.module_from_spec(_spec)
sys.modules["edits_bench"] = edits  # its dataclasses look their module up
_spec.loader.exec_module(edits)


def _original(case: Any) -> str:
    specs = json.loads((edits.FIXTURES / "cases.json").read_text())
    spec = next(s for s in specs if s["name"] == case.name.split(":")[0])
    return str((edits.FIXTURES / spec["file"]).read_text())


def _edit(text: str, a: int, b: int, new: str) -> dict[str, Any]:
    return {"range": {"start": edits._position(text, a), "end": edits._position(text, b)}, "text": new}


def test_the_cases_are_faults_of_real_code_and_as_many_clean_positions() -> None:
    cases = edits.cut_cases()
    faults = [c for c in cases if c.kind not in edits.CLEAN]
    assert len(faults) >= 40 and sum(c.kind in edits.CLEAN for c in cases) >= len(faults)
    assert {c.kind for c in faults} == {*edits.KINDS, "signature"}
    for c in faults:
        if c.kind == "signature":
            continue  # below
        a, b = c.span
        fixed = c.text[:a] + c.fixed + c.text[b:]
        if c.kind != "rename":  # a rename also renamed the definition: the rest differs there
            assert fixed == _original(c), c.name
        assert c.text[a:b] != c.fixed
    assert all(c.text == _original(c) for c in cases if c.kind == "clean")


def test_a_rename_is_a_next_edit_whose_fixes_are_the_later_uses() -> None:
    """The server sees the document before the rename, then the rename; each fix puts the
    new name at a later use, and with all of them the document is the original renamed."""
    renames = [c for c in edits.cut_cases() if c.kind == "rename"]
    assert renames
    for c in renames:
        assert c.before == _original(c) and c.fixes
        new = c.fixes[0][2]
        old = c.text[c.fixes[0][0] : c.fixes[0][1]]
        assert new.startswith(old) and c.text[c.at - len(new) : c.at] == new  # asked where the rename ends
        done = c.text
        for s, e, text in sorted(c.fixes, reverse=True):
            assert done[s:e] == old
            done = done[:s] + text + done[e:]
        assert done.count(new) == len(c.fixes) + 1  # the definition and every later use
    clean_next = [c for c in edits.cut_cases() if c.kind == "clean_next"]
    assert clean_next and all(c.before == _original(c) and c.text != c.before for c in clean_next)


def test_a_changed_signature_is_a_next_edit_whose_fixes_drop_the_calls_last_argument() -> None:
    cases = [c for c in edits.cut_cases() if c.kind == "signature"]
    assert len(cases) >= 5
    for c in cases:
        assert c.before == _original(c) and len(c.text) < len(c.before)
        for s, e, new in c.fixes:
            assert new == "" and c.text[s] == "," and c.text[e] == ")", (c.name, c.text[s - 20 : e + 2])
    without = edits.cut_cases(signatures=False)  # the other cases are the same with them or without
    rest = iter(edits.cut_cases())
    assert all(any(c == d for d in rest) for c in without)


def test_a_next_edit_is_right_only_when_each_edit_is_implied() -> None:
    case = next(c for c in edits.cut_cases() if c.kind == "rename")
    (s1, e1, new), (s2, e2, _) = case.fixes[0], case.fixes[-1]
    both = edits.judge(case, [_edit(case.text, s1, e1, new), _edit(case.text, s2, e2, new)])
    assert both["right_edit"] and both["right_place"]
    stray = edits.judge(case, [_edit(case.text, s1, e1, new), _edit(case.text, 0, 1, "x")])
    assert not stray["right_edit"] and stray["right_place"]


def test_an_answer_is_judged_by_what_applying_it_does() -> None:
    case = next(c for c in edits.cut_cases() if c.kind == "typo")
    a, b = case.span
    right = edits.judge(case, [_edit(case.text, a, b, case.fixed)])
    assert right["right_edit"] and right["right_place"] and right["replaced_chars"] == b - a
    line_start = case.text.rfind("\n", 0, a) + 1
    wide = edits.judge(case, [_edit(case.text, line_start, b, case.text[line_start:a] + "x")])
    assert not wide["right_edit"] and wide["right_place"] and wide["replaced_chars"] == b - line_start
    assert edits.judge(case, []) == {
        "changed": False, "right_edit": False, "right_place": False, "replaced_chars": 0, "fault_chars": b - a,
    }  # fmt: skip
