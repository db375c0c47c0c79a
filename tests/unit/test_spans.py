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
