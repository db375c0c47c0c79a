"""Repository context through the real server (docs/server.md, Repository context): the file
the current one imports, read from the workspace folder on disk, goes to the engine (here a
fake llama.cpp `/infill` endpoint, which shows what it was sent in `input_extra`); a file
outside the workspace never does; the pieces stay the same while the user types, and are
chosen again at a pause; `repositoryContext` off sends none."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient, client_capabilities
from pytest_lsp.client import make_test_lsp_client

from lsp_server.service import TYPING_PAUSE_S
from tests.fake_engine import Engine, json_reply, serve

STOCK = "RECOUNT_BATCH = 40\n\n\ndef write_off_value(line, keep_fraction):\n    return line * keep_fraction\n"
SECRET = "def write_off_value(line):\n    return 'a file outside the workspace'\n"
MAIN = "from stock import RECOUNT_BATCH, write_off_value\nfrom .. import secret\n\n\ndef loss(lines):\n    return "

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def fake() -> Iterator[Engine]:
    with serve() as engine:
        engine.reply = content
        yield engine


def content(h: Any, body: dict[str, Any]) -> None:
    json_reply(h, 200, {"content": "sum(lines)"})


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ws")
    (root / "proj").mkdir()
    (root / "proj" / "stock.py").write_text(STOCK)
    (root / "proj" / "main.py").write_text(MAIN)
    (root / "secret.py").write_text(SECRET)  # beside the workspace folder, not in it
    return root / "proj"


async def started(fake: Engine, project: Path, **settings: Any) -> LanguageClient:
    client = make_test_lsp_client()
    await client.start_io(sys.executable, "-m", "lsp_server")
    caps = client_capabilities("visual_studio_code")
    assert caps.text_document is not None
    caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    options = {"endpoint": fake.url, "dialect": "llama-infill", "fillAhead": False, **settings}
    await client.initialize_session(
        types.InitializeParams(
            capabilities=caps,
            initialization_options={"diffusionLsp": options},
            workspace_folders=[types.WorkspaceFolder(uri=project.as_uri(), name="proj")],
        )
    )
    return client


async def ask(client: LanguageClient, uri: str, text: str, version: int) -> None:
    if version == 1:
        client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "python", 1, text)))
    else:
        change = types.TextDocumentContentChangeWholeDocument(text=text)
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(types.VersionedTextDocumentIdentifier(version=version, uri=uri), [change])
        )
    lines = text.split("\n")
    params = types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri),
        position=types.Position(len(lines) - 1, len(lines[-1])),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
    )
    await client.text_document_inline_completion_async(params)


async def test_the_imported_file_goes_along_and_the_outside_one_never(fake: Engine, project: Path) -> None:
    client = await started(fake, project)
    try:
        uri = (project / "main.py").as_uri()
        await ask(client, uri, MAIN, 1)
        extra = fake.seen[-1].body["input_extra"]
        assert [e["filename"] for e in extra] == ["stock.py"]
        assert "def write_off_value(line, keep_fraction):" in extra[0]["text"]
        assert not any("outside the workspace" in e["text"] for e in extra)
        await ask(client, uri, MAIN + "s", 2)  # a keystroke on the same line: the same pieces
        assert fake.seen[-1].body["input_extra"] == extra
    finally:
        await client.shutdown_session()


async def test_a_file_opened_meanwhile_joins_at_the_next_pause_not_at_the_next_keystroke(
    fake: Engine, project: Path
) -> None:
    client = await started(fake, project)
    try:
        uri = (project / "main.py").as_uri()
        await ask(client, uri, MAIN, 1)
        first = fake.seen[-1].body["input_extra"]
        notes = "def loss_ratio(lines):\n    return write_off_value(lines, 0.5) / RECOUNT_BATCH\n"
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(types.TextDocumentItem((project / "notes.py").as_uri(), "python", 1, notes))
        )
        asked = len(fake.seen)
        await ask(client, uri, MAIN + "x", 2)
        assert len(fake.seen) == asked + 1 and fake.seen[-1].body["input_extra"] == first  # typing: it stays
        await asyncio.sleep(TYPING_PAUSE_S + 0.5)  # a pause: chosen again, and sent ahead for llama.cpp to cache
        ahead = fake.seen[-1].body
        assert len(fake.seen) == asked + 2 and ahead["n_predict"] == 0 and ahead["input_prefix"] == ""
        assert [e["filename"] for e in ahead["input_extra"]] == ["notes.py", "stock.py"]
        await ask(client, uri, MAIN + "xy", 3)
        assert len(fake.seen) == asked + 3  # (not the fill's start: the engine's answer, not the type-through)
        assert fake.seen[-1].body["input_extra"] == ahead["input_extra"]
    finally:
        await client.shutdown_session()


async def test_the_setting_off_sends_none(fake: Engine, project: Path) -> None:
    client = await started(fake, project, repositoryContext=False)
    try:
        await ask(client, (project / "main.py").as_uri(), MAIN, 1)
        assert fake.seen[-1].body["input_extra"] == []
    finally:
        await client.shutdown_session()
