"""A fill the engine offers: its text, tokens and how sure the model was of them.

A fill's confidence (docs/confidence.md) is one number in [0, 1] per candidate, made here
from the log-probabilities of its tokens, end-of-fill counted (`scored`), whatever gave
them: the one-token mode's likelihood, the canvas's lock confidences, the verifier's, or
a remote engine's logprobs. None: the source gave none (a remote engine without logprobs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

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
    # the fill as the model wrote it, end-of-fill's last when it ended there; a cut (the syntax check)
    # keeps them, as it keeps the confidence; `diffusion-infill serve` returns them (fill_server.logprobs)
    token_logprobs: list[float] | None = None

    @property
    def mean_confidence(self) -> float:
        return float(np.mean(self.confidence)) if self.confidence else 1.0

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
