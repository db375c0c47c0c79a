"""Edits the user asks for: code actions (fill hole, fill all holes, regenerate or refine
a selection) run as commands that apply versioned WorkspaceEdits, and diffusion/inlineEdit
(next edit suggestion). A region for which no fill parses is left as it is."""

from __future__ import annotations

from lsprotocol import converters, types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.workspace import TextDocument

from engine.edits import MAX_PROPOSALS, EditRequest, Replacement, Slot, implied, signature_edits
from engine.fill import InfillRequest
from engine.spans import (
    Document,
    Span,
    enclosing_node,
    enclosing_scope,
    expand_selection,
    find_holes,
    signature_change,
)
from engine.spans.lines import line_end, line_start
from lsp_server import convert
from lsp_server.context import grammar_name, open_document, require, syntax_tree
from lsp_server.protocol import DiffusionServer
from lsp_server.service import REGION
from lsp_server.settings import AUTO

INLINE_EDIT = "diffusion/inlineEdit"  # custom request: next edit suggestion
REGION_CANDIDATES = 8  # when the greedy fill of a region is blank: candidates to choose a parsing fill from
MAX_INLINE_EDIT_CHARS = 2000  # a next-edit rewrites a statement, not a whole file
MAX_REGION_LINES = 3  # a longer statement: a next edit refines the position's line
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
    """Next edit suggestion (engine.edits): what the developer's last edit implies elsewhere
    in the document (the other uses of a renamed name, lines like the one changed), and
    what the statement at the position needs, each bounded to what it fixes. Answer:
    {"edits": [{"range", "text", "confidence", "textDocument": {"uri", "version"}}]}, best
    first (the shape Copilot's inline edits use); no edits where nothing is likely wrong."""
    uri, _version, position = _inline_edit_params(params)
    doc = open_document(ls, uri)
    if doc is None or not doc.source.strip():
        return {"edits": []}
    text, version = doc.source, doc.version
    tree = syntax_tree(ls, uri, doc)
    region = edit_region(tree, convert.locate(doc, position).offset)
    last = ls.fills.last_edit(uri, text)
    proposals: list[Replacement] = []
    slots: list[Slot] = []
    if last is not None:
        signature = signature_change(tree, last.start, last.old, last.new)
        if signature is not None:  # the calls' arguments follow the parameters
            proposals, slots = signature_edits(signature)
        else:  # the old text where it still stands: a rename's other uses
            proposals = implied(text, last.start, last.old, last.new, enclosing_scope(tree, last.start))
        proposals.sort(key=lambda p: abs(p.start - last.start))
        slots.sort(key=lambda s: abs(s.start - last.start))
    # text the developer changed (not new text typed) is theirs: no edit undoes it
    protected = (last.start, last.start + len(last.new)) if last is not None and last.old else None
    req = EditRequest(
        text,
        grammar_name(doc),
        region,
        proposals[:MAX_PROPOSALS],
        margin=_margin(ls),
        protected=protected,
        refills=slots,
    )
    edits = await ls.fills.edits(uri, req)
    if not edits or not _current(ls, uri, version):
        return {"edits": []}
    return {
        "edits": [
            {
                "range": _CONVERTER.unstructure(_text_edit(doc, e.start, e.end, e.text).range),
                "text": e.text,
                "confidence": e.confidence,
                "textDocument": {"uri": uri, "version": version},
            }
            for e in edits
        ]
    }


def edit_region(doc: Document, offset: int) -> tuple[int, int] | None:
    """Where a next edit looks for what is wrong: the statement at `offset` when it is at
    most MAX_REGION_LINES lines, else the line; None on a blank line (nothing to refine)."""
    lo, hi = enclosing_node(doc, offset)
    if hi - lo > MAX_INLINE_EDIT_CHARS or doc.text.count("\n", lo, hi) >= MAX_REGION_LINES:
        lo, hi = line_start(doc.text, offset), line_end(doc.text, offset)
    if not doc.text[lo:hi].strip():
        return None
    return lo, hi


def _margin(ls: DiffusionServer) -> float | None:
    """The editMargin setting for engine.edits (None: its own margins)."""
    value = ls.fills.settings.edit_margin
    return None if value == AUTO else float(value)


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
    """Regenerate (the whole selection re-filled) or refine (the few edits the model finds
    it needs, engine.edits) a selection grown to whole syntax nodes."""
    doc = open_document(ls, uri)
    if doc is None:
        return None
    lo = convert.locate(doc, rng.start).offset
    hi = convert.locate(doc, rng.end).offset
    lo, hi = expand_selection(syntax_tree(ls, uri, doc), lo, hi)
    if not refine:
        return await _replace(ls, doc, uri, lo, hi)
    text, version = doc.source, doc.version
    edits = await ls.fills.edits(uri, EditRequest(text, grammar_name(doc), (lo, hi), margin=_margin(ls)))
    if edits is None or not _current(ls, uri, version):
        return None
    if not edits:
        ls.tell("nothing here that the model finds wrong; the text was left as it is")
        return None
    return _edit(ls, uri, version, [_text_edit(doc, e.start, e.end, e.text) for e in edits], True, "Refine selection")


async def _replace(
    ls: DiffusionServer, doc: TextDocument, uri: str, start: int, end: int
) -> types.WorkspaceEdit | None:
    """Fill text[start:end] from its surroundings and apply the edit in the client. The
    range and version are those of the text the fill was made for; when the document changes meanwhile, the fill is dropped."""
    text, version = doc.source, doc.version
    req = InfillRequest(
        text[:start],
        text[end:],
        grammar_name(doc),
        region=text[start:end],
        retry_candidates=REGION_CANDIDATES,  # a blank fill would delete the region: never that
    )
    answer = await ls.fills.fill(uri, req, REGION)
    if answer is None or not _current(ls, uri, version):
        return None
    if not answer.text:  # never delete the user's code for want of a fill
        ls.tell("no fill that parses here; the text was left as it is")
        return None
    return _edit(ls, uri, version, [_text_edit(doc, start, end, answer.text)], True)


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
