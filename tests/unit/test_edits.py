"""engine.edits: refinement and next edits, judged by a scorer that knows the right text.

`KnowsTheRegion` is a fake scorer, one token a character: a character of a region that the
right text has in the same place scores 0, any other -5 (where characters are missing, the
one after them); its rewrite from a character on is the right text from the matching place
on. So a fix gains 5 nats a character, and what the framing keeps, bounds, ranks and
drops is what these tests check; none depends on a real model's weights."""

from __future__ import annotations

import difflib
from collections.abc import Callable

import pytest

from engine.edits import (
    Edit,
    EditRequest,
    Replacement,
    Scored,
    Slot,
    best,
    distance,
    grown,
    implied,
    is_fix,
    misspelled,
    realigned,
    signature_edits,
    suggest_edits,
)

WRONG = -5.0


class KnowsTheRegion:
    """Scores and rewrites a region against `right[prefix]`: the right text of the region
    that follows each prefix (a prefix it does not know: the region is taken as right)."""

    def __init__(self, right: dict[str, str], runs_on: str = "") -> None:
        self.right = right
        self.runs_on = runs_on  # what its rewrite writes after the right text
        self.rewrites = 0

    def _ops(self, prefix: str, region: str) -> list[tuple[str, int, int, int, int]]:
        want = self.right.get(prefix, region)
        return difflib.SequenceMatcher(None, region, want, autojunk=False).get_opcodes()

    def score(self, prefix: str, region: str, suffix: str, context_tokens: int | None = None) -> Scored:
        logprobs = [0.0] * (len(region) + 1)  # then end-of-fill's
        for tag, i1, i2, _j1, _j2 in self._ops(prefix, region):
            if tag != "equal":  # what differs, or (an insertion) the character after it, is unlikely
                logprobs[i1 : max(i2, i1 + 1)] = [WRONG] * (max(i2, i1 + 1) - i1)
        return Scored(list(range(len(region))), logprobs)

    def rewrite(
        self,
        prefix: str,
        region: str,
        token: int,
        suffix: str,
        most: int,
        done: Callable[[str], bool],
        context_tokens: int | None = None,
    ) -> str:
        self.rewrites += 1
        want = self.right.get(prefix, region)
        at = len(want)
        for tag, i1, i2, j1, _j2 in self._ops(prefix, region):
            if tag == "equal" and i1 <= token < i2:
                at = j1 + token - i1
                break
            if tag != "equal" and i1 <= token <= i2:
                at = j1
                break
        out = ""
        for c in (want + self.runs_on)[at : at + most]:
            out += c
            if done(out):
                break
        return out


class Generator:
    def __init__(self, scorer: object | None) -> None:
        self.scorer = scorer


class Engine:
    """What suggest_edits needs of an engine: a generator (with or without a scorer) and
    `fill` (the re-fill of a generator without one)."""

    def __init__(self, scorer: object | None = None, fill: str = "") -> None:
        self.generator = Generator(scorer)
        self.refill = fill
        self.asked: list[object] = []

    def fill(self, req: object, control: object = None) -> object:
        self.asked.append(req)

        class Candidate:
            text = self.refill

        class Result:
            candidates = [Candidate()]

        return Result()


def region_of(text: str, line: str) -> tuple[int, int]:
    start = text.index(line)
    return start, start + len(line)


def edits_for(text: str, line: str, right: str, **kw: object) -> list[Edit]:
    a, b = region_of(text, line)
    scorer = KnowsTheRegion({text[:a]: right})
    return suggest_edits(Engine(scorer), EditRequest(text, "python", (a, b), **kw))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("line", "right", "old", "new"),
    [
        ("    print('Hello, ' + nmae)", "    print('Hello, ' + name)", "nmae", "name"),  # a typo: the whole name
        ("    return n % 2 == 1", "    return n % 2 == 0", "1", "0"),  # at the region's end
        ("    total = total_price(items)", "    total = total_cost(items)", "total_price", "total_cost"),
        ("    for i in range(n + 1):", "    for i in range(n - 1):", "+", "-"),  # an operator
    ],
)
def test_a_fix_replaces_only_what_is_wrong(line: str, right: str, old: str, new: str) -> None:
    text = f"def f(n, items, name):\n{line}\n    return None\n"
    (edit,) = edits_for(text, line, right)
    assert (text[edit.start : edit.end], edit.text) == (old, new)
    assert edit.gain is not None and edit.gain > 0 and edit.source in ("refine", "spelling")
    fixed = text[: edit.start] + edit.text + text[edit.end :]
    assert fixed == text.replace(line, right)


