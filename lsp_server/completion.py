"""Completion at the cursor: textDocument/inlineCompletion (ghost text), the completion
fallback for clients without it, and diffusion/draft notifications while a fill forms."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

from lsprotocol import types
from pygls.workspace import TextDocument

from engine.remote import RemoteEngine
from lsp_server import convert
from lsp_server.context import DiffusionServer, grammar_name, language, model_ready, open_document, require, syntax_tree
from lsp_server.service import FillAnswer

log = logging.getLogger(__name__)

DRAFT = "diffusion/draft"  # custom notification: a fill as it forms (clients opt in)
EXTRA_FILES = 4  # other open documents sent as repository context to an engine that takes it
EXTRA_FILE_CHARS = 4000


async def inline_completion(
    ls: DiffusionServer, params: types.InlineCompletionParams
) -> types.InlineCompletionList | None:
    """Ghost text: one candidate while typing (Automatic), `alternatives` when asked
    (Invoked, or the first request after diffusion.suggestNow)."""
    require(params, types.InlineCompletionParams)
    asked = ls.fills.take_ask(params.text_document.uri)
    invoked = asked or params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
    answer, where = await fill_at(
        ls,
        params.text_document.uri,
        params.position,
        ls.fills.settings.alternatives if invoked else 1,
        debounce=not invoked,
        drafts=True,
        selected=params.context.selected_completion_info,
    )
    return convert.inline_items(answer, where) if answer else None


async def completion(ls: DiffusionServer, params: types.CompletionParams) -> types.CompletionList | None:
    """The fill as a completion item, for clients without inline completion."""
    require(params, types.CompletionParams)
    answer, where = await fill_at(ls, params.text_document.uri, params.position, 1)
    doc = open_document(ls, params.text_document.uri)
    if not answer or where is None or doc is None:
        return None
    return convert.completion_items(answer, convert.word_before(doc, where), _reads_markdown(ls))


async def fill_at(
    ls: DiffusionServer,
    uri: str,
    position: types.Position,
    candidates: int,
    debounce: bool = False,
    drafts: bool = False,
    selected: types.SelectedCompletionInfo | None = None,
) -> tuple[FillAnswer | None, convert.Where | None]:
    """Read the document at its version, fill on the worker, drop the answer if stale.

    debounce: wait `debounceMs` first and give up if a newer request or an edit for the
    document came meanwhile (type-through answers skip the wait). drafts: send
    diffusion/draft notifications while denoising, when the settings ask for them.
    selected: the completion item the user has selected in the popup; the fill continues
    its text, and the items replace its range."""
    doc = open_document(ls, uri)
    if doc is None:  # unknown URI: nothing to complete
        return None, None
    where = convert.locate(doc, position)
    settings = ls.fills.settings
    if settings.languages and {language(doc).name, doc.language_id or ""}.isdisjoint(settings.languages):
        return None, None
    version = doc.version
    prefix, suffix = doc.source[: where.offset], doc.source[where.offset :]
    if selected is not None:
        shown, prefix = _with_selected(doc, where, selected, prefix)
        if shown is None:
            return None, None
        where = shown
    flag = ls.fills.begin(uri)  # this request supersedes the document's older one
    if debounce and settings.debounce_ms and ls.fills.type_through(uri, prefix, suffix) is None:
        await asyncio.sleep(settings.debounce_ms / 1000)
        if flag.is_set():
            return None, None
    await model_ready(ls)
    lang = grammar_name(doc)
    tree = syntax_tree(ls, uri, doc) if lang and selected is None else None
    on_draft = _draft_sender(ls, uri, version, where.position) if drafts and settings.drafts else None
    engine = ls.fills.engine
    extra = _other_files(ls, doc) if isinstance(engine, RemoteEngine) and engine.takes_extra_files else None
    future = ls.fills.submit(uri, prefix, suffix, lang, candidates, flag, tree, on_draft, extra)
    try:
        answer = await asyncio.wrap_future(future)
    except asyncio.CancelledError:  # $/cancelRequest: stop this fill (not a newer one) between steps
        flag.set()
        raise
    except Exception:  # an engine bug: logged, an empty answer, the server goes on
        log.exception("fill failed for %s", uri)
        return None, None
    if answer is None or flag.is_set():  # cancelled, or the document moved on meanwhile
        return None, None
    return answer, where


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


def _other_files(ls: DiffusionServer, doc: TextDocument) -> list[tuple[str, str]]:
    """Repository context for a remote engine that takes it (llama-server's input_extra):
    the other open documents of the same language, at most EXTRA_FILES of them, each cut
    to EXTRA_FILE_CHARS."""
    out: list[tuple[str, str]] = []
    for other in list(ls.workspace.text_documents.values()):
        if other.uri != doc.uri and other.language_id == doc.language_id and len(out) < EXTRA_FILES:
            out.append((unquote(urlsplit(other.uri).path) or other.uri, other.source[:EXTRA_FILE_CHARS]))
    return out


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
