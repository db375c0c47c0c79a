"""Infill tasks cut from source files: the shape of an editor request, for training and eval.

A task splits a file into (prefix, middle, suffix); the model sees prefix and suffix and
must write the middle. The kinds mirror what an editor asks for (docs/spans.md):

  lines          1-3 whole lines, line breaks included (training)
  line           one whole non-blank line after its indentation, line break excluded:
                 the cursor on an indented empty line (eval's single-line task)
  rest_of_line   the rest of a line from a random column (may be empty: the model must
                 also learn to stop at once)
  random_span    a random character span
  expression     a tree-sitter expression node (calls, operators, literals, ...; bare
                 names and numbers are left out: they teach little)
  argument_list  the text between the parentheses of a non-empty argument list
  statement      a statement (simple or compound: a child of a module or block; not
                 a docstring or comment), without its indentation
  block_body     the whole indented block after a `:` line, as whole lines (indentation
                 and the last line break included)

Node kinds come from one tree-sitter parse per file; the node spans of the most recent
files are kept in a small LRU keyed by the text, since training draws the same files
again and again and calls `cut_example` millions of times. A file that does not parse
cleanly, or has no node of a kind within `max_middle_chars`, yields None from `cut`
(callers draw another file); `cut_example` then falls back to whole lines.
"""

from __future__ import annotations

import bisect
import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from engine.spans import parser_for

NodeKind = Literal["expression", "argument_list", "statement", "block_body"]
TaskKind = Literal[
    "lines", "line", "rest_of_line", "random_span", "expression", "argument_list", "statement", "block_body"
]
NODE_KINDS: tuple[NodeKind, ...] = ("expression", "argument_list", "statement", "block_body")

# Training mix, shaped like editor requests (docs/training.md says why these shares):
# the commonest request is a cursor on an indented blank line (`line`: the whole line
# after its indentation, the eval's single-line task), then typing inside a line
# (`rest_of_line`), then syntax nodes; whole lines with their indentation and line breaks
# (`lines`) and random spans keep the model honest about text that is not a node.
MIX: tuple[tuple[TaskKind, float], ...] = (
    ("line", 0.25),
    ("rest_of_line", 0.20),
    ("expression", 0.10),
    ("argument_list", 0.08),
    ("statement", 0.10),
    ("block_body", 0.10),
    ("lines", 0.10),
    ("random_span", 0.07),
)
# Kinds whose middles may run to several lines: trained with the longer canvas (the
# editor gives bodies 128 tokens and random spans 64, so the model must see such canvases).
LONG_KINDS: frozenset[TaskKind] = frozenset({"statement", "block_body", "lines", "random_span"})

# Python node types per kind (tree-sitter-python's names).
PY_EXPRESSIONS = (
    "call",
    "attribute",
    "subscript",
    "binary_operator",
    "boolean_operator",
    "comparison_operator",
    "not_operator",
    "unary_operator",
    "conditional_expression",
    "lambda",
    "await",
    "list",
    "dictionary",
    "set",
    "tuple",
    "list_comprehension",
    "dictionary_comprehension",
    "set_comprehension",
    "generator_expression",
    "parenthesized_expression",
    "string",
    "concatenated_string",
)
PROSE_PARENTS = ("module", "block", "expression_statement", "concatenated_string")
NODE_QUERIES: dict[str, str] = {
    "python": " ".join(
        (
            "[" + " ".join(f"({t})" for t in PY_EXPRESSIONS) + "] @expression",
            "(argument_list) @argument_list",
            "(module (_) @statement) (block (_) @statement)",  # a statement is a child of either
            "(block) @block_body",
        )
    )
}
SPAN_CACHE_FILES = 256  # files whose node spans are kept (LRU)


@dataclass(frozen=True)
class _KindSpans:
    """Byte spans of one kind, sorted by length, so the spans that fit a limit are a prefix."""

    lengths: list[int]
    spans: list[tuple[int, int]]

    def pick(self, rng: random.Random, max_bytes: int) -> tuple[int, int] | None:
        n = bisect.bisect_right(self.lengths, max_bytes)
        return self.spans[rng.randrange(n)] if n else None


@dataclass(frozen=True)
class _FileSpans:
    data: bytes | None  # the UTF-8 text when it is not ASCII (byte -> char offsets); else None
    kinds: dict[str, _KindSpans]

    def char(self, b: int) -> int:
        return b if self.data is None else len(self.data[:b].decode("utf-8"))


@functools.cache
def _query(language: str) -> Any | None:
    from tree_sitter import Query

    parser = parser_for(language)
    source = NODE_QUERIES.get(language)
    if parser is None or source is None:
        return None
    return Query(parser.language, source)


def _whole_lines(data: bytes, start: int, end: int) -> tuple[int, int] | None:
    """[start, end) grown to whole lines (last line break included); None when text
    before `start` on its line is not indentation (a body on the `:` line)."""
    line = data.rfind(b"\n", 0, start) + 1
    if data[line:start].strip():
        return None
    nl = data.find(b"\n", end)
    return line, len(data) if nl == -1 else nl + 1


