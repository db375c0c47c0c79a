"""Edit regions: a selection grown to whole syntax nodes, the node to rewrite for a
next-edit suggestion, and every hole in a file for joint filling."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.spans.document import Document
from engine.spans.lines import next_line_start
from engine.spans.select import MULTI_LINE_BUDGET, Span, _hole, _line_at, in_string

# Node types that hold a body of statements (an empty one is a hole).
BODY_TYPES = frozenset(
    {
        "block",
        "statement_block",
        "compound_statement",
        "declaration_list",
        "field_declaration_list",
        "class_body",
        "body_statement",
    }
)
# Node types of the functions whose locals a name may be (Python, JavaScript/TypeScript, Go,
# Rust, Java, C/C++, Ruby, Lua).
SCOPE_TYPES = frozenset(
    {
        "function_definition",
        "function_declaration",
        "function_expression",
        "arrow_function",
        "method_definition",
        "method_declaration",
        "func_literal",
        "function_item",
        "constructor_declaration",
        "method",
        "function_definition_statement",
        "local_function",
    }
)
# A function's parameter list, and a call and its function and arguments (fields
# `function`, `arguments`), in the grammars above.
PARAMETER_TYPES = frozenset({"parameters", "formal_parameters", "parameter_list"})
CALL_TYPES = frozenset({"call", "call_expression"})
# Suffixes of node types that make sense to rewrite as a whole.
STATEMENT_SUFFIXES = ("statement", "definition", "declaration", "item", "method", "function", "assignment")


class _Offsets:
    """Byte <-> string offsets of one text (tree-sitter speaks bytes)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.ascii = text.isascii()

    def to_byte(self, offset: int) -> int:
        return offset if self.ascii else len(self.text[:offset].encode("utf-8"))

    def to_char(self, data: bytes, offset: int) -> int:
        return offset if self.ascii else len(data[:offset].decode("utf-8", errors="replace"))


def expand_selection(doc: Document, start: int, end: int) -> tuple[int, int]:
    """The smallest run of complete sibling nodes that covers text[start:end]; lines
    without a grammar."""
    start, end = sorted((max(0, min(start, len(doc.text))), max(0, min(end, len(doc.text)))))
    if doc.tree is None or start == end:  # no grammar, or no selection: whole lines
        first = _line_at(doc.text, start).start
        last = _line_at(doc.text, max(start, end - 1) if end > start else end).end
        return first, last
    off = _Offsets(doc.text)
    bs, be = off.to_byte(start), off.to_byte(end)
    node = doc.tree.root_node.descendant_for_byte_range(bs, be) or doc.tree.root_node
    while node.parent is not None and (not node.is_named or node.type == "ERROR"):
        node = node.parent
    lo, hi = node.start_byte, node.end_byte
    if (node.type in BODY_TYPES or node.parent is None) and not (lo >= bs and hi <= be):
        # inside a body: the statements the selection touches, not the whole body
        touched = [c for c in node.children if c.is_named and c.end_byte > bs and c.start_byte < be]
        if touched:
            lo, hi = touched[0].start_byte, touched[-1].end_byte
    lo, hi = min(lo, bs), max(hi, be)
    return off.to_char(doc.data, lo), off.to_char(doc.data, hi)


def enclosing_node(doc: Document, offset: int) -> tuple[int, int]:
    """The statement-level node around `offset` (for next-edit suggestions); the line
    without a grammar."""
    if doc.tree is None:
        line = _line_at(doc.text, offset)
        return line.start, line.end
    off = _Offsets(doc.text)
    b = off.to_byte(max(0, min(offset, len(doc.text))))
    node: Any = doc.tree.root_node.descendant_for_byte_range(b, b) or doc.tree.root_node
    while node.parent is not None and not (node.is_named and node.type.endswith(STATEMENT_SUFFIXES)):
        if node.parent.parent is None:  # a direct child of the root: as far as we go
            break
        node = node.parent
    return off.to_char(doc.data, node.start_byte), off.to_char(doc.data, node.end_byte)


def enclosing_scope(doc: Document, offset: int) -> tuple[int, int]:
    """The function (or method) around `offset`, where a local name lives (next edits look
    for a renamed name's uses there); the whole text at the top level or without a grammar."""
    if doc.tree is None:
        return 0, len(doc.text)
    off = _Offsets(doc.text)
    b = off.to_byte(max(0, min(offset, len(doc.text))))
    node: Any = doc.tree.root_node.descendant_for_byte_range(b, b)
    while node is not None and node.type not in SCOPE_TYPES:
        node = node.parent
    if node is None:
        return 0, len(doc.text)
    return off.to_char(doc.data, node.start_byte), off.to_char(doc.data, node.end_byte)


@dataclass(frozen=True)
class SignatureChange:
    """A function's parameter list changed: a parameter `removed` or `added` at that index
    (counted as its calls count their arguments: a method's `self` left out), and the
    argument nodes of its calls in the text as (start, end) offsets, per call with the
    offsets just inside its brackets."""

    name: str
    params: int  # its parameters now (a method's `self` left out)
    removed: int | None
    added: int | None
    calls: tuple[tuple[tuple[int, int], tuple[tuple[int, int], ...]], ...]  # ((inside start, end), arguments)