def test_right_code_gets_no_edit_and_no_rewrite() -> None:
    line = "    return n % 2 == 0"
    text = f"def is_even(n):\n{line}\n"
    a, b = region_of(text, line)
    scorer = KnowsTheRegion({text[:a]: line})
    assert suggest_edits(Engine(scorer), EditRequest(text, "python", (a, b))) == []  # type: ignore[arg-type]
    assert scorer.rewrites == 0  # no token was unlikely: nothing was rewritten


def test_an_edit_below_the_margin_is_not_suggested() -> None:
    text = "def is_even(n):\n    return n % 2 == 1\n"
    line = "    return n % 2 == 1"
    assert edits_for(text, line, line.replace("1", "0"), margin=4.0)  # one character: 10 nats
    assert edits_for(text, line, line.replace("1", "0"), margin=11.0) == []


def test_a_rewrite_that_runs_on_past_the_region_is_cut_at_its_lines() -> None:
    """The model's text in place of the region's last line goes on with new lines: the
    edit is the difference in the line alone."""
    text = "def is_even(n):\n    return n % 2 == 1\n"
    line = "    return n % 2 == 1"
    a, b = region_of(text, line)
    scorer = KnowsTheRegion({text[:a]: line.replace("1", "0")}, runs_on="\n\ndef main():\n    pass")
    (edit,) = suggest_edits(Engine(scorer), EditRequest(text, "python", (a, b)))  # type: ignore[arg-type]
    assert (text[edit.start : edit.end], edit.text) == ("1", "0")


@pytest.mark.parametrize(
    ("line", "right"),
    [
        ("    for i in range(n + 1):", "    for i in range(n):"),  # a word deleted
        ("    x = f(a,b)", "    x = f(a, b)"),  # blanks only
    ],
)
def test_what_is_not_the_shape_of_a_fix_is_not_suggested(line: str, right: str) -> None:
    text = f"def f(n, items):\n{line}\n"
    assert edits_for(text, line, right) == []


@pytest.mark.parametrize(
    ("old", "new", "fix"),
    [
        ("nmae", "name", True),
        ("!=", "==", True),
        ("", "_all", True),  # appended to a name (grown, it is the name)
        ("2", "1", True),
        ("accepted[i]", "spec", False),  # two words for one
        ("hx[0::2] != hx[1::2]", "len(s) == 6", False),
        ("[1]", "", False),  # a word deleted
        ("  ", "", False),  # blanks only
        ("a" * 41, "b", False),  # too long
    ],
)
def test_is_fix(old: str, new: str, fix: bool) -> None:
    assert is_fix(old, new) is fix


def test_no_edit_touches_what_the_developer_just_wrote() -> None:
    text = "def is_even(n):\n    return n % 2 == 1\n"
    line = "    return n % 2 == 1"
    one = text.index("1\n")
    assert edits_for(text, line, line.replace("1", "0"))
    assert edits_for(text, line, line.replace("1", "0"), protected=(one, one + 1)) == []


def test_an_edit_wider_than_the_limit_is_dropped() -> None:
    line = "    x = aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    text = f"{line}\n"
    assert edits_for(text, line, "    x = " + "b" * 50) == []


def test_an_edit_that_breaks_the_syntax_is_dropped() -> None:
    text = "total = area(2, 3)\n"
    line = "total = area(2, 3)"
    assert edits_for(text, line, "total = area(2, 3") == []  # the "fix" leaves a bracket open
    assert edits_for(text, line, "total = area(2, 4)")  # the same place, a fix that parses


