"""A fill asked of a chat model, and its answer taken apart (the remote `chat` dialect).

Hosted endpoints that serve an instruction-tuned model often offer only OpenAI's
`/v1/chat/completions`: no prompt of our own, no suffix field, no FIM tokens. So the fill
is asked for in words (`messages`): the code around the cursor with a hole marker where
the fill goes, what kind of span the hole is, and "answer with the code for the hole
only". Chat models answer as they like: in a code fence, after a sentence, with the line
they were asked to complete written out again, or the whole function. `extract_fill`
takes such an answer apart, and what is left goes through the usual span check
(engine.fill) like any other fill.
"""

from __future__ import annotations

import re
from typing import Any

HOLE = "<FILL_HERE>"
SYSTEM = (
    "You are a code completion engine inside an editor. You are given a file with exactly one "
    f"hole marked {HOLE}. Reply with the code that replaces {HOLE} and nothing else: no "
    "explanation, no code fences, not the code before or after the hole. Keep the file's "
    "indentation. If nothing belongs there, reply with nothing."
)
# what the span planner says about a hole (engine.spans.SpanKind), in words
SPAN_WORDS = {
    "line": "the rest of the current line",
    "lines": "one or more whole lines",
    "block": "the body of a block: several lines, indented as the block is",
    "expression": "an expression",
    "arguments": "the arguments of a call",
    "statement": "a statement",
    "string": "the rest of a string",
    "comment": "the rest of a comment",
}
_FENCE = re.compile(r"^[ \t]*(```|~~~)[^\n]*\n?", re.MULTILINE)
# a sentence that introduces the code ("Here is the code:", "Sure! The missing line is:")
_LEAD_IN = re.compile(
    r"\A[ \t]*(?:sure|certainly|here(?:'s| is| are)|the (?:missing|completed?|code|line|fill)|this)\b[^\n]*[:.!]\s*\n",
    re.IGNORECASE,
)
MIN_ECHO_CHARS = 3  # an echo of the code around the hole shorter than this is not stripped


def messages(
    prefix: str, suffix: str, language: str | None, span: str | None, single_line: bool
) -> list[dict[str, Any]]:
    """The chat messages that ask for the fill between `prefix` and `suffix`."""
    what = SPAN_WORDS.get(span or "", "code")
    shape = "a single line at most" if single_line else "as many lines as it needs"
    lang = f" ({language})" if language else ""
    user = f"Fill the hole in this file{lang}. The hole is {what}; the answer is {shape}.\n\n{prefix}{HOLE}{suffix}"
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def extract_fill(answer: str, prefix: str, suffix: str) -> str:
    """The code for the hole in a chat model's `answer`: the first fenced block's code when
    there is a fence (an unclosed one runs to the end), without a sentence that leads into
    it, the hole marker, or the code before and after the hole written out again."""
    text = answer.replace("\r\n", "\n") if "\r\n" in answer and "\r\n" not in prefix + suffix else answer
    text = _fenced(text)
    text = _LEAD_IN.sub("", text, count=1)
    text = text.replace(HOLE, "")
    text = _strip_echo(text, prefix, suffix)
    if prefix and not prefix.endswith(("\n", "\r")):  # mid-line: a line break the fence left is not the fill's
        text = text.lstrip("\n") if text.strip() else text
    if text.endswith("\n") and (not suffix or suffix.startswith(("\n", "\r"))):
        text = text[:-1]  # the last line's break: the suffix brings its own
    return text


def _fenced(text: str) -> str:
    """The code of the first fenced block, or `text` as it is without one."""
    opening = _FENCE.search(text)
    if opening is None:
        return text
    rest = text[opening.end() :]
    closing = _FENCE.search(rest)
    return rest[: closing.start()] if closing is not None else rest


def _strip_echo(text: str, prefix: str, suffix: str) -> str:
    """`text` without the end of `prefix` it starts with and the start of `suffix` it ends
    with: a model that writes out the line it completes, or the whole function."""
    line_start = prefix.rfind("\n") + 1
    current = prefix[line_start:]  # the cursor's line up to the cursor
    # the longest end of the prefix the answer repeats, from a line start (whole lines
    # and the cursor's line, or the cursor's line without its indentation)
    starts = [line_start + len(current) - len(current.lstrip(" \t")), line_start]
    nl = line_start - 1
    for _ in range(200):  # at most this many lines back
        if nl <= 0:
            break
        nl = prefix.rfind("\n", 0, nl)
        starts.append(nl + 1)
    best = 0
    for s in starts:
        echo = prefix[s:]
        if len(echo.strip()) >= MIN_ECHO_CHARS and text.startswith(echo):
            best = max(best, len(echo))
    text = text[best:]
    # the longest start of the suffix the answer ends with, up to a line end
    ends = sorted({e for i, ch in enumerate(suffix[:20_000]) if ch == "\n" for e in (i, i + 1)})
    cut = 0
    for e in ends:
        echo = suffix[:e]
        if len(echo.strip()) >= MIN_ECHO_CHARS and text.endswith(echo) and len(echo) < len(text):
            cut = max(cut, len(echo))
        elif e > len(text):
            break
    return text[: len(text) - cut] if cut else text
