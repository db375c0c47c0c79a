"""The canvas loop's choices at one step: the scores of each open position (`_scores`,
`_scores_at`), which positions a strategy accepts (`select_positions`: entropy bound,
confidence threshold, fixed k, low_confidence, left to right), where a row ends
(`pad_after_end`, `leftmost_end`), and the stop rule of the uniform regime
(`StableAndConfident`). Pure functions of arrays, numpy or torch (array-api-compat)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import array_api_compat

from engine.decoding import SamplerConfig, Strategy
from engine.denoisers.base import RandomSource
from engine.local.steering import entropy, log_softmax, softmax

# An entropy larger than any real one (log V < 13 for V = 262,144): marks positions
# that a strategy must not pick, without the NaNs an infinity would bring into cumsum.
_NOT_OPEN = 1.0e4


def _rank(scores: Any) -> Any:
    """Rank of each position within its row, ascending (0 = smallest); ties by index."""
    xp = array_api_compat.array_namespace(scores)
    return xp.argsort(xp.argsort(scores, axis=-1, stable=True), axis=-1, stable=True)


def select_positions(
    strategy: Strategy,
    cfg: SamplerConfig,
    ent: Any,
    conf: Any,
    open_: Any,
    remaining: Any = 1,
) -> Any:
    """Which open positions to accept this step: (B, C) bool.

    `ent` and `conf` are the per-position entropy and top probability (B, C); `open_`
    marks positions the strategy may choose; `remaining` counts the steps left, this one
    included, for all rows (an int) or per row ((B, 1), each >= 1: the steps left in the
    row's block); `low_confidence` spreads the open positions over them. Every strategy
    accepts at least one open position per row, so the absorbing loop always progresses.
    """
    xp = array_api_compat.array_namespace(ent)
    n_open = xp.sum(xp.astype(open_, xp.int64), axis=-1, keepdims=True)  # (B, 1)
    if strategy == "left_to_right":
        c = open_.shape[-1]
        idx = xp.arange(c, device=array_api_compat.device(ent))
        first = xp.min(xp.where(open_, idx, c), axis=-1, keepdims=True)  # (B, 1)
        return idx == first
    if strategy == "entropy_bound":
        # Sort by entropy; accept the k smallest such that sum(H) - max(H) <= bound
        # (an upper bound on their mutual information: arXiv 2505.24857).
        masked = xp.where(open_, ent, _NOT_OPEN)
        order = xp.argsort(masked, axis=-1, stable=True)
        sorted_h = xp.take_along_axis(masked, order, axis=-1)
        before = xp.cumulative_sum(sorted_h, axis=-1) - sorted_h  # sum of smaller ones
        k = xp.sum(xp.astype(before <= cfg.entropy_bound, xp.int64), axis=-1, keepdims=True)
    elif strategy == "low_confidence":
        # LLaDA's generate(remasking='low_confidence'): the most probable first, as many
        # as spread the open positions evenly over the steps left (ceil(open / left) is
        # its get_num_transfer_tokens count at every step: base + 1 for the first
        # `remainder` steps, then base)
        left = max(remaining, 1) if isinstance(remaining, int) else remaining
        k = (n_open + (left - 1)) // left
        masked = xp.where(open_, -conf, _NOT_OPEN)
    elif strategy == "confidence":
        k = xp.sum(xp.astype(xp.logical_and(open_, conf >= cfg.confidence_threshold), xp.int64), axis=-1, keepdims=True)
        masked = xp.where(open_, -conf, _NOT_OPEN)
    else:  # fixed_k
        k = xp.full_like(n_open, cfg.k)
        masked = xp.where(open_, -conf, _NOT_OPEN)
    k = xp.clip(k, 1, None)
    k = xp.minimum(k, n_open)
    return xp.logical_and(_rank(masked) < k, open_)


def pad_after_end(canvas: Any, locked: Any, eof_id: int, pad_id: int) -> tuple[Any, Any]:
    """Absorbing regime: a canvas is fill, end-of-fill, then padding to the end. So every
    position after a locked end-of-fill or a locked pad becomes locked padding."""
    xp = array_api_compat.array_namespace(canvas)
    is_end = xp.logical_and(locked, xp.logical_or(canvas == eof_id, canvas == pad_id))
    seen = xp.cumulative_sum(xp.astype(is_end, xp.int32), axis=-1)
    after = (seen - xp.astype(is_end, xp.int32)) > 0  # strictly after the first end
    canvas = xp.where(after, xp.asarray(pad_id, dtype=canvas.dtype, device=array_api_compat.device(canvas)), canvas)
    return canvas, xp.logical_or(locked, after)


def leftmost_end(pad_lp: Any, open_: Any, threshold: float) -> Any:
    """(B, C) bool: per row, the leftmost open position whose padding probability
    (`pad_lp`, (B, C) log-probabilities) reaches `threshold` (none when no position does)."""
    xp = array_api_compat.array_namespace(pad_lp)
    sure = xp.logical_and(open_, xp.exp(pad_lp) >= threshold)  # (B, C)
    c = sure.shape[-1]
    idx = xp.arange(c, device=array_api_compat.device(pad_lp))
    first = xp.min(xp.where(sure, idx, c), axis=-1, keepdims=True)  # (B, 1); c when none
    return idx == first


@dataclass
class _Scores:
    """Per-position results of one step's logits, each (B, C)."""

    ent: Any  # entropy of the tempered distribution
    argmax: Any  # its most likely token
    pred: Any  # the token drawn (the argmax when greedy)
    top_lp: Any  # log-probability of the argmax
    pred_lp: Any  # log-probability of the token drawn
    pad_lp: Any  # log-probability of padding
    logp: Any | None = None  # (B, C, V) log-probabilities (computed on the whole canvas only)


def _barred(proc: Any, suppress: Any | None, early: Any | None, ends: Any | None) -> Any:
    """`proc` (..., V) with suppressed tokens, and end-of-fill/padding at positions
    before min_tokens (`early`, proc's shape without V), set to a large negative logit."""
    xp = array_api_compat.array_namespace(proc)
    low = xp.asarray(-1.0e30, dtype=proc.dtype, device=array_api_compat.device(proc))
    if suppress is not None:
        proc = xp.where(suppress, low, proc)
    if early is not None and ends is not None:
        proc = xp.where(xp.logical_and(xp.expand_dims(early, axis=-1), ends), low, proc)
    return proc


def _scores(
    proc: Any, greedy: Any | None, cfg: SamplerConfig, rng: RandomSource, pad_id: int, exact: bool = True
) -> _Scores:
    """Entropy, argmax, the drawn token and their log-probabilities for tempered logits
    `proc` (B, C, V); `greedy` (broadcasts to (B, C)): positions that take the argmax
    even when sampling. `exact`: probabilities as torch.softmax computes them (a seeded
    uniform-regime run reproduces transformers); else exp(log-probabilities), two
    passes over (B, C, V) fewer."""
    xp = array_api_compat.array_namespace(proc)
    logp = log_softmax(proc)
    argmax = xp.argmax(proc, axis=-1)
    probs = None if exact else xp.exp(logp)
    ent = entropy(logp) if probs is None else -xp.sum(probs * logp, axis=-1)
    if cfg.greedy:
        pred = argmax
    else:
        pred = rng.categorical(softmax(proc) if probs is None else probs)
        if greedy is not None:
            pred = xp.where(greedy, xp.astype(argmax, pred.dtype), pred)
    pred = xp.astype(pred, xp.int64)
    pred_lp = xp.squeeze(xp.take_along_axis(logp, xp.expand_dims(pred, axis=-1), axis=-1), axis=-1)
    return _Scores(ent, argmax, pred, xp.max(logp, axis=-1), pred_lp, logp[..., pad_id], logp)


def _scores_at(
    logits: Any,
    live: Any,
    canvas: Any,
    temp: float,
    row_temperature: Any | None,
    suppress: Any | None,
    early: Any | None,
    ends: Any | None,
    greedy_rows: Any | None,
    cfg: SamplerConfig,
    rng: RandomSource,
    pad_id: int,
) -> _Scores:
    """`_scores` computed at the `live` positions (B, C) only; elsewhere the entropy is
    0, the argmax and the drawn token are the canvas's, and the log-probabilities are 0
    (padding: none)."""
    xp = array_api_compat.array_namespace(logits)
    dev = array_api_compat.device(logits)
    b, c, v = logits.shape
    flat = xp.reshape(live, (-1,))

    def pick(per_position: Any) -> Any:
        """A (B, C)-broadcastable array at the live positions, as (1, N)."""
        return xp.reshape(xp.reshape(xp.broadcast_to(per_position, (b, c)), (-1,))[flat], (1, -1))

    proc = xp.reshape(xp.reshape(logits, (b * c, v))[flat], (1, -1, v))  # (1, N, V)
    if row_temperature is not None:
        proc = proc / (xp.expand_dims(pick(xp.reshape(row_temperature, (b, 1))), axis=-1) * temp)
    else:
        proc = proc / temp
    proc = _barred(proc, suppress, None if early is None else pick(early), ends)
    greedy = None if greedy_rows is None else pick(xp.reshape(greedy_rows, (b, 1)))
    sc = _scores(proc, greedy, cfg, rng, pad_id, exact=False)

    def spread(values: Any, fill: Any) -> Any:
        out = xp.reshape(xp.astype(fill, values.dtype, copy=True), (-1,))
        out[flat] = xp.reshape(values, (-1,))
        return xp.reshape(out, (b, c))

    zeros = xp.zeros((b, c), dtype=xp.float32, device=dev)
    return _Scores(
        ent=spread(sc.ent, zeros),
        argmax=spread(sc.argmax, canvas),
        pred=spread(sc.pred, canvas),
        top_lp=spread(sc.top_lp, zeros),
        pred_lp=spread(sc.pred_lp, zeros),
        pad_lp=spread(sc.pad_lp, zeros - 1.0e30),
    )


class StableAndConfident:
    """Per-row stop rule: the argmax canvas equals the one of each of the last
    `threshold` steps and the mean entropy is below `max_entropy` (as transformers'
    StableAndConfidentStoppingCriteria)."""

    def __init__(self, threshold: int, max_entropy: float) -> None:
        self.threshold = threshold
        self.max_entropy = max_entropy
        self.history: list[Any] = []

    def __call__(self, argmax_canvas: Any, ent: Any) -> Any:
        xp = array_api_compat.array_namespace(argmax_canvas)
        stable = xp.ones(argmax_canvas.shape[:1], dtype=xp.bool, device=array_api_compat.device(argmax_canvas))
        if self.threshold > 0:
            if len(self.history) < self.threshold:
                stable = xp.logical_and(stable, xp.zeros_like(stable))
            for past in self.history:
                stable = xp.logical_and(stable, xp.all(past == argmax_canvas, axis=-1))
            self.history = [*self.history, argmax_canvas][-self.threshold :]
        confident = xp.mean(ent, axis=-1) < self.max_entropy
        return xp.logical_and(stable, confident)
