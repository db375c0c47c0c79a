"""Completion at the cursor: textDocument/inlineCompletion (ghost text), the completion
fallback for clients without it, and diffusion/draft notifications while a fill forms."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import unquote, urlsplit

from lsprotocol import types
from pygls.workspace import TextDocument

from engine.fill import InfillRequest
from lsp_server import convert
from lsp_server.context import grammar_name, language, open_document, require, syntax_tree
from lsp_server.protocol import DiffusionServer
from lsp_server.service import COMPLETION, INLINE, INVOKED

log = logging.getLogger(__name__)

DRAFT = "diffusion/draft"  # custom notification: a fill as it forms (clients opt in)


@dataclass(frozen=True)
class Cursor:
    """A fill at the cursor of an open document, read at its version."""

    doc: TextDocument
    where: convert.Where  # the cursor (and the text the items replace before it)
    request: InfillRequest


async def inline_completion(
    ls: DiffusionServer, params: types.InlineCompletionParams
) -> types.InlineCompletionList | None:
    """Ghost text: one candidate while typing (Automatic, debounced), `alternatives` when
    asked (Invoked, or the first request after diffusion.suggestNow)."""
    require(params, types.InlineCompletionParams)
    await ls.fills.wait_ready()  # the engine decides what the request carries (repository context)
    uri, settings = params.text_document.uri, ls.fills.settings
    invoked = ls.fills.take_ask(uri) or params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
    candidates = settings.alternatives if invoked else 1
    at = cursor(ls, uri, params.position, params.context.selected_completion_info, candidates)
    if at is None:
        return None
    if not invoked and settings.one_line_while_typing:
        at = replace(at, request=replace(at.request, one_line=True))
    drafts = _draft_sender(ls, uri, at.doc.version, at.where.position) if settings.drafts else None
    answer = await ls.fills.fill(uri, at.request, INVOKED if invoked else INLINE, drafts)
    return convert.inline_items(answer, at.where) if answer else None


async def completion(ls: DiffusionServer, params: types.CompletionParams) -> types.CompletionList | None:
    """The fill as a completion item, for clients without inline completion."""
    require(params, types.CompletionParams)
    await ls.fills.wait_ready()
    at = cursor(ls, params.text_document.uri, params.position)
    if at is None:
        return None
    answer = await ls.fills.fill(params.text_document.uri, at.request, COMPLETION)
    if not answer:
        return None
    return convert.completion_items(answer, convert.word_before(at.doc, at.where), _reads_markdown(ls))


def cursor(
    ls: DiffusionServer,
    uri: str,
    position: types.Position,
    selected: types.SelectedCompletionInfo | None = None,
    candidates: int = 1,
) -> Cursor | None:
    """The fill at `position` of the open document, `candidates` of them: None for an
    unknown document, a language the settings leave out, or a selected item that does not
    end at the cursor. selected: the completion item the user has selected in the popup;
    the fill continues its text, and the items replace its range."""
    doc = open_document(ls, uri)
    languages = ls.fills.settings.languages
    if doc is None or (languages and {language(doc).name, doc.language_id or ""}.isdisjoint(languages)):
        return None
    where = convert.locate(doc, position)
    prefix, suffix = doc.source[: where.offset], doc.source[where.offset :]
    if selected is not None:
        shown, prefix = _with_selected(doc, where, selected, prefix)
        if shown is None:
            return None
        where = shown
    lang = grammar_name(doc)
    request = InfillRequest(
        prefix=prefix,
        suffix=suffix,
        language=lang or language(doc).name,
        candidates=candidates,
        document=syntax_tree(ls, uri, doc) if lang and selected is None else None,
        **_repository(ls, doc, prefix, suffix),  # type: ignore[arg-type]
    )
    return Cursor(doc, where, request)


def _with_selected(
    doc: TextDocument, where: convert.Where, selected: types.SelectedCompletionInfo, prefix: str
) -> tuple[convert.Where | None, str]:
    """Honour the completion item selected in the popup: the fill is made as if its text
    replaced its range, and the items start at the range's start with that text in front."""
    start = convert.locate(doc, selected.range.start)
    end = convert.locate(doc, selected.range.end)
    if start.offset > where.offset or end.offset != where.offset or start.position.line != where.position.line:
        return None, prefix  # not a range ending at the cursor on its line: nothing sensible to show
    shown = convert.Where(where.offset, where.position, start.position, selected.text)
    return shown, prefix[: start.offset] + selected.text


