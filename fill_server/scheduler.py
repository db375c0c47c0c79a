"""The bounded queue and the one worker that holds the model.

Concurrent requests share one engine. The engine fills one request per call
(`Engine.fill`: one context, one cache state; the candidates of that request are the
only batch it makes), so fills from different clients cannot join one denoising batch
through it: they wait in a queue, and one worker thread runs them one at a time, in
order. docs/serve.md says what that means for throughput (bench/serve_bench.py).

- Bounded: at most `capacity` fills wait; the next is refused at once (`QueueFull`,
  a 429 with Retry-After: the median fill time times the queue ahead), never left to hang.
- Superseded: a request with a key (OpenAI's `user`, or the X-Diffusion-Document header)
  cancels the older request with the same key: a queued one is taken out before it
  computes and answered 409; a running one stops at the engine's next step.
- Cancelled: a client that disconnects sets its ticket's flag; a queued fill is taken
  out, a running one stops at the next step (`FillControl.cancel`).
- The worker loads the model first; until it has, requests are refused with 503 and
  Retry-After (`NotReady`), as llama.cpp's server does while loading.

A ticket reports to its request through `sink`, called on the worker thread with
("started",), ("draft", step, texts), ("done", Outcome) or ("failed", ApiError).
"""

from __future__ import annotations

import collections
import logging
import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.fill import Engine, FillControl
from fill_server.errors import ApiError
from fill_server.filling import run_fill
from fill_server.metrics import Metrics
from fill_server.schema import FillAsk

log = logging.getLogger(__name__)

Sink = Callable[[tuple[Any, ...]], None]
RECENT_FILLS = 32  # fill times kept for the Retry-After estimate
LOADING_RETRY_S = 2


@dataclass(eq=False)
class Ticket:
    """One request's fill, from the queue to its answer."""

    ask: FillAsk
    key: str | None
    sink: Sink
    cancel: threading.Event = field(default_factory=threading.Event)
    why: str | None = None  # why it was cancelled: "superseded", "disconnected", "shutdown"
    finished: bool = False  # its fill has ended (a late cancel changes nothing)
    enqueued: float = field(default_factory=time.monotonic)


