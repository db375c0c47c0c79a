"""diffusion-lsp: the language server. Thin handlers turn LSP into engine calls and back.

Implemented: inline completion (LSP 3.18 textDocument/inlineCompletion), the completion
fallback for clients without it, code actions (fill hole, fill all holes, regenerate
selection, refine selection) run as commands that apply WorkspaceEdits, settings from
initializationOptions and workspace/configuration, model loading with $/progress,
cancellation by newer requests and edits, debounce, type-through, diffusion/inlineEdit
(next edit suggestion), diffusion/draft (the fill as it forms, to clients that opt in),
and a `diffusion.stats` command (engine calls, for tests). docs/server.md is the
protocol reference.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from urllib.parse import unquote

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams, JsonRpcInvalidRequest
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol

from engine.spans import Document, enclosing_node, expand_selection, find_holes, language_for
from lsp_server import convert
from lsp_server.service import FillAnswer, FillService
from lsp_server.settings import engine_changed, parse_settings

log = logging.getLogger(__name__)

NAME = "diffusion-lsp"
INLINE_EDIT = "diffusion/inlineEdit"  # custom request: next edit suggestion
DRAFT = "diffusion/draft"  # custom notification: a fill as it forms (clients opt in)
MAX_INLINE_EDIT_CHARS = 2000  # a next-edit rewrites a statement, not a whole file
VERSION = "0.1.0"


class _Unreadable:
    """A message that could not be read: pygls's dispatcher ignores it (its jsonrpc field
    is not "2.0")."""

    jsonrpc = "unreadable"


class TolerantProtocol(LanguageServerProtocol):
    """pygls drops a request whose params do not fit the method's types without any
    answer, and the client waits forever; here it gets InvalidParams at once."""

    def structure_message(self, data: dict[str, Any]) -> Any:
        method = data.get("method")
        is_request = "id" in data and isinstance(method, str)
        try:
            message = super().structure_message(data)
        except JsonRpcException:
            if is_request:
                invalid = JsonRpcInvalidParams(f"invalid params for {method}")
                self._send_response(data["id"], None, invalid.to_response_error())
            log.warning("dropped a message that does not fit its method's types: %.200s", method)
            return _Unreadable()
        if is_request and "jsonrpc" in data and not hasattr(message, "id"):
            # a notification's method sent as a request: it still needs an answer
            wrong = JsonRpcInvalidRequest(f"{method} is a notification, not a request")
            self._send_response(data["id"], None, wrong.to_response_error())
            return _Unreadable()
        return message


class DiffusionServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__(NAME, VERSION, protocol_cls=TolerantProtocol)
        self.fills = FillService()
        # an engine fault (a remote endpoint down) is told once, as a warning
        self.fills.notify = lambda message: self.window_show_message(
            types.ShowMessageParams(types.MessageType.Warning, f"diffusion-lsp: {message}")
        )
        self.model_ready = threading.Event()
        self.trees: dict[str, Document] = {}  # per open document: its syntax tree, kept incrementally
        self.request_seq: dict[str, int] = {}  # per document: the newest completion request


def create_server(model: str | None = None) -> DiffusionServer:
    server = DiffusionServer()
    register(server, model)
    return server


def register(server: DiffusionServer, model_override: str | None) -> None:
    @server.feature(types.INITIALIZE)
    def initialize(ls: DiffusionServer, params: types.InitializeParams) -> None:
        settings, problems = parse_settings(params.initialization_options)
        if model_override:
            settings = replace(settings, model=model_override)
        ls.fills.settings = settings
        for problem in problems:
            ls.window_show_message(types.ShowMessageParams(types.MessageType.Warning, problem))

    @server.feature(types.INITIALIZED)
    async def initialized(ls: DiffusionServer, params: types.InitializedParams) -> None:
        """Pull workspace/configuration (it wins over initializationOptions), then load the
        model in the background."""
        pulled = await _pull_settings(ls)
        if pulled is not None:
            _apply_settings(ls, pulled, load=False)
        threading.Thread(target=_load_model, args=(ls,), daemon=True, name="diffusion-load").start()

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(ls: DiffusionServer, params: types.DidChangeConfigurationParams) -> None:
        """Clients that can be asked (workspace/configuration) are asked; the others send
        the settings in the notification."""
        pulled = await _pull_settings(ls)
        _apply_settings(ls, pulled if pulled is not None else params.settings, load=True)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: DiffusionServer, params: types.DidChangeTextDocumentParams) -> None:
        ls.fills.cancel(params.text_document.uri)  # the running fill is for old text

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: DiffusionServer, params: types.DidCloseTextDocumentParams) -> None:
        ls.fills.forget(params.text_document.uri)
        ls.trees.pop(params.text_document.uri, None)
        ls.request_seq.pop(params.text_document.uri, None)

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(
        ls: DiffusionServer, params: types.InlineCompletionParams
    ) -> types.InlineCompletionList | None:
        _require(params, types.InlineCompletionParams)
        invoked = params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
        answer, where = await _fill(
            ls,
            params.text_document.uri,
            params.position,
            ls.fills.settings.alternatives if invoked else 1,
            debounce=not invoked,
            drafts=True,
            selected=params.context.selected_completion_info,
        )
        return convert.inline_items(answer, where) if answer else None

    @server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(trigger_characters=[]))
    async def completion(ls: DiffusionServer, params: types.CompletionParams) -> types.CompletionList | None:
        _require(params, types.CompletionParams)
        answer, where = await _fill(ls, params.text_document.uri, params.position, 1)
        doc = _doc(ls, params.text_document.uri)
        if not answer or where is None or doc is None:
            return None
        return convert.completion_items(answer, convert.word_before(doc, where), _reads_markdown(ls))

    @server.feature(
        types.TEXT_DOCUMENT_CODE_ACTION,
        types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.RefactorRewrite]),
    )
    def code_action(ls: DiffusionServer, params: types.CodeActionParams) -> list[types.CodeAction] | None:
        _require(params, types.CodeActionParams)
        uri = params.text_document.uri
        doc = _doc(ls, uri)
        if doc is None:
            return None
        start = convert.locate(doc, params.range.start)
        end = convert.locate(doc, params.range.end)
        holes = find_holes(_tree(ls, uri, doc))
        line_start, line_end = doc.source.rfind("\n", 0, start.offset) + 1, doc.source.find("\n", end.offset)
        line_end = len(doc.source) if line_end == -1 else line_end
        here = [h for h in holes if line_start <= h.start <= line_end]
        actions = []
        if here:
            pos = convert.position_at(doc, here[0].start)
            actions.append(_action("Fill hole", "diffusion.fillHole", [uri, pos.line, pos.character]))
        if holes:
            actions.append(_action("Fill all holes in file", "diffusion.fillAllHoles", [uri]))
        if end.offset > start.offset:
            rng = [uri, start.position.line, start.position.character, end.position.line, end.position.character]
            actions.append(_action("Regenerate selection", "diffusion.regenerateSelection", rng))
            actions.append(_action("Refine selection", "diffusion.refineSelection", rng))
        return actions or None

    @server.command("diffusion.fillHole")
    async def fill_hole(ls: DiffusionServer, uri: str, line: int, character: int) -> types.WorkspaceEdit | None:
        doc = _doc(ls, uri)
        if doc is None:
            return None
        at = convert.locate(doc, types.Position(line, character)).offset
        holes = [h for h in find_holes(_tree(ls, uri, doc)) if h.start <= at <= h.end]
        if not holes:
            return None
        return await _replace(ls, doc, uri, holes[0].start, holes[0].end)

    @server.command("diffusion.fillAllHoles")
    async def fill_all_holes(ls: DiffusionServer, uri: str) -> types.WorkspaceEdit | None:
        """Fill the holes so that they agree: a first pass fills each hole, last to first,
        in the text where the later holes are already filled; a second pass refines each
        fill (its unlikely tokens re-filled) in the text where every other hole holds its
        fill, so the earlier fills also see the later ones. (One span per engine call:
        the model's canvas ends with end-of-fill, so it cannot hold several holes.)"""
        doc = _doc(ls, uri)
        if doc is None:
            return None
        lang = language_for(doc.language_id, uri)
        language = lang.name if lang.grammar else None
        text, version = doc.source, doc.version
        holes = find_holes(_tree(ls, uri, doc))
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
            fill = await _in_worker(ls, prefix, suffix, language, None, fills[k])
            if fill.strip():  # a blank fill would delete the hole: leave it for the user
                fills[k], filled[k] = fill, True
        if sum(filled) > 1:
            for k in range(len(holes)):
                if filled[k]:
                    prefix, suffix = around(k)
                    better = await _in_worker(ls, prefix, suffix, language, fills[k], fills[k])
                    fills[k] = better if better.strip() else fills[k]
        now = _doc(ls, uri)
        if now is None or now.version != version:
            return None
        edits = [
            types.TextEdit(types.Range(convert.position_at(doc, h.start), convert.position_at(doc, h.end)), fills[k])
            for k, h in enumerate(holes)
            if filled[k]
        ]
        if len(edits) < len(holes):
            _tell(
                ls,
                f"no fill that parses for {len(holes) - len(edits)} of {len(holes)} holes; those were left as they are",
            )
        if not edits:
            return None
        return _edit(ls, uri, version, edits, apply=True, label="Fill all holes")

    @server.command("diffusion.regenerateSelection")
    async def regenerate(
        ls: DiffusionServer, uri: str, sl: int, sc: int, el: int, ec: int
    ) -> types.WorkspaceEdit | None:
        return await _rewrite_selection(ls, uri, types.Range(types.Position(sl, sc), types.Position(el, ec)), False)

    @server.command("diffusion.refineSelection")
    async def refine(ls: DiffusionServer, uri: str, sl: int, sc: int, el: int, ec: int) -> types.WorkspaceEdit | None:
        return await _rewrite_selection(ls, uri, types.Range(types.Position(sl, sc), types.Position(el, ec)), True)

    @server.feature(INLINE_EDIT)
    async def inline_edit(ls: DiffusionServer, params: object) -> dict[str, object]:
        """Next edit suggestion: the statement around the position, refined (its unlikely
        tokens re-filled). Answer: {"edits": [{"range", "text", "textDocument": {"uri",
        "version"}}]}, the shape Copilot's inline edits use; no edits when nothing changes."""
        uri, version, position = _inline_edit_params(params)
        doc = _doc(ls, uri)
        if doc is None:
            return {"edits": []}
        if not doc.source.strip():
            return {"edits": []}
        at = convert.locate(doc, position).offset
        lo, hi = enclosing_node(_tree(ls, uri, doc), at)
        if hi - lo > MAX_INLINE_EDIT_CHARS or (lo, hi) == (0, len(doc.source)):
            return {"edits": []}  # no statement here (a blank line): nothing to suggest
        old = doc.source[lo:hi]
        edit = await _replace(ls, doc, uri, lo, hi, refine=True, apply=False)
        if edit is None or not edit.document_changes:
            return {"edits": []}
        change = edit.document_changes[0].edits[0]  # type: ignore[union-attr]
        assert isinstance(change, types.TextEdit)
        if change.new_text == old or not change.new_text.strip():
            return {"edits": []}
        rng = ls.protocol._converter.unstructure(change.range)
        return {
            "edits": [{"range": rng, "text": change.new_text, "textDocument": {"uri": uri, "version": doc.version}}]
        }

    @server.command("diffusion.stats")
    def stats(ls: DiffusionServer, *args: object) -> dict[str, object]:
        return {
            "engine_calls": ls.fills.engine_calls,
            "model_loaded": ls.fills.engine is not None,
            "load_error": ls.fills.load_error,
        }


async def _in_worker(
    ls: DiffusionServer,
    prefix: str,
    suffix: str,
    language: str | None,
    refine: str | None = None,
    replaced: str = "",
) -> str:
    await _model_ready(ls)
    work = ls.fills.worker.submit(ls.fills.fill_region, prefix, suffix, language, refine, replaced)
    return await asyncio.wrap_future(work)


async def _rewrite_selection(
    ls: DiffusionServer, uri: str, rng: types.Range, refine: bool
) -> types.WorkspaceEdit | None:
    """Regenerate (everything masked) or refine (unlikely tokens masked) a selection grown
    to whole syntax nodes."""
    doc = _doc(ls, uri)
    if doc is None:
        return None
    lo = convert.locate(doc, rng.start).offset
    hi = convert.locate(doc, rng.end).offset
    lo, hi = expand_selection(_tree(ls, uri, doc), lo, hi)
    return await _replace(ls, doc, uri, lo, hi, refine=refine)


async def _replace(
    ls: DiffusionServer, doc: Any, uri: str, start: int, end: int, refine: bool = False, apply: bool = True
) -> types.WorkspaceEdit | None:
    """Fill text[start:end] from its surroundings (or refine the text there) and apply the
    edit in the client. The range and version are those of the text the fill was made
    for; when the document changes meanwhile, the fill is dropped."""
    text: str = doc.source
    version = doc.version
    rng = types.Range(convert.position_at(doc, start), convert.position_at(doc, end))
    lang = language_for(doc.language_id, uri)
    current = text[start:end] if refine else None
    fill = await _in_worker(ls, text[:start], text[end:], lang.name if lang.grammar else None, current, text[start:end])
    now = _doc(ls, uri)
    if now is None or now.version != version:
        return None
    if not fill.strip():  # never delete the user's code for want of a fill
        if apply:
            _tell(ls, "no fill that parses here; the text was left as it is")
        return None
    return _edit(ls, uri, version, [types.TextEdit(rng, fill)], apply)


def _edit(
    ls: DiffusionServer,
    uri: str,
    version: int | None,
    edits: list[types.TextEdit],
    apply: bool,
    label: str = "diffusion-lsp",
) -> types.WorkspaceEdit:
    """The edits as one WorkspaceEdit for that version of the document, applied in the
    client when `apply` (the client refuses it if the document has changed since)."""
    edit = convert.versioned_edit(uri, version, edits)
    if apply:
        ls.workspace_apply_edit(types.ApplyWorkspaceEditParams(edit, label=label))
    return edit


def _inline_edit_params(params: object) -> tuple[str, int | None, types.Position]:
    """(uri, version, position) of a diffusion/inlineEdit request; InvalidParams else."""

    def get(obj: object, key: str) -> object:
        return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)

    doc, pos = get(params, "textDocument"), get(params, "position")
    uri, line, character = get(doc, "uri"), get(pos, "line"), get(pos, "character")
    if (
        not isinstance(uri, str)
        or not isinstance(line, int)
        or not isinstance(character, int)
        or line < 0
        or character < 0
    ):
        raise JsonRpcInvalidParams("diffusion/inlineEdit needs textDocument.uri and a position")
    version = get(doc, "version")
    return uri, version if isinstance(version, int) else None, types.Position(line, character)


