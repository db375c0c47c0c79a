"""Infill tasks: each kind cuts what it says, and the three parts always give the file back."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from engine.spans import parser_for
from engine.training.tasks import (
    MIX,
    NODE_KINDS,
    PY_EXPRESSIONS,
    _file_spans,
    cut,
    cut_example,
    draw_kind,
    node_spans,
)

SOURCE = '''"""A module — with a non-ASCII docstring (café)."""

import os


def greet(name: str, excited: bool = False) -> str:
    """Say hello, à la française."""
    word = "héllo" if not excited else "HÉLLO"
    if excited:
        word = word.upper() + "!"
        print(word, name, sep=", ")
    for ch in name:
        os.environ.get(ch, "ü")
    return f"{word}, {name}"


class Box:
    def __init__(self, items):
        self.items = [i * 2 for i in items if i > 0]

    def total(self):
        with open(os.devnull) as fh:
            fh.read()
            return sum(self.items)
'''


def _tree(text: str) -> Any:
    parser = parser_for("python")
    assert parser is not None
    return parser.parse(text.encode("utf-8"))


def _nodes_at(text: str, prefix: str, middle: str) -> list[Any]:
    """Every node whose byte range is exactly the middle's."""
    lo = len(prefix.encode("utf-8"))
    hi = lo + len(middle.encode("utf-8"))
    out, stack = [], [_tree(text).root_node]
    while stack:
        node = stack.pop()
        if node.start_byte <= lo and node.end_byte >= hi:
            if (node.start_byte, node.end_byte) == (lo, hi):
                out.append(node)
            stack.extend(node.children)
    return out


@pytest.mark.parametrize("kind", ["lines", "line", "rest_of_line", "random_span", *NODE_KINDS])
def test_parts_give_the_file_back(kind: Any) -> None:
    rng = random.Random(1)
    for _ in range(200):
        got = cut(SOURCE, kind, rng, 80)
        assert got is not None
        prefix, middle, suffix = got
        assert prefix + middle + suffix == SOURCE
        assert len(middle) <= 80


def test_expression_is_an_expression_node() -> None:
    rng = random.Random(2)
    seen = set()
    for _ in range(100):
        prefix, middle, suffix = cut(SOURCE, "expression", rng) or ("", "", "")
        types = {n.type for n in _nodes_at(SOURCE, prefix, middle)}
        assert types & set(PY_EXPRESSIONS), (middle, types)
        seen |= types & set(PY_EXPRESSIONS)
    assert {"call", "string", "binary_operator"} <= seen  # several expression kinds occur


def test_statement_is_a_statement_node() -> None:
    rng = random.Random(3)
    compound = False
    for _ in range(100):
        prefix, middle, suffix = cut(SOURCE, "statement", rng) or ("", "", "")
        nodes = _nodes_at(SOURCE, prefix, middle)
        parents = {n.parent.type for n in nodes if n.parent is not None}
        assert parents & {"module", "block"} and not middle.startswith('"""'), (middle, parents)
        compound |= bool({n.type for n in nodes} & {"if_statement", "for_statement", "with_statement"})
    assert compound


def test_argument_list_is_inside_the_parentheses() -> None:
    rng = random.Random(4)
    for _ in range(100):
        prefix, middle, suffix = cut(SOURCE, "argument_list", rng) or ("", "", "")
        assert prefix.endswith("(") and suffix.startswith(")") and middle.strip()
        # the node spans the parentheses around the middle
        nodes = _nodes_at(SOURCE, prefix[:-1], "(" + middle + ")")
        assert "argument_list" in {n.type for n in nodes}, middle


def test_block_body_is_whole_lines_of_a_block() -> None:
    rng = random.Random(5)
    bodies = set()
    for _ in range(100):
        prefix, middle, suffix = cut(SOURCE, "block_body", rng, 400) or ("", "", "")
        assert prefix.endswith("\n") and middle.endswith("\n")  # whole lines
        assert prefix.rstrip().endswith(":")  # after a colon line
        # the middle, less its indentation and last line break, is exactly a block node
        lead = len(middle) - len(middle.lstrip())
        nodes = _nodes_at(SOURCE, prefix + middle[:lead], middle[lead:].rstrip("\n"))
        assert "block" in {n.type for n in nodes}, middle
        bodies.add(middle)
    assert any(b.count("\n") > 1 for b in bodies)  # multi-line bodies occur
    assert any("fh.read()" in b and "return sum" in b for b in bodies)


def test_node_kind_without_a_node_is_none() -> None:
    rng = random.Random(0)
    assert cut("x = 1\n", "argument_list", rng) is None
    assert cut("x = 1\n", "block_body", rng) is None
    assert cut("def f(:\n    pass\n", "statement", rng) is None  # does not parse
    assert cut(SOURCE, "block_body", rng, max_middle_chars=5) is None  # none fits
    assert cut("\n\n", "line", rng) is None


def test_line_is_one_line_after_its_indentation() -> None:
    rng = random.Random(6)
    for _ in range(50):
        prefix, middle, suffix = cut(SOURCE, "line", rng) or ("", "", "")
        assert middle.strip() == middle and "\n" not in middle and middle
        assert prefix.split("\n")[-1].strip() == "" and suffix[:1] in ("\n", "")


def test_node_spans_are_character_offsets() -> None:
    spans = node_spans(SOURCE, "expression")
    texts = {SOURCE[s:e] for s, e in spans}
    assert '"héllo"' in texts and '"ü"' in texts  # after non-ASCII text, offsets still match
    assert node_spans("def f(:\n", "expression") == []


def test_cut_example_mix_and_fallback() -> None:
    rng = random.Random(7)
    counts = Counter(draw_kind(rng) for _ in range(20_000))
    for kind, share in MIX:
        assert abs(counts[kind] / 20_000 - share) < 0.015, kind
    assert sum(share for _, share in MIX) == pytest.approx(1.0)
    broken = "def f(:\n    return 1\nx = [1, 2\n"
    for _ in range(200):
        for text in (SOURCE, broken, "x = 1\n"):
            prefix, middle, suffix = cut_example(text, rng, 60)
            assert prefix + middle + suffix == text and len(middle) <= 60


def test_one_parse_per_file() -> None:
    _file_spans.cache_clear()
    rng = random.Random(8)
    for _ in range(50):
        cut(SOURCE, "statement", rng)
        cut(SOURCE, "expression", rng)
    info = _file_spans.cache_info()
    assert info.misses == 1 and info.hits == 99
