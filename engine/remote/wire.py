"""The wire to an inference server: HTTP, streaming, timeouts, TLS, cancellation, faults.

Knows nothing of dialects: a `Reading` (a dialect, engine.remote.dialects) says how a
reply's JSON becomes candidates (`Written`: the text, and the tokens' log-probabilities
where the server sent them); this module moves the bytes and maps what goes wrong to a
message for the user.

- One kept-alive connection (`Wire`): a warm fill pays no new TCP or TLS handshake; a
  connection the server closed while idle is reopened once, silently.
- Every reply may come whole (JSON) or streamed (SSE, `text/event-stream`); a stream's
  events carry indexed pieces of the candidates, each shown as a draft when it changes.
- Newest request wins on the wire: a `Watcher` shuts the socket down the moment the fill
  is cancelled or its deadline passes, so a blocking read returns at once and the engine
  sees its client leave (an engine notices that only when it writes, which is why every
  request streams; docs/remote.md has the measurement).
- Faults become a `RemoteError` with the user's message: refused, DNS, TLS, timeouts,
  HTTP errors (the server's own message; a 4xx is a `Refused`), malformed, cut or
  oversized replies. Those that ask for a pause (unreachable, timed out, HTTP 5xx) are
  an `Unreachable`, and `Backoff` is the pause (1 s doubling to 30 s) its owner keeps.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol
from urllib.parse import urlsplit

from engine.errors import EngineError
from engine.fill import FillControl

MAX_ERROR_BODY = 65_536  # bytes of an error reply read for its message
MAX_REPLY = 16 << 20  # bytes of a reply, past which it is refused
BACKOFF_START_S, BACKOFF_MAX_S = 1.0, 30.0
WATCH_S = 0.01  # how often the watcher checks cancel and the deadline


class RemoteError(EngineError):
    """The remote engine could not give a fill; the message is for the user."""


class Unreachable(RemoteError):
    """A fault that asks for a pause before the next request (unreachable, timeout, 5xx)."""


class Refused(RemoteError):
    """The server refused the request (HTTP 4xx); `detail` is its own message."""

    def __init__(self, message: str, status: int, detail: str) -> None:
        super().__init__(message)
        self.status, self.detail = status, detail


class Cancelled(Exception):
    """The fill was cancelled or ran past its deadline; the reason is "cancelled" or "deadline"."""


class BadReply(Exception):
    """A reply a dialect cannot read; the message follows the endpoint ("sent no choices")."""


class Written(NamedTuple):
    """One candidate as the server wrote it: its text and its tokens' log-probabilities
    (None: the server sent none, or ones that could not be read)."""

    text: str
    logprobs: list[float] | None = None


class Piece(NamedTuple):
    """One candidate's part of a streamed event: its text, whether it has ended, and the
    log-probabilities of the tokens it carries (None: none)."""

    candidate: int  # its index
    text: str
    ended: bool
    logprobs: list[float] | None = None


class Reading(Protocol):
    """How a reply becomes candidates (each dialect is one)."""

    @property
    def whole_when_all_stopped(self) -> bool:
        """Whether a stream is whole when every candidate has stopped (it sends no [DONE])."""
        ...

    def written(self, reply: Any, n: int) -> list[Written]:
        """The candidates of a whole (non-streamed) reply's JSON; BadReply if it has none."""
        ...

    def pieces(self, chunk: dict[str, Any]) -> Iterator[Piece]:
        """The candidates' pieces in one streamed event's JSON object."""
        ...


@dataclass
class Backoff:
    until: float = 0.0
    delay: float = BACKOFF_START_S
    reason: str = ""

    def fail(self, reason: str) -> None:
        self.until, self.reason = time.monotonic() + self.delay, reason
        self.delay = min(self.delay * 2, BACKOFF_MAX_S)

    def ok(self) -> None:
        self.until, self.delay, self.reason = 0.0, BACKOFF_START_S, ""


