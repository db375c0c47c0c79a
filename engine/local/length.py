"""The canvas sized to the fill: the length head's prediction within the span's budget.

A diffusion canvas fills every position it is given: with a canvas longer than the fill,
the model must place end-of-fill and padding exactly, and a canvas of a fixed length is
the known weak point of diffusion infilling (a single-line benchmark's pass@1 more than
doubles when the model is given the true length). A model with a length head
(`LengthPredictor`) predicts the fill's token count from the context alone, in the same
pass that encodes it; the canvas then holds that many tokens, the end-of-fill, and a
little slack (training cuts canvases the same way: engine/training/loop.py, `fit_canvas_*`).

`fitted_length` reads the distribution, not its mode: the canvas holds the fill at the
`quantile` of the predicted count (a canvas one token too short cuts the fill, one token
too long costs little), and the last class ("that many or more") keeps the whole budget.
"""

from __future__ import annotations

from typing import Any

import numpy as np

DEFAULT_QUANTILE = 0.9  # the canvas holds the fill's length at this quantile of the prediction
DEFAULT_SLACK = 4  # positions past the predicted end-of-fill (training drew 0..8)


def fitted_length(
    logits: Any,
    budget: int,
    quantile: float = DEFAULT_QUANTILE,
    slack: int = DEFAULT_SLACK,
    min_tokens: int = 0,
) -> int:
    """The canvas length for a fill whose token count the length head scores with
    `logits` (K,): the count at `quantile` of the predicted distribution, plus one for
    the end-of-fill, plus `slack`; never more than `budget`, never too short for
    `min_tokens` tokens and their end-of-fill. The last class means "K-1 or more": the
    whole budget."""
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"quantile must be in (0, 1]; got {quantile}")
    z = np.asarray(logits, dtype=np.float64).reshape(-1)
    if z.size == 0 or not np.all(np.isfinite(z)):
        return budget
    p = np.exp(z - z.max())
    cdf = np.cumsum(p / p.sum())
    count = int(np.searchsorted(cdf, quantile - 1e-9))  # the first count whose cdf reaches the quantile
    if count >= z.size - 1:
        return budget
    return max(1, min(budget, max(count, min_tokens) + 1 + max(0, slack)))
