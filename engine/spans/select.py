"""Span selection: what a fill at the cursor should complete (rules in docs/spans.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from engine.spans.languages import Language, parser_for
from engine.spans.lines import line_end, line_start

SpanKind = Literal["hole", "string", "comment", "argument_list", "expression", "block", "statement", "lines", "line"]

SINGLE_LINE_BUDGET = 32  # canvas tokens for a one-line fill
# ... for a whole line with its indentation and line break, inserted before an existing
# line (whole-line middles of the standard library: p95 25 tokens, p99 36, max 55)
WHOLE_LINE_BUDGET = 40
PROSE_BUDGET = 64  # ... for prose in a multi-line string or comment
MULTI_LINE_BUDGET = 128  # ... for a block body or a hole
BRACKET_LOOKBACK = 4000  # characters scanned back for an open bracket

GENERIC_COMMENTS = ("#", "//", "--", ";")
EXPRESSION_KEYWORDS = (
    "return",
    "yield",
    "await",
    "not",
    "and",
    "or",
    "in",
    "is",
    "if",
    "elif",
    "while",
    "assert",
    "case",
    "when",
    "throw",
    "new",
    "typeof",
    "lambda",
)
OPERATOR_END = re.compile(r"(?:[=+\-*/%<>!&|^~?:,.]|\bin|=>|->)\s*$")
CALLEE_END = re.compile(r"[\w)\]>]\s*$")
# a `(` after these is not a call's
NOT_CALLEES = frozenset(
    {
        "if",
        "elif",
        "while",
        "for",
        "switch",
        "catch",
        "with",
        "return",
        "and",
        "or",
        "not",
        "in",
        "match",
        "sizeof",
        "typeof",
        "until",
        "unless",
    }
)
# words that may come right before a called name (`return foo(`, `new Foo(`)
CALL_LEADS = frozenset(
    {
        "return",
        "new",
        "await",
        "yield",
        "else",
        "in",
        "of",
        "not",
        "and",
        "or",
        "throw",
        "case",
        "typeof",
        "is",
        "do",
        "then",
        "go",
        "defer",
        "delete",
        "puts",
    }
)
TOP_LEVEL_LINE = re.compile(r"(?:\r\n?|\n)(?=[^\s)\]}])")  # a line break before a line at column 0


@dataclass(frozen=True)
class Span:
    start: int  # the fill replaces text[start:end]
    end: int
    kind: SpanKind
    multiline: bool
    budget: int  # canvas tokens


@dataclass(frozen=True)
class _Line:
    start: int
    end: int  # before the line break
    before: str  # the line's text before the cursor
    after: str  # ... after the cursor, line break excluded


def _line_at(text: str, cursor: int) -> _Line:
    """The line holding `cursor`; lines end at \\n, \\r\\n or \\r (searches stay within it)."""
    start, end = line_start(text, cursor), line_end(text, cursor)
    return _Line(start, end, text[start:cursor], text[cursor:end])


def _hole(text: str, line: _Line, lang: Language) -> Span | None:
    body = text[line.start : line.end]
    stripped = body.strip()
    if not stripped:
        return None
    prefixes = (lang.line_comment,) if lang.line_comment else GENERIC_COMMENTS
    is_todo = any(
        stripped.startswith(p) and stripped[len(p) :].lstrip().startswith(("TODO", "FIXME")) for p in prefixes
    )
    if not (is_todo or stripped in lang.hole_lines):
        return None
    start = line.start + len(body) - len(body.lstrip())
    return Span(start, start + len(stripped), "hole", True, MULTI_LINE_BUDGET)


def in_string(text: str, offset: int, lang: Language, tree: Any) -> bool:
    """Whether `offset` lies inside a string literal (a `pass` in a docstring is prose)."""
    b = len(text[:offset].encode("utf-8"))
    node = tree.root_node.descendant_for_byte_range(b, b)
    while node is not None:
        if node.type in lang.string_types and node.start_byte < b < node.end_byte:
            return True
        node = node.parent
    return False


def _string_or_comment(text: str, cursor: int, lang: Language, tree: Any) -> Span | None:
    cb = len(text[:cursor].encode("utf-8"))
    # the node just before the cursor: at the end of a line comment, the cursor is past it
    node = tree.root_node.descendant_for_byte_range(max(0, cb - 1), cb)
    while node is not None:
        if node.type in lang.comment_types and node.start_byte < cb <= node.end_byte:
            body = node.text.decode("utf-8", errors="replace").rstrip("\r\n")
            multi = "\n" in body or "\r" in body
            line_comment = (
                bool(lang.line_comment) and body.startswith(lang.line_comment) and not body.startswith("--[[")
            )
            # a line comment runs to the end of its line: its end counts as inside
            if cb < node.start_byte + len(body.encode("utf-8")) or line_comment:
                return Span(cursor, cursor, "comment", multi, PROSE_BUDGET if multi else SINGLE_LINE_BUDGET)
        if node.type in lang.string_types and node.start_byte < cb < node.end_byte:
            multi = node.start_point[0] != node.end_point[0]
            return Span(cursor, cursor, "string", multi, PROSE_BUDGET if multi else SINGLE_LINE_BUDGET)
        node = node.parent
    return None


def _open_bracket(text: str, cursor: int, comment: str = "") -> tuple[str, str] | None:
    """The innermost unclosed bracket before the cursor and the code before it, skipping
    brackets inside string literals on the way (a cheap scan, robust to broken code)."""
    start = max(0, cursor - BRACKET_LOOKBACK)
    # a line that starts at column 0 starts a new top-level statement: brackets left open
    # before it belong to broken code, not to the cursor
    for top in TOP_LEVEL_LINE.finditer(text, start, max(start, _line_at(text, cursor).start)):
        start = top.end()  # the last one wins
    stack: list[int] = []
    quote = ""
    i = start
    while i < cursor:
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote or (ch in "\r\n" and quote != "`"):
                quote = ""
        elif comment and text.startswith(comment, i):  # skip a line comment
            i = min(line_end(text, i), cursor)
            continue
        elif ch in "\"'`":
            quote = ch
        elif ch in "([{":
            stack.append(i)
        elif ch in ")]}" and stack:
            stack.pop()
        i += 1
    if not stack:
        return None
    pos = stack[-1]
    return text[pos], text[max(start, pos - 200) : pos]


def _bracket_kind(bracket: tuple[str, str]) -> SpanKind:
    """A call's `(` holds arguments; a condition's, a declaration's parameters or a
    grouping's `(` holds an expression."""
    char, before = bracket
    if char != "(" or not CALLEE_END.search(before):
        return "expression"
    if re.search(r"(=>|\s>)\s*$", before):  # `x => (`, `a > (`: not calls
        return "expression"
    words = re.findall(r"[^\W\d]\w*|\S", before)
    name = words[-1] if words else ""
    if name in NOT_CALLEES:
        return "expression"
    if not re.fullmatch(r"[^\W\d]\w*", name):  # `f(x)(`, `a[0](`, `foo<T>(`: calls
        return "argument_list"
    lead = words[-2] if len(words) > 1 else ""
    if re.fullmatch(r"[^\W\d]\w*", lead) and lead not in CALL_LEADS:  # `int add(`, `def f(`
        return "expression"
    return "argument_list"


