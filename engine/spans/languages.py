"""Languages: LSP languageId and file extension -> a tree-sitter grammar and its conventions.

Grammars come from tree-sitter-language-pack 0.13.0, which bundles them in its wheel (its
1.x releases download grammars at first use, which fails offline). A language without a
grammar, or with the package missing, gets line-based spans: never an error.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Language:
    name: str  # our id, also the grammar name in tree-sitter-language-pack
    line_comment: str  # prefix of a line comment ("" when none)
    hole_lines: tuple[str, ...] = ()  # whole-line hole markers, stripped (besides TODO comments)
    block_open: str = "{"  # a line ending with this opens a block ("" when indentation-based)
    block_keywords: tuple[
        str, ...
    ] = ()  # a line starting with one of these and ending ":" / "do" / "then" opens a block
    string_types: tuple[str, ...] = ("string", "string_literal", "template_string", "raw_string_literal")
    comment_types: tuple[str, ...] = ("comment", "line_comment", "block_comment")
    grammar: bool = True


PYTHON_BLOCKS = (
    "def",
    "class",
    "if",
    "elif",
    "else",
    "for",
    "while",
    "with",
    "try",
    "except",
    "finally",
    "async",
    "match",
    "case",
)

LANGUAGES: dict[str, Language] = {
    "python": Language(
        "python",
        "#",
        hole_lines=("pass", "...", "raise NotImplementedError", "raise NotImplementedError()"),
        block_open="",
        block_keywords=PYTHON_BLOCKS,
    ),
    "javascript": Language("javascript", "//"),
    "typescript": Language("typescript", "//"),
    "tsx": Language("tsx", "//"),
    "go": Language("go", "//", string_types=("interpreted_string_literal", "raw_string_literal")),
    "rust": Language(
        "rust",
        "//",
        hole_lines=("todo!()", "todo!();", "unimplemented!()", "unimplemented!();"),
        string_types=("string_literal", "raw_string_literal"),
    ),
    "java": Language("java", "//", string_types=("string_literal", "text_block")),
    "c": Language("c", "//", string_types=("string_literal", "char_literal")),
    "cpp": Language("cpp", "//", string_types=("string_literal", "raw_string_literal", "char_literal")),
    "ruby": Language(
        "ruby",
        "#",
        block_open="",
        block_keywords=(
            "def",
            "class",
            "module",
            "if",
            "elsif",
            "else",
            "unless",
            "while",
            "until",
            "case",
            "when",
            "begin",
            "do",
        ),
        string_types=("string",),
    ),
    "lua": Language(
        "lua",
        "--",
        block_open="",
        block_keywords=("function", "local function", "if", "elseif", "else", "for", "while", "repeat"),
        string_types=("string",),
    ),
}

# LSP languageId -> our id (ids not listed map to themselves when known)
LANGUAGE_IDS: dict[str, str] = {
    "javascriptreact": "tsx",  # JSX parses with the TSX grammar
    "typescriptreact": "tsx",
    "c++": "cpp",
    "golang": "go",
}

EXTENSIONS: dict[str, str] = {
    ".py": "python",
    ".pyi": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "tsx",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".cxx": "cpp",
    ".hpp": "cpp",
    ".hh": "cpp",
    ".rb": "ruby",
    ".lua": "lua",
}

# Any other language: line-based spans, TODO/FIXME holes after the usual comment prefixes.
PLAIN = Language("plain", "", block_open="", grammar=False)


def language_for(language_id: str | None = None, path: str | None = None) -> Language:
    """The Language for an LSP languageId or, failing that, a file path's extension."""
    if language_id:
        key = LANGUAGE_IDS.get(language_id.lower(), language_id.lower())
        if key in LANGUAGES:
            return LANGUAGES[key]
    if path:
        dot = path.rfind(".")
        if dot != -1:
            key = EXTENSIONS.get(path[dot:].lower(), "")
            if key:
                return LANGUAGES[key]
    return PLAIN


@functools.cache
def parser_for(name: str) -> Any | None:
    """A tree-sitter Parser for a language, or None (line-based spans then)."""
    if name not in LANGUAGES:
        return None
    try:
        from tree_sitter_language_pack import get_parser

        return get_parser(name)  # type: ignore[arg-type]
    except Exception as exc:  # missing package or grammar: degrade, never fail
        log.warning("no tree-sitter grammar for %s (%s); using line-based spans", name, exc)
        return None
