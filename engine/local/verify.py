"""Drafts verified by the same weights: the canvas drafts, the one-token mode checks.

Self-speculative decoding with the diffusion canvas as the drafter (strategy "verified";
the denoiser must also be an `Autoregressive`). Per candidate row, in rounds:

  1. stop if `stop_requested` says so;
  2. draft: the canvas fills the rest of the span in `draft_steps` parallel passes
     (the canvas loop, `sampler.run`) against the prompt with the tokens accepted so
     far as its fill (`Prompt.extended`, laid out by the backend: in the suffix-prefix-
     middle order they go before the middle marker, so the drafter sees the layout it was
     trained on and only those tokens and the marker are encoded); a model with a length
     head sizes the draft (`fit`);
  3. verify: the one-token mode scores the whole draft in one pass of the causal encoder
     (`extend`), and keeps the longest prefix whose tokens it picks itself, plus its own
     token where it first disagrees (or after the whole draft): greedy rows take the
     argmax, so the text equals the one-token mode's greedy fill; sampled rows accept a
     drafted token with the probability the mode gives it and otherwise sample from the
     rest of its distribution (speculative sampling with a point-mass draft), so their
     text is distributed as the one-token mode's;
  4. the row ends at end-of-fill, after a token of `stop_after`, or at `length` tokens.

Every round decodes at least one token, so a row takes at most `length` rounds. Where
the mode replaced one drafted token, the rest of the draft is tried first in the next
round, as it stands (a wrong name or operator leaves the code after it in place): that
round costs one verification pass and no draft, and a new draft is made only when the
rest fails at once. The one-token mode's state is cut back to the accepted tokens
(`cut`: a prefix of its cache); the token it adds itself is encoded with the next round's
verification.
`passes` counts the sequential forward passes (draft encodes, canvas steps,
verifications, plus one for the context), `rounds` and `accepted` the drafts and how
many of their tokens were kept: the acceptance length is accepted / rounds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from engine.decoding import SamplerConfig, StopReason
from engine.denoisers.base import EncodedContext, Prompt, RandomSource
from engine.local.sampler import (
    OneToken,
    SampleResult,
    StepView,
    initial_canvas,
    row_settings,
    run,
    stop_requested,
    to_numpy,
)


@dataclass
class VerifyStats:
    passes: int = 0
    rounds: int = 0
    drafted: int = 0  # draft tokens proposed (end-of-fill included)
    accepted: int = 0  # draft tokens the one-token mode kept


class _Chooser(OneToken):
    """The one-token mode's choice, checking a drafted token: greedy rows keep it when it
    is the argmax; sampled rows keep it with the probability the mode gives it, else draw
    from the rest of the distribution (speculative sampling with a point-mass draft)."""

    def check(self, logits: np.ndarray, position: int, drafted: int | None) -> tuple[int, float, bool]:
        """(token, its probability, whether it is the drafted one)."""
        if self.greedy or drafted is None:
            tok, p = self.choose(logits, position)
            return tok, p, tok == drafted
        _, probs = self.probs(logits, position)
        if self._uniform() < float(probs[drafted]):
            return drafted, float(probs[drafted]), True
        rest = probs.copy()
        rest[drafted] = 0.0
        total = float(rest.sum())
        if total > 0:
            probs = rest / total
        tok = self.draw(probs)
        return tok, float(probs[tok]), False

    def _uniform(self) -> float:
        """A uniform draw in (0, 1) from the row's random source."""
        grid = 1 << 24
        return (float(to_numpy(self.rng.uniform_tokens((1, 1), grid))[0, 0]) + 0.5) / grid


def run_verified(
    denoiser: Any,
    state: EncodedContext,
    prompt: Prompt,
    length: int,
    cfg: SamplerConfig,
    rng: RandomSource,
    *,
    batch: int = 1,
    greedy_rows: Any | None = None,
    row_temperature: Any | None = None,
    deadline: float | None = None,
    cancel: Callable[[], bool] | None = None,
    on_step: Callable[[StepView], None] | None = None,
    stop_after: frozenset[int] = frozenset(),
    fit: Callable[[EncodedContext, int], int] | None = None,
    stats: VerifyStats | None = None,
) -> SampleResult:
    """Verified decoding of `batch` rows after `state` (the context the one-token mode
    continues, which also serves the first draft); `prompt` is what it encodes, and
    `prompt.extended(accepted)` what the canvas drafts the rest against; `fit(state, room)` the draft's
    length within `room` (default: all of it). The result has the canvas's shape, as
    `run_autoregressive`'s; `steps` is the number of sequential passes."""
    info = denoiser.info
    stats = stats if stats is not None else VerifyStats()
    tokens = np.full((batch, length), info.pad_id, dtype=np.int64)
    confidence = np.ones((batch, length), dtype=np.float32)
    temps, greedy = row_settings(batch, row_temperature, greedy_rows)
    draft_cfg = replace(
        cfg,
        strategy=cfg.draft_strategy,
        max_steps=cfg.draft_steps,
        greedy=True,
        t_max=1.0,
        t_min=1.0,
        stability_threshold=0,
    )
    temp = cfg.temperature(cfg.max_steps)
    reason: StopReason = "complete"
    row_steps = []
    for r in range(batch):
        chooser = _Chooser(denoiser, cfg, temp * float(temps[r]), bool(cfg.greedy or greedy[r]), rng)
        before = stats.passes
        reason = _row(
            denoiser, state, prompt, length, draft_cfg, rng, chooser, tokens[r], confidence[r],
            stop_after, fit, stats, deadline, cancel, on_step, tokens,
        )  # fmt: skip
        row_steps.append(stats.passes - before)
        if reason != "complete":
            break
    return SampleResult(
        tokens=tokens, confidence=confidence, steps=max(stats.passes, 1), stop_reason=reason, row_steps=row_steps
    )


