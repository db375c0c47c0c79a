"""Spans beyond selection: validation and truncation, incremental parsing, holes, regions,
language mapping."""

from __future__ import annotations

import pytest

from engine.candidate import Candidate
from engine.spans import (
    Document,
    count_errors,
    enclosing_node,
    expand_selection,
    find_holes,
    language_for,
    select_span,
    validate_fill,
)
from engine.spans.validate import whole_lines_break
from engine.syntax import check_candidates

PY = language_for("python")
JS = language_for("javascript")
RS = language_for("rust")

GOOD = "def f(x):\n    return ‸\n\n\ndef g():\n    pass\n"
BROKEN = "def f(x):\n    y = (\n    return ‸\n"


@pytest.mark.parametrize(
    ("doc", "lang", "fill", "status", "kept"),
    [
        (GOOD, PY, "x + 1", "ok", "x + 1"),
        (GOOD, PY, "x +", "truncated", "x"),
        (GOOD, PY, "foo(a, b))", "truncated", "foo(a, b)"),
        (GOOD, PY, "x + 1\n    y = (", "truncated", "x + 1\n"),
        (GOOD, PY, "(((", "rejected", ""),
        (GOOD, PY, ")", "rejected", ""),
        # an already broken file: a fill that makes it no worse is accepted
        (BROKEN, PY, "x", "ok", "x"),
        (BROKEN, PY, "x)", "ok", "x)"),  # closes the open bracket: fewer errors
        ("function f(a) {\n  return ‸\n}\n", JS, "a * 2;", "ok", "a * 2;"),
        ("function f(a) {\n  return ‸\n}\n", JS, "a * 2; }", "truncated", "a * 2;"),
        ("fn f() -> i32 {\n    ‸\n}\n", RS, "let x = 1;\n    x + {", "truncated", "let x = 1;\n"),
        ("no grammar here ‸\n", language_for("cobol"), "anything (", "unchecked", "anything ("),
        # the statement at the cursor is incomplete (an error) before the fill: a fill
        # cannot pass by replacing that error with one of its own
        ("def f(items):\n    result = ‸\n    return items\n", PY, "foo(a, b))", "truncated", "foo(a, b)"),
        ("def f(items):\n    result = ‸\n    return items\n", PY, "len(items", "truncated", "len"),
    ],
)
def test_validation_accepts_truncates_or_rejects(doc: str, lang: object, fill: str, status: str, kept: str) -> None:
    cursor = doc.index("‸")
    d = Document(doc.replace("‸", ""), lang)  # type: ignore[arg-type]
    verdict = validate_fill(d, cursor, fill)
    assert (verdict.status, verdict.fill) == (status, kept)


def test_validating_a_hole_replacement() -> None:
    text = "def f(x):\n    pass\n"
    d = Document(text, PY)
    hole = select_span(text, text.index("pass"), PY)
    assert validate_fill(d, hole.end, "return x * 2", start=hole.start).status == "ok"
    assert validate_fill(d, hole.end, "return (x", start=hole.start).fill == "return"


def nodes(tree: object) -> list[tuple[str, int, int]]:
    """Every node's type and byte range, in document order."""
    out: list[tuple[str, int, int]] = []
    stack = [tree.root_node]  # type: ignore[attr-defined]
    while stack:
        node = stack.pop()
        out.append((node.type, node.start_byte, node.end_byte))
        stack.extend(reversed(node.children))
    return out


def test_incremental_parse_equals_a_fresh_parse() -> None:
    text = "def f(x):\n    return x\n" * 50
    d = Document(text, PY, version=1)
    edits = [
        text[:30] + "y" + text[30:],  # insert
        text[:30] + text[31:],  # delete
        text.replace("return x", "return (", 1),  # break it
        "",  # empty it
        "é = 1\n" + text,  # non-ASCII before everything
    ]
    for version, new in enumerate(edits, 2):
        d.update(new, version)
        fresh = Document(new, PY)
        assert d.version == version
        assert nodes(d.tree) == nodes(fresh.tree)
        assert count_errors(d.tree) == count_errors(fresh.tree)