class Watcher:
    """Shuts the connection's socket down when `cancel()` says so or `deadline` passes:
    a blocking read then returns at once, and the engine sees the client leave."""

    def __init__(self, conn: http.client.HTTPConnection, cancel: Callable[[], bool] | None, deadline: float | None):
        self.conn, self.cancel, self.deadline = conn, cancel, deadline
        self.fired: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="diffusion-remote-watch")
        if cancel is not None or deadline is not None:
            self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(WATCH_S):
            if self.cancel is not None and self.cancel():
                self.fired = "cancelled"
            elif self.deadline is not None and time.monotonic() >= self.deadline:
                self.fired = "deadline"
            else:
                continue
            sock = self.conn.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            return

    def check(self) -> None:
        """Cancelled if the watcher has fired."""
        if self.fired:
            raise Cancelled(self.fired)

    def stop(self) -> None:
        self._done.set()


class Wire:
    """One endpoint over one kept-alive connection; one request at a time."""

    def __init__(self, endpoint: str, timeout_s: float, verify_tls: bool = True, api_key_env: str | None = None):
        url = urlsplit(endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise RemoteError(f"endpoint {endpoint!r} is not an http:// or https:// URL")
        self.endpoint, self.timeout_s, self.verify_tls, self.api_key_env = endpoint, timeout_s, verify_tls, api_key_env
        self._url = url
        self._conn: http.client.HTTPConnection | None = None
        self.requests = 0  # sent to the engine (for tests and stats)

    def url_path(self, path: str) -> str:
        """`path` under the endpoint's base path (`https://host/api` + `/infill`)."""
        return self._url.path.rstrip("/") + path

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        env = self.api_key_env
        if env:
            key = os.environ.get(env)
            if not key:
                raise RemoteError(f"the API key variable {env} is not set in the server's environment")
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """(the kept-alive connection, whether it was used before)."""
        if self._conn is not None:
            return self._conn, True
        host, port, timeout = self._url.hostname or "", self._url.port, self.timeout_s
        if self._url.scheme == "https":
            ctx = ssl.create_default_context()
            if not self.verify_tls:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self._conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=ctx)
        else:
            self._conn = http.client.HTTPConnection(host, port, timeout=timeout)
        return self._conn, False

    def post(self, path: str, body: dict[str, Any], reading: Reading, n: int, control: FillControl) -> list[Written]:
        """POST `body` as JSON to `path` (under the endpoint's base) and read `n` candidates
        with `reading`, drafts to `control.on_draft`. Raises Cancelled, Unreachable or
        RemoteError; the connection is kept only after a reply read to its end."""
        data = json.dumps(body).encode("utf-8")
        headers = self._headers()
        for attempt in (0, 1):
            conn, reused = self._connection()
            watcher = Watcher(conn, control.cancel, control.deadline)
            try:
                self.requests += 1
                conn.request("POST", self.url_path(path), body=data, headers=headers)
                resp = conn.getresponse()
                written = self._read(resp, reading, n, control, watcher)
                if resp.will_close:
                    self.close()
                return written
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                self.close()
                watcher.check()
                if reused and attempt == 0:  # the server closed an idle kept-alive connection
                    continue
                raise Unreachable(f"{self.endpoint} closed the connection") from exc
            except (Cancelled, RemoteError):
                self.close()
                raise
            except TimeoutError as exc:
                self.close()
                watcher.check()
                raise Unreachable(f"{self.endpoint} did not answer in {self.timeout_s:g} s") from exc
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                watcher.check()
                raise Unreachable(f"cannot reach {self.endpoint}: {_network_reason(exc)}") from exc
            finally:
                watcher.stop()
        raise AssertionError("unreachable")

    def _read(
        self, resp: http.client.HTTPResponse, reading: Reading, n: int, control: FillControl, watcher: Watcher
    ) -> list[Written]:
        if resp.status != 200:
            message = _error_message(resp.read(MAX_ERROR_BODY))
            error = f"{self.endpoint} answered HTTP {resp.status}: {message}"
            raise Unreachable(error) if resp.status >= 500 else Refused(error, resp.status, message)
        ctype = resp.getheader("Content-Type", "")
        if "text/event-stream" in ctype:
            return self._read_stream(resp, reading, n, control, watcher)
        try:
            raw = resp.read(MAX_REPLY + 1)
        except http.client.IncompleteRead as exc:
            watcher.check()
            raise RemoteError(f"{self.endpoint} cut its reply short") from exc
        watcher.check()
        length = resp.getheader("Content-Length", "")
        if length.isdigit() and len(raw) < int(length):
            raise RemoteError(f"{self.endpoint} cut its reply short")
        if len(raw) > MAX_REPLY:
            raise RemoteError(f"{self.endpoint} sent a reply over {MAX_REPLY >> 20} MB")
        try:
            return reading.written(_json(raw), n)
        except BadReply as exc:
            raise RemoteError(f"{self.endpoint} {exc}") from exc

    def _read_stream(
        self, resp: http.client.HTTPResponse, reading: Reading, n: int, control: FillControl, watcher: Watcher
    ) -> list[Written]:
        """The candidates of a streamed reply. Each candidate's events carry its index
        (OpenAI's choices[].index, llama.cpp's index); it has ended at its finish_reason
        or `stop`. OpenAI streams end with [DONE], llama.cpp's /infill stream does not:
        the reply is whole when [DONE] comes or every candidate has ended. Each event's
        log-probabilities are its own tokens': they add up per candidate (`_joined`)."""
        texts = [""] * n
        logprobs: list[list[float] | None] = [[] for _ in range(n)]
        seen: set[int] = set()
        ended: set[int] = set()
        done = False
        for step, event in enumerate(_sse_events(resp), 1):
            watcher.check()
            if event == "[DONE]":
                done = True
                break
            before = list(texts)
            chunk = _json(event.encode("utf-8"))
            if not isinstance(chunk, dict):
                raise RemoteError(f"{self.endpoint} sent a stream event that is not an object")
            for piece in reading.pieces(chunk):
                i = piece.candidate
                if 0 <= i < n:
                    texts[i] += piece.text
                    logprobs[i] = _joined(logprobs[i], piece)
                    seen.add(i)
                    if piece.ended:
                        ended.add(i)
            if control.on_draft is not None and texts != before:
                control.on_draft(step, list(texts))
            if len(ended) == n and reading.whole_when_all_stopped:
                done = True
                break
        watcher.check()
        # a server that gives fewer candidates than asked (one without `n`) ends those it gave
        if not done and not (ended and ended >= seen):
            raise RemoteError(f"{self.endpoint} cut the stream before the fill ended")
        resp.read()  # the rest (the last chunk's end), so the connection can be used again
        return [Written(t, lp) for t, lp in zip(texts, logprobs, strict=True)]


