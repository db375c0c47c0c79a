"""What every handler reads: the open document at its version, its language, its syntax
tree (kept by the fill service), and the params it was given."""

from __future__ import annotations

from urllib.parse import unquote

from pygls.exceptions import JsonRpcInvalidParams
from pygls.workspace import TextDocument

from engine.spans import Document, Language, language_for
from lsp_server.protocol import DiffusionServer


def open_document(ls: DiffusionServer, uri: str) -> TextDocument | None:
    """The open document for `uri` (pygls keys them by the unquoted URI), or None."""
    docs = ls.workspace.text_documents
    return docs.get(uri) or docs.get(unquote(uri))


def language(doc: TextDocument) -> Language:
    return language_for(doc.language_id, doc.uri)


def grammar_name(doc: TextDocument) -> str | None:
    """The language to validate fills in: its name when it has a grammar, else None."""
    lang = language(doc)
    return lang.name if lang.grammar else None


def syntax_tree(ls: DiffusionServer, uri: str, doc: TextDocument) -> Document:
    """The document's syntax tree at its current version (FillService.tree)."""
    version = doc.version if doc.version is not None else 0  # an open document always has one
    return ls.fills.tree(uri, doc.source, language(doc), version)


def require(params: object, kind: type) -> None:
    """pygls hands over the raw JSON when params do not match the method's type."""
    if not isinstance(params, kind):
        raise JsonRpcInvalidParams(f"params are not {kind.__name__}")