async def _model_ready(ls: DiffusionServer) -> None:
    """Wait (off the event loop) until the model has loaded or failed to; no thread hop
    once it has."""
    if not ls.model_ready.is_set():
        await asyncio.get_running_loop().run_in_executor(None, ls.model_ready.wait)


def _tree(ls: DiffusionServer, uri: str, doc: Any) -> Document:
    """The spans Document of an open document at its current version, reparsed
    incrementally from the previous version's tree. Each version is a new object, so a
    fill on the worker thread keeps a consistent text and tree while edits arrive."""
    cached = ls.trees.get(uri)
    if cached is not None and cached.version == doc.version and cached.text == doc.source:
        return cached
    if cached is None:
        tree = Document(doc.source, language_for(doc.language_id, uri), doc.version)
    else:
        tree = copy.copy(cached)
        tree.update(doc.source, doc.version)
    ls.trees[uri] = tree
    return tree


def _reads_markdown(ls: DiffusionServer) -> bool:
    """Whether the client renders markdown in completion item documentation."""
    caps = ls.client_capabilities.text_document
    item = caps.completion.completion_item if caps and caps.completion else None
    return bool(item and item.documentation_format and types.MarkupKind.Markdown in item.documentation_format)


def _tell(ls: DiffusionServer, message: str) -> None:
    ls.window_show_message(types.ShowMessageParams(types.MessageType.Info, f"diffusion-lsp: {message}"))


