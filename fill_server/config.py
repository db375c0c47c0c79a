"""ServeConfig: what the command line sets for the fill server."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_HOST = "127.0.0.1"  # loopback unless told otherwise
DEFAULT_PORT = 8000
DEFAULT_QUEUE = 16  # fills waiting for the model; the next one is answered 429
DEFAULT_MAX_BODY = 2 << 20  # bytes of a request body (a file's worth of context and more)
KEEPALIVE_S = 5.0  # an SSE comment this often while a streamed fill waits or runs


@dataclass(frozen=True)
class ServeConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    model_name: str = "diffusion-lsp"  # what GET /v1/models lists and replies carry as `model`
    api_key_env: str | None = None
    insecure_no_key: bool = False
    queue_size: int = DEFAULT_QUEUE
    max_body_bytes: int = DEFAULT_MAX_BODY
    allow_unknown_fields: bool = False
    keepalive_s: float = KEEPALIVE_S
