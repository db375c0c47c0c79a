"""What every handler gets and reads: the server object (its fill service and per-document
state), the open document at its version and its syntax tree, the model being ready; and
how it answers: the client told, bad params refused."""

from __future__ import annotations

import copy
import logging
from collections.abc import Generator
from typing import Any
from urllib.parse import unquote

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams, JsonRpcInvalidRequest
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, lsp_method
from pygls.workspace import TextDocument

from engine.spans import Document, Language, language_for
from lsp_server.service import FillService

log = logging.getLogger(__name__)

NAME = "diffusion-lsp"
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

    @lsp_method(types.SHUTDOWN)
    def lsp_shutdown(self, *args: Any) -> Generator[Any, Any, None]:
        """pygls's shutdown cancels the pending requests while iterating the table that a
        cancelled command's callback removes itself from, and answers the shutdown with
        that RuntimeError; cancelled here from a copy of the table first, pygls's own
        loop finds nothing left to cancel."""
        current = self.msg_id
        for msg_id, future in list(self._request_futures.items()):
            if msg_id != current and not future.done():
                future.cancel()
        yield from super().lsp_shutdown(*args)


class DiffusionServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__(NAME, VERSION, protocol_cls=TolerantProtocol)
        self.fills = FillService()
        # an engine fault (a remote endpoint down) is told once, as a warning
        self.fills.notify = lambda message: self.window_show_message(
            types.ShowMessageParams(types.MessageType.Warning, f"diffusion-lsp: {message}")
        )
        self.model_override: str | None = None  # --model: wins over the settings' model


def open_document(ls: DiffusionServer, uri: str) -> TextDocument | None:
    """The open document for `uri` (pygls keys them by the unquoted URI), or None."""
    docs = ls.workspace.text_documents
    return docs.get(uri) or docs.get(unquote(uri))


def language(doc: TextDocument) -> Language:
    return language_for(doc.language_id, doc.uri)


def grammar_name(doc: TextDocument) -> str | None:
    """The language to validate fills in: its name when it has a grammar, else None."""
    lang = language(doc)
    return lang.name if lang.grammar else None


def syntax_tree(ls: DiffusionServer, uri: str, doc: TextDocument) -> Document:
    """The spans Document of an open document at its current version, reparsed
    incrementally from the previous version's tree. Each version is a new object, so a
    fill on the worker thread keeps a consistent text and tree while edits arrive."""
    version = doc.version if doc.version is not None else 0  # an open document always has one
    record = ls.fills.document(uri)
    cached: Document | None = record.tree
    if cached is not None and cached.version == version and cached.text == doc.source:
        return cached
    if cached is None:
        tree = Document(doc.source, language(doc), version)
    else:
        tree = copy.copy(cached)
        tree.update(doc.source, version)
    record.tree = tree
    return tree


def tell(ls: DiffusionServer, message: str) -> None:
    ls.window_show_message(types.ShowMessageParams(types.MessageType.Info, f"diffusion-lsp: {message}"))


def require(params: object, kind: type) -> None:
    """pygls hands over the raw JSON when params do not match the method's type."""
    if not isinstance(params, kind):
        raise JsonRpcInvalidParams(f"params are not {kind.__name__}")
