"""Tree-sitter spans: where a fill starts and ends, syntax validation, holes, edit regions.

Pure functions over text (and a syntax tree when the language has a grammar); no LSP, no
torch. See docs/spans.md for the rules.
"""

from engine.spans.document import Document
from engine.spans.languages import LANGUAGES, Language, language_for, parser_for
from engine.spans.regions import (
    RegionFill,
    SignatureChange,
    enclosing_node,
    enclosing_scope,
    expand_selection,
    fill_holes_jointly,
    find_holes,
    signature_change,
)
from engine.spans.select import Span, SpanKind, select_span
from engine.spans.validate import Verdict, count_errors, validate_fill

__all__ = [
    "LANGUAGES",
    "Document",
    "Language",
    "RegionFill",
    "SignatureChange",
    "Span",
    "SpanKind",
    "Verdict",
    "count_errors",
    "enclosing_node",
    "enclosing_scope",
    "expand_selection",
    "fill_holes_jointly",
    "find_holes",
    "language_for",
    "parser_for",
    "select_span",
    "signature_change",
    "validate_fill",
]
