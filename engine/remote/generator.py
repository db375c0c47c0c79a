"""Remote engines: whole fills from an inference server the user's team runs.

A remote engine is not a Denoiser: it returns whole fills. It is a generator behind the
one engine (engine.fill), so everything around a fill is the same as for a local one: the
span and its length budget (sent as max_tokens) are planned before the request, and the
replies go through the same dedupe, indentation fit, validation and truncation.
`remote_engine(cfg)` is that engine.

Dialects (docs/remote.md says what each sends):
- "vllm": OpenAI `/v1/completions` with the prompt rendered here exactly as the local
  DiffusionGemma path renders it, `<|fim_suffix|>S<|fim_prefix|>P<|fim_middle|>` (vLLM
  refuses a `suffix` field for diffusion models);
- "openai-fim": OpenAI-style FIM, `prompt` + `suffix` (`/v1/completions`, or the hosted
  `/v1/fim/completions` with `path`);
- "llama-infill": llama.cpp's `llama-server` `/infill` (`input_prefix`, `input_suffix`,
  `input_extra`, `n_predict`, `t_max_predict_ms`, `cache_prompt`);
- "chat": OpenAI `/v1/chat/completions` (hosted endpoints, vLLM's and llama.cpp's chat
  routes, Ollama): the fill asked for in words with a hole marker, the answer taken apart
  (engine.remote.chat) before the span check.

The wire: one kept-alive connection (no new TLS handshake for a warm fill); every reply is
streamed (SSE), drafts or not. Newest request wins on the wire too: a watcher shuts the
socket down the moment the request is cancelled or its deadline passes, and an engine
notices a client that left only when it writes to it: llama.cpp's server went on
computing a non-streamed fill for seconds after its client had gone (measured against
the real engine, tests/engine/test_real_engine.py), a streamed one stops at its next
token. Faults (refused,
DNS, timeouts, HTTP errors, malformed or cut replies) become a `RemoteError` message and
an empty answer; after an unreachable endpoint or a 5xx the engine backs off
(1 s doubling to 30 s) instead of being hammered on every keystroke.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from engine.candidate import Candidate
from engine.decoding import CANDIDATE_TEMPERATURE
from engine.errors import EngineError
from engine.fill import Engine, FillControl, FillLimits, FillOptions, InfillResult, Job
from engine.models.tokenizer import Tokenizer
from engine.remote import chat

log = logging.getLogger(__name__)

Dialect = Literal["vllm", "openai-fim", "llama-infill", "chat"]
DIALECTS: tuple[Dialect, ...] = ("vllm", "openai-fim", "llama-infill", "chat")
DEFAULT_PATHS: dict[str, str] = {
    "vllm": "/v1/completions",
    "openai-fim": "/v1/completions",
    "llama-infill": "/infill",
    "chat": "/v1/chat/completions",
}
CHAT_SLACK_TOKENS = 16  # a chat answer's code fence and language tag, on top of the fill's budget
# DiffusionGemma's infill tokens (engine.models.directory.DG_SPECIAL_TOKENS), in the order infill puts them
FIM_TOKENS = ("<|fim_suffix|>", "<|fim_prefix|>", "<|fim_middle|>")
DEFAULT_BUDGET = 64  # max_tokens without a span (no language)
CONTEXT_CHARS = 12_000  # characters of context sent (the engine's tokenizer is not here)
SUFFIX_SHARE = 0.25  # ... of which the code after the cursor gets at most this
MAX_ERROR_BODY = 65_536  # bytes of an error reply read for its message
MAX_REPLY = 16 << 20  # bytes of a reply, past which it is refused
BACKOFF_START_S, BACKOFF_MAX_S = 1.0, 30.0
WATCH_S = 0.01  # how often the watcher checks cancel and the deadline


class RemoteError(EngineError):
    """The remote engine could not give a fill; the message is for the user."""


@dataclass(frozen=True)
class RemoteConfig:
    endpoint: str  # http(s)://host[:port][/base]
    dialect: Dialect = "vllm"
    model: str | None = None  # the served model's name; None: not sent (llama-server) or the server's
    path: str | None = None  # None: the dialect's
    api_key_env: str | None = None  # the environment variable that holds the API key
    timeout_s: float = 10.0  # connecting, and waiting for each piece of the reply
    verify_tls: bool = True
    context_chars: int = CONTEXT_CHARS
    fim_tokens: tuple[str, str, str] = FIM_TOKENS


@dataclass
class _Backoff:
    until: float = 0.0
    delay: float = BACKOFF_START_S
    reason: str = ""

    def fail(self, reason: str) -> None:
        self.until, self.reason = time.monotonic() + self.delay, reason
        self.delay = min(self.delay * 2, BACKOFF_MAX_S)

    def ok(self) -> None:
        self.until, self.delay, self.reason = 0.0, BACKOFF_START_S, ""


class _Cancelled(Exception):
    pass


class _Watcher:
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

    def stop(self) -> None:
        self._done.set()


@dataclass
class _Reply:
    texts: list[str] = field(default_factory=list)  # one per candidate


class RemoteGenerator:
    """Fills through an inference server; one request at a time (the server's worker)."""

    tokenizer: Tokenizer | None = None  # the engine's tokenizer is not here: candidates carry text only
    languages: frozenset[str] | None = None  # a served model is not limited to the embedded model's languages
    # no tokenizer here: about 3 characters a token for a region's length
    CHARS_PER_TOKEN = 3

    def __init__(self, cfg: RemoteConfig) -> None:
        if cfg.dialect not in DIALECTS:
            raise RemoteError(f"unknown dialect {cfg.dialect!r}; choose one of {', '.join(DIALECTS)}")
        url = urlsplit(cfg.endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise RemoteError(f"endpoint {cfg.endpoint!r} is not an http:// or https:// URL")
        self.cfg = cfg
        self._url = url
        self._path = url.path.rstrip("/") + (cfg.path or DEFAULT_PATHS[cfg.dialect])
        self._conn: http.client.HTTPConnection | None = None
        self._backoff = _Backoff()
        self.requests = 0  # sent to the engine (for tests and stats)
        self.limits = FillLimits(default=DEFAULT_BUDGET, longest=None, hard=None)

    @property
    def takes_extra_files(self) -> bool:
        """Whether the dialect sends repository context (llama-server's input_extra)."""
        return self.cfg.dialect == "llama-infill"

    def count_tokens(self, text: str) -> int:
        return len(text) // self.CHARS_PER_TOKEN

    def reset(self) -> None:
        pass

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def generate(self, job: Job) -> InfillResult:
        """The candidates the server writes for the job's budget; sampling options are
        the server's own (it decodes as its operators configured it)."""
        t0 = time.perf_counter()
        req, plan = job.request, job.plan
        result = InfillResult(candidates=[], canvas_tokens=job.budget)
        try:
            if time.monotonic() < self._backoff.until:  # the same message: the user is told once
                raise RemoteError(self._backoff.reason)
            prefix, suffix = self._trim(req.prefix, req.suffix)
            n = max(1, int(req.candidates))
            single = plan is not None and not plan.span.multiline
            body = self._body(prefix, suffix, job.budget, n, single, job)
            if self.cfg.dialect == "chat" and job.control.on_draft is not None:
                job = _extracting_drafts(job, prefix, suffix)
            reply = self._post(body, n, job)
        except _Cancelled as why:
            result.stop_reason = str(why)
            return result
        except RemoteError as exc:
            result.stop_reason, result.error = "error", str(exc)
            result.warnings.append(str(exc))
            return result
        finally:
            result.denoise_ms = (time.perf_counter() - t0) * 1000
        texts = reply.texts
        if self.cfg.dialect == "chat":
            texts = [chat.extract_fill(t, prefix, suffix) for t in texts]
        result.candidates = [Candidate(text=text, token_ids=[], confidence=[]) for text in texts]
        return result

    def _trim(self, prefix: str, suffix: str) -> tuple[str, str]:
        """The code nearest the cursor within the character budget, cut at line starts."""
        room = self.cfg.context_chars
        if len(suffix) > room * SUFFIX_SHARE:
            cut = suffix.rfind("\n", 0, int(room * SUFFIX_SHARE))
            suffix = suffix[: cut + 1] if cut >= 0 else suffix[: int(room * SUFFIX_SHARE)]
        room -= len(suffix)
        if len(prefix) > room:
            start = len(prefix) - room
            nl = prefix.find("\n", start)
            prefix = prefix[nl + 1 :] if nl != -1 else prefix[start:]
        return prefix, suffix

    def _body(self, prefix: str, suffix: str, budget: int, n: int, single: bool, job: Job) -> dict[str, Any]:
        cfg = self.cfg
        stream = True  # an engine stops a streamed fill when its client leaves (see the module's docstring)
        temperature = CANDIDATE_TEMPERATURE if n > 1 else 0.0
        stop = ["\n"] if single and not prefix.endswith(("\n", "\r")) else None
        if cfg.dialect == "llama-infill":
            body: dict[str, Any] = {
                "input_prefix": prefix,
                "input_suffix": suffix,
                "input_extra": [{"filename": name, "text": text} for name, text in job.request.extra_files],
                "n_predict": budget,
                "cache_prompt": True,
                "temperature": temperature,
                "stream": stream,
            }
            if n > 1:  # llama-server streams the n candidates indexed, each ended by its `stop`
                body["n"] = n
            if job.control.deadline is not None:
                body["t_max_predict_ms"] = max(1, int((job.control.deadline - time.monotonic()) * 1000))
            if stop:
                body["stop"] = stop
        elif cfg.dialect == "chat":
            plan = job.plan
            span = plan.span.kind if plan is not None else None
            body = {"messages": chat.messages(prefix, suffix, job.request.language, span, single)}
            body.update(max_tokens=budget + CHAT_SLACK_TOKENS, temperature=temperature, stream=stream)
            if n > 1:
                body["n"] = n
        else:
            if cfg.dialect == "vllm":
                suf, pre, mid = cfg.fim_tokens
                body = {"prompt": f"{suf}{suffix}{pre}{prefix}{mid}"}
            else:
                body = {"prompt": prefix, "suffix": suffix}
            body.update(max_tokens=budget, temperature=temperature, stream=stream)
            if n > 1:
                body["n"] = n
            if stop:
                body["stop"] = stop
        if cfg.model:
            body["model"] = cfg.model
        return body

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        env = self.cfg.api_key_env
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
        host, port, timeout = self._url.hostname or "", self._url.port, self.cfg.timeout_s
        if self._url.scheme == "https":
            ctx = ssl.create_default_context()
            if not self.cfg.verify_tls:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self._conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=ctx)
        else:
            self._conn = http.client.HTTPConnection(host, port, timeout=timeout)
        return self._conn, False

    def _post(self, body: dict[str, Any], n: int, job: Job) -> _Reply:
        data = json.dumps(body).encode("utf-8")
        headers = self._headers()
        for attempt in (0, 1):
            conn, reused = self._connection()
            watcher = _Watcher(conn, job.control.cancel, job.control.deadline)
            try:
                self.requests += 1
                conn.request("POST", self._path, body=data, headers=headers)
                resp = conn.getresponse()
                reply = self._read(resp, n, job, watcher)
                if resp.will_close:
                    self.close()
                self._backoff.ok()
                return reply
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                self.close()
                if watcher.fired:
                    raise _Cancelled(watcher.fired) from exc
                if reused and attempt == 0:  # the server closed an idle kept-alive connection
                    continue
                raise self._unreachable(f"{self.cfg.endpoint} closed the connection") from exc
            except (_Cancelled, RemoteError):
                self.close()
                raise
            except TimeoutError as exc:
                self.close()
                if watcher.fired:
                    raise _Cancelled(watcher.fired) from exc
                raise self._unreachable(f"{self.cfg.endpoint} did not answer in {self.cfg.timeout_s:g} s") from exc
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if watcher.fired:
                    raise _Cancelled(watcher.fired) from exc
                raise self._unreachable(f"cannot reach {self.cfg.endpoint}: {_network_reason(exc)}") from exc
            finally:
                watcher.stop()
        raise AssertionError("unreachable")

    def _unreachable(self, message: str) -> RemoteError:
        """The error for a fault that asks for a pause: requests in the next seconds
        (1, doubling to 30) get the same message at once, without a request."""
        self._backoff.fail(message)
        return RemoteError(message)

    def _read(self, resp: http.client.HTTPResponse, n: int, job: Job, watcher: _Watcher) -> _Reply:
        if resp.status != 200:
            message = _error_message(resp.read(MAX_ERROR_BODY))
            error = f"{self.cfg.endpoint} answered HTTP {resp.status}: {message}"
            raise self._unreachable(error) if resp.status >= 500 else RemoteError(error)
        ctype = resp.getheader("Content-Type", "")
        if "text/event-stream" in ctype:
            return self._read_stream(resp, n, job, watcher)
        try:
            raw = resp.read(MAX_REPLY + 1)
        except http.client.IncompleteRead as exc:
            if watcher.fired:
                raise _Cancelled(watcher.fired) from exc
            raise RemoteError(f"{self.cfg.endpoint} cut its reply short") from exc
        if watcher.fired:
            raise _Cancelled(watcher.fired)
        length = resp.getheader("Content-Length", "")
        if length.isdigit() and len(raw) < int(length):
            raise RemoteError(f"{self.cfg.endpoint} cut its reply short")
        if len(raw) > MAX_REPLY:
            raise RemoteError(f"{self.cfg.endpoint} sent a reply over {MAX_REPLY >> 20} MB")
        return _Reply(self._texts(_json(raw), n))

    def _read_stream(self, resp: http.client.HTTPResponse, n: int, job: Job, watcher: _Watcher) -> _Reply:
        """The candidates of a streamed reply. Each candidate's events carry its index
        (OpenAI's choices[].index, llama.cpp's index); it has ended at its finish_reason
        or `stop`. OpenAI streams end with [DONE], llama.cpp's /infill stream does not:
        the reply is whole when [DONE] comes or every candidate has ended."""
        texts = [""] * n
        seen: set[int] = set()
        ended: set[int] = set()
        done = False
        for step, event in enumerate(_sse_events(resp), 1):
            if watcher.fired:
                raise _Cancelled(watcher.fired)
            if event == "[DONE]":
                done = True
                break
            before = list(texts)
            chunk = _json(event.encode("utf-8"))
            for i, piece, end in self._pieces(chunk):
                if 0 <= i < n:
                    texts[i] += piece
                    seen.add(i)
                    if end:
                        ended.add(i)
            if job.control.on_draft is not None and texts != before:
                job.control.on_draft(step, list(texts))
            if len(ended) == n and self.cfg.dialect == "llama-infill":
                done = True
                break
        if watcher.fired:
            raise _Cancelled(watcher.fired)
        # a server that gives fewer candidates than asked (one without `n`) ends those it gave
        if not done and not (ended and ended >= seen):
            raise RemoteError(f"{self.cfg.endpoint} cut the stream before the fill ended")
        resp.read()  # the rest (the last chunk's end), so the connection can be used again
        return _Reply(texts)

    # -- replies
    def _texts(self, reply: Any, n: int) -> list[str]:
        if self.cfg.dialect == "llama-infill":  # one object, or a list of them (n > 1), with content
            items = reply if isinstance(reply, list) else [reply]
            if not items or not all(isinstance(r, dict) and isinstance(r.get("content"), str) for r in items):
                raise RemoteError(f"{self.cfg.endpoint} sent a reply without content")
            reply = {"choices": [{"index": r.get("index", k), "text": r["content"]} for k, r in enumerate(items)]}
        choices = reply.get("choices") if isinstance(reply, dict) else None
        if not isinstance(choices, list):
            raise RemoteError(f"{self.cfg.endpoint} sent a reply without choices")
        if not choices:
            raise RemoteError(f"{self.cfg.endpoint} sent no choices")
        texts = [""] * len(choices)
        for k, c in enumerate(choices):
            text = self._choice_text(c)
            if text is None:
                raise RemoteError(f"{self.cfg.endpoint} sent a choice without text")
            i = c.get("index", k)
            texts[i if isinstance(i, int) and 0 <= i < len(texts) else k] = text
        return texts[:n]

    def _choice_text(self, choice: Any) -> str | None:
        """A whole reply's choice: its `text`, or for chat its message's `content` (None,
        as a model that says nothing sends it, is an empty answer)."""
        if not isinstance(choice, dict):
            return None
        if self.cfg.dialect != "chat":
            return choice["text"] if isinstance(choice.get("text"), str) else None
        message = choice.get("message")
        if not isinstance(message, dict):
            return None
        content = message.get("content")
        return content if isinstance(content, str) else "" if content is None else None

    def _pieces(self, chunk: Any) -> Iterator[tuple[int, str, bool]]:
        """(candidate, text, ended) of one streamed chunk."""
        if not isinstance(chunk, dict):
            raise RemoteError(f"{self.cfg.endpoint} sent a stream event that is not an object")
        if self.cfg.dialect == "llama-infill":
            i = chunk.get("index", 0)
            yield (i if isinstance(i, int) else 0), str(chunk.get("content", "")), bool(chunk.get("stop", False))
            return
        for k, c in enumerate(chunk.get("choices") or []):
            if isinstance(c, dict):
                i = c.get("index", k)
                piece = c.get("text")
                if self.cfg.dialect == "chat":  # chat streams the message's pieces as deltas
                    delta = c.get("delta")
                    piece = delta.get("content") if isinstance(delta, dict) else None
                yield (i if isinstance(i, int) else k), str(piece or ""), c.get("finish_reason") is not None


def _extracting_drafts(job: Job, prefix: str, suffix: str) -> Job:
    """The job with drafts shown as the code the chat answer holds so far."""
    show = job.control.on_draft
    assert show is not None

    def on_draft(step: int, texts: list[str]) -> None:
        show(step, [chat.extract_fill(t, prefix, suffix) for t in texts])

    control = FillControl(deadline=job.control.deadline, cancel=job.control.cancel, on_draft=on_draft)
    return Job(job.request, job.options, control, job.plan, job.budget, job.warnings)


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


def remote_engine(cfg: RemoteConfig, options: FillOptions | None = None) -> Engine:
    """The engine over an inference server."""
    return Engine(RemoteGenerator(cfg), options)