class Scheduler:
    def __init__(self, loader: Callable[[], Engine], capacity: int, metrics: Metrics) -> None:
        self.loader, self.capacity, self.metrics = loader, capacity, metrics
        self.engine: Engine | None = None
        self.load_error: str | None = None
        self._queue: collections.deque[Ticket] = collections.deque()
        self._newest: dict[str, Ticket] = {}  # key -> its newest ticket
        self._running: Ticket | None = None
        self._recent: collections.deque[float] = collections.deque(maxlen=RECENT_FILLS)
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="diffusion-serve-worker", daemon=True)
        metrics.queue_depth = lambda: len(self._queue)
        metrics.running = lambda: int(self._running is not None)
        metrics.model_loaded = lambda: self.engine is not None

    @property
    def state(self) -> str:
        return "ok" if self.engine is not None else "error" if self.load_error else "loading"

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop the worker: queued fills are refused, a running one is cancelled."""
        with self._cond:
            self._closed = True
            for t in [*self._queue, *([self._running] if self._running else [])]:
                self._drop(t, "shutdown")
            self._cond.notify_all()
        self._thread.join(timeout=10)
        if self.engine is not None:
            self.engine.close()

    def submit(self, ask: FillAsk, key: str | None, sink: Sink) -> Ticket:
        """Queue a fill; raises ApiError 503 (not loaded) or 429 (the queue is full)."""
        self._check_ready()
        ticket = Ticket(ask, key, sink)
        with self._cond:
            if key is not None and (old := self._newest.get(key)) is not None:
                self._drop(old, "superseded")
            if len(self._queue) >= self.capacity:
                raise ApiError(
                    429,
                    f"the server is busy ({len(self._queue)} fills waiting); retry later",
                    kind="rate_limit_error",
                    headers={"Retry-After": str(self.retry_after())},
                )
            if key is not None:
                self._newest[key] = ticket
            self._queue.append(ticket)
            self._cond.notify()
        return ticket

    def cancel(self, ticket: Ticket, why: str) -> None:
        """The client left (or was superseded): the fill never starts, or stops at its next step."""
        with self._cond:
            self._drop(ticket, why)

    def retry_after(self) -> int:
        """Seconds until a place in the queue is likely free: the median fill, times the fills ahead."""
        per_fill = statistics.median(self._recent) if self._recent else 1.0
        return max(1, math.ceil(per_fill * (len(self._queue) + 1)))

    def _check_ready(self) -> None:
        if self.engine is not None and not self._closed:
            return
        if self.load_error is not None:
            raise ApiError(503, f"the model failed to load: {self.load_error}", kind="server_error")
        retry = {"Retry-After": str(LOADING_RETRY_S)}
        message = "the server is shutting down" if self._closed else "the model is loading"
        raise ApiError(503, message, kind="server_error", headers=retry)

    def _drop(self, ticket: Ticket, why: str) -> None:
        """Under the lock: cancel `ticket` (a queued one leaves the queue and is answered now)."""
        if ticket.cancel.is_set() or ticket.finished:
            return
        ticket.why = why
        ticket.cancel.set()
        self.metrics.cancel(why)
        if ticket.key is not None and self._newest.get(ticket.key) is ticket:
            del self._newest[ticket.key]
        if ticket in self._queue:
            self._queue.remove(ticket)
            _report(ticket, ("failed", cancelled_error(why)))

    def _work(self) -> None:
        """The worker: load the model, then run queued fills one at a time."""
        try:
            self.engine = self.loader()
        except Exception as exc:  # a broken model directory: /health and every fill say why
            log.exception("the model failed to load")
            self.load_error = str(exc) or type(exc).__name__
            return
        log.info("the model is loaded")
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                ticket = self._running = self._queue.popleft()
            self._run(ticket)

    def _run(self, ticket: Ticket) -> None:
        assert self.engine is not None
        ask, started = ticket.ask, time.monotonic()
        _report(ticket, ("started",))
        deadline = started + ask.deadline_ms / 1000 if ask.deadline_ms is not None else None
        on_draft = (lambda step, texts: _report(ticket, ("draft", step, texts))) if ask.drafts else None
        control = FillControl(deadline=deadline, cancel=ticket.cancel.is_set, on_draft=on_draft)
        try:
            outcome = run_fill(self.engine, ask, control)
        except Exception as exc:  # an engine bug: this request fails, the server goes on
            log.exception("the fill failed")
            self._finish(ticket, ("failed", ApiError(500, f"the fill failed: {exc}", kind="server_error")))
            return
        self._recent.append(outcome.fill_s)
        self.metrics.fill(
            outcome.fill_s, started - ticket.enqueued, outcome.prompt_tokens, outcome.completion_tokens, outcome.steps
        )
        self._finish(ticket, ("failed", cancelled_error(ticket.why)) if ticket.why else ("done", outcome))

    def _finish(self, ticket: Ticket, event: tuple[Any, ...]) -> None:
        with self._cond:
            ticket.finished = True
            self._running = None
            if ticket.key is not None and self._newest.get(ticket.key) is ticket:
                del self._newest[ticket.key]
        _report(ticket, event)


def cancelled_error(why: str) -> ApiError:
    if why == "superseded":
        return ApiError(409, "superseded by a newer request for the same user or document", kind="superseded")
    if why == "shutdown":
        return ApiError(503, "the server is shutting down", kind="server_error")
    return ApiError(499, "the client closed the request", kind="cancelled")


def _report(ticket: Ticket, event: tuple[Any, ...]) -> None:
    try:
        ticket.sink(event)
    except Exception:  # a request whose event loop is gone: nobody is listening
        log.debug("a fill's event was not delivered", exc_info=True)