def _draft_sender(
    ls: DiffusionServer, uri: str, version: int | None, position: types.Position
) -> Callable[[int, list[str]], None]:
    """A callback for the engine (called on the worker thread at each denoising step) that
    sends diffusion/draft notifications from the event loop's thread."""
    loop = asyncio.get_running_loop()
    request_id = ls.protocol.msg_id
    pos = {"line": position.line, "character": position.character}
    last: list[str] = []

    def send(step: int, texts: list[str]) -> None:
        if not texts or not texts[0] or texts[0] in last:
            return  # nothing (new) to show
        last[:] = [texts[0]]
        params = {
            "requestId": request_id,
            "textDocument": {"uri": uri, "version": version},
            "position": pos,
            "text": texts[0],
            "step": step,
            "done": False,
        }
        loop.call_soon_threadsafe(ls.protocol.notify, DRAFT, params)

    return send


def _repository(ls: DiffusionServer, doc: TextDocument, prefix: str, suffix: str) -> dict[str, object]:
    """The request's repository context (docs/server.md, Repository context): pieces of the
    other open documents and of the files this one imports in the workspace, chosen by
    engine.repository, chosen again when the user pauses (FillService.pieces);
    none when the setting is off or the engine has no use for them."""
    engine = ls.fills.engine
    if engine is None or not engine.takes_extra_files or not ls.fills.settings.repository_context:
        return {}
    path = Path(unquote(urlsplit(doc.uri).path)) if doc.uri.startswith("file:") else None
    folder = ls.fills.repository.folder_of(path) if path is not None else None
    current = str(path.relative_to(folder)) if path is not None and folder is not None else doc.uri

    def files() -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for other in list(ls.workspace.text_documents.values()):
            if other.uri != doc.uri:
                out.append((_shown_path(ls, other.uri), other.source))
        if path is not None:
            for imported in ls.fills.repository.imported(path, doc.source, language(doc).name):
                text, shown = ls.fills.repository.read(imported), _shown_path(ls, imported.as_uri())
                if text is not None and shown not in {p for p, _ in out}:  # not an open document already
                    out.append((shown, text))
        return out

    pieces = ls.fills.pieces(doc.uri, files, prefix, suffix, current, lambda: _recent(ls, doc))
    return {"extra_files": pieces, "repository": folder.name if folder is not None else "", "path": current}


def _recent(ls: DiffusionServer, doc: TextDocument) -> list[tuple[str, int]]:
    """(path, line) of the last edit in each other open document (lsp_server/history.py)."""
    out = []
    for other in list(ls.workspace.text_documents.values()):
        last = ls.fills.last_edit(other.uri, other.source) if other.uri != doc.uri else None
        if last is not None:
            out.append((_shown_path(ls, other.uri), other.source.count("\n", 0, last.start)))
    return out


def _shown_path(ls: DiffusionServer, uri: str) -> str:
    """A file's path as the model is shown it: relative to its workspace folder."""
    if not uri.startswith("file:"):
        return uri
    path = Path(unquote(urlsplit(uri).path))
    folder = ls.fills.repository.folder_of(path)
    return str(path.resolve().relative_to(folder)) if folder is not None else str(path)


def _reads_markdown(ls: DiffusionServer) -> bool:
    """Whether the client renders markdown in completion item documentation."""
    caps = ls.client_capabilities.text_document
    item = caps.completion.completion_item if caps and caps.completion else None
    return bool(item and item.documentation_format and types.MarkupKind.Markdown in item.documentation_format)


def suggest_now(ls: DiffusionServer, uri: str) -> None:
    """diffusion.suggestNow: serve the document's next inline request as Invoked, for
    clients whose inline completion API can only be asked through its own automatic
    request (Neovim's vim.lsp.inline_completion)."""
    ls.fills.ask(uri)


def dismiss(ls: DiffusionServer, uri: str) -> None:
    """diffusion.dismiss: the user hid the suggestion; its fill stops, and typing its
    start does not bring it back (no type-through)."""
    ls.fills.dismiss(uri)
