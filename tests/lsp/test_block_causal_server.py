"""The language server on a Fast-dLLM v2 checkpoint directory in its own format (a tiny
random one; tests/lsp/test_sdar_server.py runs the same on SDAR's): the `model` setting is
all it takes; fills come from the block_causal backend."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from tests import block_checkpoint

pytest.importorskip("transformers")

URI = "file:///work/notes.txt"
TEXT = "first line\n\nlast line\n"

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return block_checkpoint.write(tmp_path_factory.mktemp("fast-dllm-server") / "tiny-fast-dllm", "fast_dllm")


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server", "-v"]), scope="module"
)
async def client(lsp_client: LanguageClient, checkpoint: Path):  # type: ignore[no-untyped-def]
    caps = client_capabilities("neovim")
    if caps.text_document is not None:
        caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=caps,
            initialization_options={"diffusionLsp": {"model": str(checkpoint), "maxFillTokens": 6}},
        )
    )
    lsp_client.text_document_did_open(
        types.DidOpenTextDocumentParams(types.TextDocumentItem(URI, "plaintext", 1, TEXT))
    )
    yield
    await lsp_client.shutdown_session()


async def test_inline_completion_comes_from_the_block_causal_backend(client: LanguageClient, checkpoint: Path) -> None:
    result = await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(URI),
            position=types.Position(1, 0),  # the blank line: a fill of at least one token
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
        )
    )
    logs = [m.message for m in client.log_messages]
    assert any(f"{checkpoint} (block_causal backend)" in m for m in logs), logs
    assert not any(m.type == types.MessageType.Error for m in client.messages), client.messages
    assert result is not None
    items = result.items if isinstance(result, types.InlineCompletionList) else result
    assert items and all(isinstance(i.insert_text, str) and i.insert_text for i in items)
