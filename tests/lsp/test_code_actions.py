"""Code actions and their commands: fill hole, fill all holes, regenerate selection,
refine selection and diffusion/inlineEdit, applied as WorkspaceEdits (the client's
workspace/applyEdit is captured here).

The server is the real one with a scripted model (tests/lsp/scripted_server.py): the fill
for each place is chosen below, so every outcome (the edit, its text, "no fill that
parses") is fixed by the script and the server's logic, never by what the shipped weights
happen to write."""

from __future__ import annotations

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from tests.lsp import helpers
from tests.lsp.scripted_server import scripted_command

URI = "file:///work/holes.py"
TEXT = "def area(w, h):\n    pass\n\n\ndef perimeter(w, h):\n    # TODO: compute it\n\n\ntotal = area(2, 3) + perimeter(2, 3)\n"

AREA = "def area(w, h):\n    "  # the text before the `pass` in TEXT
PERIMETER = "def perimeter(w, h):\n    "  # the text before the TODO in TEXT
SCRIPT = {
    "rules": [
        # fill all holes, made to show which text each fill was made in: the perimeter's
        # TODO first (holes are filled last to first) while `pass` is still there, then
        # area's `pass` with the perimeter's first fill in place; then both refined, the
        # perimeter's with area's fill in place
        {"after": PERIMETER, "contains": "return w * h", "fill": "return 2 * (w + h)"},
        {"after": PERIMETER, "fill": "return w + w + h + h"},
        {"after": AREA, "contains": "return w + w + h + h", "fill": "return w * h"},
        {"after": AREA, "fill": "return 0"},  # area alone: a fill made without the other's
        # a single hole under a docstring
        {"after": '"""The area."""\n    ', "fill": "return w * h"},
        # a hole whose fills do not compile (nor does any cut of them): one tree-sitter
        # rejects, one only CPython's parser rejects (its second line's indentation)
        {"after": "def broken(w, h):\n    ", "fill": [") * (", "w * h\n  return 0"]},
        # the selection `area(2, 3)` in `total = ...`, regenerated or refined
        {"after": "total = ", "before": " + perimeter", "fill": "area(3, 2)"},
        # the selection `area(2, 3)` in `size = ...`, refined: one argument changes
        {"after": "size = ", "fill": "area(2, 4)"},
        # the statement `total = ...` as a whole (diffusion/inlineEdit)
        {"after": "compute it\n\n\n", "before": "\n", "fill": "total = area(2, 3) * perimeter(2, 3)"},
        {"after": "y = 2\n", "before": "\n", "fill": "x = 1"},  # the statement as it is
        # blank fills, where deleting the selection would still compile
        {"contains": "# blank only", "fill": ""},
        {"contains": "# blank first", "fill": ["", "area(4, 5)"]},
    ],
    "default": "return None",
}

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_lsp.fixture(config=ClientServerConfig(server_command=scripted_command(SCRIPT)), scope="module")
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


def open_doc(client: LanguageClient, uri: str, text: str) -> None:
    client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "python", 1, text)))


async def actions(client: LanguageClient, rng: types.Range, uri: str = URI) -> list[tuple[str, str, list[object]]]:
    return await helpers.actions(client, rng, uri)


async def action(client: LanguageClient, title: str, rng: types.Range, uri: str = URI) -> tuple[str, str, list[object]]:
    return await helpers.action(client, title, rng, uri)


async def run(client: LanguageClient, action: tuple[str, str, list[object]], uri: str = URI) -> list[types.TextEdit]:
    """Execute the action's command: the edits of the one versioned document change it
    answers with, which is also the edit the server asked the client to apply."""
    _, command, arguments = action
    applied = len(client.applied)  # type: ignore[attr-defined]
    result = await client.workspace_execute_command_async(types.ExecuteCommandParams(command, arguments))
    assert result is not None, [m.message for m in client.messages]  # None: no fill parsed (the server says so)
    (change,) = result["documentChanges"]  # one versioned edit of the document
    assert change["textDocument"] == {"uri": uri, "version": 1}
    edits = [types.TextEdit(**_edit(e)) for e in change["edits"]]
    (sent,) = client.applied[applied:]  # type: ignore[attr-defined]
    (sent_change,) = sent.document_changes
    assert sent_change.text_document.version == 1 and list(sent_change.edits) == edits
    return edits


