"""The fill server on the shipped model, once for the tests of this folder that need it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from fill_server.config import ServeConfig  # noqa: E402
from tests.serve.harness import Running, running  # noqa: E402


def shipped_engine():  # type: ignore[no-untyped-def]
    from engine.denoisers.loading import load_model
    from engine.local.generator import local_engine

    return local_engine(load_model())


@pytest.fixture(scope="session")
def shipped() -> Iterator[Running]:
    """The shipped model behind the app, in this process, on 127.0.0.1 and an ephemeral port."""
    with running(shipped_engine, ServeConfig(port=0, queue_size=8)) as server:
        assert server.server.scheduler.state == "ok", server.server.scheduler.load_error
        yield server
