"""What several LSP test modules share (so that none imports another): the file the remote
tests fill in, the shipped model's server command and a sample file, and small requests
(inline completion texts, the code actions offered, a raw response's shape)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

from lsprotocol import types
from pytest_lsp import LanguageClient

ROOT = Path(__file__).resolve().parents[2]
REAL_SERVER = [sys.executable, "-m", "lsp_server"]  # the shipped model
SAMPLE = (ROOT / "fixtures" / "code" / "inventory.py").read_text()
SAMPLE_URI = "file:///work/inventory.py"
INTERNAL_ERROR = -32603
# the file the remote-engine tests fill in, the cursor after `return `
TOTAL_URI = "file:///work/remote.py"
TOTAL_TEXT = "def total(items):\n    count = 0\n    for item in items:\n        count += item\n    return \n"
TOTAL_CURSOR = types.Position(4, 11)


async def inline(client: LanguageClient, kind: types.InlineCompletionTriggerKind) -> list[str]:
    """The texts of the inline completion items at TOTAL_CURSOR in TOTAL_URI."""
    result = await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(TOTAL_URI),
            position=TOTAL_CURSOR,
            context=types.InlineCompletionContext(trigger_kind=kind),
        )
    )
    items = result.items if isinstance(result, types.InlineCompletionList) else result or []
    return [i.insert_text if isinstance(i.insert_text, str) else i.insert_text.value for i in items]


async def actions(client: LanguageClient, rng: types.Range, uri: str) -> list[tuple[str, str, list[object]]]:
    """(title, command, arguments) of each code action offered."""
    result = await client.text_document_code_action_async(
        types.CodeActionParams(types.TextDocumentIdentifier(uri), rng, types.CodeActionContext(diagnostics=[]))
    )
    out = []
    for a in result or []:
        if isinstance(a, types.CodeAction) and a.command is not None:
            out.append((a.title, a.command.command, list(a.command.arguments or [])))
        elif isinstance(a, types.Command):
            # the test client's converter reads a CodeAction that carries a command as a
            # Command whose `command` is the str() of the nested one: undo that here
            nested = (
                ast.literal_eval(a.command)
                if a.command.startswith("{")
                else {"command": a.command, "arguments": a.arguments}
            )
            out.append((a.title, nested["command"], list(nested.get("arguments") or [])))
    return out


async def action(client: LanguageClient, title: str, rng: types.Range, uri: str) -> tuple[str, str, list[object]]:
    return next(a for a in await actions(client, rng, uri) if a[0] == title)


def answered(response: dict[str, Any]) -> bool:
    """A response carries a result, or a clear error: a code other than InternalError (a
    handler that failed) and a one-line message."""
    if "error" in response:
        error = response["error"]
        code = error.get("code")
        return isinstance(code, int) and code != INTERNAL_ERROR and "Traceback" not in str(error.get("message"))
    return "result" in response


def inline_params(uri: str, line: int, character: int, invoked: bool = True) -> dict[str, Any]:
    return {
        "textDocument": {"uri": uri},
        "position": {"line": line, "character": character},
        "context": {"triggerKind": 1 if invoked else 2},
    }
