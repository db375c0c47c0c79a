"""Next edits from the edit history, through the real server over stdio with the shipped
model (it has the one-token mode, so it scores): the developer renames a variable where it
is defined, and diffusion/inlineEdit there proposes the other uses in its function, each
bounded to the name. `editMargin` -100 keeps every proposal whatever the shipped weights
think of it (what the model's judgment keeps is tests/unit/test_edits.py's, with a fake
that knows the right text); what the server proposes, where, and for which version is
what this checks."""

from __future__ import annotations

from typing import Any

from lsp_server.client import StdioClient
from tests.lsp.helpers import REAL_SERVER

URI = "file:///work/next_edit.py"
TEXT = (
    "def total(items):\n"
    "    count = 0\n"
    "    for item in items:\n"
    "        count += item.count\n"
    "    return count\n"
    "\n"
    "\n"
    "def other(count):\n"
    "    return count\n"
)
RENAMED = TEXT.replace("    count = 0", "    amount = 0")


def change(c: StdioClient, text: str, version: int) -> None:
    c.notify(
        "textDocument/didChange",
        {"textDocument": {"uri": URI, "version": version}, "contentChanges": [{"text": text}]},
    )


def ask(c: StdioClient, line: int, character: int, version: int) -> list[dict[str, Any]]:
    params = {"textDocument": {"uri": URI, "version": version}, "position": {"line": line, "character": character}}
    result = c.request("diffusion/inlineEdit", params, timeout=120)
    return list(result["edits"])


def offset(text: str, pos: dict[str, int]) -> int:
    lines = text.split("\n")
    return sum(len(s) + 1 for s in lines[: pos["line"]]) + pos["character"]


def test_a_rename_proposes_the_other_uses_in_its_function() -> None:
    c = StdioClient(REAL_SERVER)
    try:
        c.initialize({"editMargin": -100})
        c.open(URI, TEXT)
        change(c, RENAMED, 2)
        edits = ask(c, 1, len("    amount"), 2)
        spans = sorted((offset(RENAMED, e["range"]["start"]), offset(RENAMED, e["range"]["end"])) for e in edits)
        uses = [RENAMED.index("count +="), RENAMED.index("return count") + len("return ")]
        assert spans == [(u, u + len("count")) for u in uses]  # not `item.count`, not other()'s `count`
        assert {e["text"] for e in edits} == {"amount"}
        assert all(0.0 <= e["confidence"] <= 1.0 and e["textDocument"]["version"] == 2 for e in edits)
        applied = RENAMED
        for s, e in sorted(spans, reverse=True):
            applied = applied[:s] + "amount" + applied[e:]
        assert (
            applied
            == TEXT[: TEXT.index("def other")].replace("count", "amount").replace("item.amount", "item.count")
            + TEXT[TEXT.index("def other") :]
        )
    finally:
        assert c.close() == 0


def test_no_history_and_a_blank_line_propose_nothing() -> None:
    c = StdioClient(REAL_SERVER)
    try:
        c.initialize({"editMargin": -100})
        c.open(URI, TEXT)
        assert ask(c, 5, 0, 1) == []  # a blank line, no edit made: nothing to look at
    finally:
        assert c.close() == 0
