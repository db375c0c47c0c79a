"""Edits the user asks for: code actions (fill hole, fill all holes, regenerate or refine
a selection) run as commands that apply versioned WorkspaceEdits, and diffusion/inlineEdit
(next edit suggestion). A region for which no fill parses is left as it is."""

from __future__ import annotations

from lsprotocol import converters, types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.workspace import TextDocument

from engine.fill import InfillRequest
from engine.spans import Span, enclosing_node, expand_selection, find_holes
from engine.spans.lines import line_end, line_start
from lsp_server import convert
from lsp_server.context import grammar_name, open_document, require, syntax_tree
from lsp_server.protocol import DiffusionServer
from lsp_server.service import REGION

INLINE_EDIT = "diffusion/inlineEdit"  # custom request: next edit suggestion
REGION_CANDIDATES = 8  # when the greedy fill of a region is blank: candidates to choose a parsing fill from
MAX_INLINE_EDIT_CHARS = 2000  # a next-edit rewrites a statement, not a whole file
_CONVERTER = converters.get_converter()


def code_action(ls: DiffusionServer, params: types.CodeActionParams) -> list[types.CodeAction] | None:
    """The actions that apply at the range: fill the hole on its lines, fill every hole,
    regenerate or refine a non-empty selection."""
    require(params, types.CodeActionParams)
    uri = params.text_document.uri
    doc = open_document(ls, uri)
    if doc is None:
        return None
    start, end = convert.locate(doc, params.range.start), convert.locate(doc, params.range.end)
    holes = find_holes(syntax_tree(ls, uri, doc))
    actions = []
    here = holes_on_lines(doc.source, holes, start.offset, end.offset)
    if here:
        pos = convert.position_at(doc, here[0].start)
        actions.append(_action("Fill hole", "diffusion.fillHole", [uri, pos.line, pos.character]))
    if holes:
        actions.append(_action("Fill all holes in file", "diffusion.fillAllHoles", [uri]))
    if end.offset > start.offset:
        actions += _selection_actions(uri, start.position, end.position)
    return actions or None


async def fill_hole(ls: DiffusionServer, uri: str, line: int, character: int) -> types.WorkspaceEdit | None:
    doc = open_document(ls, uri)
    if doc is None:
        return None
    at = convert.locate(doc, convert.position(line, character, "diffusion.fillHole")).offset
    holes = [h for h in find_holes(syntax_tree(ls, uri, doc)) if h.start <= at <= h.end]
    if not holes:
        return None
    return await _replace(ls, doc, uri, holes[0].start, holes[0].end)


async def fill_all_holes(ls: DiffusionServer, uri: str) -> types.WorkspaceEdit | None:
    """Every hole filled so that the fills agree (engine.spans.fill_holes_jointly), on
    the worker, as one edit; holes with no fill that parses are left, with a message."""
    doc = open_document(ls, uri)
    holes = find_holes(syntax_tree(ls, uri, doc)) if doc is not None else []
    if doc is None or not holes:
        return None
    version = doc.version
    request = InfillRequest(doc.source, language=grammar_name(doc), retry_candidates=REGION_CANDIDATES)
    answer = await ls.fills.fill(uri, request, REGION, holes=holes)
    if answer is None or not _current(ls, uri, version):
        return None
    edits = [_text_edit(doc, h.start, h.end, fill) for h, fill in zip(holes, answer.holes, strict=True) if fill]
    if len(edits) < len(holes):
        ls.tell(f"no fill that parses for {len(holes) - len(edits)} of {len(holes)} holes; those were left as they are")
    return _edit(ls, uri, version, edits, apply=True, label="Fill all holes") if edits else None


async def regenerate_selection(
    ls: DiffusionServer, uri: str, sl: int, sc: int, el: int, ec: int
) -> types.WorkspaceEdit | None:
    what = "diffusion.regenerateSelection"
    return await _rewrite_selection(
        ls, uri, types.Range(convert.position(sl, sc, what), convert.position(el, ec, what)), False
    )


async def refine_selection(
    ls: DiffusionServer, uri: str, sl: int, sc: int, el: int, ec: int
) -> types.WorkspaceEdit | None:
    what = "diffusion.refineSelection"
    return await _rewrite_selection(
        ls, uri, types.Range(convert.position(sl, sc, what), convert.position(el, ec, what)), True
    )


