"""The real server with a remote engine (settings `endpoint` and `dialect`): the fills come
from the endpoint, through the same span budget, validation and alternatives as local
fills; a fault is told once and answered empty, and the server keeps serving."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from tests.fake_engine import Engine, json_reply, serve
from tests.lsp.helpers import TOTAL_CURSOR, TOTAL_TEXT, TOTAL_URI, inline

URI, TEXT, CURSOR = TOTAL_URI, TOTAL_TEXT, TOTAL_CURSOR  # the cursor after `return `

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def fake() -> Iterator[Engine]:
    with serve() as engine:
        yield engine


def choices(h: Any, body: dict[str, Any]) -> None:
    texts = ["count", "count +", "sum(items)"][: body.get("n", 1)]
    json_reply(h, 200, {"choices": [{"index": i, "text": t} for i, t in enumerate(texts)]})


@pytest_lsp.fixture(config=ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server"]), scope="module")
async def client(lsp_client: LanguageClient, fake: Engine):  # type: ignore[no-untyped-def]
    caps = client_capabilities("neovim")
    if caps.text_document is not None:
        caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    fake.reply = choices
    await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=caps,
            initialization_options={
                # no fills made ahead: each test reads the last request the endpoint saw
                "diffusionLsp": {
                    "endpoint": fake.url,
                    "dialect": "vllm",
                    "remoteModel": "dg",
                    "alternatives": 3,
                    "fillAhead": False,
                }
            },
        )
    )
    lsp_client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(URI, "python", 1, TEXT)))
    yield
    await lsp_client.shutdown_session()


async def test_ghost_text_comes_from_the_endpoint(client: LanguageClient, fake: Engine) -> None:
    fake.reply = choices
    assert await inline(client, types.InlineCompletionTriggerKind.Automatic) == ["count"]
    sent = fake.seen[-1].body
    assert sent["model"] == "dg" and sent["max_tokens"] == 32 and "suffix" not in sent
    assert sent["prompt"].endswith("    return <|fim_middle|>")


async def test_alternatives_are_asked_for_and_validated(client: LanguageClient, fake: Engine) -> None:
    fake.reply = choices
    texts = await inline(client, types.InlineCompletionTriggerKind.Invoked)
    assert fake.seen[-1].body["n"] == 3
    assert texts == ["count", "sum(items)"]  # `count +` cut to `count`, a duplicate: dropped


async def test_other_open_files_go_along_as_repository_context(client: LanguageClient, fake: Engine) -> None:
    other = "file:///work/util.py"
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(types.TextDocumentItem(other, "python", 1, "def helper():\n    return 1\n"))
    )
    fake.reply = choices
    # Invoked: a fresh fill (an Automatic request here would get the earlier fill at this place again)
    assert await inline(client, types.InlineCompletionTriggerKind.Invoked) == ["count", "sum(items)"]
    # the vllm dialect has no field for them: the prompt holds only this file
    assert "helper" not in fake.seen[-1].body["prompt"]
    client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(other)))


async def test_a_fault_is_told_once_and_the_server_keeps_serving(client: LanguageClient, fake: Engine) -> None:
    fake.reply = lambda h, b: json_reply(h, 400, {"error": {"message": "model 'dg' does not exist"}})
    before = len(client.messages)
    for _ in range(3):  # Invoked: each a fresh fill (Automatic ones would get the earlier fill here again)
        assert await inline(client, types.InlineCompletionTriggerKind.Invoked) == []
    told = [m.message for m in client.messages[before:] if "does not exist" in m.message]
    assert len(told) == 1, told
    fake.reply = choices
    assert await inline(client, types.InlineCompletionTriggerKind.Invoked) == ["count", "sum(items)"]
