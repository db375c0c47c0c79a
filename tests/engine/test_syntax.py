"""Candidates through tree-sitter: validated, cut, dropped and ranked."""

from __future__ import annotations

import pytest

from engine.candidate import Candidate
from engine.denoisers.loading import load_model
from engine.fill import Engine, InfillRequest
from engine.local.generator import LocalGenerator, local_engine
from engine.syntax import check_candidates

from ..conftest import FIXTURE_CODE

PREFIX = "def f(items):\n    result = "
SUFFIX = "\n    return result\n"


def local(engine: Engine) -> LocalGenerator:
    assert isinstance(engine.generator, LocalGenerator)
    return engine.generator


def cand(engine: Engine, text: str) -> Candidate:
    ids = local(engine).tok.encode(text)
    return Candidate(text=text, token_ids=ids, confidence=[0.5] * len(ids))


def test_candidates_are_validated_cut_dropped_and_ranked() -> None:
    engine = local_engine(load_model())
    tok = local(engine).tok
    cands = [cand(engine, t) for t in ("len(items) +", "(((", "sum(items)", "max(items)\n    extra = (")]
    out = check_candidates(tok, cands, PREFIX, SUFFIX, "python")
    assert [(c.text, c.syntax) for c in out] == [
        ("sum(items)", "ok"),
        ("max(items)", "ok"),  # one line: the span after `=` is single-line, cut at the newline
        ("len(items)", "truncated"),
    ]
    for c in out:  # token ids and confidences follow the cut
        assert tok.decode(c.token_ids) == c.text and len(c.confidence) == len(c.token_ids)
    # no grammar: untouched
    same = check_candidates(tok, cands, PREFIX, SUFFIX, "cobol")
    assert [c.text for c in same] == [c.text for c in cands]


def test_infill_with_a_language_returns_only_fills_that_parse() -> None:
    engine = local_engine(load_model())
    src = (FIXTURE_CODE / "inventory.py").read_text()
    kept = 0
    for cut in range(0, len(src), 37):
        r = engine.fill(InfillRequest(prefix=src[:cut], suffix=src[cut:], language="python", candidates=3))
        assert all(c.syntax in ("ok", "truncated") for c in r.candidates)
        kept += len(r.candidates)
    assert kept > 0  # some fills parse: the check is not dropping everything


def test_python_fills_must_compile_where_the_replaced_text_did() -> None:
    """tree-sitter-python accepts a body indented wrongly; CPython's parser does not."""
    engine = local_engine(load_model())
    tok = local(engine).tok
    prefix = "class A:\n    def f(self):\n        "
    suffix = "\n\n    def g(self):\n        return 2\n"
    cands = [cand(engine, t) for t in ("return 1\n      x = 2", "return 1")]
    assert [c.text for c in check_candidates(tok, cands, prefix, suffix, "python", replaced="pass")] == ["return 1"]
    # where the text did not compile before (the user is mid-edit), tree-sitter's verdict stands
    both = check_candidates(tok, cands, prefix, suffix + "  )(", "python", replaced="pass")
    assert len(both) == 2


def test_the_compile_check_reads_only_the_top_level_statement_around_the_fill() -> None:
    from engine.syntax import _top_level_chunk

    prefix = "import os\n\n\nif os.sep:\n    a = 1\nelse:\n    "
    suffix = "\n    b = 2\n\n\ndef g():\n    return 3\n"
    before, after = _top_level_chunk(prefix, suffix)
    assert before == "if os.sep:\n    a = 1\nelse:\n    " and after == "\n    b = 2\n\n\n"


def test_a_whole_line_fill_is_moved_to_the_next_lines_indentation_when_only_that_fails() -> None:
    """At column 0 before an indented line, a line the model wrote at the wrong
    indentation is kept at the next line's; one that fails anyway is still dropped."""
    engine = local_engine(load_model())
    tok = local(engine).tok
    prefix = "def bisect(a, lo, hi):\n    if lo < 0:\n"
    suffix = "        raise ValueError('lo must be non-negative')\n    return lo\n"
    cands = [cand(engine, t) for t in ("print(lo)\n", "    print(hi)\n", "    x = (\n")]
    out = check_candidates(tok, cands, prefix, suffix, "python")
    assert [(c.text, c.syntax) for c in out] == [
        ("        print(lo)\n", "truncated"),
        ("        print(hi)\n", "truncated"),
    ]
    for c in out:  # tokens follow the new text
        assert tok.decode(c.token_ids) == c.text and len(c.confidence) == len(c.token_ids)
    # at the right indentation already: kept as written, ranked first
    right = check_candidates(tok, [cand(engine, "        print(lo)\n")], prefix, suffix, "python")
    assert [(c.text, c.syntax) for c in right] == [("        print(lo)\n", "ok")]
    # before a dedented line (`else:`), the line before it gives the indentation
    prefix, suffix = "def f(x):\n    if x:\n        y = 1\n", "    else:\n        y = 2\n    return y\n"
    inside = check_candidates(tok, [cand(engine, "z = 3\n")], prefix, suffix, "python")
    assert [c.text for c in inside] == ["        z = 3\n"]


@pytest.mark.parametrize(
    ("language", "prefix", "suffix", "line", "kept_open"),
    [
        ("python", "def total(xs):\n    s = 0\n    ", "\n    return s\n", "for x in xs:", True),
        ("javascript", "function total(xs) {\n  let s = 0;\n  ", "\n  return s;\n}\n", "for (const x of xs) {", True),
        ("go", "func total(xs []int) int {\n\ts := 0\n\t", "\n\treturn s\n}\n", "for _, x := range xs {", True),
        ("python", "def total(xs):\n    s = 0\n    ", "\n    return s\n", "for x in", False),  # broken, not open
    ],
)
def test_a_first_line_that_opens_a_block_is_kept_while_typing(
    language: str, prefix: str, suffix: str, line: str, kept_open: bool
) -> None:
    """InfillRequest.one_line (ghost text while typing): a line that opens a block passes as
    it is when the block closed after it parses; the same line as a whole fill does not."""
    fill = [Candidate(text=line, token_ids=[], confidence=[])]
    whole = [c.text for c in check_candidates(None, fill, prefix, suffix, language)]
    open_end = [c.text for c in check_candidates(None, fill, prefix, suffix, language, open_end=True)]
    assert line not in whole  # as a whole fill, a header without its body does not parse (it is cut or dropped)
    assert open_end == ([line] if kept_open else [])
