"""A request's side of its fill: the channel the worker reports on, waiting for it while
watching for the client to leave, and the server-sent event stream.

A client that disconnects stops its fill: while a request waits (queued, or a whole
reply being computed) a watcher reads the connection's `http.disconnect`; once a stream
has begun, Starlette's StreamingResponse listens for it and cancels the stream, whose
`finally` cancels the ticket. Either way the scheduler takes a queued fill out, and a
running one stops at the engine's next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request

from fill_server import replies
from fill_server.scheduler import Scheduler, Ticket
from fill_server.schema import Dialect


class Channel:
    """Events from the worker thread, delivered on the request's event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

    def put(self, event: tuple[Any, ...]) -> None:
        """Thread-safe: called on the worker."""
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (the body has been read: nothing else comes)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def wait_for(request: Request, channel: Channel, kinds: frozenset[str]) -> tuple[Any, ...] | None:
    """The first event of one of `kinds` (drafts before it are dropped), or None when the
    client disconnected first."""
    leaving = asyncio.ensure_future(_disconnected(request))
    try:
        while True:
            getting = asyncio.ensure_future(channel.queue.get())
            done, _ = await asyncio.wait({getting, leaving}, return_when=asyncio.FIRST_COMPLETED)
            if getting not in done:
                getting.cancel()
                return None
            event = getting.result()
            if event[0] in kinds:
                return event
    finally:
        leaving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await leaving


def sse(data: Any) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()


async def events(
    channel: Channel,
    ticket: Ticket,
    scheduler: Scheduler,
    render: Callable[[Any], list[Any]],
    keepalive_s: float,
) -> AsyncIterator[bytes]:
    """The stream of a started fill: drafts (when asked), a comment every `keepalive_s`
    while nothing else comes, then the final events (or an error event)."""
    finished = False
    try:
        while True:
            try:
                event = await asyncio.wait_for(channel.queue.get(), keepalive_s)
            except TimeoutError:
                yield b": keep-alive\n\n"
                continue
            if event[0] == "draft":
                for item in render(event):
                    yield sse(item)
                continue
            finished = True
            if event[0] == "done":
                for item in render(event):
                    yield sse(item)
            else:
                yield sse(event[1].body())
            return
    finally:
        if not finished:
            scheduler.cancel(ticket, "disconnected")


def renderer(dialect: Dialect, model: str, rid: str) -> Callable[[Any], list[Any]]:
    """How a draft or done event becomes the stream's JSON items."""

    def render(event: tuple[Any, ...]) -> list[Any]:
        if event[0] == "draft":
            return replies.draft_event(dialect, event[1], event[2], model, rid)
        return replies.final_events(dialect, event[1], model, rid)

    return render
