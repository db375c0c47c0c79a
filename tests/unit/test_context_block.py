"""When a document's repository context is chosen again (FillService.pieces, `_paused`):
never on a keystroke, whatever the line (the block comes first in the prompt: a new one is
encoded again whole, and in a real project the windows most like the code around the cursor
change every few lines); at a pause, at the last request's place, where a new block is
encoded ahead on the worker (`encodeWhenIdle`) and becomes the document's only once it is
all encoded; work handed to the worker stops that encoding. The engine here is a stand-in
that records what it is asked (the real warm: tests/engine/test_warm.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest

from engine.fill import InfillRequest
from lsp_server import service
from lsp_server.reuse import Job
from lsp_server.service import INLINE, TYPING_PAUSE_S, FillService
from lsp_server.settings import Settings

URI = "file:///project/main.py"
FILES = [
    ("stock.py", "RECOUNT_BATCH = 40\n\n\ndef recount(lines):\n    return lines[:RECOUNT_BATCH]\n"),
    ("prices.py", "def unit_price(item):\n    return item.cents / 100\n"),
]
TEXT = "from stock import recount\n\n\ndef audit(lines):\n    return "


class Warming:
    """What the service asks of the engine for repository context: its budget, and to
    encode a request ahead (each call waits for `go`, then stops if `stop()` says)."""

    def __init__(self) -> None:
        self.warmed: list[InfillRequest] = []
        self.go = threading.Event()
        self.go.set()

    def repository_chars(self) -> int:
        return 10_000

    def warm(self, req: InfillRequest, stop: Callable[[], bool]) -> bool:
        self.go.wait(5)
        if stop():
            return False
        self.warmed.append(req)
        return True


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(service.time, "monotonic", lambda: now[0])
    return now


def started(encode_when_idle: bool = True) -> tuple[FillService, Warming, list[int]]:
    fills = FillService()
    fills.settings = Settings(encode_when_idle=encode_when_idle)
    engine = Warming()
    fills.engine = engine  # type: ignore[assignment]
    fills.opened(URI, TEXT)
    return fills, engine, []


def ask(fills: FillService, asked: list[int], prefix: str) -> Any:
    """What a request at the end of `prefix` gets, as the handler asks for it, and the
    request the service then sees (`fill` records it)."""

    def files() -> list[tuple[str, str]]:
        asked.append(len(asked))
        return FILES

    pieces = fills.pieces(URI, files, prefix, "\n", "main.py")
    fills.document(URI).last = InfillRequest(prefix=prefix, suffix="\n", extra_files=pieces)
    return pieces


def paused(fills: FillService) -> None:
    """The look for a pause, run as the event loop would run it, and the worker's work after."""
    fills._paused(URI, fills.document(URI))
    fills.worker.submit(lambda: None).result(5)


def typed(fills: FillService, asked: list[int], clock: list[float], text: str) -> Any:
    fills.edited(URI, text)
    clock[0] += TYPING_PAUSE_S / 2
    return ask(fills, asked, text)


def test_the_block_is_chosen_once_and_kept_on_every_line_while_typing(clock: list[float]) -> None:
    fills, _, asked = started()
    text = TEXT
    first = ask(fills, asked, text)
    assert [path for path, _ in first] == ["stock.py"] and len(asked) == 1
    for more in ["recount(lines)\n", "    total = ", "unit_price(x)\n"]:  # typing, line after line
        text += more
        assert typed(fills, asked, clock, text) is first
    assert len(asked) == 1  # never chosen again on a keystroke, though a new choice differs


@pytest.mark.parametrize("encode_when_idle", [True, False])
def test_at_a_pause_a_new_block_is_encoded_ahead_and_then_used(clock: list[float], encode_when_idle: bool) -> None:
    fills, engine, asked = started(encode_when_idle)
    first = ask(fills, asked, TEXT)
    text = TEXT + "unit_price(lines)\n    total = "
    assert typed(fills, asked, clock, text) is first
    clock[0] += TYPING_PAUSE_S
    paused(fills)
    assert len(asked) == 2  # chosen again at the pause: the file now used near the cursor is in
    block = ask(fills, asked, text + "u")
    assert [path for path, _ in block] == ["prices.py", "stock.py"] and block != first
    if encode_when_idle:
        assert [r.extra_files for r in engine.warmed] == [block]  # encoded before the keystroke asked for it
        assert engine.warmed[0].prefix == text
        assert fills.encoded_ahead == {"done": 1}
    else:
        assert engine.warmed == []
    clock[0] += TYPING_PAUSE_S
    paused(fills)  # the same choice at the next pause: nothing to encode
    assert len(engine.warmed) == int(encode_when_idle)


def test_a_block_stopped_part_way_is_not_used_and_a_pause_while_typing_is_no_pause(clock: list[float]) -> None:
    fills, engine, asked = started()
    first = ask(fills, asked, TEXT)
    text = TEXT + "unit_price(lines)\n    total = "
    assert typed(fills, asked, clock, text) is first
    fills.edited(URI, text + "u")  # an edit after the request: no pause yet (looked at again later)
    clock[0] += TYPING_PAUSE_S / 2
    looked: list[float] = []
    fills._pause_later = lambda uri, record, delay: looked.append(delay)  # type: ignore[method-assign]
    fills._paused(URI, fills.document(URI))
    assert looked == [pytest.approx(TYPING_PAUSE_S / 2)] and len(asked) == 1  # not chosen again
    clock[0] += TYPING_PAUSE_S
    running = fills.document(URI).job = Job.at(fills.document(URI).last, INLINE)  # type: ignore[arg-type]
    running.future = Future()
    fills._paused(URI, fills.document(URI))  # a fill is running for it: the user waits for it, no pause
    assert looked[-1] == TYPING_PAUSE_S and len(asked) == 1
    running.future.set_result(None)
    clock[0] += TYPING_PAUSE_S
    engine.go.clear()  # the warm starts, then a keystroke's fill is handed to the worker
    fills._paused(URI, fills.document(URI))
    keystroke = fills._submit(lambda: None)
    engine.go.set()
    keystroke.result(5)
    assert engine.warmed == [] and fills.encoded_ahead == {"stopped": 1}
    assert ask(fills, asked, text + "u") is first  # the old block, whose tokens are cached


def test_a_closed_document_is_not_looked_at(clock: list[float]) -> None:
    fills, engine, asked = started()
    ask(fills, asked, TEXT)
    record = fills.document(URI)
    fills.forget(URI)
    clock[0] += TYPING_PAUSE_S
    fills._paused(URI, record)
    assert len(asked) == 1 and engine.warmed == []
