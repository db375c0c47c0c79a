"""The Starlette application: the routes, and handlers that only read, queue and answer.

    POST /v1/completions       OpenAI's completions with `suffix` (vLLM, llama.cpp accept it so)
    POST /v1/fim/completions   Mistral's and Mercury's FIM form
    POST /infill               llama.cpp's `input_prefix` / `input_suffix` / `input_extra`
    GET  /v1/models            the one model served
    GET  /health               whether the model is loaded (200) or not yet / failed (503); no key needed
    GET  /metrics              Prometheus text

A fill handler: check the key, read and validate the body (schema, body), queue the fill
(scheduler), wait for it while watching the client (stream), and render the answer
(replies). Every refusal is an ApiError with an OpenAI-style body; a route or method that
does not exist gets the same shape.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.fill import Engine
from fill_server import replies, stream
from fill_server.auth import ApiKey
from fill_server.body import read_json
from fill_server.config import ServeConfig
from fill_server.errors import ApiError
from fill_server.metrics import Metrics
from fill_server.scheduler import Scheduler, cancelled_error
from fill_server.schema import Dialect, fill_ask

log = logging.getLogger(__name__)

DOCUMENT_HEADER = "x-diffusion-document"  # names the document: a newer request for it supersedes this one
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"
ANSWERED = frozenset({"done", "failed"})
STARTED = frozenset({"started", "failed"})


class Server:
    """What the handlers share: the settings, the key, the scheduler and the metrics."""

    def __init__(self, config: ServeConfig, loader: Callable[[], Engine], key: ApiKey) -> None:
        self.config, self.key = config, key
        self.metrics = Metrics()
        self.scheduler = Scheduler(loader, config.queue_size, self.metrics)

    def authorize(self, request: Request) -> None:
        if not self.key.allows(request.headers.get("authorization")):
            message = "a valid API key is required (Authorization: Bearer KEY)"
            raise ApiError(401, message, kind="authentication_error", headers={"WWW-Authenticate": "Bearer"})

    async def fill(self, request: Request, dialect: Dialect) -> Response:
        self.authorize(request)
        ask = fill_ask(await read_json(request, self.config.max_body_bytes), dialect, self.config.allow_unknown_fields)
        channel = stream.Channel()
        key = request.headers.get(DOCUMENT_HEADER) or ask.user
        ticket = self.scheduler.submit(ask, key, channel.put)
        event = await stream.wait_for(request, channel, STARTED if ask.stream else ANSWERED)
        if event is None:  # the client left: its fill never starts, or stops at the next step
            self.scheduler.cancel(ticket, "disconnected")
            raise cancelled_error("disconnected")
        if event[0] == "failed":
            raise event[1]
        rid, model = replies.completion_id(), self.config.model_name
        if not ask.stream:
            return JSONResponse(replies.whole(dialect, event[1], model, rid))
        render = stream.renderer(dialect, model, rid)
        body = stream.events(channel, ticket, self.scheduler, render, self.config.keepalive_s)
        return StreamingResponse(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def models(self, request: Request) -> Response:
        self.authorize(request)
        entry = {"id": self.config.model_name, "object": "model", "created": 0, "owned_by": "diffusion-lsp"}
        return JSONResponse({"object": "list", "data": [entry]})

    async def health(self, request: Request) -> Response:
        s = self.scheduler
        body: dict[str, Any] = {"status": s.state, "model": self.config.model_name, "loaded": s.engine is not None}
        if s.load_error:
            body["error"] = s.load_error
        return JSONResponse(body, status_code=200 if s.engine is not None else 503)

    async def prometheus(self, request: Request) -> Response:
        self.authorize(request)
        return PlainTextResponse(self.metrics.render(), media_type=PROMETHEUS)


def create_app(config: ServeConfig, loader: Callable[[], Engine], key: ApiKey | None = None) -> Starlette:
    """The application; the model loads on the worker when the app starts."""
    server = Server(config, loader, key or ApiKey(None))

    def fill_route(path: str, dialect: Dialect) -> Route:
        async def handler(request: Request) -> Response:
            return await server.fill(request, dialect)

        return Route(path, handler, methods=["POST"])

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        server.scheduler.start()
        yield
        server.scheduler.close()

    routes = [
        fill_route("/v1/completions", "completions"),
        fill_route("/v1/fim/completions", "fim"),
        fill_route("/infill", "infill"),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/metrics", server.prometheus, methods=["GET"]),
    ]
    handlers: Any = {ApiError: _api_error, HTTPException: _http_error, Exception: _internal_error}
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    app.state.server = server
    app.add_middleware(CountRequests, metrics=server.metrics, routes=frozenset(r.path for r in routes))
    return app


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return await _api_error(request, ApiError(exc.status_code, str(exc.detail), headers=dict(exc.headers or {})))


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("internal error on %s", request.url.path)
    return await _api_error(request, ApiError(500, f"internal error: {type(exc).__name__}", kind="server_error"))


class CountRequests:
    """Counts every answer by route and status (unknown paths as one route, "other")."""

    def __init__(self, app: ASGIApp, metrics: Metrics, routes: frozenset[str]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in self.routes else "other"
        counted = False

        async def counting_send(message: Message) -> None:
            nonlocal counted
            if message["type"] == "http.response.start" and not counted:
                counted = True
                self.metrics.request(route, int(message["status"]))
            await send(message)

        await self.app(scope, receive, counting_send)
