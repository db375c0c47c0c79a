"""The language server as a real client sees it (pytest-lsp over stdio), with the VS Code,
Neovim and Emacs capability presets (which do not advertise inlineCompletion: added here).

The server is the real one with a scripted model (tests/lsp/scripted_server.py): what it
fills at each place is chosen in SCRIPT, so the items asserted on are fixed by the script
and the server's logic, never by what the shipped weights happen to write."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from tests.lsp.scripted_server import scripted_command

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = (ROOT / "fixtures" / "code" / "inventory.py").read_text()
URI = "file:///work/inventory.py"
BLANK = types.Position(26, 0)  # a blank line between two methods
COUNT = "    def count(self) -> int:\n        return len(self.items)\n"  # the fill there ...
COUNT_LINE = COUNT.split("\n")[0]  # ... as ghost text while typing: one line (oneLineWhileTyping)
SIZE = "    def size(self) -> int:\n        return len(self.items)\n"  # ... and its alternative
SLOW_URI = "file:///work/slow.py"  # a document whose fill takes long: it holds the worker
SLOW = '"""The slow document."""\n\n\nx = 1\n'
SCRIPT = {
    "rules": [
        {"contains": "The slow document", "fill": "y = 2", "delay_ms": 1500},
        {"after": "    main()\n", "fill": '    print("done")'},  # the end of the file
        {"after": 'fills in."""\n', "fill": "# the fixture"},  # the blank line after the docstring
    ],
    "default": [COUNT, SIZE],  # one per candidate row
    "delay_ms": 50,  # a denoising step takes a while, as with a real model (the storm test)
}

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=scripted_command(SCRIPT)),
    params=["visual_studio_code", "neovim", "emacs"],
    scope="module",
)
async def client(request: pytest.FixtureRequest, lsp_client: LanguageClient):  # type: ignore[no-untyped-def]
    caps = client_capabilities(request.param)
    if caps.text_document is not None:
        caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=caps,
            initialization_options={"diffusionLsp": {"alternatives": 2, "debounceMs": "soon"}},
        )
    )
    lsp_client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(URI, "python", 1, SAMPLE)))
    yield
    await lsp_client.shutdown_session()


def position_of(text: str, marker: str) -> types.Position:
    offset = SAMPLE.index(marker) + len(marker)
    line = SAMPLE.count("\n", 0, offset)
    return types.Position(line, offset - (SAMPLE.rfind("\n", 0, offset) + 1))


async def inline(  # type: ignore[no-untyped-def]
    client: LanguageClient, position: types.Position, kind: types.InlineCompletionTriggerKind, uri: str = URI
):
    return await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri),
            position=position,
            context=types.InlineCompletionContext(trigger_kind=kind),
        )
    )


async def test_invalid_settings_are_named_and_defaulted(client: LanguageClient) -> None:
    messages = [m.message for m in client.messages]
    assert any("diffusionLsp.debounceMs must be an integer" in m for m in messages), messages


async def test_inline_completion_returns_ghost_text_at_the_cursor(client: LanguageClient) -> None:
    pos = BLANK
    result = await inline(client, pos, types.InlineCompletionTriggerKind.Invoked)
    assert result is not None
    assert [item.insert_text for item in result.items] == [COUNT, SIZE]  # `alternatives`: 2, best first
    for item in result.items:
        assert item.range is not None and item.range.start == item.range.end == pos


async def test_an_automatic_request_gets_one_suggestion(client: LanguageClient) -> None:
    result = await inline(client, BLANK, types.InlineCompletionTriggerKind.Automatic)
    assert result is not None and [item.insert_text for item in result.items] == [COUNT_LINE]  # one line


async def test_completion_fallback_offers_the_fill_first(client: LanguageClient) -> None:
    pos = BLANK
    result = await client.text_document_completion_async(
        types.CompletionParams(text_document=types.TextDocumentIdentifier(URI), position=pos)
    )
    assert isinstance(result, types.CompletionList)
    (item,) = result.items
    assert item.label == "✦ def count(self) -> int:" and item.sort_text == "!0"
    assert item.text_edit == types.TextEdit(types.Range(pos, pos), COUNT)


