"""Conversion between LSP and the engine: positions (UTF-16, clamped) to text offsets, and
fill candidates to inline completion and completion items. No server state here."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams

from engine.spans.lines import LINE_BREAK, line_start
from lsp_server.service import FillAnswer

COMPLETION_LABEL_CHARS = 60  # a completion item's label shows this much of the fill
UINTEGER_MAX = 2**31 - 1  # LSP's uinteger: a position past it is not a position


def position(line: object, character: object, what: str = "a position") -> types.Position:
    """A client's (line, character) as an LSP position; InvalidParams (not an internal
    error) for anything that is not a pair of LSP uintegers."""
    if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= UINTEGER_MAX for x in (line, character)):
        raise JsonRpcInvalidParams(f"{what} needs a line and a character from 0 to {UINTEGER_MAX}")
    assert isinstance(line, int) and isinstance(character, int)
    return types.Position(line, character)


@dataclass(frozen=True)
class Where:
    offset: int  # code point offset into the document's text
    position: types.Position  # the (clamped) client position of that offset
    # when items replace text before the cursor (the completion item selected in the
    # popup, or the word being typed): where that text starts, and the text, which the
    # items put in front of the fill
    replace_from: types.Position | None = None
    lead: str = ""

    @property
    def range(self) -> types.Range:
        """What an item replaces: nothing (at the cursor), or the text before it."""
        return types.Range(self.replace_from or self.position, self.position)


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)?")


def _utf16(s: str) -> int:
    """UTF-16 code units of `s`; a lone surrogate (a JSON "\\ud800" escape) counts as one."""
    return len(s.encode("utf-16-le", "surrogatepass")) // 2


def _line_at(text: str, line: int) -> tuple[int, int, str]:
    """(index, start offset, text without its break) of line `line`, or of the last line
    when the text has fewer lines; scans only up to it."""
    start, index = 0, 0
    for m in _LINE.finditer(text):
        seg = m.group(0)
        if not seg:
            break
        if index == line:
            return index, start, seg.rstrip("\r\n")
        start += len(seg)
        index += 1
        if not seg.endswith(("\n", "\r")):  # the last line, without a break
            return index - 1, start - len(seg), seg
    return index, start, ""  # the empty line after a final break (or an empty text)


def locate(doc: Any, position: types.Position) -> Where:
    """The offset of an LSP position (UTF-16 columns); a position past the end of its
    line or of the document is clamped to that end (clients send such positions while
    typing). Never touches the caller's position object."""
    index, start, body = _line_at(doc.source, position.line)
    target = position.character if index == position.line else _utf16(body)
    col, units = 0, 0
    while col < len(body) and units + _utf16(body[col]) <= target:
        units += _utf16(body[col])
        col += 1
    return Where(start + col, types.Position(index, units))


def position_at(doc: Any, offset: int) -> types.Position:
    """The LSP (UTF-16) position of a code point offset into the document's text."""
    text: str = doc.source
    offset = max(0, min(offset, len(text)))
    before = text[:offset]
    line = len(LINE_BREAK.findall(before))
    return types.Position(line, _utf16(before[line_start(before, offset) :]))


def inline_items(answer: FillAnswer, where: Where | None) -> types.InlineCompletionList | None:
    """Ghost text at the cursor: the range is empty and on one line, as the spec requires;
    multi-line fills go in insertText."""
    if where is None:
        return None
    items = [
        types.InlineCompletionItem(insert_text=where.lead + c.text, range=where.range)
        for c in answer.candidates
        if c.text.strip()  # ghost text made of spaces helps nobody
    ]
    return types.InlineCompletionList(items=items) if items else None


_WORD_END = re.compile(r"\w+$")


def word_before(doc: Any, where: Where) -> Where:
    """`where`, grown to replace the identifier characters before the cursor, which its
    items then repeat: clients filter completion items by the word at the cursor (eglot
    hides an item whose text does not start with it)."""
    if where.replace_from is not None:
        return where
    m = _WORD_END.search(doc.source[line_start(doc.source, where.offset) : where.offset])
    if m is None:
        return where
    start = types.Position(where.position.line, where.position.character - _utf16(m.group(0)))
    return Where(where.offset, where.position, start, m.group(0))


def completion_items(answer: FillAnswer, where: Where | None, markdown: bool = True) -> types.CompletionList | None:
    """The fill as one completion item (for clients without inline completion), sorted
    first; its documentation in markdown when the client reads markdown, else a string."""
    if where is None:
        return None
    items = []
    for i, c in enumerate(answer.candidates):
        if not c.text.strip():
            continue
        first = c.text.strip().splitlines()[0]
        label = first if len(first) <= COMPLETION_LABEL_CHARS else first[: COMPLETION_LABEL_CHARS - 1] + "…"
        items.append(
            types.CompletionItem(
                label=f"✦ {label}",
                kind=types.CompletionItemKind.Snippet,
                detail="diffusion-lsp",
                documentation=(
                    types.MarkupContent(types.MarkupKind.Markdown, f"```\n{c.text}\n```")
                    if markdown
                    else c.text  # a plain string: every client reads that
                ),
                sort_text=f"!{i}",  # before any other item
                filter_text=where.lead + c.text,
                text_edit=types.TextEdit(where.range, where.lead + c.text),
                insert_text_format=types.InsertTextFormat.PlainText,
            )
        )
    return types.CompletionList(is_incomplete=True, items=items) if items else None


def versioned_edit(uri: str, version: int | None, edits: list[types.TextEdit]) -> types.WorkspaceEdit:
    """A WorkspaceEdit for one version of a document (the client refuses it if the
    document has changed since)."""
    ident = types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=version)
    return types.WorkspaceEdit(document_changes=[types.TextDocumentEdit(ident, edits)])