def _action(title: str, command: str, arguments: list[object]) -> types.CodeAction:
    """A rewrite code action that runs one of our commands."""
    cmd = types.Command(title=title, command=command, arguments=arguments)
    return types.CodeAction(title, kind=types.CodeActionKind.RefactorRewrite, command=cmd)


def _doc(ls: DiffusionServer, uri: str) -> Any | None:
    """The open document for `uri` (pygls keys them by the unquoted URI), or None."""
    docs = ls.workspace.text_documents
    return docs.get(uri) or docs.get(unquote(uri))


def _require(params: object, kind: type) -> None:
    """pygls hands over the raw JSON when params do not match the method's type."""
    if not isinstance(params, kind):
        raise JsonRpcInvalidParams(f"params are not {kind.__name__}")


async def _pull_settings(ls: DiffusionServer) -> Any | None:
    """The client's `diffusionLsp` section through workspace/configuration, when it
    supports that; None when it does not, or does not answer within a few seconds."""
    caps = ls.client_capabilities.workspace
    if caps is None or not caps.configuration:
        return None
    query = types.ConfigurationParams(items=[types.ConfigurationItem(section="diffusionLsp")])
    try:
        answer = await asyncio.wait_for(ls.workspace_configuration_async(query), timeout=5)
    except Exception as exc:  # a client that errs or never answers: keep the settings we have
        log.warning("workspace/configuration failed: %s", exc)
        return None
    return answer[0] if answer else None


