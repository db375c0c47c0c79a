"""A local HTTP server that behaves as the remote engines document: vLLM's OpenAI
completions (no `suffix` for diffusion models: HTTP 400), OpenAI-style SSE streams,
llama-server's /infill; each test scripts the reply. Loopback only."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    port: int


@dataclass
class Engine:
    """What the fake engine does: `reply(handler, body)` writes the answer."""

    url: str
    seen: list[Seen] = field(default_factory=list)
    reply: Callable[[Any, dict[str, Any]], None] = lambda h, b: None
    disconnects: int = 0  # writes that failed because the client had gone


def json_reply(h: Any, status: int, payload: Any, raw: bytes | None = None) -> None:
    data = raw if raw is not None else json.dumps(payload).encode()
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def sse(h: Any, events: list[Any], pause: float = 0.0, done: bool = True) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream")
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()

    def chunk(data: bytes) -> None:
        h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        h.wfile.flush()

    for e in events:
        chunk(f"data: {json.dumps(e)}\n\n".encode())
        time.sleep(pause)
    if done:
        chunk(b"data: [DONE]\n\n")
        h.wfile.write(b"0\r\n\r\n")


def vllm(h: Any, body: dict[str, Any]) -> None:
    """vLLM serving a diffusion model: no `suffix`; choices[].text."""
    if "suffix" in body:
        json_reply(h, 400, {"error": {"message": "suffix is not currently supported", "type": "BadRequestError"}})
        return
    n = body.get("n", 1)
    texts = ["count", "count + 0", "sum(items)"][:n]
    if body.get("stream"):  # every choice in pieces, each ended by its finish_reason
        events = [
            {"choices": [{"index": i, "text": piece, "finish_reason": None}]}
            for i, t in enumerate(texts)
            for piece in (t[:2], t[2:])
        ]
        events += [{"choices": [{"index": i, "text": "", "finish_reason": "stop"}]} for i in range(len(texts))]
        sse(h, events)
        return
    json_reply(h, 200, {"choices": [{"index": i, "text": t, "finish_reason": "stop"} for i, t in enumerate(texts)]})


CHAT_ANSWERS = ["```python\n    return count\n```", "Here is the code:\n```python\ncount + 0\n```", "sum(items)"]


def chat(h: Any, body: dict[str, Any]) -> None:
    """An OpenAI-compatible chat route: choices[].message.content, or choices[].delta in a
    stream; answers in the shapes chat models give (a fence, a sentence, the line again)."""
    if not isinstance(body.get("messages"), list) or "prompt" in body:
        json_reply(h, 400, {"error": {"message": "'messages' is a required property"}})
        return
    texts = CHAT_ANSWERS[: body.get("n", 1)]
    if body.get("stream"):
        events = [
            {"choices": [{"index": i, "delta": {"role": "assistant"}, "finish_reason": None}]}
            for i in range(len(texts))
        ]
        events += [
            {"choices": [{"index": i, "delta": {"content": piece}, "finish_reason": None}]}
            for i, t in enumerate(texts)
            for piece in (t[:5], t[5:])
        ]
        events += [{"choices": [{"index": i, "delta": {}, "finish_reason": "stop"}]} for i in range(len(texts))]
        sse(h, events)
        return
    choices = [
        {"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "stop"}
        for i, t in enumerate(texts)
    ]
    json_reply(h, 200, {"choices": choices})


@contextmanager
def serve() -> Iterator[Engine]:
    """A fake engine on 127.0.0.1 (a free port), stopped on exit."""
    state = Engine(url="")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            size = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(size) or b"{}")
            state.seen.append(Seen(self.path, dict(self.headers), body, self.client_address[1]))
            try:
                state.reply(self, body)
            except (BrokenPipeError, ConnectionResetError):
                state.disconnects += 1
                self.close_connection = True

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()
