"""Spans beyond selection: validation and truncation, incremental parsing, holes, regions,
language mapping."""

from __future__ import annotations

import pytest

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
    assert verdict.errors_after >= 0 and verdict.errors_before >= 0


def test_validating_a_hole_replacement() -> None:
    text = "def f(x):\n    pass\n"
    d = Document(text, PY)
    hole = select_span(text, text.index("pass"), PY)
    assert validate_fill(d, hole.end, "return x * 2", start=hole.start).status == "ok"
    assert validate_fill(d, hole.end, "return (x", start=hole.start).fill == "return"


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
        assert str(d.tree.root_node) == str(fresh.tree.root_node)  # type: ignore[union-attr]
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
