"""A minimal LSP client over a server's stdio: for the README's demo, the benchmark, and tests
that must send what a typed client cannot (malformed requests).

    python -m lsp_server.client --file F --line L --col C [--server CMD...]

starts `diffusion-lsp` (this interpreter's, by default), opens F, asks for the inline
completion at the 1-based line and column, and prints the ghost text it returns.

Requests the server sends to the client are answered as a plain editor would:
workspace/configuration with nothing (null per item), window/workDoneProgress/create
with success, workspace/applyEdit as applied (and recorded).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import queue
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)


class ServerError(RuntimeError):
    """The server answered a request with an error, or went away."""


class StdioClient:
    def __init__(self, command: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
        )
        self._ids = itertools.count(1)
        self._pending: dict[int | str, queue.Queue[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self.notifications: list[dict[str, Any]] = []  # every notification the server sent, in order
        self.applied_edits: list[Any] = []
        self._reader = threading.Thread(target=self._read_loop, daemon=True, name="lsp-client-reader")
        self._reader.start()

    # -- wire
    def send(self, message: dict[str, Any] | bytes) -> None:
        """Send one message (a dict, or raw bytes for the body as they are)."""
        body = message if isinstance(message, bytes) else json.dumps(message).encode("utf-8")
        assert self.proc.stdin is not None
        with self._lock:
            self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            self.proc.stdin.flush()

    def _read_loop(self) -> None:
        out = self.proc.stdout
        assert out is not None
        while True:
            message = _read_message(out)
            if message is None:
                break
            if "id" in message and "method" in message:
                self._answer(message)
            elif "id" in message:
                waiter = self._pending.pop(message["id"], None)
                if waiter is not None:
                    waiter.put(message)
            else:
                self.notifications.append(message)
        for waiter in list(self._pending.values()):  # the server went away
            waiter.put({"error": {"code": -32099, "message": "the server exited"}})

    def _answer(self, request: dict[str, Any]) -> None:
        method, params = request["method"], request.get("params") or {}
        result: Any = None
        if method == "workspace/configuration":
            result = [None for _ in params.get("items", [])]
        elif method == "workspace/applyEdit":
            self.applied_edits.append(params.get("edit"))
            result = {"applied": True}
        with contextlib.suppress(BrokenPipeError, OSError):
            self.send({"jsonrpc": "2.0", "id": request["id"], "result": result})

    # -- requests
    def request_raw(self, method: str, params: Any = None, timeout: float = 60.0) -> dict[str, Any]:
        """Send a request; the whole response message (result or error)."""
        msg_id = next(self._ids)
        waiter: queue.Queue[dict[str, Any]] = queue.Queue()
        self._pending[msg_id] = waiter
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        try:
            return waiter.get(timeout=timeout)
        except queue.Empty:
            self._pending.pop(msg_id, None)
            raise ServerError(f"no answer to {method} within {timeout} s") from None

    def request(self, method: str, params: Any = None, timeout: float = 60.0) -> Any:
        response = self.request_raw(method, params, timeout)
        if "error" in response:
            raise ServerError(f"{method}: {response['error'].get('message')}")
        return response.get("result")

    def notify(self, method: str, params: Any = None) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    # -- a session
    def initialize(self, options: dict[str, Any] | None = None, root: Path | None = None) -> dict[str, Any]:
        caps = {
            "textDocument": {
                "synchronization": {"dynamicRegistration": False},
                "inlineCompletion": {"dynamicRegistration": False},
                "completion": {"completionItem": {"snippetSupport": False}},
            },
            "window": {"workDoneProgress": True},
            "workspace": {"applyEdit": True, "configuration": True},
        }
        params = {
            "processId": None,
            "rootUri": root.resolve().as_uri() if root else None,
            "capabilities": caps,
            "initializationOptions": {"diffusionLsp": options or {}},
        }
        result = self.request("initialize", params)
        self.notify("initialized", {})
        return result

    def open(self, uri: str, text: str, language: str = "python", version: int = 1) -> None:
        item = {"uri": uri, "languageId": language, "version": version, "text": text}
        self.notify("textDocument/didOpen", {"textDocument": item})

    def inline_completion(self, uri: str, line: int, character: int, invoked: bool = True) -> list[dict[str, Any]]:
        result = self.request(
            "textDocument/inlineCompletion",
            {
                "textDocument": {"uri": uri},
                "position": {"line": line, "character": character},
                "context": {"triggerKind": 1 if invoked else 2},
            },
        )
        if isinstance(result, dict):
            return list(result.get("items", []))
        return list(result or [])

    def close(self, timeout: float = 10.0) -> int:
        """shutdown, exit, and wait: the server's exit status."""
        try:
            self.request("shutdown", timeout=timeout)
            self.notify("exit")
        except (ServerError, BrokenPipeError, OSError):
            self.proc.kill()
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def _read_message(stream: IO[bytes]) -> dict[str, Any] | None:
    """One framed message, or None at the end of the stream."""
    length = None
    while True:
        line = stream.readline()
        if not line:
            return None
        line = line.strip()
        if not line:
            break
        name, _, value = line.decode("ascii", "replace").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    if length is None:
        return None
    body = stream.read(length)
    if len(body) < length:
        return None
    message: dict[str, Any] = json.loads(body)
    return message


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m lsp_server.client",
        description="Start diffusion-lsp, open a file, and print the ghost text at a line and column.",
    )
    p.add_argument("--file", required=True, help="the document to open")
    p.add_argument("--line", type=int, required=True, help="1-based line of the cursor")
    p.add_argument("--col", type=int, required=True, help="1-based column of the cursor (in UTF-16 code units)")
    p.add_argument("--model", help="model directory (default: the shipped model)")
    p.add_argument("--alternatives", type=int, default=1, help="how many alternatives to ask for (1-8)")
    args = p.parse_args(argv)
    # diagnostics go to stderr through logging; stdout carries only the ghost text
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    path = Path(args.file)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        log.error("error: cannot read %s: %s", path, exc)
        return 2
    if args.line < 1 or args.col < 1:
        log.error("error: --line and --col are 1-based")
        return 2
    command = [sys.executable, "-m", "lsp_server"] + (["--model", args.model] if args.model else [])
    client = StdioClient(command)
    try:
        info = client.initialize({"alternatives": args.alternatives}, root=path.parent)
        uri = path.resolve().as_uri()
        client.open(uri, text, language="python" if path.suffix == ".py" else path.suffix.lstrip("."))
        items = client.inline_completion(uri, args.line - 1, args.col - 1, invoked=True)
    except ServerError as exc:
        log.error("error: %s", exc)
        client.close()
        return 1
    problems = [n["params"]["message"] for n in client.notifications if n.get("method") == "window/showMessage"]
    status = client.close()
    for message in problems:
        log.warning("server: %s", message)
    name = info.get("serverInfo", {}).get("name", "server")
    log.info("# %s: %d suggestion(s) at %s:%d:%d", name, len(items), path, args.line, args.col)
    for i, item in enumerate(items):
        if i:
            log.info("# --- alternative %d", i + 1)
        sys.stdout.write(item.get("insertText", "") + "\n")  # the result: the only thing on stdout
    return 0 if items and status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