def test_find_holes_lists_markers_and_empty_bodies_in_order() -> None:
    text = "function a() {}\nfunction b() {\n  // TODO: b\n}\nfunction c() { return 1; }\n"
    holes = find_holes(Document(text, JS))
    assert [(h.start, text[h.start : h.end]) for h in holes] == [
        (text.index("{}") + 1, ""),
        (text.index("// TODO"), "// TODO: b"),
    ]
    py = "def a():\n    pass\n\ndef b():\n    ...\n\ndef c():\n    return 1\n"
    assert [py[h.start : h.end] for h in find_holes(Document(py, PY))] == ["pass", "..."]
    rs = "fn a() { todo!() }\nfn b() {\n    unimplemented!();\n}\n"
    assert [rs[h.start : h.end] for h in find_holes(Document(rs, RS))] == ["unimplemented!();"]


def test_selection_grows_to_whole_nodes() -> None:
    text = "def f(x):\n    a = 1\n    b = g(x, 2)\n    c = 3\n"
    d = Document(text, PY)
    inner = text.index("x, 2")
    assert text[slice(*expand_selection(d, inner + 1, inner + 3))] == "(x, 2)"  # part of the arguments
    s = text.index("1\n    b")
    assert text[slice(*expand_selection(d, s, s + 8))] == "a = 1\n    b = g(x, 2)"
    assert text[slice(*enclosing_node(d, text.index("g(x")))] == "b = g(x, 2)"


@pytest.mark.parametrize(
    ("language_id", "path", "name"),
    [
        ("python", None, "python"),
        ("typescriptreact", None, "tsx"),
        ("javascriptreact", None, "tsx"),
        (None, "src/main.rs", "rust"),
        (None, "lib/x.HPP", "cpp"),
        ("cobol", "a.cbl", "plain"),
        (None, None, "plain"),
    ],
)
def test_language_mapping(language_id: str | None, path: str | None, name: str) -> None:
    assert language_for(language_id, path).name == name


def test_no_grammar_means_line_spans_never_errors() -> None:
    lang = language_for("cobol")
    assert select_span("MOVE A TO ‸B.\n".replace("‸", ""), 10, lang).kind == "line"
    assert select_span("", 0, lang).kind == "block"
    assert select_span("x\n* TODO: later\n", 5, lang).kind == "line"
    assert find_holes(Document("a\n# TODO fix\n", lang))[0].kind == "hole"


def test_offsets_are_characters_even_after_multibyte_text() -> None:
    """Positions are str offsets; tree-sitter's are bytes: text before the cursor with
    multi-byte characters must not shift anything."""
    pre = "größe = '→→→'  # ünïcödé\n"
    text = pre + 'def f(x):\n    s = "héllo wörld"\n    # TODO: ça\n    return s\n'
    d = Document(text, PY)
    inside = text.index("wörld")
    assert select_span(text, inside, PY).kind == "string"
    todo = text.index("# TODO")
    hole = select_span(text, todo + 3, PY)
    assert (hole.kind, text[hole.start : hole.end]) == ("hole", "# TODO: ça")
    assert [text[h.start : h.end] for h in find_holes(d)] == ["# TODO: ça"]
    s = text.index("héllo")
    assert text[slice(*expand_selection(d, s, s + 3))] == "héllo wörld"  # the string's content
    assert text[slice(*enclosing_node(d, s))] == 's = "héllo wörld"'
    verdict = validate_fill(d, hole.end, "s = s.upper()", start=hole.start)
    assert verdict.status == "ok"
    verdict = validate_fill(d, hole.end, "s = (s", start=hole.start)
    assert (verdict.status, verdict.fill) == ("truncated", "s")  # `s` alone is an expression statement


