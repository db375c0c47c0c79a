"""The language server on a real inference engine (llama.cpp's server through xllamacpp,
tests/real_engine.py), set up with the two settings a user sets (`endpoint`, `dialect`):
ghost text, Invoked alternatives, drafts and Fill hole come from the engine."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from tests.lsp.helpers import TOTAL_TEXT as TEXT
from tests.lsp.helpers import TOTAL_URI as URI
from tests.lsp.helpers import action, inline
from tests.real_engine import RunningEngine

pytest.importorskip("xllamacpp")

HOLE_URI = "file:///work/hole.py"
HOLE_TEXT = "def area(w, h):\n    # TODO\n\n\nprint(area(2, 3))\n"

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_lsp.fixture(config=ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server"]), scope="module")
async def client(lsp_client: LanguageClient, real_engine: RunningEngine):  # type: ignore[no-untyped-def]
    caps = client_capabilities("visual_studio_code")
    if caps.text_document is not None:
        caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    drafts: list[Any] = []
    lsp_client.feature("diffusion/draft")(lambda params: drafts.append(params))
    lsp_client.drafts = drafts  # type: ignore[attr-defined]

    @lsp_client.feature(types.WORKSPACE_APPLY_EDIT)
    def apply_edit(params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
        return types.ApplyWorkspaceEditResult(applied=True)

    await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=caps,
            initialization_options={
                "diffusionLsp": {
                    "endpoint": real_engine.url,
                    "dialect": "llama-infill",
                    "alternatives": 3,
                    "drafts": True,
                }
            },
        )
    )
    for uri, text in ((URI, TEXT), (HOLE_URI, HOLE_TEXT)):
        lsp_client.text_document_did_open(
            types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "python", 1, text))
        )
    yield
    await lsp_client.shutdown_session()


async def test_ghost_text_and_its_drafts_come_from_the_engine(client: LanguageClient) -> None:
    drafts: list[Any] = client.drafts  # type: ignore[attr-defined]
    drafts.clear()
    (text,) = await inline(client, types.InlineCompletionTriggerKind.Automatic)
    assert text == "x" * 32  # the greedy fill, the span's whole budget
    texts = [d._asdict()["text"] for d in drafts]  # pygls hands custom notifications over as named tuples
    assert len(texts) >= 2 and all(t and set(t) <= {"x"} for t in texts) and texts[-1] == text


async def test_invoked_alternatives_come_from_the_engine(client: LanguageClient) -> None:
    texts = await inline(client, types.InlineCompletionTriggerKind.Invoked)
    assert len(texts) == 3 and len(set(texts)) == 3 and all(set(t) <= {"x", "y"} for t in texts)


async def test_fill_hole_is_filled_by_the_engine(client: LanguageClient) -> None:
    cursor = types.Position(1, 6)
    _, command, arguments = await action(client, "Fill hole", types.Range(cursor, cursor), HOLE_URI)
    edit = await client.workspace_execute_command_async(types.ExecuteCommandParams(command, arguments))
    assert edit is not None, [m.message for m in client.messages]
    (change,) = edit["documentChanges"]
    (new,) = change["edits"]
    assert new["range"]["start"]["line"] == 1 and new["newText"].strip() and set(new["newText"].strip()) <= {"x", "y"}