def test_without_a_scorer_the_refill_is_bounded_to_where_it_differs() -> None:
    text = "total = area(2, 3) + perimeter(2, 3)\n"
    engine = Engine(None, fill="total = area(2, 3) * perimeter(2, 3)")
    (edit,) = suggest_edits(engine, EditRequest(text, "python", (0, len(text) - 1)))  # type: ignore[arg-type]
    assert (text[edit.start : edit.end], edit.text, edit.gain) == ("+", "*", None)
    assert engine.asked  # it asked the generator for the region's re-fill


def test_without_a_scorer_a_refill_that_rewrites_everything_is_no_edit() -> None:
    text = "total = area(2, 3) + perimeter(2, 3) + volume(2, 3, 4)\n"
    engine = Engine(None, fill="print('something else entirely, longer than the limit allows')")
    assert suggest_edits(engine, EditRequest(text, "python", (0, len(text) - 1))) == []  # type: ignore[arg-type]


def test_proposals_are_kept_where_the_model_prefers_them() -> None:
    text = "def total_cost(items):\n    pass\n\nx = total_price(a)\ny = total_price(b)\n"
    use = text.index("x = ")
    scorer = KnowsTheRegion({text[:use]: "x = total_cost(a)"})  # the second use: as it is, for the model
    right = Replacement(text.index("total_price"), text.index("total_price") + 11, "total_cost")
    second = text.index("total_price(b)")
    wrong = Replacement(second, second + 11, "total_cost")
    edits = suggest_edits(Engine(scorer), EditRequest(text, "python", None, [right, wrong]))  # type: ignore[arg-type]
    assert [(e.start, e.text, e.source) for e in edits] == [(right.start, "total_cost", "next")]
    assert edits[0].confidence is not None and edits[0].confidence > 0.5


def test_best_keeps_the_better_of_overlapping_edits_and_at_most_a_few() -> None:
    text = "a = b + c\n"
    edits = [Edit(4, 5, "x", 2.0), Edit(4, 9, "y", 5.0), Edit(0, 1, "z", 1.0), Edit(0, 1, "a", 9.0)]
    kept = best(text, "python", edits, 3)
    assert [(e.start, e.end, e.text) for e in kept] == [(4, 9, "y"), (0, 1, "z")]  # "a" -> "a" changes nothing
    assert len(best(text, None, [Edit(i, i + 1, "q", 1.0) for i in range(0, 9, 2)], 2)) == 2


@pytest.mark.parametrize(
    ("old", "written", "complete", "want"),
    [
        ("mae)", "ame)", False, []),  # two differences one letter apart, and no anchor after them yet
        ("mae)", "ame)", True, [(0, 0, "a"), (0, 2, "am")]),  # the first difference, then both
        ("_price(items)", "_cost(items)", False, [(1, 4, ""), (1, 6, "cost")]),
        ("1", "0", True, [(0, 1, "0")]),  # the end of both
        ("1", "0", False, []),  # not yet: more may come
        ("1)", "0", True, [(0, 2, "0")]),
        ("name)", "name + '!')", True, [(4, 4, " + '!'")]),
        ("same text", "same text", True, []),  # no difference
        ("x = 1\ny = 2", "x = 3\ny = 2\nz = 3", True, [(4, 5, "3")]),  # lines past the old text's dropped
    ],
)
def test_realigned(old: str, written: str, complete: bool, want: list[tuple[int, int, str]]) -> None:
    assert realigned(old, written, complete) == want


@pytest.mark.parametrize(
    ("text", "lo", "hi", "new", "want"),
    [
        ("print(nmae)", 7, 9, "am", (6, 10, "name")),  # inside a word: the word
        ("total_price(x)", 6, 11, "cost", (0, 11, "total_cost")),
        ("name)", 4, 4, "_all", (0, 4, "name_all")),  # appended to a word: the word
        ("n == 1", 5, 6, "0", (5, 6, "0")),  # a word already whole
        ("a + b", 1, 4, " - ", (1, 4, " - ")),  # no word touched
        ("f(a, b)", 3, 3, ", c", (3, 3, ", c")),  # between a word and a symbol, by a symbol: as it is
    ],
)
def test_grown(text: str, lo: int, hi: int, new: str, want: tuple[int, int, str]) -> None:
    assert grown(text, lo, hi, new) == want


