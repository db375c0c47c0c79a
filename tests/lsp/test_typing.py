"""While the developer types (lsp_server/reuse.py, docs/server.md): the next line, made
ahead, is there after Tab, an earlier fill answers again at its place, a running fill the user types
into is kept and answers the rest, and one the user types past otherwise is stopped.

The real server over stdio with a scripted model (tests/lsp/scripted_server.py): what it
fills where is fixed by SCRIPT, so what is asserted is the server's logic."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from tests.lsp.scripted_server import scripted_command

AREA = "def area(w, h):\n    \n\n\nprint(area(2, 3))\n"
SLOW = "def slow(w, h):\n    \n\n\nprint(slow(2, 3))\n"
CURSOR = types.Position(1, 4)  # the indented blank line of the body
SCRIPT = {
    "rules": [
        {"after": "return w * h\n", "fill": "    # the area"},  # on the line after the suggestion
        {"contains": "def slow", "fill": "return 42", "delay_ms": 400},  # a fill that takes a while
        {"after": "(w, h):\n    x", "fill": " = 1"},
    ],
    "default": "return w * h",
}

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_lsp.fixture(config=ClientServerConfig(server_command=scripted_command(SCRIPT)), scope="module")
async def client(lsp_client: LanguageClient):  # type: ignore[no-untyped-def]
    caps = client_capabilities("visual_studio_code")
    assert caps.text_document is not None
    caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    await lsp_client.initialize_session(types.InitializeParams(capabilities=caps))
    yield
    await lsp_client.shutdown_session()


class Doc:
    """A document of the test's own, edited as the user types."""

    def __init__(self, client: LanguageClient, uri: str, text: str) -> None:
        self.client, self.uri, self.version = client, uri, 1
        client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "python", 1, text)))

    def type(self, at: types.Position, text: str) -> None:
        self.version += 1
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                types.VersionedTextDocumentIdentifier(version=self.version, uri=self.uri),
                [types.TextDocumentContentChangePartial(range=types.Range(at, at), text=text)],
            )
        )

    def delete(self, start: types.Position, end: types.Position) -> None:
        self.version += 1
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                types.VersionedTextDocumentIdentifier(version=self.version, uri=self.uri),
                [types.TextDocumentContentChangePartial(range=types.Range(start, end), text="")],
            )
        )

    async def ask(self, at: types.Position) -> str | None:
        got = await self.client.text_document_inline_completion_async(
            types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(self.uri),
                position=at,
                context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
            )
        )
        return str(got.items[0].insert_text) if got and got.items else None

    def close(self) -> None:
        self.client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(self.uri)))


async def stats(client: LanguageClient) -> dict[str, Any]:
    got = await client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
    return dict(got)


def answers(s: dict[str, Any], source: str) -> int:
    return int(s["answers"].get(source, 0))


async def settle(client: LanguageClient, ahead_fills: int) -> dict[str, Any]:
    """The stats once the fill made ahead has reached the engine."""
    for _ in range(100):
        s = await stats(client)
        if s["ahead_fills"] > ahead_fills:
            await asyncio.sleep(0.3)  # and finished (the scripted fill takes a few steps)
            return await stats(client)
        await asyncio.sleep(0.05)
    raise AssertionError("no fill was made ahead of the suggestion")


async def test_after_tab_the_next_suggestion_was_made_ahead(client: LanguageClient) -> None:
    doc = Doc(client, "file:///typing/ahead.py", AREA)
    start = await stats(client)
    assert await doc.ask(CURSOR) == "return w * h"
    before = await settle(client, start["ahead_fills"])
    doc.type(CURSOR, "return w * h")  # Tab
    assert await doc.ask(types.Position(1, 16)) == "\n    # the area"  # the next line, made ahead
    doc.type(types.Position(1, 16), "\n    ")  # Enter (the editor indents): the rest of that line
    assert await doc.ask(types.Position(2, 4)) == "# the area"
    after = await stats(client)
    assert answers(after, "ahead") == answers(before, "ahead") + 1
    assert answers(after, "type_through") == answers(before, "type_through") + 1
    assert after["engine_calls"] == before["engine_calls"]  # no fill was run for these requests
    doc.close()


async def test_an_earlier_fill_answers_again_at_its_place(client: LanguageClient) -> None:
    doc = Doc(client, "file:///typing/recall.py", AREA)
    start = await stats(client)
    assert await doc.ask(CURSOR) == "return w * h"
    await settle(client, start["ahead_fills"])
    doc.type(CURSOR, "x")  # something else: a fill of its own
    assert await doc.ask(types.Position(1, 5)) == " = 1"
    before = await stats(client)
    doc.delete(CURSOR, types.Position(1, 5))  # backspace: back at the first fill's place
    assert await doc.ask(CURSOR) == "return w * h"
    after = await stats(client)
    assert answers(after, "recalled") == answers(before, "recalled") + 1
    assert after["engine_calls"] == before["engine_calls"]
    doc.close()


async def test_a_running_fill_the_user_types_into_is_kept_and_answers_the_rest(client: LanguageClient) -> None:
    doc = Doc(client, "file:///typing/kept.py", SLOW)
    before = await stats(client)
    first = asyncio.ensure_future(doc.ask(CURSOR))
    await asyncio.sleep(0.2)  # the slow fill has started
    doc.type(CURSOR, "re")  # the user types the start of what it is writing
    assert await doc.ask(types.Position(1, 6)) == "turn 42"
    assert await first is None  # its document moved on: the answer went to the newer request
    after = await stats(client)
    assert answers(after, "kept") == answers(before, "kept") + 1
    assert after["engine_calls"] == before["engine_calls"] + 1  # one fill for both requests
    doc.close()


async def test_typing_past_a_running_fill_otherwise_stops_it(client: LanguageClient) -> None:
    doc = Doc(client, "file:///typing/stopped.py", SLOW)
    before = await stats(client)
    first = asyncio.ensure_future(doc.ask(CURSOR))
    await asyncio.sleep(0.2)
    doc.type(CURSOR, "x")  # not what it writes
    second = await doc.ask(types.Position(1, 5))
    assert await first is None
    after = await stats(client)
    assert answers(after, "kept") == answers(before, "kept")
    assert answers(after, "model") == answers(before, "model") + (second is not None)
    assert after["engine_calls"] == before["engine_calls"] + 2  # the stopped fill, then one of its own
    doc.close()