@functools.lru_cache(maxsize=SPAN_CACHE_FILES)
def _file_spans(text: str, language: str) -> _FileSpans | None:
    """Node spans of every kind in `text`, or None when it has no grammar or does not parse."""
    query = _query(language)
    if query is None:
        return None
    from tree_sitter import QueryCursor

    data = text.encode("utf-8")
    tree = parser_for(language).parse(data)  # type: ignore[union-attr]
    if tree.root_node.has_error:
        return None
    captures = QueryCursor(query).captures(tree.root_node)
    kinds: dict[str, _KindSpans] = {}
    for kind in NODE_KINDS:
        spans: list[tuple[int, int]] = []
        for node in captures.get(kind, ()):
            span: tuple[int, int] | None = (node.start_byte, node.end_byte)
            if node.type in ("comment", "string") and kind in ("expression", "statement"):
                parent = node.parent.type if node.parent is not None else ""
                if node.type == "comment" or parent in PROSE_PARENTS:  # docstrings, comments: prose
                    continue
            elif kind == "argument_list":
                span = (node.start_byte + 1, node.end_byte - 1)  # inside the parentheses
                if not data[span[0] : span[1]].strip() or data[span[1] : node.end_byte] != b")":
                    continue
            elif kind == "block_body":
                span = _whole_lines(data, node.start_byte, node.end_byte)
            if span is not None and span[1] > span[0]:
                spans.append(span)
        spans = sorted(set(spans), key=lambda s: (s[1] - s[0], s[0]))
        kinds[kind] = _KindSpans([e - s for s, e in spans], spans)
    return _FileSpans(None if len(data) == len(text) else data, kinds)


def node_spans(text: str, kind: NodeKind, language: str = "python") -> list[tuple[int, int]]:
    """Character spans of every `kind` node in `text` (empty when it does not parse)."""
    spans = _file_spans(text, language)
    if spans is None:
        return []
    return [(spans.char(s), spans.char(e)) for s, e in spans.kinds[kind].spans]


def _line_start(lines: list[str], i: int) -> int:
    return sum(len(x) for x in lines[:i])


def cut(
    text: str, kind: TaskKind, rng: random.Random, max_middle_chars: int = 160, language: str = "python"
) -> tuple[str, str, str] | None:
    """Split a file into (prefix, middle, suffix), or None when a node kind (or `line`)
    finds nothing to cut within `max_middle_chars`."""
    if kind in NODE_KINDS:
        spans = _file_spans(text, language)
        if spans is None:
            return None
        # byte length >= char length: a span that fits in bytes fits in characters
        picked = spans.kinds[kind].pick(rng, max_middle_chars)
        if picked is None:
            return None
        start, end = spans.char(picked[0]), spans.char(picked[1])
        return text[:start], text[start:end], text[end:]
    lines = text.splitlines(keepends=True)
    if kind == "line":  # one whole non-blank line, after its indentation
        candidates = [i for i, x in enumerate(lines) if x.strip() and len(x.strip()) <= max_middle_chars]
        if not candidates:
            return None
        i = rng.choice(candidates)
        body = lines[i].rstrip("\r\n")
        start = _line_start(lines, i) + len(body) - len(body.lstrip())
        end = start + len(body.strip())
    elif kind == "lines" and len(lines) > 2:  # 1-3 whole lines
        i = rng.randrange(len(lines))
        j = min(len(lines), i + rng.randint(1, 3))
        start = _line_start(lines, i)
        end = start + sum(len(x) for x in lines[i:j])
    elif kind == "rest_of_line" and lines:  # rest of a line from a cursor inside it
        i = rng.randrange(len(lines))
        start_line = _line_start(lines, i)
        line = lines[i].rstrip("\r\n")
        col = rng.randint(0, len(line))
        start, end = start_line + col, start_line + len(line)
    else:  # a random character span
        start = rng.randrange(len(text) + 1)
        end = min(len(text), start + rng.randint(1, max_middle_chars))
    end = min(end, start + max_middle_chars)
    return text[:start], text[start:end], text[end:]


def draw_kind(rng: random.Random, mix: Sequence[tuple[TaskKind, float]] | None = None) -> TaskKind:
    """A task kind drawn from `mix` (default MIX; shares need not sum to 1)."""
    mix = MIX if mix is None else mix
    r = rng.random() * sum(w for _, w in mix)
    for kind, share in mix:
        r -= share
        if r < 0:
            return kind
    return mix[-1][0]


def cut_example(
    text: str,
    rng: random.Random,
    max_middle_chars: int = 160,
    language: str = "python",
    mix: Sequence[tuple[TaskKind, float]] | None = None,
) -> tuple[str, str, str]:
    """A training example of a kind drawn from `mix` (default MIX); whole lines when a
    node kind (or `line`) finds nothing (the file does not parse, or has none that fits)."""
    kind = draw_kind(rng, mix)
    got = cut(text, kind, rng, max_middle_chars, language)
    if got is None:
        got = cut(text, "lines", rng, max_middle_chars, language)
    assert got is not None  # line kinds other than `line` always cut
    return got
