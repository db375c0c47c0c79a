"""Token healing: a fill that must begin with given characters, in whatever tokens the
model likes.

Middle priming (engine.local.generator) puts the text typed on the cursor's line after
the middle marker, as the start of the fill, so that typing on the line only appends to
the sequence the cache holds. But the typed text ends in a partial piece (`retu` of
`return`): given its tokens (` ret`, `u`), a model trained on whole pieces sees a split it
never saw and ends the fill or starts a comment. So the line's last piece is left out of
the prompt, and the fill's first tokens are held to spelling it (`Heal`): at each step
only the tokens whose text begins with what is left of it, or is a start of it, may be
chosen (` return` for ` retu`), their probabilities renormalised among them. The fill
the editor gets is what the model wrote after those characters.
"""

from __future__ import annotations

import functools
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BARRED = np.float32(-1.0e30)  # as the one-token chooser bars a token
_LAST_CHAR = "\U0010ffff"  # after every character: text + it bounds the texts that start with text


class Spelling:
    """The vocabulary by text, to find the tokens that can spell a given text's start."""

    def __init__(self, texts: Sequence[str]) -> None:
        usable = sorted((t, i) for i, t in enumerate(texts) if t and "\ufffd" not in t)
        self._sorted = [t for t, _ in usable]
        self._ids = np.asarray([i for _, i in usable], dtype=np.int64)
        self._exact: dict[str, list[int]] = {}
        for t, i in usable:
            self._exact.setdefault(t, []).append(i)
        self._texts = list(texts)

    def allowed(self, rest: str) -> np.ndarray:
        """Ids of the tokens that may come next while `rest` is left to spell: those whose
        text starts with it, and those whose text is a shorter start of it that leaves
        what the vocabulary can still spell."""
        lo, hi = self._extending(rest)
        starts = [
            self._exact[rest[:k]] for k in range(1, len(rest)) if rest[:k] in self._exact and self.spells(rest[k:])
        ]
        return np.concatenate([self._ids[lo:hi], np.asarray([i for ids in starts for i in ids], dtype=np.int64)])

    @functools.lru_cache(maxsize=4096)  # noqa: B019 (one Spelling a model, kept as long as it)
    def spells(self, text: str) -> bool:
        """Whether some tokens of the vocabulary write `text` first (a vocabulary of every
        byte always can; a small one may not have a token for a space)."""
        if not text:
            return True
        lo, hi = self._extending(text)
        return hi > lo or any(text[:k] in self._exact and self.spells(text[k:]) for k in range(1, len(text)))

    def _extending(self, text: str) -> tuple[int, int]:
        """The range of the sorted texts that start with `text`."""
        lo = bisect_left(self._sorted, text)
        return lo, bisect_left(self._sorted, text + _LAST_CHAR, lo)

    def text(self, token: int) -> str:
        return self._texts[token] if 0 <= token < len(self._texts) else ""


@dataclass(frozen=True)
class Heal:
    """The characters a one-token row must write first (`text`), and how (`Spelling`).
    The sampler keeps what is left of them per row (`rest`)."""

    text: str
    spelling: Spelling

    def masked(self, logits: np.ndarray, rest: str) -> np.ndarray:
        """`logits` with every token that cannot spell the start of `rest` barred."""
        ids = self.spelling.allowed(rest)
        out = np.full_like(logits, BARRED)
        out[ids] = logits[ids]
        return out

    def step(self, rest: str, token: int) -> tuple[str, bool]:
        """(what is left to spell after `token`, whether the token's text lay wholly within
        `rest`: then it wrote nothing of the fill itself)."""
        text = self.spelling.text(token)
        if rest.startswith(text):
            return rest[len(text) :], True
        return "", False


def split_line(line: str, piece_start: int) -> tuple[str, str] | None:
    """(the start of the cursor's line given as the fill's start, the characters the fill
    must spell first) for middle priming, or None where the line is not primed: a last
    piece that is not ASCII (a token of part of a character could not spell it).

    A last piece of blanks (the indentation of a line with nothing on it yet) keeps all
    but its last blank: a word typed after blanks takes the last one (` else` after the
    indentation's other spaces: the pre-tokenizers of GPT-style vocabularies split
    blanks before a word so), and the fill then starts with such a word, as the model
    saw indented lines written. Held to spell the whole run instead, the model may
    choose short runs of blanks, one after another, past the indentation (measured on
    the held-out eval: docs/models.md)."""
    kept, tail = line[:piece_start], line[piece_start:]
    if len(tail) > 1 and not tail.strip():
        kept, tail = line[:-1], line[-1:]
    if not tail.isascii():
        return None
    return kept, tail


def primed(line: str, piece_start: int, spelling: Spelling) -> tuple[str, str] | None:
    """`split_line`, where the vocabulary can spell the characters given to the fill."""
    split = split_line(line, piece_start)
    return split if split is not None and spelling.spells(split[1]) else None
