"""diffusion-lsp: the language server. Thin handlers turn LSP into engine calls and back.

This module keeps the server's lifecycle (initialize, settings, documents opening and
closing, model loading) and `register`, the table of every method and command; the
features are in completion.py (ghost text, completion, drafts) and actions.py (code
actions, their commands, next edit), reading documents through context.py.

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
import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from lsprotocol import types

from lsp_server import actions, completion
from lsp_server.protocol import DiffusionServer
from lsp_server.settings import engine_changed, parse_settings

log = logging.getLogger(__name__)


def create_server(model: str | None = None) -> DiffusionServer:
    server = DiffusionServer()
    server.model_override = model
    register(server)
    return server


def register(server: DiffusionServer) -> None:
    """Every method and command the server answers, and its handler."""
    features: list[tuple[str, Any, Any]] = [
        (types.INITIALIZE, None, initialize),
        (types.INITIALIZED, None, initialized),
        (types.WORKSPACE_DID_CHANGE_CONFIGURATION, None, did_change_configuration),
        (types.TEXT_DOCUMENT_DID_OPEN, None, did_open),
        (types.TEXT_DOCUMENT_DID_CHANGE, None, did_change),
        (types.TEXT_DOCUMENT_DID_CLOSE, None, did_close),
        (types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions(), completion.inline_completion),
        (types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(trigger_characters=[]), completion.completion),
        (
            types.TEXT_DOCUMENT_CODE_ACTION,
            types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.RefactorRewrite]),
            actions.code_action,
        ),
        (actions.INLINE_EDIT, None, actions.inline_edit),
    ]
    for method, options, handler in features:
        server.feature(method, options)(handler)
    commands: dict[str, Callable[..., Any]] = {
        "diffusion.fillHole": actions.fill_hole,
        "diffusion.fillAllHoles": actions.fill_all_holes,
        "diffusion.regenerateSelection": actions.regenerate_selection,
        "diffusion.refineSelection": actions.refine_selection,
        "diffusion.suggestNow": completion.suggest_now,
        "diffusion.dismiss": completion.dismiss,
        "diffusion.stats": stats,
    }
    for name, handler in commands.items():
        server.command(name)(handler)


def initialize(ls: DiffusionServer, params: types.InitializeParams) -> None:
    settings, problems = parse_settings(params.initialization_options)
    ls.fills.repository.set_folders(_workspace_folders(params))
    if ls.model_override:
        settings = replace(settings, model=ls.model_override)
    ls.fills.configure(settings)
    for problem in problems:
        ls.tell(problem, types.MessageType.Warning)


def _workspace_folders(params: types.InitializeParams) -> list[Path]:
    """The workspace folders the client names (or its root), as local paths."""
    uris = [f.uri for f in params.workspace_folders or []] or ([params.root_uri] if params.root_uri else [])
    paths = [Path(unquote(urlsplit(u).path)) for u in uris if u and u.startswith("file:")]
    if not paths and params.root_path:
        paths = [Path(params.root_path)]
    return paths


async def initialized(ls: DiffusionServer, params: types.InitializedParams) -> None:
    """Pull workspace/configuration (it wins over initializationOptions), then load the
    model in the background."""
    pulled = await _pull_settings(ls)
    if pulled is not None:
        _apply_settings(ls, pulled, load=False)
    threading.Thread(target=_load_model, args=(ls,), daemon=True, name="diffusion-load").start()


async def did_change_configuration(ls: DiffusionServer, params: types.DidChangeConfigurationParams) -> None:
    """Clients that can be asked (workspace/configuration) are asked; the others send
    the settings in the notification."""
    pulled = await _pull_settings(ls)
    _apply_settings(ls, pulled if pulled is not None else params.settings, load=True)


def did_open(ls: DiffusionServer, params: types.DidOpenTextDocumentParams) -> None:
    """pygls has stored the document: its edit history starts (lsp_server.history)."""
    uri = params.text_document.uri
    doc = ls.workspace.text_documents.get(uri)
    if doc is not None:
        ls.fills.opened(uri, doc.source)


def did_change(ls: DiffusionServer, params: types.DidChangeTextDocumentParams) -> None:
    """pygls has applied the change: the running fill goes on only if the user typed into
    it, and the edit joins the document's history."""
    uri = params.text_document.uri
    doc = ls.workspace.text_documents.get(uri)
    if doc is not None:
        ls.fills.edited(uri, doc.source)


def did_close(ls: DiffusionServer, params: types.DidCloseTextDocumentParams) -> None:
    ls.fills.forget(params.text_document.uri)  # its one record: tree, request, suggestion


def stats(ls: DiffusionServer, *args: object) -> dict[str, object]:
    """diffusion.stats: engine calls, answers by source and the model's state (for tests and
    bench/typing_bench.py)."""
    return {
        "engine_calls": ls.fills.engine_calls,
        "answers": dict(ls.fills.answers),  # answers given, by source (lsp_server/reuse.py)
        "ahead_fills": ls.fills.ahead_fills,  # fills made ahead of the user, apart from engine_calls
        "encoded_ahead": dict(ls.fills.encoded_ahead),  # repository context encoded at a pause: done, stopped
        "model_loaded": ls.fills.engine is not None,
        "model": ls.fills.where,  # where fills come from
        "load_error": ls.fills.load_error,
    }


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
        ls.tell(problem, types.MessageType.Warning)
    ls.fills.configure(settings)
    if load and engine_changed(old, settings):
        ls.fills.ready.clear()  # requests wait for the new model
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
            error = ls.fills.load(ls.fills.settings)  # never raises: a broken model must not hang the server
            if token:
                ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message=error or f"ready: {ls.fills.where}"))
            if error:
                ls.tell(error, types.MessageType.Error)
        finally:
            ls.fills.ready.set()
