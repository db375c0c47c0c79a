"""When a document's repository context is chosen again (FillService.pieces): never while the
user types in it, whatever the line (the block comes first in the prompt: a new one is
encoded again whole, and in a real project the windows most like the code around the cursor
change every few lines); at a pause, on another line; on the same line after REBUILD_S."""

from __future__ import annotations

from typing import Any

import pytest

from lsp_server import service
from lsp_server.service import REBUILD_S, TYPING_PAUSE_S, FillService

URI = "file:///project/main.py"
FILES = [
    ("stock.py", "RECOUNT_BATCH = 40\n\n\ndef recount(lines):\n    return lines[:RECOUNT_BATCH]\n"),
    ("prices.py", "def unit_price(item):\n    return item.cents / 100\n"),
]


class Budget:
    """The one thing pieces() asks of the engine."""

    def repository_chars(self) -> int:
        return 10_000


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(service.time, "monotonic", lambda: now[0])
    return now


def test_the_block_is_kept_while_typing_and_chosen_again_at_a_pause(clock: list[float]) -> None:
    fills = FillService()
    fills.engine = Budget()  # type: ignore[assignment]
    asked: list[int] = []

    def files() -> list[tuple[str, str]]:
        asked.append(len(asked))
        return FILES

    def pieces(line: int, prefix: str) -> Any:
        return fills.pieces(URI, line, files, prefix, "\n", "main.py")

    text = "from stock import recount\n\n\ndef audit(lines):\n    return "
    fills.opened(URI, text)
    first = pieces(4, text)
    assert [path for path, _ in first] == ["stock.py"] and len(asked) == 1
    for i, typed in enumerate(["recount(lines)\n", "    total = ", "unit_price(x)\n"]):  # typing, line after line
        text += typed
        fills.edited(URI, text)
        clock[0] += TYPING_PAUSE_S / 2
        assert pieces(5 + i, text) is first
    assert len(asked) == 1  # never chosen again while the user typed, though a new choice differs:
    clock[0] += TYPING_PAUSE_S  # at a pause, on another line, it is made, with the file now used
    assert [path for path, _ in pieces(9, text)] == ["prices.py", "stock.py"] and len(asked) == 2
    clock[0] += TYPING_PAUSE_S
    pieces(9, text)  # the same line: kept
    assert len(asked) == 2
    clock[0] += REBUILD_S  # ... for REBUILD_S at most
    pieces(9, text)
    assert len(asked) == 3
