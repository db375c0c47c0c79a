"""A fill the engine offers: its text, tokens and how sure the model was of them.

A fill's confidence (docs/confidence.md) is one number in [0, 1] per candidate, made here
from the log-probabilities of its tokens, end-of-fill counted (`scored`), whatever gave
them: the one-token mode's likelihood, the canvas's lock confidences, the verifier's, or
a remote engine's logprobs. None: the source gave none (a remote engine without logprobs).

A candidate's per-token lists (`token_ids`, `confidence`, `token_texts`, `token_logprobs`)
go together: whatever changes its text does it through `trimmed` (the indentation the
editor already has dropped, a cut at the end) or `rewritten` (another text), which keep
them in step; its confidence (`mean_logprob`, `min_logprob`) stays that of the fill as the
model wrote it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import accumulate
from typing import Protocol

import numpy as np

LOGPROB_FLOOR = -30.0  # a token the model gave (almost) nothing: log(0) would poison the mean


@dataclass
class Candidate:
    text: str
    token_ids: list[int]
    confidence: list[float]  # per token, probability when chosen
    syntax: str = "unchecked"  # "ok", "truncated" (cut to parse), or "unchecked" (no grammar)
    logprob: float | None = None  # mean log-likelihood per token (end-of-fill included) in the AR mode, teacher-forced
    # the confidence's parts (`scored`), from whatever source gave log-probabilities; None: none did
    mean_logprob: float | None = None  # mean log-probability per token, end-of-fill included
    min_logprob: float | None = None  # the least likely token's log-probability, end-of-fill included
    # the per-token log-probabilities both were made from (floored at LOGPROB_FLOOR): one per token of
    # token_ids, end-of-fill's last when the fill ended there and was not cut; None: none, or none that
    # can be paired with these tokens (`rewritten`); `diffusion-infill serve` returns them (fill_server.logprobs)
    token_logprobs: list[float] | None = None
    # the text each of token_ids writes in `text` (they spell it; "" for a token whose text the editor's
    # indentation stands for, or the first bytes of a character the next token completes), set by the
    # engine (`spelled`); None: not known (no tokenizer: a remote engine)
    token_texts: list[str] | None = None

    @property
    def mean_confidence(self) -> float:
        return float(np.mean(self.confidence)) if self.confidence else 1.0

    def token_offsets(self) -> list[int] | None:
        """Where each token's text starts in the text; None: not known."""
        if self.token_texts is None:
            return None
        return list(accumulate((len(t) for t in self.token_texts), initial=0))[: len(self.token_texts)]

    @property
    def score(self) -> float | None:
        """The fill's confidence in [0, 1]: the probability of its least likely token,
        end-of-fill counted (docs/confidence.md says why the minimum); None: no
        log-probabilities (a remote engine that returned none)."""
        return None if self.min_logprob is None else math.exp(self.min_logprob)


def scored(cand: Candidate, logprobs: Sequence[float]) -> Candidate:
    """`cand` with its confidence from its tokens' log-probabilities (`logprobs`: one per
    token, end-of-fill's last when the fill ended there), which it keeps as
    `token_logprobs`; unchanged when there are none."""
    if not logprobs:
        return cand
    lp = [max(LOGPROB_FLOOR, float(x)) for x in logprobs]
    return replace(cand, mean_logprob=sum(lp) / len(lp), min_logprob=min(lp), token_logprobs=lp)