def _joined(so_far: list[float] | None, piece: Piece) -> list[float] | None:
    """A candidate's log-probabilities with a piece's added: a piece with text but none
    leaves the candidate without (a part missing would make the confidence a guess); a
    piece with neither (an end of stream) changes nothing."""
    if so_far is None or piece.logprobs is None:
        return None if piece.text else so_far
    return so_far + piece.logprobs


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RemoteError(f"the engine sent a reply that is not JSON ({len(raw)} bytes)") from exc


def _sse_events(resp: http.client.HTTPResponse) -> Iterator[str]:
    """The data of each server-sent event (multi-line data joined), until the stream ends."""
    data: list[str] = []
    while True:
        line = resp.readline(MAX_REPLY)
        if not line:
            if data:
                yield "\n".join(data)
            return
        text = line.decode("utf-8", "replace").rstrip("\r\n")
        if not text:
            if data:
                yield "\n".join(data)
                data = []
        elif text.startswith("data:"):
            data.append(text[5:].lstrip(" "))


def _error_message(raw: bytes) -> str:
    """The message of an error reply: OpenAI's {"error": {"message"}}, vLLM's and llama.cpp's
    {"error": {"message"}} / {"message"}, or the text itself, shortened."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        body = None
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"][:300]
        for key in ("message", "detail", "error"):
            if isinstance(body.get(key), str):
                return str(body[key])[:300]
    text = raw.decode("utf-8", "replace").strip()
    return (text[:300] or "no message").replace("\n", " ")


def _network_reason(exc: BaseException) -> str:
    if isinstance(exc, socket.gaierror):
        return "the host name does not resolve"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed ({exc.reason or exc})"
    if isinstance(exc, http.client.HTTPException):
        return f"a malformed HTTP reply ({exc.__class__.__name__})"
    return str(exc) or exc.__class__.__name__