def test_hole_markers_inside_strings_are_prose() -> None:
    text = 'def f():\n    """\n    pass\n    """\n    return 1\n'
    assert select_span(text, text.index("pass") + 2, PY).kind == "string"
    assert find_holes(Document(text, PY)) == []


@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r"])
def test_line_endings_do_not_change_the_verdict(ending: str) -> None:
    text = ending.join(["def f(x):", "    return ", "", "", "def g(x):", "    pass"]) + ending
    d = Document(text, PY)
    cursor = text.index("return ") + 7
    assert [validate_fill(d, cursor, f).fill for f in ("x + 1", "len(x)")] == ["x + 1", "len(x)"]


def test_truncation_cuts_before_the_first_error_however_long_the_fill() -> None:
    text = "def f(x):\n    return \n"
    d = Document(text, PY)
    cursor = text.index("return ") + 7
    assert validate_fill(d, cursor, "x )" + "\n    a = 1" * 13).fill == "x"
    assert validate_fill(d, cursor, "x + 1" + "\n    a = (" * 14).fill == "x + 1\n"


def test_selection_bounds_are_clamped_and_ordered() -> None:
    d = Document("abc\n", PY)
    assert expand_selection(d, 3, 0) == expand_selection(d, 0, 3)
    assert expand_selection(d, -5, 100) == (0, 4)


GO = language_for("go")
# column 0 of a line holding code (the usual fill-in-the-middle form: the prefix ends with
# a line break, the suffix starts with the next line): the fill is whole lines
PY_LINE = "import os\n\n\ndef f(x):\n    y = x + 1\n‸    return y\n"
JS_LINE = "function f(a) {\n  const b = a + 1;\n‸  return b;\n}\n"
GO_LINE = "package main\n\nfunc f(a int) int {\n\tb := a + 1\n‸\treturn b\n}\n"


@pytest.mark.parametrize(
    ("doc", "lang", "fill", "status", "kept"),
    [
        (PY_LINE, PY, "    z = y * 2\n", "ok", "    z = y * 2\n"),  # a whole line, as it is
        (PY_LINE, PY, "    z = y * 2", "ok", "    z = y * 2\n"),  # its line break added
        (PY_LINE, PY, "    z = y * 2\n    ", "ok", "    z = y * 2\n"),  # the next line's indentation dropped
        (PY_LINE, PY, "    z = 1\n    w = 2", "ok", "    z = 1\n    w = 2\n"),
        (PY_LINE, PY, "    if y:", "ok", "    if y:\n"),  # an opener: the next line is its body
        (PY_LINE, PY, "    @property", "rejected", ""),  # a decorator before a return: no
        (PY_LINE, PY, "    z = (", "rejected", ""),  # never merged into `return y`
        (PY_LINE, PY, "    (((", "rejected", ""),
        (PY_LINE, PY, "", "ok", ""),  # nothing to insert: no line break either
        (JS_LINE, JS, "  const c = b * 2;\n", "ok", "  const c = b * 2;\n"),
        (JS_LINE, JS, "  const c = b * 2;", "ok", "  const c = b * 2;\n"),
        (JS_LINE, JS, "  if (b > 2)", "ok", "  if (b > 2)\n"),
        # `c = b *` before `return b;` would be `c = b * return b;`; `c = b` before it runs
        # on into nothing (a statement of its own after automatic semicolon insertion)
        (JS_LINE, JS, "  c = b *", "truncated", "  c = b\n"),
        (JS_LINE, JS, "  foo(b));", "truncated", "  foo(b)\n"),
        (GO_LINE, GO, "\tc := b * 2\n", "ok", "\tc := b * 2\n"),
        (GO_LINE, GO, "\tc := b * 2", "ok", "\tc := b * 2\n"),
        (GO_LINE, GO, "\tc := b * 2\n\t", "ok", "\tc := b * 2\n"),
        (GO_LINE, GO, "\tb = b +", "truncated", "\tb = b\n"),
        (GO_LINE, GO, "\t}}", "rejected", ""),
    ],
)
def test_whole_lines_at_column_0(doc: str, lang: object, fill: str, status: str, kept: str) -> None:
    cursor = doc.index("‸")
    text = doc.replace("‸", "")
    span = select_span(text, cursor, lang)  # type: ignore[arg-type]
    assert (span.kind, span.multiline, span.start, span.end) == ("lines", False, cursor, cursor)
    verdict = validate_fill(Document(text, lang), cursor, fill)  # type: ignore[arg-type]
    assert (verdict.status, verdict.fill) == (status, kept)


