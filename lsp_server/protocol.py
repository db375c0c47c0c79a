"""The server object and pygls's protocol, as this server needs them.

- `DiffusionServer`: pygls's `LanguageServer` with the fill service (`fills`) and
  `tell`, the one way anything is told to the user: logged and shown.
- `TolerantProtocol`: pygls's protocol, patched so that every request gets an answer
  (bad params or a command's missing arguments: InvalidParams; a notification sent as a
  request: InvalidRequest) and shutdown does not fail on the requests it cancels.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams, JsonRpcInvalidRequest
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, lsp_method

from lsp_server.service import FillService

log = logging.getLogger(__name__)

NAME = "diffusion-lsp"
VERSION = "0.1.0"

_LEVELS = {
    types.MessageType.Error: logging.ERROR,
    types.MessageType.Warning: logging.WARNING,
    types.MessageType.Info: logging.INFO,
}


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

    @lsp_method(types.WORKSPACE_EXECUTE_COMMAND)
    def lsp_workspace__execute_command(self, params: types.ExecuteCommandParams) -> Generator[Any, Any, Any]:
        """pygls calls a command sent without `arguments` with no arguments at all, and a
        command that takes some fails inside the server (an internal error); taken as an
        empty list, the missing arguments are InvalidParams, as a wrong count is."""
        if params.arguments is None:
            params = types.ExecuteCommandParams(params.command, [], params.work_done_token)
        return (yield from super().lsp_workspace__execute_command(params))

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
        self.fills.notify = lambda message: self.tell(message, types.MessageType.Warning)
        self.model_override: str | None = None  # --model: wins over the settings' model

    def tell(self, message: str, kind: types.MessageType = types.MessageType.Info) -> None:
        """Tell the user: the one path for what the server has to say (an invalid setting,
        a model that did not load, an engine fault, a region left as it was). Logged at
        the matching level (stderr, --log-file, window/logMessage) and shown
        (window/showMessage)."""
        log.log(_LEVELS.get(kind, logging.INFO), "%s", message)
        self.window_show_message(types.ShowMessageParams(kind, f"{NAME}: {message}"))
