"""Code actions and their commands: fill hole, fill all holes, regenerate selection,
applied as WorkspaceEdits (the client's workspace/applyEdit is captured here)."""

from __future__ import annotations

import ast
import sys

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

URI = "file:///work/holes.py"
TEXT = "def area(w, h):\n    pass\n\n\ndef perimeter(w, h):\n    # TODO: compute it\n\n\ntotal = area(2, 3) + perimeter(2, 3)\n"

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_lsp.fixture(config=ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server"]), scope="module")
async def client(lsp_client: LanguageClient):  # type: ignore[no-untyped-def]
    applied: list[types.WorkspaceEdit] = []

    @lsp_client.feature(types.WORKSPACE_APPLY_EDIT)
    def apply_edit(params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
        applied.append(params.edit)
        return types.ApplyWorkspaceEditResult(applied=True)

    lsp_client.applied = applied  # type: ignore[attr-defined]
    await lsp_client.initialize_session(types.InitializeParams(capabilities=client_capabilities("visual_studio_code")))
    lsp_client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(URI, "python", 1, TEXT)))
    yield
    await lsp_client.shutdown_session()


async def actions(client: LanguageClient, rng: types.Range, uri: str = URI) -> list[tuple[str, str, list[object]]]:
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


async def run(client: LanguageClient, action: tuple[str, str, list[object]], uri: str = URI) -> types.WorkspaceEdit:
    _, command, arguments = action
    result = await client.workspace_execute_command_async(types.ExecuteCommandParams(command, arguments))
    assert result is not None, [m.message for m in client.messages]  # None: no fill parsed (the server says so)
    (change,) = result["documentChanges"]  # one versioned edit of the document
    assert change["textDocument"]["uri"] == uri and isinstance(change["textDocument"]["version"], int)
    return types.WorkspaceEdit(changes={uri: [types.TextEdit(**_edit(e)) for e in change["edits"]]})


def _edit(raw: dict) -> dict:  # type: ignore[type-arg]
    r = raw["range"]
    rng = types.Range(types.Position(**r["start"]), types.Position(**r["end"]))
    return {"range": rng, "new_text": raw["newText"]}


async def test_a_hole_under_the_cursor_offers_fill_hole_and_fill_all(client: LanguageClient) -> None:
    cursor = types.Position(1, 6)  # on `pass`
    titles = [a[0] for a in await actions(client, types.Range(cursor, cursor))]
    assert titles == ["Fill hole", "Fill all holes in file"]
    nowhere = types.Position(8, 3)  # the last line: no hole there, no selection
    assert [a[0] for a in await actions(client, types.Range(nowhere, nowhere))] == ["Fill all holes in file"]


async def test_fill_hole_replaces_the_marker_only(client: LanguageClient) -> None:
    # a body with a docstring: the shipped model finds a fill here that compiles
    uri = "file:///work/docstring.py"
    text = 'def area(w, h):\n    """The area."""\n    pass\n\n\nprint(area(2, 3))\n'
    client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "python", 1, text)))
    cursor = types.Position(2, 6)
    fill_hole = (await actions(client, types.Range(cursor, cursor), uri))[0]
    edit = await run(client, fill_hole, uri)
    (change,) = edit.changes[uri]  # type: ignore[index]
    assert change.range == types.Range(types.Position(2, 4), types.Position(2, 8))  # `pass`
    assert change.new_text.strip()
    applied = client.applied[-1].document_changes[0]  # type: ignore[attr-defined]
    assert applied.edits[0].range == change.range


async def test_fill_all_holes_edits_every_hole_in_one_edit(client: LanguageClient) -> None:
    cursor = types.Position(1, 6)
    fill_all = (await actions(client, types.Range(cursor, cursor)))[1]
    before = await client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
    edit = await run(client, fill_all)
    after = await client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
    ranges = sorted((e.range.start.line, e.range.start.character) for e in edit.changes[URI])  # type: ignore[index]
    assert ranges == [(1, 4), (5, 4)]  # `pass` and the TODO comment
    # jointly: a fill per hole, then each refined with the other's fill in place
    assert after["engine_calls"] - before["engine_calls"] == 4


async def test_regenerate_selection_grows_to_whole_nodes(client: LanguageClient) -> None:
    sel = types.Range(types.Position(8, 10), types.Position(8, 14))  # "ea(2": part of `area(2, 3)`
    action = next(a for a in await actions(client, sel) if a[0] == "Regenerate selection")
    edit = await run(client, action)
    (change,) = edit.changes[URI]  # type: ignore[index]
    assert change.range == types.Range(types.Position(8, 8), types.Position(8, 18))  # `area(2, 3)`


async def test_refine_selection_rewrites_the_selected_nodes(client: LanguageClient) -> None:
    sel = types.Range(types.Position(8, 10), types.Position(8, 14))
    action = next(a for a in await actions(client, sel) if a[0] == "Refine selection")
    edit = await run(client, action)
    (change,) = edit.changes[URI]  # type: ignore[index]
    assert change.range == types.Range(types.Position(8, 8), types.Position(8, 18))


def field(obj: object, key: str) -> object:
    """A key of a JSON object as the test client hands it over (dict or pygls Object)."""
    return obj[key] if isinstance(obj, dict) else getattr(obj, key)


async def test_inline_edit_proposes_a_rewrite_of_the_enclosing_statement(client: LanguageClient) -> None:
    params = {"textDocument": {"uri": URI, "version": 1}, "position": {"line": 8, "character": 10}}
    result = await client.protocol.send_request_async("diffusion/inlineEdit", params)
    edits = field(result, "edits")
    assert isinstance(edits, (list, tuple))
    for edit in edits:  # the shipped model may or may not change the statement
        start = field(field(edit, "range"), "start")
        assert field(start, "line") == 8 and field(start, "character") == 0  # the whole statement
        assert field(field(edit, "textDocument"), "uri") == URI and isinstance(field(edit, "text"), str)


async def test_inline_edit_with_bad_params_is_invalid_params(client: LanguageClient) -> None:
    with pytest.raises(Exception, match="InvalidParams|needs textDocument"):
        await client.protocol.send_request_async("diffusion/inlineEdit", {"position": "nowhere"})
    stats = await client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
    assert stats["model_loaded"] is True  # still serving


async def test_a_hole_with_no_fill_that_compiles_is_left_alone_and_the_user_told(client: LanguageClient) -> None:
    """The shipped model's fills for this `pass` do not compile (checked by CPython's
    parser): nothing is applied, and a message says why."""
    cursor = types.Position(1, 6)
    applied = len(client.applied)  # type: ignore[attr-defined]
    fill_hole = (await actions(client, types.Range(cursor, cursor)))[0]
    result = await client.workspace_execute_command_async(types.ExecuteCommandParams(fill_hole[1], fill_hole[2]))
    assert result is None
    assert len(client.applied) == applied  # type: ignore[attr-defined]
    assert any("no fill that parses here" in m.message for m in client.messages)