@pytest.mark.parametrize(
    ("prefix", "suffix", "lang", "fill", "kept"),
    [
        # most grammars read on across a line break that cannot end a statement: `x =`
        # before `y = 1` parses as `x = y = 1`, which must not pass for a whole line
        ("A = 1\n", "B = 2\n", PY, "C =", "C\n"),
        ("let a = 1;\n", "b = 2;\n", JS, "c =", "c\n"),
        ("int f(void) {\n  int x;\n", "  x = 2;\n  return x;\n}\n", language_for("c"), "  int", ""),  # not `int x = 2;`
        ("int f(void) {\n  int x;\n", "  x = 2;\n  return x;\n}\n", language_for("c"), "  x = 1;", "  x = 1;\n"),
        # ... unless that removes errors: the next line closes the bracket the fill opens
        ("x = 1\n", "    2, 3)\n", PY, "y = f(1,", "y = f(1,\n"),
    ],
)
def test_a_whole_line_does_not_run_on_into_the_next(
    prefix: str, suffix: str, lang: object, fill: str, kept: str
) -> None:
    verdict = validate_fill(Document(prefix + suffix, lang), len(prefix), fill)  # type: ignore[arg-type]
    assert verdict.fill == kept


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_a_whole_line_gets_the_documents_line_break(eol: str) -> None:
    prefix = eol.join(["def f(x):", "    y = x", ""])
    text = prefix + eol.join(["    return y", ""])
    assert whole_lines_break(text, len(prefix)) == eol
    assert whole_lines_break(text, 0) == eol  # at the start of the text: the first line's
    assert whole_lines_break(text, len(prefix) + 1) == ""  # not at column 0
    assert whole_lines_break(text, len(text)) == ""  # no code after the cursor
    if eol != "\r":  # the grammars do not take a lone \r for a line break
        assert validate_fill(Document(text, PY), len(prefix), "    z = y").fill == "    z = y" + eol


def test_replacing_whole_lines_keeps_the_line_break() -> None:
    text = "def f(x):\n    y = x\n    return y\n"
    start, end = text.index("    y"), text.index("    return")  # the whole line `y = x`, break included
    verdict = validate_fill(Document(text, PY), end, "    y = x * 2", start=start)
    assert (verdict.status, verdict.fill) == ("ok", "    y = x * 2\n")


@pytest.mark.parametrize(
    ("raw", "kept"),
    [
        ("    z = y * 2\n", ["    z = y * 2\n"]),
        ("    z = y * 2", ["    z = y * 2\n"]),
        ("    z = y * 2\n    w = 1\n", ["    z = y * 2\n"]),  # one line: the rest is cut
        ("    z = y *", ["    z = y\n"]),  # cut, and never run into `return y`
        ("  z = 1\n", ["    z = 1\n"]),  # CPython refuses the indentation: moved to the next line's
        ("", [""]),
    ],
)
def test_check_candidates_keeps_whole_lines_at_column_0(raw: str, kept: list[str]) -> None:
    """The infill path (engine.syntax) with fixed candidates: the one-line cut keeps a
    whole line, with its line break, before the next line (once every candidate there
    was dropped for running into it)."""
    cursor = PY_LINE.index("‸")
    prefix, suffix = PY_LINE[:cursor], PY_LINE[cursor + 1 :]
    out = check_candidates(None, [Candidate(text=raw, token_ids=[], confidence=[])], prefix, suffix, "python")
    assert [c.text for c in out] == kept
