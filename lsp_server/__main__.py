"""`diffusion-lsp`: start the server on stdio (default) or TCP. Stdout is the protocol:
logs go to the client (window/logMessage), stderr, or --log-file, never to stdout."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Sequence


class _ClientLogHandler(logging.Handler):
    """Forward log records to the client as window/logMessage."""

    def __init__(self, server: object) -> None:
        super().__init__(logging.INFO)
        self.server = server

    _state = threading.local()  # per thread: a message logged while sending one is dropped

    def emit(self, record: logging.LogRecord) -> None:
        from lsprotocol import types

        if getattr(self._state, "busy", False):
            return

        kind = (
            types.MessageType.Error
            if record.levelno >= logging.ERROR
            else (types.MessageType.Warning if record.levelno >= logging.WARNING else types.MessageType.Log)
        )
        self._state.busy = True
        try:
            self.server.window_log_message(types.LogMessageParams(kind, self.format(record)))  # type: ignore[attr-defined]
        except Exception:  # no client yet, or it went away: logging must never fail a request
            pass
        finally:
            self._state.busy = False


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="diffusion-lsp", description="Language server for diffusion-model code infill.")
    p.add_argument("--tcp", metavar="HOST:PORT", help="serve over TCP instead of stdio")
    p.add_argument("--model", help="model directory (default: the shipped model)")
    p.add_argument("--log-file", help="also write the log to this file")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    args = p.parse_args(argv)

    from lsp_server.server import create_server

    server = create_server(args.model)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if args.log_file:
        handlers.append(logging.FileHandler(args.log_file, encoding="utf-8"))
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        handlers=handlers,
        force=True,
        format="%(asctime)s %(name)s %(levelname)s: %(message)s",
    )
    # our own messages also go to the client; pygls's do not (they would loop when the
    # transport is gone)
    to_client = _ClientLogHandler(server)
    for name in ("engine", "lsp_server"):
        logging.getLogger(name).addHandler(to_client)
        logging.getLogger(name).setLevel(logging.DEBUG if args.verbose else logging.INFO)
    if args.tcp:
        host, _, port = args.tcp.rpartition(":")
        server.start_tcp(host or "127.0.0.1", int(port))
    else:
        server.start_io()
    return 0


if __name__ == "__main__":
    sys.exit(main())
