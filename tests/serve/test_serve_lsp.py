"""The whole way round: the language server (a subprocess, driven by pytest-lsp as an
editor drives it) with `diffusion-infill serve` (a subprocess on the shipped model) as
its remote engine, through each of the project's dialects that the server speaks. The
fill must reach the server and come back without a fault; what the tiny model writes
(and whether the span's check keeps it) is not asserted. With `logprobs` on, the
language server reads the fill's confidence from the server's log-probabilities and
holds back an Automatic fill under minConfidence, as it would a local engine's."""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterator

import httpx
import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from tests.serve.harness import command, read_metric

URI = "file:///work/served.py"
TEXT = "def total(items):\n    count = 0\n    for item in items:\n        count += item\n    return \n"
CURSOR = types.Position(4, 11)  # after `return `

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    with command() as (url, _):
        yield url


@pytest_lsp.fixture(config=ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server"]), scope="module")
async def client(lsp_client: LanguageClient, served: str):  # type: ignore[no-untyped-def]
    caps = client_capabilities("neovim")
    if caps.text_document is not None:
        caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    # no fills made ahead: the tests count the fills serve answered
    options = {"diffusionLsp": {"endpoint": served, "dialect": "openai-fim", "alternatives": 2, "fillAhead": False}}
    await lsp_client.initialize_session(types.InitializeParams(capabilities=caps, initialization_options=options))
    lsp_client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(URI, "python", 1, TEXT)))
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(config=ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server"]), scope="module")
async def gated(lsp_client: LanguageClient, served: str):  # type: ignore[no-untyped-def]
    """A language server that asks serve for log-probabilities and shows Automatic fills
    only at confidence 1 (none is that sure); a generous deadline, so a loaded machine
    still gets its fill."""
    caps = client_capabilities("neovim")
    if caps.text_document is not None:
        caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    settings = {"endpoint": served, "dialect": "openai-fim", "logprobs": "on", "minConfidence": 1, "deadlineMs": 30000}
    await lsp_client.initialize_session(
        types.InitializeParams(capabilities=caps, initialization_options={"diffusionLsp": settings})
    )
    lsp_client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(URI, "python", 1, TEXT)))
    yield
    await lsp_client.shutdown_session()


async def inline(client: LanguageClient, kind: types.InlineCompletionTriggerKind) -> list[types.InlineCompletionItem]:
    result = await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(URI),
            position=CURSOR,
            context=types.InlineCompletionContext(trigger_kind=kind),
        )
    )
    return result.items if isinstance(result, types.InlineCompletionList) else result or []


async def test_an_automatic_fill_under_min_confidence_is_held_back(gated: LanguageClient, served: str) -> None:
    asked = await inline(gated, types.InlineCompletionTriggerKind.Invoked)
    assert asked and all(i.insert_text for i in asked)  # asked for: shown, whatever its confidence
    assert await inline(gated, types.InlineCompletionTriggerKind.Automatic) == []
    held = [m.message for m in gated.log_messages if "a fill was held back" in m.message]
    assert held, [m.message for m in gated.log_messages]
    found = re.search(r"its confidence ([0-9.]+) is below minConfidence 1\.00", held[-1])
    assert found, held[-1]
    # the confidence is the engine's own: what serve gives the request the dialect sent (a line's budget)
    prefix, suffix = TEXT[: TEXT.index("return ") + 7], TEXT[TEXT.index("return ") + 7 :]
    body = {"prompt": prefix, "suffix": suffix, "max_tokens": 32, "temperature": 0.0, "stop": ["\n"], "logprobs": 1}
    choice = httpx.post(served + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    assert found.group(1) == f"{math.exp(min(choice['logprobs']['token_logprobs'])):.2f}"


def served_fills(url: str, route: str) -> float:
    scrape = httpx.get(url + "/metrics").text
    return read_metric(scrape, f'diffusion_serve_requests_total{{route="{route}",status="200"}}')


@pytest.mark.parametrize(
    "kind", [types.InlineCompletionTriggerKind.Invoked, types.InlineCompletionTriggerKind.Automatic]
)
async def test_ghost_text_comes_through_the_fill_server(
    client: LanguageClient, served: str, kind: types.InlineCompletionTriggerKind
) -> None:
    before = served_fills(served, "/v1/completions")
    result = await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(URI),
            position=CURSOR,
            context=types.InlineCompletionContext(trigger_kind=kind),
        )
    )
    items = result.items if isinstance(result, types.InlineCompletionList) else result or []
    assert all(isinstance(i.insert_text, str) for i in items)
    assert served_fills(served, "/v1/completions") == before + 1  # the fill went to the server and back
    faults = [m.message for m in client.messages if m.type in (types.MessageType.Error, types.MessageType.Warning)]
    assert faults == []
