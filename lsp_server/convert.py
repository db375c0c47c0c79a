"""Conversion between LSP and the engine: positions (UTF-16, clamped) to text offsets, and
fill candidates to inline completion and completion items. No server state here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lsprotocol import types

from lsp_server.service import FillAnswer

COMPLETION_LABEL_CHARS = 60  # a completion item's label shows this much of the fill


@dataclass(frozen=True)
class Where:
    offset: int  # code point offset into the document's text
    position: types.Position  # the (clamped) client position of that offset


def locate(doc: Any, position: types.Position) -> Where:
    """The offset of an LSP position; a position past the end of its line or of the
    document is clamped to that end (clients send such positions while typing)."""
    lines: list[str] = doc.lines
    if not lines:
        return Where(0, types.Position(0, 0))
    if position.line >= len(lines):  # past the last line: the end of the document
        last = lines[-1]
        if last.endswith(("\n", "\r")):
            return Where(len(doc.source), types.Position(len(lines), 0))
        end = doc.position_codec.position_to_client_units(lines, types.Position(len(lines) - 1, len(last)))
        return Where(len(doc.source), end)
    server = doc.position_codec.position_from_client_units(lines, position)
    body = lines[position.line].rstrip("\r\n")
    col = min(server.character, len(body))
    offset = sum(len(line) for line in lines[: position.line]) + col
    return Where(offset, doc.position_codec.position_to_client_units(lines, types.Position(position.line, col)))


def inline_items(answer: FillAnswer, where: Where | None) -> types.InlineCompletionList | None:
    """Ghost text at the cursor: the range is empty and on one line, as the spec requires;
    multi-line fills go in insertText."""
    if where is None:
        return None
    here = types.Range(where.position, where.position)
    items = [types.InlineCompletionItem(insert_text=c.text, range=here) for c in answer.candidates if c.text]
    return types.InlineCompletionList(items=items) if items else None


def completion_items(answer: FillAnswer, where: Where | None) -> types.CompletionList | None:
    """The fill as one completion item (for clients without inline completion), sorted first."""
    if where is None:
        return None
    here = types.Range(where.position, where.position)
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
                documentation=types.MarkupContent(types.MarkupKind.Markdown, f"```\n{c.text}\n```"),
                sort_text=f"!{i}",  # before any other item
                filter_text="",
                text_edit=types.TextEdit(here, c.text),
                insert_text_format=types.InsertTextFormat.PlainText,
            )
        )
    return types.CompletionList(is_incomplete=True, items=items) if items else None


def position_at(doc: Any, offset: int) -> types.Position:
    """The LSP (UTF-16) position of a code point offset into the document's text."""
    server = doc.server_position_at_offset(max(0, min(offset, len(doc.source))))
    return doc.position_codec.position_to_client_units(doc.lines, server)


def replace_edit(doc: Any, uri: str, start: int, end: int, text: str) -> types.WorkspaceEdit:
    """A WorkspaceEdit replacing the document's text[start:end] with `text`."""
    rng = types.Range(position_at(doc, start), position_at(doc, end))
    return types.WorkspaceEdit(changes={uri: [types.TextEdit(rng, text)]})