def _row(
    den: Any,
    state: EncodedContext,
    prompt: Prompt,
    length: int,
    draft_cfg: SamplerConfig,
    rng: RandomSource,
    chooser: _Chooser,
    out: np.ndarray,
    conf: np.ndarray,
    stop_after: frozenset[int],
    fit: Callable[[EncodedContext, int], int] | None,
    stats: VerifyStats,
    deadline: float | None,
    cancel: Callable[[], bool] | None,
    on_step: Callable[[StepView], None] | None,
    view: np.ndarray,
) -> StopReason:
    info = den.info
    ends = (info.eof_id, info.pad_id)
    accepted: list[int] = []
    ar_state = state  # the one-token mode's state: the context and accepted[: len(accepted) - len(pending)]
    pending: list[int] = []  # accepted tokens not yet in ar_state (the mode's own last token)
    canvas_state = state
    leftover: list[int] = []  # the last draft after the token the mode replaced, tried before a new draft
    stats.passes += 1  # the context's pass (it also gives the first next-token logits)
    while True:
        if (stop := stop_requested(cancel, deadline)) is not None:
            return stop
        room = length - len(accepted)
        fresh = not leftover
        if leftover:  # a token replaced, the rest of the draft may still fit: free to try
            draft, leftover = leftover[:room], []
        else:  # 2. a new draft, the accepted tokens in the prefix
            if accepted:
                canvas_state = den.encode(prompt.extended(accepted), canvas_state)
                stats.passes += 1
            n = max(1, min(room, fit(canvas_state, room) if fit is not None else room))
            cfg = replace(draft_cfg, min_tokens=max(0, chooser.cfg.min_tokens - len(accepted)))
            drafted = run(den, canvas_state, initial_canvas(den, 1, n, rng), cfg, rng)
            stats.passes += drafted.steps
            row = [int(t) for t in drafted.tokens[0]]
            end = next((i for i, t in enumerate(row) if t in ends), None)
            draft = row[:end] + [info.eof_id] if end is not None else row
        body = draft[:-1] if draft and draft[-1] == info.eof_id else draft
        # 3. verify the whole draft in one pass: row j of `scored` predicts the token
        # after (pending + body)[j]
        fed = pending + body
        ext, scored = ar_state, None
        if fed:
            ext, out_logits = den.extend(ar_state, fed)
            scored = to_numpy(out_logits)
            stats.passes += 1
        stats.rounds += 1
        stats.drafted += len(draft)

        new: list[int] = []
        done = False
        missed: int | None = None  # the draft position whose token the mode replaced
        for i in range(len(draft) + (0 if draft and draft[-1] == info.eof_id else 1)):
            if len(accepted) + len(new) >= length:
                done = True
                break
            d = draft[i] if i < len(draft) else None
            j = len(pending) + i - 1  # the row of `scored` that predicts this token; -1: the state's own
            logits = scored[j] if scored is not None and j >= 0 else to_numpy(den.next_logits(ar_state))
            tok, p, agreed = chooser.check(logits, len(accepted) + len(new), d)
            pos = len(accepted) + len(new)
            conf[pos] = p
            if tok in ends:
                out[pos] = info.eof_id
                stats.accepted += int(agreed)
                done = True
                break
            new.append(tok)
            out[pos] = tok
            stats.accepted += int(agreed)
            if tok in stop_after or pos == length - 1:
                done = True
                break
            if not agreed:
                missed = i if d is not None else None
                break
        kept = _agreed_prefix(new, body)
        if missed is not None and (fresh or kept > 0):  # a leftover that fails at once is not tried again
            leftover = draft[missed + 1 :]
        # the mode's state: the context, the accepted tokens before this round and the
        # drafted ones it kept (a prefix of `ext`, free); the rest waits for the next pass
        prefix_len = len(ar_state.token_ids) + len(pending) + kept
        ar_state = den.cut(ext, prefix_len)
        pending = new[kept:]
        accepted.extend(new)
        if on_step is not None:
            arr = den.as_array(view)
            on_step(StepView(step=stats.passes - 1, argmax_canvas=arr, canvas=arr))
        if done or not new:
            return "complete"


def _agreed_prefix(new: list[int], body: list[int]) -> int:
    """How many of the round's tokens are drafted ones (they are in the verifier's state)."""
    k = 0
    while k < len(new) and k < len(body) and new[k] == body[k]:
        k += 1
    return k
