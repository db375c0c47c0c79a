"""A fill the engine offers: its text, tokens and how sure the model was of them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Candidate:
    text: str
    token_ids: list[int]
    confidence: list[float]  # per token, probability when chosen
    syntax: str = "unchecked"  # "ok", "truncated" (cut to parse), or "unchecked" (no grammar)
    logprob: float | None = None  # mean log-likelihood per token (end-of-fill included) in the AR mode

    @property
    def mean_confidence(self) -> float:
        return float(np.mean(self.confidence)) if self.confidence else 1.0


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