def signature_change(doc: Document, start: int, old: str, new: str) -> SignatureChange | None:
    """What an edit at `start` (`old` became `new`, in offsets of `doc`'s text, the text
    after it) did to a function's parameter list: one parameter removed (the edit deleted
    a name with its comma) or added (it wrote one); None when it is in no parameter list
    or did something else. The calls are those of the function by its name (`name(...)`
    or a method `x.name(...)`)."""
    if doc.tree is None:
        return None
    off = _Offsets(doc.text)
    b = off.to_byte(max(0, min(start, len(doc.text))))
    node: Any = doc.tree.root_node.descendant_for_byte_range(b, b)
    while node is not None and node.type not in PARAMETER_TYPES:
        node = node.parent
    name = node.parent.child_by_field_name("name") if node is not None and node.parent is not None else None
    if name is None:
        return None
    params = [p for p in node.named_children if p.type not in ("comment",)]
    method = bool(params) and params[0].text in (b"self", b"cls")
    before = sum(1 for p in params if p.end_byte <= b) - int(method)
    removed = added = None
    if not new.strip(" ,\t\n") and old.strip(" ,\t\n"):
        removed = max(0, before)
    elif not old.strip(" ,\t\n") and new.strip(" ,\t\n"):
        added = max(0, before)
    else:
        return None
    calls = []
    stack = [doc.tree.root_node]
    while stack:
        n = stack.pop()
        stack.extend(n.children)
        if n.type not in CALL_TYPES:
            continue
        fn, args = n.child_by_field_name("function"), n.child_by_field_name("arguments")
        callee = fn.named_children[-1] if fn is not None and fn.named_children else fn
        if callee is None or args is None or callee.text != name.text or args.end_byte - args.start_byte < 2:
            continue
        inside = (off.to_char(doc.data, args.start_byte + 1), off.to_char(doc.data, args.end_byte - 1))
        spans = tuple(
            (off.to_char(doc.data, a.start_byte), off.to_char(doc.data, a.end_byte))
            for a in args.named_children
            if a.type != "comment"
        )
        calls.append((inside, spans))
    count = len(params) - int(method)
    return SignatureChange(name.text.decode("utf-8", "replace"), count, removed, added, tuple(sorted(calls)))


def find_holes(doc: Document) -> list[Span]:
    """Every hole marker line (not inside a string) and every empty `{}` body, in
    document order. (Indentation languages cannot have an empty body: their markers
    are `pass` and `...`; Ruby and Lua bodies without braces are not found yet.)"""
    holes: list[Span] = []
    pos = 0
    text = doc.text
    while pos <= len(text):
        line = _line_at(text, pos)
        hole = _hole(text, line, doc.lang)
        if hole is not None and not (doc.tree is not None and in_string(text, hole.start, doc.lang, doc.tree)):
            holes.append(hole)
        nxt = next_line_start(text, pos)
        if nxt == line.end:  # no line break: the last line
            break
        pos = nxt
    if doc.tree is not None and doc.lang.block_open:  # braces: `{}` is an empty body
        off = _Offsets(text)
        stack = [doc.tree.root_node]
        while stack:
            node = stack.pop()
            # an empty body; one holding only a comment is left to the comment's marker
            if node.type in BODY_TYPES and not any(c.is_named for c in node.children):
                inner = (
                    node.children[0].end_byte if node.child_count and node.children[0].type == "{" else node.start_byte
                )
                at = off.to_char(doc.data, inner)
                holes.append(Span(at, at, "hole", True, MULTI_LINE_BUDGET))
            stack.extend(node.children)
    return sorted(set(holes), key=lambda s: (s.start, s.end))


# fill(prefix, suffix, refine, replaced) -> the fill ("" for none): refine is the text to
# keep the likely tokens of (None: fill from scratch), replaced the text the fill takes
# the place of
RegionFill = Callable[[str, str, str | None, str], str]


def fill_holes_jointly(text: str, holes: list[Span], fill: RegionFill) -> list[str | None]:
    """Fills for `holes` (in document order) that agree with each other; None for a
    hole left as it is (a blank fill would delete it).

    A first pass fills each hole, last to first, in the text where the later holes are
    already filled; a second pass refines each fill (its unlikely tokens re-filled) in the
    text where every other hole holds its fill, so the earlier fills also see the later
    ones. (One span per fill: a canvas ends with end-of-fill, so it cannot hold several.)"""
    fills = [text[h.start : h.end] for h in holes]  # the markers, until filled
    bounds = [0] + [x for h in holes for x in (h.start, h.end)] + [len(text)]
    gaps = [text[bounds[2 * i] : bounds[2 * i + 1]] for i in range(len(holes) + 1)]  # text between holes

    def around(k: int) -> tuple[str, str]:
        """The text before and after hole k, every other hole holding its fill."""
        before = "".join(gaps[i] + fills[i] for i in range(k)) + gaps[k]
        after = gaps[k + 1] + "".join(fills[i] + gaps[i + 1] for i in range(k + 1, len(holes)))
        return before, after

    filled = [False] * len(holes)
    for k in reversed(range(len(holes))):
        prefix, suffix = around(k)
        got = fill(prefix, suffix, None, fills[k])
        if got.strip():
            fills[k], filled[k] = got, True
    if sum(filled) > 1:
        for k in range(len(holes)):
            if filled[k]:
                prefix, suffix = around(k)
                better = fill(prefix, suffix, fills[k], fills[k])
                fills[k] = better if better.strip() else fills[k]
    return [f if ok else None for f, ok in zip(fills, filled, strict=True)]
