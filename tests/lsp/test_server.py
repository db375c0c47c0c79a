"""The language server as a real client sees it (pytest-lsp over stdio), with the VS Code,
Neovim and Emacs capability presets (which do not advertise inlineCompletion: added here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = (ROOT / "fixtures" / "code" / "inventory.py").read_text()
URI = "file:///work/inventory.py"

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server"]),
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


async def inline(client: LanguageClient, position: types.Position, kind: types.InlineCompletionTriggerKind):  # type: ignore[no-untyped-def]
    return await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(URI),
            position=position,
            context=types.InlineCompletionContext(trigger_kind=kind),
        )
    )


async def test_invalid_settings_are_named_and_defaulted(client: LanguageClient) -> None:
    messages = [m.message for m in client.messages]
    assert any("diffusionLsp.debounceMs must be an integer" in m for m in messages), messages


async def test_inline_completion_returns_ghost_text_at_the_cursor(client: LanguageClient) -> None:
    pos = types.Position(26, 0)  # a blank line between two methods
    result = await inline(client, pos, types.InlineCompletionTriggerKind.Invoked)
    assert result is not None and 1 <= len(result.items) <= 2  # up to `alternatives`
    for item in result.items:
        assert item.range is not None and item.range.start == item.range.end == pos
        assert isinstance(item.insert_text, str) and item.insert_text


async def test_completion_fallback_offers_the_fill_first(client: LanguageClient) -> None:
    pos = types.Position(26, 0)
    result = await client.text_document_completion_async(
        types.CompletionParams(text_document=types.TextDocumentIdentifier(URI), position=pos)
    )
    assert isinstance(result, types.CompletionList) and result.items
    item = result.items[0]
    assert item.label.startswith("✦") and item.sort_text == "!0"
    assert item.text_edit is not None and item.text_edit.range.start == pos  # type: ignore[union-attr]


async def test_type_through_answers_without_the_engine(client: LanguageClient) -> None:
    pos = types.Position(26, 0)
    first = await inline(client, pos, types.InlineCompletionTriggerKind.Automatic)
    assert first is not None
    text = str(first.items[0].insert_text)
    before = await client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
    # the user types the first character of the suggestion
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(version=2, uri=URI),
            [types.TextDocumentContentChangePartial(range=types.Range(pos, pos), text=text[0])],
        )
    )
    after_pos = types.Position(26, 1) if "\n" not in text[0] else types.Position(27, 0)
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


async def test_bad_positions_and_unknown_documents_get_empty_answers(client: LanguageClient) -> None:
    lines = SAMPLE.split("\n")
    # positions past the end of the document or of a line are clamped to that end
    past_end = await inline(client, types.Position(10_000, 0), types.InlineCompletionTriggerKind.Invoked)
    end = types.Position(len(lines) - 1, len(lines[-1]))
    assert past_end is None or all(i.range is not None and i.range.start == end for i in past_end.items)
    past_line_end = await inline(client, types.Position(1, 500), types.InlineCompletionTriggerKind.Invoked)
    line_end = types.Position(1, len(lines[1]))
    assert past_line_end is None or all(i.range is not None and i.range.start == line_end for i in past_line_end.items)
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

    pos = types.Position(26, 0)
    pending = []
    version = 100
    before = await client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
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
    assert results[-1] is not None and results[-1].items  # the newest is answered
    assert sum(r is None for r in results[:-1]) >= 10  # most stale ones were dropped
    stats = await client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
    # superseded requests are cancelled before they reach the engine (one worker runs
    # fills in turn); without cancellation all 20 would run
    assert stats["engine_calls"] - before["engine_calls"] <= 10


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server", "--model", "/nonexistent/model"]),
    scope="module",
)
async def broken(lsp_client: LanguageClient):  # type: ignore[no-untyped-def]
    await lsp_client.initialize_session(types.InitializeParams(capabilities=client_capabilities("visual_studio_code")))
    lsp_client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(URI, "python", 1, SAMPLE)))
    yield
    await lsp_client.shutdown_session()


async def test_a_model_that_fails_to_load_is_reported_and_the_server_stays_up(broken: LanguageClient) -> None:
    result = await inline(broken, types.Position(26, 0), types.InlineCompletionTriggerKind.Invoked)
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
    result = await inline(broken, types.Position(26, 0), types.InlineCompletionTriggerKind.Invoked)
    assert result is not None and result.items


async def test_uris_with_escapes_are_found(client: LanguageClient) -> None:
    uri = "file:///work/my%20file.py"  # a space; Windows paths arrive as file:///c%3A/...
    client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "python", 1, SAMPLE)))
    result = await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri),
            position=types.Position(26, 0),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
        )
    )
    assert result is not None and result.items