async def test_type_through_answers_without_the_engine(client: LanguageClient) -> None:
    pos = BLANK
    first = await inline(client, pos, types.InlineCompletionTriggerKind.Automatic)
    assert first is not None
    text = str(first.items[0].insert_text)
    assert text == COUNT_LINE
    before = await client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
    # the user types the first character of the suggestion
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(version=2, uri=URI),
            [types.TextDocumentContentChangePartial(range=types.Range(pos, pos), text=text[0])],
        )
    )
    after_pos = types.Position(26, 1)
    again = await inline(client, after_pos, types.InlineCompletionTriggerKind.Automatic)
    after = await client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
    assert again is not None and again.items[0].insert_text == text[1:]
    assert after["engine_calls"] == before["engine_calls"]  # answered without a model call
    # put the document back for the other tests
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(version=3, uri=URI),
            [types.TextDocumentContentChangePartial(range=types.Range(pos, after_pos), text="")],
        )
    )


def open_copy(client: LanguageClient, uri: str) -> None:
    """SAMPLE opened at another URI: a document of the test's own."""
    client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "python", 1, SAMPLE)))


def close(client: LanguageClient, uri: str) -> None:
    client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri)))


async def command(client: LanguageClient, name: str, *args: object) -> object:
    return await client.workspace_execute_command_async(types.ExecuteCommandParams(name, list(args)))


async def test_suggest_now_serves_the_next_automatic_request_as_invoked(client: LanguageClient) -> None:
    uri = "file:///work/asked.py"
    open_copy(client, uri)
    auto = types.InlineCompletionTriggerKind.Automatic
    plain = await inline(client, BLANK, auto, uri)
    assert plain is not None and [i.insert_text for i in plain.items] == [COUNT_LINE]
    await command(client, "diffusion.suggestNow", uri)
    asked = await inline(client, BLANK, auto, uri)
    assert asked is not None and [i.insert_text for i in asked.items] == [COUNT, SIZE]  # `alternatives`
    again = await inline(client, BLANK, auto, uri)  # the ask is used up
    assert again is not None and [i.insert_text for i in again.items] == [COUNT_LINE]
    close(client, uri)


async def test_a_dismissed_suggestion_does_not_come_back_by_type_through(client: LanguageClient) -> None:
    uri = "file:///work/dismissed.py"
    open_copy(client, uri)
    auto = types.InlineCompletionTriggerKind.Automatic
    shown = await inline(client, BLANK, auto, uri)
    assert shown is not None and shown.items[0].insert_text == COUNT_LINE
    await command(client, "diffusion.dismiss", uri)
    client.text_document_did_change(  # the user types the suggestion's first character
        types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(version=2, uri=uri),
            [types.TextDocumentContentChangePartial(range=types.Range(BLANK, BLANK), text=COUNT_LINE[0])],
        )
    )
    before = await command(client, "diffusion.stats")
    again = await inline(client, types.Position(26, 1), auto, uri)
    after = await command(client, "diffusion.stats")
    # the engine was asked (type-through would answer the rest of COUNT without it)
    assert isinstance(before, dict) and isinstance(after, dict)
    assert after["engine_calls"] == before["engine_calls"] + 1
    assert again is None or COUNT_LINE[1:] not in [i.insert_text for i in again.items]
    close(client, uri)


