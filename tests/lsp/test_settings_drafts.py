"""Settings pulled through workspace/configuration, the languages filter, debounce,
drafts (diffusion/draft), $/progress while the model loads, and selectedCompletionInfo,
against a real server over stdio (pytest-lsp).

The server is the real one with a scripted model (tests/lsp/scripted_server.py): what it
fills at each place is chosen in SCRIPT, so the suggestions asserted on are fixed by the
script and the server's logic, never by what the shipped weights happen to write."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from tests.lsp.scripted_server import scripted_command

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = (ROOT / "fixtures" / "code" / "inventory.py").read_text()
URI = "file:///work/inventory.py"
BLANK = types.Position(26, 0)  # a blank line between two methods
COUNT = "    def count(self) -> int:\n        return len(self.items)\n"  # the fill there
SCRIPT = {
    "rules": [{"after": "\n    se", "fill": "lf.items.clear()"}],  # after "se" typed on the blank line
    "default": COUNT,
}

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=scripted_command(SCRIPT)),
    scope="module",
)
async def client(lsp_client: LanguageClient):  # type: ignore[no-untyped-def]
    """A VS Code-like client whose workspace settings (pulled by the server) enable only
    Rust, and whose initializationOptions ask for drafts and a debounce."""
    lsp_client.set_configuration({"languages": ["rust"]}, section="diffusionLsp")
    drafts: list[Any] = []
    lsp_client.feature("diffusion/draft")(lambda params: drafts.append(plain(params)))
    lsp_client.drafts = drafts  # type: ignore[attr-defined]
    caps = client_capabilities("visual_studio_code")
    assert caps.text_document is not None
    caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=caps,
            initialization_options={"diffusionLsp": {"drafts": True, "debounceMs": 300, "languages": []}},
        )
    )
    lsp_client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(URI, "python", 1, SAMPLE)))
    yield
    await lsp_client.shutdown_session()


def plain(obj: Any) -> Any:
    """pygls hands custom notifications over as named tuples: make them plain JSON values."""
    if hasattr(obj, "_asdict"):
        return {k: plain(v) for k, v in obj._asdict().items()}
    if isinstance(obj, list):
        return [plain(v) for v in obj]
    return obj


async def inline(
    client: LanguageClient,
    position: types.Position,
    kind: types.InlineCompletionTriggerKind = types.InlineCompletionTriggerKind.Invoked,
    selected: types.SelectedCompletionInfo | None = None,
) -> types.InlineCompletionList | None:
    result = await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(URI),
            position=position,
            context=types.InlineCompletionContext(trigger_kind=kind, selected_completion_info=selected),
        )
    )
    assert result is None or isinstance(result, types.InlineCompletionList)
    return result


async def stats(client: LanguageClient) -> dict[str, Any]:
    result = await client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
    assert isinstance(result, dict)
    return result


async def test_model_loading_reports_progress(client: LanguageClient) -> None:
    await inline(client, BLANK)  # returns once the model is ready
    reports = client.progress_reports.get("diffusion-lsp/load-model")
    assert reports, client.progress_reports
    assert isinstance(reports[0], types.WorkDoneProgressBegin) and "loading" in reports[0].title
    assert isinstance(reports[-1], types.WorkDoneProgressEnd) and (reports[-1].message or "").startswith("ready: ")


async def test_pulled_settings_win_and_the_languages_filter_applies(client: LanguageClient) -> None:
    # initializationOptions said every language; workspace/configuration says only Rust
    assert await inline(client, BLANK) is None
    client.set_configuration({"languages": ["python"]}, section="diffusionLsp")
    # VS Code sends an empty notification and expects the server to pull
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))
    for _ in range(50):
        result = await inline(client, BLANK)
        if result is not None:
            break
        await asyncio.sleep(0.1)
    assert result is not None and [i.insert_text for i in result.items] == [COUNT]


async def test_drafts_are_sent_while_a_fill_denoises(client: LanguageClient) -> None:
    drafts: list[Any] = client.drafts  # type: ignore[attr-defined]
    drafts.clear()
    result = await inline(client, BLANK)
    await asyncio.sleep(0.2)  # notifications sent just before the response may trail it
    assert result is not None and [i.insert_text for i in result.items] == [COUNT]
    assert drafts, "no diffusion/draft notification"
    ids = {str(d["requestId"]) for d in drafts}
    assert len(ids) == 1 and "None" not in ids  # all for the one request, which is named
    first = drafts[0]
    assert first["textDocument"]["uri"] == URI and first["textDocument"]["version"] == 1
    assert first["position"] == {"line": BLANK.line, "character": BLANK.character}
    steps = [d["step"] for d in drafts]
    assert steps == sorted(steps)
    assert all(d["text"] and d["done"] is False for d in drafts)  # never an empty draft
    assert drafts[-1]["text"] == COUNT  # the fill as it formed, ending as the answer


async def test_automatic_requests_are_debounced_and_only_the_latest_runs(client: LanguageClient) -> None:
    # the fills the tests before made here are forgotten: an Automatic request would get them again
    await client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.dismiss", [URI]))
    before = await stats(client)
    pos = BLANK
    automatic = types.InlineCompletionTriggerKind.Automatic
    first = asyncio.ensure_future(inline(client, pos, automatic))
    await asyncio.sleep(0.05)  # well inside the 300 ms debounce
    second = asyncio.ensure_future(inline(client, pos, automatic))
    results = await asyncio.gather(first, second)
    after = await stats(client)
    assert results[0] is None  # superseded while it waited
    # while typing, ghost text is one line (oneLineWhileTyping)
    assert results[1] is not None and [i.insert_text for i in results[1].items] == [COUNT.split("\n")[0]]
    assert after["engine_calls"] - before["engine_calls"] == 1


async def test_the_selected_completion_item_is_continued(client: LanguageClient) -> None:
    """With "se" selected in the popup after a typed "s", the suggestion is "se" plus the
    fill the model makes when "se" has been typed, over the selected item's range."""
    lines = SAMPLE.split("\n")
    lines[BLANK.line] = "    s"
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(version=2, uri=URI),
            [types.TextDocumentContentChangeWholeDocument(text="\n".join(lines))],
        )
    )
    at = types.Position(BLANK.line, 5)
    selected = types.SelectedCompletionInfo(range=types.Range(types.Position(BLANK.line, 4), at), text="se")
    result = await inline(client, at, selected=selected)
    assert result is not None
    (item,) = result.items
    assert item.range == types.Range(selected.range.start, at)
    assert item.insert_text == "self.items.clear()"  # "se", then the fill made after "se"

    lines[BLANK.line] = "    se"  # the same text, typed
    other = "file:///work/typed.py"
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(types.TextDocumentItem(other, "python", 1, "\n".join(lines)))
    )
    typed = await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(other),
            position=types.Position(BLANK.line, 6),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
        )
    )
    assert typed is not None and [i.insert_text for i in typed.items] == ["lf.items.clear()"]

    # a selected range that does not end at the cursor is not something to continue
    wrong = types.SelectedCompletionInfo(range=types.Range(types.Position(20, 0), types.Position(20, 2)), text="zz")
    assert await inline(client, at, selected=wrong) is None
