"""Infill tasks cut from source files: the shape of an editor request, for training and eval."""

from __future__ import annotations

import random
from typing import Literal

TaskKind = Literal["lines", "rest_of_line", "random_span"]


def cut(text: str, kind: TaskKind, rng: random.Random, max_middle_chars: int = 160) -> tuple[str, str, str]:
    """Split a file into (prefix, middle, suffix)."""
    lines = text.splitlines(keepends=True)
    if kind == "lines" and len(lines) > 2:  # 1-3 whole lines
        i = rng.randrange(len(lines))
        j = min(len(lines), i + rng.randint(1, 3))
        start = sum(len(x) for x in lines[:i])
        end = start + sum(len(x) for x in lines[i:j])
    elif kind == "rest_of_line" and lines:  # rest of a line from a cursor inside it
        i = rng.randrange(len(lines))
        start_line = sum(len(x) for x in lines[:i])
        line = lines[i].rstrip("\r\n")
        col = rng.randint(0, len(line))
        start, end = start_line + col, start_line + len(line)
    else:  # a random character span
        start = rng.randrange(len(text) + 1)
        end = min(len(text), start + rng.randint(1, max_middle_chars))
    end = min(end, start + max_middle_chars)
    return text[:start], text[start:end], text[end:]


def cut_example(text: str, rng: random.Random, max_middle_chars: int = 160) -> tuple[str, str, str]:
    """A training example: 40% whole lines, 30% rest of a line, 30% random spans."""
    r = rng.random()
    kind: TaskKind = "lines" if r < 0.4 else "rest_of_line" if r < 0.7 else "random_span"
    return cut(text, kind, rng, max_middle_chars)