async def refused(client: LanguageClient, action: tuple[str, str, list[object]]) -> list[str]:
    """Execute the action's command, which must answer None and apply nothing: the
    messages the server showed meanwhile."""
    _, command, arguments = action
    applied, shown = len(client.applied), len(client.messages)  # type: ignore[attr-defined]
    result = await client.workspace_execute_command_async(types.ExecuteCommandParams(command, arguments))
    assert result is None
    assert len(client.applied) == applied  # type: ignore[attr-defined]
    return [m.message for m in client.messages[shown:]]


def _edit(raw: dict) -> dict:  # type: ignore[type-arg]
    r = raw["range"]
    rng = types.Range(types.Position(**r["start"]), types.Position(**r["end"]))
    return {"range": rng, "new_text": raw["newText"]}


def span(sl: int, sc: int, el: int, ec: int) -> types.Range:
    return types.Range(types.Position(sl, sc), types.Position(el, ec))


async def engine_calls(client: LanguageClient) -> int:
    stats = await client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
    assert isinstance(stats, dict)
    return int(stats["engine_calls"])


async def test_a_hole_under_the_cursor_offers_fill_hole_and_fill_all(client: LanguageClient) -> None:
    cursor = types.Position(1, 6)  # on `pass`
    titles = [a[0] for a in await actions(client, types.Range(cursor, cursor))]
    assert titles == ["Fill hole", "Fill all holes in file"]
    nowhere = types.Position(8, 3)  # the last line: no hole there, no selection
    assert [a[0] for a in await actions(client, types.Range(nowhere, nowhere))] == ["Fill all holes in file"]


async def test_fill_hole_replaces_the_marker_only(client: LanguageClient) -> None:
    uri = "file:///work/docstring.py"
    open_doc(client, uri, 'def area(w, h):\n    """The area."""\n    pass\n\n\nprint(area(2, 3))\n')
    cursor = types.Position(2, 6)
    fill_hole = await action(client, "Fill hole", types.Range(cursor, cursor), uri)
    edits = await run(client, fill_hole, uri)
    assert edits == [types.TextEdit(span(2, 4, 2, 8), "return w * h")]  # `pass`, and nothing else


async def test_fill_all_holes_fills_them_jointly_in_one_edit(client: LanguageClient) -> None:
    """Each hole's fill is made with the other hole filled: area's `return w * h` only
    where the perimeter's first fill is in place, the perimeter's refined
    `return 2 * (w + h)` only where area's fill is (see SCRIPT)."""
    cursor = types.Position(1, 6)
    fill_all = await action(client, "Fill all holes in file", types.Range(cursor, cursor))
    before = await engine_calls(client)
    edits = await run(client, fill_all)
    after = await engine_calls(client)
    assert edits == [
        types.TextEdit(span(1, 4, 1, 8), "return w * h"),  # `pass`
        types.TextEdit(span(5, 4, 5, 22), "return 2 * (w + h)"),  # the TODO comment
    ]
    # jointly: a fill per hole, then each refined with the other's fill in place
    assert after - before == 4


async def test_a_hole_with_no_fill_that_compiles_is_left_alone_and_the_user_told(client: LanguageClient) -> None:
    """Neither scripted fill for this `pass` compiles (checked by tree-sitter, and by
    CPython's parser): nothing is applied, and a message says why."""
    uri = "file:///work/broken.py"
    open_doc(client, uri, "def broken(w, h):\n    pass\n\n\nprint(broken(2, 3))\n")
    cursor = types.Position(1, 6)
    messages = await refused(client, await action(client, "Fill hole", types.Range(cursor, cursor), uri))
    assert any("no fill that parses here" in m for m in messages), messages


async def test_fill_all_holes_leaves_a_hole_without_a_fill_and_says_how_many(client: LanguageClient) -> None:
    uri = "file:///work/some.py"
    open_doc(client, uri, "def broken(w, h):\n    pass\n\n\ndef area(w, h):\n    pass\n")
    cursor = types.Position(1, 6)
    fill_all = await action(client, "Fill all holes in file", types.Range(cursor, cursor), uri)
    before = await engine_calls(client)
    shown = len(client.messages)
    edits = await run(client, fill_all, uri)
    assert edits == [types.TextEdit(span(5, 4, 5, 8), "return 0")]  # area's; broken's stays `pass`
    # broken's hole: the greedy fill, then the sampled candidates (none parses); area's:
    # its greedy fill; only one hole filled, so no second pass refines it against another
    assert await engine_calls(client) - before == 3
    messages = [m.message for m in client.messages[shown:]]
    assert any("no fill that parses for 1 of 2 holes" in m for m in messages), messages


