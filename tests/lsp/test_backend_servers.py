"""The language server on a checkpoint directory of each transformers family in its own
format (tiny random ones: Dream, LLaDA, Fast-dLLM v2, SDAR): the `model` setting is all it
takes; fills come from the backend that family's row of the table names."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from tests import block_checkpoint, dream_checkpoint, llada_checkpoint

pytest.importorskip("transformers")

URI = "file:///work/notes.txt"
TEXT = "first line\n\nlast line\n"
# family: (a tiny checkpoint written into a folder, the backend that must fill it)
FAMILIES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "dream": (dream_checkpoint.write, "dream"),
    "llada": (llada_checkpoint.write, "llada"),
    "fast_dllm": (lambda root: block_checkpoint.write(root, "fast_dllm"), "block_causal"),
    "sdar": (lambda root: block_checkpoint.write(root, "sdar"), "block_causal"),
}

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module", params=list(FAMILIES))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    write, backend = FAMILIES[request.param]
    return write(tmp_path_factory.mktemp(f"{request.param}-server") / f"tiny-{request.param}"), backend


@pytest_lsp.fixture(config=ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server", "-v"]))
async def client(lsp_client: LanguageClient, checkpoint: tuple[Path, str]) -> AsyncIterator[None]:
    caps = client_capabilities("neovim")
    if caps.text_document is not None:
        caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=caps,
            initialization_options={"diffusionLsp": {"model": str(checkpoint[0]), "maxFillTokens": 6}},
        )
    )
    lsp_client.text_document_did_open(
        types.DidOpenTextDocumentParams(types.TextDocumentItem(URI, "plaintext", 1, TEXT))
    )
    yield
    await lsp_client.shutdown_session()


async def test_inline_completion_comes_from_the_familys_backend(
    client: LanguageClient, checkpoint: tuple[Path, str]
) -> None:
    path, backend = checkpoint
    result = await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(URI),
            position=types.Position(1, 0),  # the blank line: a fill of at least one token
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
        )
    )
    logs = [m.message for m in client.log_messages]
    assert any(f"{path} ({backend} backend)" in m for m in logs), logs
    assert not any(m.type == types.MessageType.Error for m in client.messages), client.messages
    assert result is not None
    items = result.items if isinstance(result, types.InlineCompletionList) else result
    assert items and all(isinstance(i.insert_text, str) and i.insert_text for i in items)