@pytest.mark.parametrize(
    ("before", "start", "old", "new", "want"),
    [
        # a rename: the other uses, nearest first, not the edit itself nor longer names
        (
            "count = 1\nprint(count)\nx = count_all + count\n",
            0,
            "count",
            "total",
            [(16, 21, "total"), (39, 44, "total")],
        ),
        # a name edited in its middle: the whole old name is looked for
        ("total_price = 1\nprint(total_price)\n", 6, "price", "cost", [(21, 32, "total_cost")]),
        ("x = a + b\ny = a + b\n", 6, "+", "-", []),  # no word in what changed
        ("pre = 1\nrow.pre = pre\n", 0, "pre", "head", [(19, 22, "head")]),  # not an attribute
        ("x = 1\n", 0, "x", "x", []),  # nothing changed
    ],
)
def test_implied(before: str, start: int, old: str, new: str, want: list[tuple[int, int, str]]) -> None:
    after = before[:start] + new + before[start + len(old) :]
    assert [(p.start, p.end, p.text) for p in implied(after, start, old, new)] == want


def test_implied_stays_in_the_scope_it_is_given() -> None:
    text = "def f():\n    total = 1\n    return count\n\ndef g(count):\n    return count\n"
    start = text.index("total")
    scope = (0, text.index("def g"))
    got = implied(text, start, "count", "total", scope)
    assert [(p.start, p.text) for p in got] == [(text.index("count"), "total")]  # not g's own `count`


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [("nmae", "name", 1), ("ponit", "point", 1), ("color", "colour", 1), ("abc", "xyz", 3), ("a", "abcdef", 3)],
)
def test_distance(a: str, b: str, want: int) -> None:
    assert distance(a, b) == want


def test_misspelled_offers_the_documents_names_spelled_like_a_name_that_stands_alone() -> None:
    text = "def f(point, pint):\n    if ponit < 3:\n        return point\n    return pint\n"
    line = "    if ponit < 3:"
    a = text.index(line)
    got = misspelled(text, (a, a + len(line)))
    at = text.index("ponit")
    assert [(p.start, p.end) for p in got] == [(at, at + 5)] * 2
    assert {p.text for p in got} == {"point", "pint"}
    assert misspelled(text, (0, text.index(":"))) == []  # names used twice are the developer's


@pytest.mark.parametrize(
    ("language", "text", "inside", "scope_starts_with"),
    [
        ("python", "x = 1\ndef f(a):\n    b = a\n    return b\n", "b = a", "def f"),
        ("python", "x = 1\ny = x\n", "y = x", "x = 1"),  # the top level: the whole text
        ("javascript", "const k = 1;\nfunction g(a) {\n  let b = a;\n  return b;\n}\n", "let b", "function g"),
        ("go", "package p\n\nfunc h(a int) int {\n\tb := a\n\treturn b\n}\n", "b := a", "func h"),
    ],
)
def test_enclosing_scope(language: str, text: str, inside: str, scope_starts_with: str) -> None:
    from engine.spans import Document, enclosing_scope, language_for

    lo, hi = enclosing_scope(Document(text, language_for(language)), text.index(inside))
    assert text[lo:].startswith(scope_starts_with) and lo <= text.index(inside) < hi


