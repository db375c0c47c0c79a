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