async def inline_edit(ls: DiffusionServer, params: object) -> dict[str, object]:
    """Next edit suggestion: the statement around the position, refined (its unlikely
    tokens re-filled). Answer: {"edits": [{"range", "text", "textDocument": {"uri",
    "version"}}]}, the shape Copilot's inline edits use; no edits when nothing changes."""
    uri, _version, position = _inline_edit_params(params)
    doc = open_document(ls, uri)
    if doc is None or not doc.source.strip():
        return {"edits": []}
    lo, hi = enclosing_node(syntax_tree(ls, uri, doc), convert.locate(doc, position).offset)
    if hi - lo > MAX_INLINE_EDIT_CHARS or (lo, hi) == (0, len(doc.source)):
        return {"edits": []}  # no statement here (a blank line): nothing to suggest
    edit = await _replace(ls, doc, uri, lo, hi, refine=True, apply=False)
    change = edit.document_changes[0].edits[0] if edit is not None and edit.document_changes else None  # type: ignore[union-attr]
    if not isinstance(change, types.TextEdit) or change.new_text == doc.source[lo:hi]:
        return {"edits": []}
    rng = _CONVERTER.unstructure(change.range)
    return {"edits": [{"range": rng, "text": change.new_text, "textDocument": {"uri": uri, "version": doc.version}}]}


def holes_on_lines(text: str, holes: list[Span], start: int, end: int) -> list[Span]:
    """The holes that start on the lines from offset `start` to offset `end`."""
    lo, hi = line_start(text, start), line_end(text, end)
    return [h for h in holes if lo <= h.start <= hi]


def _selection_actions(uri: str, start: types.Position, end: types.Position) -> list[types.CodeAction]:
    rng = [uri, start.line, start.character, end.line, end.character]
    return [
        _action("Regenerate selection", "diffusion.regenerateSelection", rng),
        _action("Refine selection", "diffusion.refineSelection", rng),
    ]


async def _rewrite_selection(
    ls: DiffusionServer, uri: str, rng: types.Range, refine: bool
) -> types.WorkspaceEdit | None:
    """Regenerate (everything masked) or refine (unlikely tokens masked) a selection grown
    to whole syntax nodes."""
    doc = open_document(ls, uri)
    if doc is None:
        return None
    lo = convert.locate(doc, rng.start).offset
    hi = convert.locate(doc, rng.end).offset
    lo, hi = expand_selection(syntax_tree(ls, uri, doc), lo, hi)
    return await _replace(ls, doc, uri, lo, hi, refine=refine)


async def _replace(
    ls: DiffusionServer, doc: TextDocument, uri: str, start: int, end: int, refine: bool = False, apply: bool = True
) -> types.WorkspaceEdit | None:
    """Fill text[start:end] from its surroundings (or refine the text there) and apply the
    edit in the client. The range and version are those of the text the fill was made
    for; when the document changes meanwhile, the fill is dropped."""
    text, version = doc.source, doc.version
    req = InfillRequest(
        text[:start],
        text[end:],
        grammar_name(doc),
        region=text[start:end],
        refine=refine,
        retry_candidates=REGION_CANDIDATES,  # a blank fill would delete the region: never that
    )
    answer = await ls.fills.fill(uri, req, REGION)
    if answer is None or not _current(ls, uri, version):
        return None
    if not answer.text:  # never delete the user's code for want of a fill
        if apply:
            ls.tell("no fill that parses here; the text was left as it is")
        return None
    return _edit(ls, uri, version, [_text_edit(doc, start, end, answer.text)], apply)


def _current(ls: DiffusionServer, uri: str, version: int | None) -> bool:
    """Whether the document is still open at `version` (an answer for another is dropped)."""
    now = open_document(ls, uri)
    return now is not None and now.version == version


def _text_edit(doc: TextDocument, start: int, end: int, text: str) -> types.TextEdit:
    return types.TextEdit(types.Range(convert.position_at(doc, start), convert.position_at(doc, end)), text)


def _edit(
    ls: DiffusionServer,
    uri: str,
    version: int | None,
    edits: list[types.TextEdit],
    apply: bool,
    label: str = "diffusion-lsp",
) -> types.WorkspaceEdit:
    """The edits as one WorkspaceEdit for that version of the document, applied in the
    client when `apply` (the client refuses it if the document has changed since)."""
    edit = convert.versioned_edit(uri, version, edits)
    if apply:
        ls.workspace_apply_edit(types.ApplyWorkspaceEditParams(edit, label=label))
    return edit


def _action(title: str, command: str, arguments: list[object]) -> types.CodeAction:
    """A rewrite code action that runs one of our commands."""
    cmd = types.Command(title=title, command=command, arguments=arguments)
    return types.CodeAction(title, kind=types.CodeActionKind.RefactorRewrite, command=cmd)


def _inline_edit_params(params: object) -> tuple[str, int | None, types.Position]:
    """(uri, version, position) of a diffusion/inlineEdit request; InvalidParams else."""

    def get(obj: object, key: str) -> object:
        return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)

    doc, pos = get(params, "textDocument"), get(params, "position")
    uri = get(doc, "uri")
    if not isinstance(uri, str):
        raise JsonRpcInvalidParams("diffusion/inlineEdit needs textDocument.uri and a position")
    at = convert.position(get(pos, "line"), get(pos, "character"), "diffusion/inlineEdit")
    version = get(doc, "version")
    return uri, version if isinstance(version, int) else None, at