class Codec(Protocol):
    """A tokenizer, as far as a candidate's tokens need one (engine.models.tokenizer.Tokenizer)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def spelled(cand: Candidate, tok: Codec | None) -> Candidate:
    """`cand` with `token_texts`: the text each of its tokens writes in its text, so that
    they spell it. Decoded a few tokens at a time, as streaming servers do: a character
    made of several byte-level tokens belongs to the token that completes it (the ones
    before it write ""), where decoding one token alone would give each a U+FFFD. Unchanged
    without a tokenizer, or when its tokens do not decode to its text."""
    if tok is None or tok.decode(cand.token_ids) != cand.text:
        return cand
    texts: list[str] = []
    at = 0
    lengths = _piece_lengths(tok, cand.token_ids)
    for k, n in enumerate(lengths):
        end = len(cand.text) if k == len(lengths) - 1 else min(at + n, len(cand.text))
        texts.append(cand.text[at:end])
        at = end
    return replace(cand, token_texts=texts)


def _piece_lengths(tok: Codec, ids: Sequence[int]) -> list[int]:
    """How many characters each token adds to the decoded text: a window from the last
    token that added some is decoded, and a token adds what its window's text grew by,
    unless that ends in an unfinished character (U+FFFD), which waits for the next token."""
    out: list[int] = []
    first = read = 0  # the window's start; the end of what was already read
    before = ""
    for k in range(len(ids)):
        now = tok.decode(ids[first : k + 1])
        if len(now) > len(before) and not now.endswith("\ufffd"):
            out.append(len(now) - len(before))
            first, read = read, k + 1
            before = tok.decode(ids[first:read])
        else:
            out.append(0)
    return out


def trimmed(cand: Candidate, start: int = 0, end: int | None = None, through: bool = False) -> Candidate:
    """`cand` with its text trimmed to `text[start:end]`, every per-token list with it: the
    one rule for every cut of a fill (the engine's indentation fit and syntax check,
    serve's stop strings).

    - Characters dropped before `start` (indentation the editor already has) keep their
      tokens and values: the model wrote them and the editor's indentation stands for
      them; a token's text becomes its part of the kept text ("" when none).
    - A cut at `end` keeps the tokens that wrote any of the kept text (the last one's text
      shortened to its part); with `through`, up to the token that writes the first
      character cut away (where a stop string starts; text "", as llama.cpp's stream gives
      it). The tokens after, and end-of-fill's value, go.

    Without token texts (a remote engine's tokens are not known), a cut at the end keeps no
    per-token values: none can be said to be the kept text's. The confidence stays that of
    the fill as the model wrote it."""
    text = cand.text
    end = len(text) if end is None else min(end, len(text))
    if start <= 0 and end == len(text):
        return cand
    out = replace(cand, text=text[start:end])
    if cand.token_texts is None:
        return out if end == len(text) else replace(out, token_logprobs=None)
    starts = cand.token_offsets() or []
    ends = [s + len(t) for s, t in zip(starts, cand.token_texts, strict=True)]
    n = len(ends)
    if end < len(text):
        n = next((k + 1 for k, e in enumerate(ends) if e > end), n) if through else sum(s < end for s in starts)
    clamp = [min(max(x, start), end) for x in (*starts[:n], *ends[:n])]
    texts = [text[a:b] for a, b in zip(clamp[:n], clamp[n:], strict=True)]
    values = cand.token_logprobs
    if values is not None and end < len(text):
        values = values[:n]
    return replace(
        out, token_ids=cand.token_ids[:n], confidence=cand.confidence[:n], token_texts=texts, token_logprobs=values
    )


def confident_head(cand: Candidate, threshold: float) -> Candidate | None:
    """The start of `cand` the model is sure of: its text before the first token whose
    probability is below `threshold` (end-of-fill counted: a fill that is sure of its text
    but not of ending there keeps its text), scored again over what is kept; the whole
    candidate when it has no such token (or no confidence at all); None when nothing but
    blanks is left, or it has no per-token values to cut by (a remote engine's tokens
    without their texts)."""
    values, texts = cand.token_logprobs, cand.token_texts
    if cand.score is None or cand.score >= threshold:
        return cand
    if values is None or texts is None:
        return None
    floor = math.log(threshold) if threshold > 0 else -math.inf
    k = next((i for i, v in enumerate(values) if v < floor), len(values))
    end = sum(len(t) for t in texts[:k])
    head = trimmed(cand, end=end)
    if not head.text.strip():
        return None
    return scored(head, head.token_logprobs or []) if end < len(cand.text) else cand


def rewritten(cand: Candidate, text: str, tok: Codec | None) -> Candidate:
    """`cand` with `text` in place of its text: cut (`trimmed`, its tokens spelled first
    where they were not) when it is a start of it, else written anew (re-indented, a line
    break added): its tokens again, each at the candidate's mean confidence, and no
    per-token log-probabilities, since the model gave its values to other tokens. Its
    confidence stays that of the fill as the model wrote it."""
    if cand.text.startswith(text):
        return trimmed(cand if cand.token_texts is not None else spelled(cand, tok), end=len(text))
    if tok is None:
        return replace(cand, text=text, token_texts=None, token_logprobs=None)
    ids = tok.encode(text)
    again = replace(cand, text=text, token_ids=ids, confidence=[cand.mean_confidence] * len(ids))
    return spelled(replace(again, token_texts=None, token_logprobs=None), tok)


@dataclass(frozen=True)
class Shown:
    """A fill the user was shown: where (prefix, suffix) and what (text). The one rule
    for typing through it: the language server answers the rest without the model
    (type-through), and the engine, given it as `InfillRequest.previous`, starts the
    canvas from the rest (warm start)."""

    prefix: str
    suffix: str
    text: str

    def rest_after(self, prefix: str, suffix: str) -> str | None:
        """What is left of the text once the user typed its start there (the suffix the
        same, the prefix grown by a start of the text); None when they typed something
        else, nothing, or all of it."""
        if suffix != self.suffix or not prefix.startswith(self.prefix):
            return None
        typed = prefix[len(self.prefix) :]
        if typed and self.text.startswith(typed) and len(self.text) > len(typed):
            return self.text[len(typed) :]
        return None