def _is_literal_brace(code_before_brace: str) -> bool:
    """A `{` after `=`, `(`, `,`, `:`, `[` or `return` opens an object literal (after `=>`, a body)."""
    code = code_before_brace.rstrip()
    return (code.endswith(("=", "(", ",", ":", "[")) and not code.endswith("=>")) or bool(re.search(r"\breturn$", code))


def _opens_block(before: str, lang: Language) -> bool:
    code = before.rstrip()
    if not code:
        return False
    if lang.block_open and code.endswith(lang.block_open):
        return not _is_literal_brace(code[: -len(lang.block_open)])
    words = code.split()
    first = words[0] if words else ""
    if lang.name == "python":
        return code.endswith(":") and first.rstrip(":") in lang.block_keywords
    if lang.name == "ruby":
        return first in lang.block_keywords or code.endswith(" do") or bool(re.search(r"\bdo\s*\|[^|]*\|$", code))
    if lang.name == "lua":
        opens = code.endswith((" then", " do")) or code == "else" or first in ("repeat", "function")
        return opens or code.startswith("local function") or bool(re.search(r"\bfunction\s*\([^)]*\)$", code))
    return not lang.grammar and code.endswith((":", "{"))


def _after_operator(before: str) -> bool:
    code = before.rstrip()
    if not code:
        return False
    if OPERATOR_END.search(code):
        return True
    last = re.split(r"\W+", code)[-1] if re.search(r"\w$", code) else ""
    return last in EXPRESSION_KEYWORDS


def select_span(text: str, cursor: int, lang: Language, tree: Any | None = None) -> Span:
    """The span a fill at `cursor` should complete. `tree`: the document's tree-sitter
    tree if the caller keeps one (incremental parsing); parsed here otherwise."""
    cursor = max(0, min(cursor, len(text)))
    line = _line_at(text, cursor)
    if lang.grammar and tree is None:
        parser = parser_for(lang.name)
        tree = parser.parse(text.encode("utf-8")) if parser is not None else None
    hole = _hole(text, line, lang)
    if hole is not None and not (tree is not None and in_string(text, hole.start, lang, tree)):
        return hole
    if tree is not None:
        prose = _string_or_comment(text, cursor, lang, tree)
        if prose is not None:
            return prose

    def one_line(kind: SpanKind) -> Span:
        return Span(cursor, cursor, kind if tree is not None else "line", False, SINGLE_LINE_BUDGET)

    block = Span(cursor, cursor, "block", True, MULTI_LINE_BUDGET)
    if not line.before and line.after.strip():  # column 0 of a line holding code: insert whole lines
        return Span(cursor, cursor, "lines", False, WHOLE_LINE_BUDGET)
    bracket = _open_bracket(text, cursor, lang.line_comment)
    if line.after.strip():  # mid-line: the rest of the line is kept
        return one_line(_bracket_kind(bracket) if bracket else "expression")
    if not line.before.strip():  # a blank line
        if bracket and (bracket[0] in "([" or _is_literal_brace(bracket[1])):
            return one_line(_bracket_kind(bracket))
        return block
    if bracket and bracket[0] in "([":  # inside an open call or list: a `:` there opens no block (`def f(a:‸`)
        return one_line(_bracket_kind(bracket))
    if _opens_block(line.before, lang):
        return block
    if bracket and bracket[0] == "{" and line.before.rstrip().endswith("{"):  # `x = {‸`
        return one_line("expression")
    if _after_operator(line.before):
        return one_line("expression")
    return one_line("statement")
