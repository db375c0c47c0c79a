"""`diffusion-infill serve`: check the bind, open the socket, run uvicorn on the app.

The socket is bound here, before uvicorn starts, so that `--port 0` (an ephemeral port,
for tests and benchmarks) can be reported: the line `listening on http://HOST:PORT` goes
to stderr once the socket is open (stdout stays empty). The model loads on the worker
once the app starts; `GET /health` says when it is ready.
"""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Callable

import uvicorn

from engine.errors import InputError
from engine.fill import Engine
from fill_server.app import create_app
from fill_server.auth import ApiKey, check_bind
from fill_server.config import ServeConfig

log = logging.getLogger(__name__)
TIMEOUT_KEEP_ALIVE_S = 30  # editors send a request every few keystrokes: keep their connection


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (IPv6 when the host is an IPv6 address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(socket.SOMAXCONN)
    sock.set_inheritable(True)
    return sock


def serve(config: ServeConfig, loader: Callable[[], Engine], verbose: bool = False) -> int:
    """Run the server until interrupted; returns the exit status."""
    key = ApiKey.from_env(config.api_key_env)
    check_bind(config.host, key, config.insecure_no_key)
    app = create_app(config, loader, key)
    try:
        sock = bind(config.host, config.port)
    except OSError as exc:
        raise InputError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from None
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    sys.stderr.write(f"diffusion-infill serve: listening on http://{shown}:{port} (model {config.model_name})\n")
    sys.stderr.flush()
    uv = uvicorn.Config(
        app,
        log_level="info" if verbose else "warning",
        timeout_keep_alive=TIMEOUT_KEEP_ALIVE_S,
        server_header=False,
        access_log=verbose,
    )
    uvicorn.Server(uv).run(sockets=[sock])
    return 0