def test_slots_are_filled_and_the_edit_bounded_to_what_differs() -> None:
    """The developer gave scale() a parameter: the model fills the new argument of each
    call (a slot after its last argument, with its comma), and its fill of one place
    again is bounded to what differs; each is kept where the model prefers it."""
    text = "def scale(v, k, o):\n    return v * k + o\n\nx = scale(a, 2)\ny = scale(b, 3, 1)\n"
    at = text.index("a, 2") + 4
    again = text.index("b, 3, 1")
    scorer = KnowsTheRegion(
        {
            text[:at] + ", ": "0)",  # its fill writes the closing bracket again: not part of the edit
            text[: text.index("x = ")]: "x = scale(a, 2, 0)",  # the lines the model judges
            text[:again]: "b, 3, 2",
            text[: text.index("y = ")]: "y = scale(b, 3, 2)",
        }
    )
    slots = [Slot(at, at, ", "), Slot(again, again + 7)]
    edits = suggest_edits(Engine(scorer), EditRequest(text, "python", None, refills=slots))  # type: ignore[arg-type]
    assert sorted((e.start, e.end, e.text, e.source) for e in edits) == [
        (at, at, ", 0", "next"),
        (again + 6, again + 7, "2", "next"),
    ]


def test_an_edit_that_implies_something_is_the_answer_not_the_region() -> None:
    text = "def is_even(n):\n    return n % 2 == 1\n"
    line = "    return n % 2 == 1"
    a, b = region_of(text, line)
    scorer = KnowsTheRegion({text[:a]: line.replace("1", "0")})
    req = EditRequest(text, "python", (a, b), refills=[Slot(text.index("n %"), text.index("n %") + 1)])
    suggest_edits(Engine(scorer), req)  # type: ignore[arg-type]
    assert scorer.rewrites == 1  # the slot alone: the region was not refined


@pytest.mark.parametrize(
    ("language", "text", "old", "want"),
    [
        # `c` dropped from f(a, b, c): each call with three arguments loses its third
        (
            "python",
            "def f(a, b):\n    pass\n\nx = f(1, 2, 3)\ny = o.f(4, 5, 6) + f(7)\n",
            ", c",
            "def f(a, b):\n    pass\n\nx = f(1, 2)\ny = o.f(4, 5) + f(7)\n",
        ),
        # the first parameter dropped: the first argument goes with the comma after it
        ("javascript", "function f(b) { return b; }\nf(1, 2);\n", "a, ", "function f(b) { return b; }\nf(2);\n"),
        # a method: `self` is not an argument
        (
            "python",
            "class A:\n    def m(self, a):\n        pass\n\nA().m(1, 2)\n",
            ", b",
            "class A:\n    def m(self, a):\n        pass\n\nA().m(1)\n",
        ),
        (
            "go",
            "package p\n\nfunc f(a int) int { return a }\n\nfunc g() { f(1, 2) }\n",
            ", b int",
            "package p\n\nfunc f(a int) int { return a }\n\nfunc g() { f(1) }\n",
        ),
    ],
)
def test_a_removed_parameter_drops_the_argument_at_its_place(language: str, text: str, old: str, want: str) -> None:
    from engine.spans import Document, language_for, signature_change

    params = text.index("(") + 1
    at = text.index(")", params) if old.startswith(",") else params  # where the edit was
    change = signature_change(Document(text, language_for(language)), at, old, "")
    assert change is not None and change.removed is not None
    removals, slots = signature_edits(change)
    assert slots == []
    after = text
    for r in sorted(removals, key=lambda r: -r.start):
        after = after[: r.start] + r.text + after[r.end :]
    assert after == want


def test_an_added_parameter_is_a_slot_at_its_place_and_other_edits_are_not_signatures() -> None:
    from engine.spans import Document, language_for, signature_change

    text = "def f(a, b, c):\n    pass\n\nf(1, 2)\nf(3, 4, 5)\n"
    doc = Document(text, language_for("python"))
    change = signature_change(doc, text.index(", c"), "", ", c")
    assert change is not None and change.added == 2
    removals, slots = signature_edits(change)
    assert removals == [] and slots == [Slot(text.index("2)") + 1, text.index("2)") + 1, ", ")]
    assert signature_change(doc, text.index("b,"), "x", "b") is None  # a parameter renamed
    assert signature_change(doc, text.index("pass"), "", "pass") is None  # not in a parameter list