def _apply_settings(ls: DiffusionServer, raw: Any, load: bool) -> None:
    """Take new settings (invalid values named in a message and defaulted); a change of
    model, backend or device loads the model again when `load`."""
    old = ls.fills.settings
    settings, problems = parse_settings(raw, old)
    for problem in problems:
        ls.window_show_message(types.ShowMessageParams(types.MessageType.Warning, problem))
    ls.fills.settings = settings
    if load and engine_changed(old, settings):
        ls.model_ready.clear()  # requests wait for the new model
        threading.Thread(target=_load_model, args=(ls,), daemon=True, name="diffusion-load").start()


_LOAD_LOCK = threading.Lock()


def _load_model(ls: DiffusionServer) -> None:
    """Load the model the settings name, with $/progress; whatever happens, requests
    waiting for the model are released (with no model they answer empty)."""
    with _LOAD_LOCK:
        token = "diffusion-lsp/load-model"
        try:
            try:
                ls.work_done_progress.create(token).result(timeout=5)
                ls.work_done_progress.begin(
                    token, types.WorkDoneProgressBegin(title="diffusion-lsp: loading the model")
                )
            except Exception:  # the client may not support progress: load anyway
                token = ""
            try:
                error = ls.fills.load(ls.fills.settings)
            except Exception as exc:  # a broken model directory must not hang the server
                log.exception("model failed to load")
                ls.fills.engine, ls.fills.load_error = None, f"the model failed to load: {exc}"
                error = ls.fills.load_error
            if token:
                ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message=error or "ready"))
            if error:
                ls.window_show_message(types.ShowMessageParams(types.MessageType.Error, f"diffusion-lsp: {error}"))
        finally:
            ls.model_ready.set()


