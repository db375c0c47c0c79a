"""Tree-sitter spans: where a fill starts and ends, syntax validation, holes, edit regions.

Pure functions over text (and a syntax tree when the language has a grammar); no LSP, no
torch. See docs/spans.md for the rules.
"""

from engine.spans.document import Document
from engine.spans.languages import LANGUAGES, Language, language_for, parser_for
from engine.spans.regions import (
    RegionFill,
    calls_of_changed_signature,
    enclosing_node,
    enclosing_scope,
    expand_selection,
    fill_holes_jointly,
    find_holes,
)
from engine.spans.select import Span, SpanKind, select_span
from engine.spans.validate import Verdict, count_errors, validate_fill

__all__ = [
    "LANGUAGES",
    "Document",
    "Language",
    "RegionFill",
    "Span",
    "SpanKind",
    "Verdict",
    "calls_of_changed_signature",
    "count_errors",
    "enclosing_node",
    "enclosing_scope",
    "expand_selection",
    "fill_holes_jointly",
    "find_holes",
    "language_for",
    "parser_for",
    "select_span",
    "validate_fill",
]