async def test_bad_positions_and_unknown_documents_get_empty_answers(client: LanguageClient) -> None:
    lines = SAMPLE.split("\n")
    # positions past the end of the document or of a line are clamped to that end
    past_end = await inline(client, types.Position(10_000, 0), types.InlineCompletionTriggerKind.Invoked)
    end = types.Position(len(lines) - 1, len(lines[-1]))
    assert past_end is not None and [(i.range, i.insert_text) for i in past_end.items] == [
        (types.Range(end, end), '    print("done")')
    ]
    past_line_end = await inline(client, types.Position(1, 500), types.InlineCompletionTriggerKind.Invoked)
    line_end = types.Position(1, len(lines[1]))
    assert past_line_end is not None and [(i.range, i.insert_text) for i in past_line_end.items] == [
        (types.Range(line_end, line_end), "# the fixture")
    ]
    unknown = await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier("file:///nowhere.py"),
            position=types.Position(0, 0),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
        )
    )
    assert unknown is None
    stats = await client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
    assert stats["model_loaded"] is True  # still serving


async def test_a_storm_of_edits_answers_only_the_latest(client: LanguageClient) -> None:
    """Requests for versions the document has moved past come back empty; the newest is
    answered, and the server keeps serving."""
    import asyncio

    pos = BLANK
    pending = []
    version = 100
    before = await client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
    # a slow fill of another document holds the one worker while the storm arrives, so
    # what reaches the engine does not depend on how fast this machine relays messages
    client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(SLOW_URI, "python", 1, SLOW)))
    slow = asyncio.ensure_future(
        inline(client, types.Position(1, 0), types.InlineCompletionTriggerKind.Invoked, SLOW_URI)
    )
    await asyncio.sleep(0.2)
    for _ in range(20):
        version += 1
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                types.VersionedTextDocumentIdentifier(version=version, uri=URI),
                [types.TextDocumentContentChangePartial(range=types.Range(pos, pos), text="")],
            )
        )
        pending.append(asyncio.ensure_future(inline(client, pos, types.InlineCompletionTriggerKind.Invoked)))
    results = await asyncio.gather(*pending)
    await slow
    client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(SLOW_URI)))
    assert results[-1] is not None and [i.insert_text for i in results[-1].items] == [COUNT, SIZE]  # the newest
    assert sum(r is None for r in results[:-1]) >= 18  # the stale ones were dropped
    stats = await client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
    # superseded requests are cancelled before they reach the engine (one worker runs
    # fills in turn): the slow fill, the newest, and at most one that ran before the
    # slow one started; without cancellation all 21 would run
    assert stats["engine_calls"] - before["engine_calls"] <= 3


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=scripted_command(SCRIPT, "--model", "/nonexistent/model")),
    scope="module",
)
async def broken(lsp_client: LanguageClient):  # type: ignore[no-untyped-def]
    await lsp_client.initialize_session(types.InitializeParams(capabilities=client_capabilities("visual_studio_code")))
    lsp_client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(URI, "python", 1, SAMPLE)))
    yield
    await lsp_client.shutdown_session()


async def test_a_model_that_fails_to_load_is_reported_and_the_server_stays_up(broken: LanguageClient) -> None:
    result = await inline(broken, BLANK, types.InlineCompletionTriggerKind.Invoked)
    assert result is None
    stats = await broken.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
    assert stats["model_loaded"] is False and "/nonexistent/model" in stats["load_error"]
    assert any("model directory not found: /nonexistent/model" in m.message for m in broken.messages)


async def test_a_settings_change_can_load_another_model(broken: LanguageClient) -> None:
    import asyncio

    shipped = str(ROOT / "engine" / "weights")
    broken.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"diffusionLsp": {"model": shipped}})
    )
    for _ in range(100):  # loading takes a moment: the stats command does not wait for it
        stats = await broken.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
        if stats["model_loaded"]:
            break
        await asyncio.sleep(0.1)
    assert stats["model_loaded"] is True
    result = await inline(broken, BLANK, types.InlineCompletionTriggerKind.Invoked)
    assert result is not None and [i.insert_text for i in result.items] == [COUNT, SIZE]


async def test_uris_with_escapes_are_found(client: LanguageClient) -> None:
    uri = "file:///work/my%20file.py"  # a space; Windows paths arrive as file:///c%3A/...
    client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "python", 1, SAMPLE)))
    result = await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri),
            position=BLANK,
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
        )
    )
    assert result is not None and [i.insert_text for i in result.items] == [COUNT, SIZE]