async def _fill(
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
    doc = _doc(ls, uri)
    if doc is None:  # unknown URI: nothing to complete
        return None, None
    where = convert.locate(doc, position)
    lang = language_for(doc.language_id, uri)
    settings = ls.fills.settings
    if settings.languages and lang.name not in settings.languages and (doc.language_id or "") not in settings.languages:
        return None, None
    version = doc.version
    prefix, suffix = doc.source[: where.offset], doc.source[where.offset :]
    if selected is not None:
        shown, prefix = _with_selected(doc, where, selected, prefix)
        if shown is None:
            return None, None
        where = shown
    seq = ls.request_seq[uri] = ls.request_seq.get(uri, 0) + 1

    def still_current() -> bool:
        current = _doc(ls, uri)
        return current is not None and current.version == version and ls.request_seq.get(uri) == seq

    if debounce and settings.debounce_ms and ls.fills.type_through(uri, prefix, suffix) is None:
        await asyncio.sleep(settings.debounce_ms / 1000)
        if not still_current():
            return None, None
    await _model_ready(ls)
    tree = _tree(ls, uri, doc) if lang.grammar and selected is None else None
    language = lang.name if lang.grammar else None
    on_draft = _draft_sender(ls, uri, version, where.position) if drafts and settings.drafts else None
    future, flag = ls.fills.submit(uri, prefix, suffix, language, candidates, still_current, tree, on_draft)
    try:
        answer = await asyncio.wrap_future(future)
    except asyncio.CancelledError:  # $/cancelRequest: stop this fill (not a newer one) between steps
        flag.set()
        raise
    except Exception:  # an engine bug: logged, an empty answer, the server goes on
        log.exception("fill failed for %s", uri)
        return None, None
    if answer is None or not still_current():
        return None, None
    return answer, where


def _with_selected(
    doc: Any, where: convert.Where, selected: types.SelectedCompletionInfo, prefix: str
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