async def test_regenerate_selection_grows_to_whole_nodes(client: LanguageClient) -> None:
    sel = span(8, 10, 8, 14)  # "ea(2": part of `area(2, 3)`
    edits = await run(client, await action(client, "Regenerate selection", sel))
    assert edits == [types.TextEdit(span(8, 8, 8, 18), "area(3, 2)")]  # `area(2, 3)`, replaced


async def test_refine_selection_replaces_only_what_the_fill_changes(client: LanguageClient) -> None:
    """The scripted model cannot score text, so the selection (grown to `area(2, 3)`) is
    re-filled, and the edit is bounded to where the fill differs: the one argument."""
    uri = "file:///work/size.py"
    open_doc(client, uri, "size = area(2, 3)\n")
    edits = await run(client, await action(client, "Refine selection", span(0, 9, 0, 12), uri), uri)
    assert edits == [types.TextEdit(span(0, 15, 0, 16), "4")]


async def test_refine_selection_that_would_rewrite_more_than_a_fix_changes_nothing(client: LanguageClient) -> None:
    """The re-fill swaps both arguments: not the shape of a fix (engine.edits.is_fix), so
    nothing is applied, and the server says so."""
    sel = span(8, 10, 8, 14)
    messages = await refused(client, await action(client, "Refine selection", sel))
    assert any("nothing here that the model finds wrong" in m for m in messages), messages


async def test_a_blank_fill_never_deletes_the_selection(client: LanguageClient) -> None:
    """The scripted fill is empty and `print()` compiles, so the engine offers it; the
    server applies nothing rather than delete the user's code."""
    uri = "file:///work/blank.py"
    open_doc(client, uri, "print(area(2, 3))  # blank only\n")
    regenerate = await action(client, "Regenerate selection", span(0, 6, 0, 16), uri)
    messages = await refused(client, regenerate)
    assert any("no fill that parses here" in m for m in messages), messages


async def test_a_blank_best_fill_gives_way_to_the_next_candidate(client: LanguageClient) -> None:
    uri = "file:///work/blank-first.py"
    open_doc(client, uri, "print(area(2, 3))  # blank first\n")
    regenerate = await action(client, "Regenerate selection", span(0, 6, 0, 16), uri)
    assert await run(client, regenerate, uri) == [types.TextEdit(span(0, 6, 0, 16), "area(4, 5)")]


def field(obj: object, key: str) -> object:
    """A key of a JSON object as the test client hands it over (dict or pygls Object)."""
    return obj[key] if isinstance(obj, dict) else getattr(obj, key)


async def inline_edits(client: LanguageClient, uri: str, line: int, character: int) -> list[object]:
    params = {"textDocument": {"uri": uri, "version": 1}, "position": {"line": line, "character": character}}
    result = await client.protocol.send_request_async("diffusion/inlineEdit", params)
    edits = field(result, "edits")
    assert isinstance(edits, (list, tuple))
    return list(edits)


async def test_inline_edit_proposes_only_what_the_statement_needs(client: LanguageClient) -> None:
    """The statement `total = ...` is re-filled (the scripted model cannot score) as
    `... * ...`: the edit is the operator alone, not the statement."""
    applied = len(client.applied)  # type: ignore[attr-defined]
    (edit,) = await inline_edits(client, URI, 8, 10)
    rng = field(edit, "range")
    start, end = field(rng, "start"), field(rng, "end")
    assert (field(start, "line"), field(start, "character")) == (8, 19)
    assert (field(end, "line"), field(end, "character")) == (8, 20)
    assert field(edit, "text") == "*"
    doc = field(edit, "textDocument")
    assert field(doc, "uri") == URI and field(doc, "version") == 1
    assert len(client.applied) == applied  # type: ignore[attr-defined]  # a proposal, not applied


async def test_inline_edit_that_changes_nothing_proposes_nothing(client: LanguageClient) -> None:
    uri = "file:///work/same.py"
    open_doc(client, uri, "y = 2\nx = 1\n")
    assert await inline_edits(client, uri, 1, 2) == []  # the fill is `x = 1` as it stands


async def test_inline_edit_with_bad_params_is_invalid_params(client: LanguageClient) -> None:
    with pytest.raises(Exception, match="InvalidParams|needs textDocument"):
        await client.protocol.send_request_async("diffusion/inlineEdit", {"position": "nowhere"})
    stats = await client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
    assert stats["model_loaded"] is True  # still serving
