"""Drafts verified by the same weights: a drafter proposes, the one-token mode checks.

Speculative decoding (strategy "verified"; the denoiser must also be an `Autoregressive`)
with drafts from one of two sources (`SamplerConfig.drafts`): the model's own diffusion
canvas (self-speculative), or tokens copied out of the context (`propose`: the
prompt-lookup drafter, engine.local.drafter, for a model whose canvas is untrained). Per
candidate row (`_Row`), in rounds:

  1. stop if the steering says so (`Steering.stopped`);
  2. draft (`_Row.draft`): `propose(accepted, room)` where it is given (no pass; an empty
     draft makes the round one token of the one-token mode), else the canvas fills the
     rest of the span in `draft_steps`
     parallel passes (the canvas loop, `sampler.run`) against the prompt with the
     tokens accepted so far as its fill (`Prompt.extended`, laid out by the backend: in
     the suffix-prefix-middle order they go before the middle marker, so the drafter
     sees the layout it was trained on and only those tokens and the marker are
     encoded); a model with a length head sizes the draft (`fit`);
  3. verify (`_Row.verify`): the one-token mode scores the whole draft in one pass of
     the causal encoder (`extend`), and keeps the longest prefix whose tokens it picks
     itself, plus its own token where it first disagrees (or after the whole draft):
     greedy rows take the argmax, so the text equals the one-token mode's greedy fill;
     sampled rows accept a drafted token with the probability the mode gives it and
     otherwise sample from the rest of its distribution (speculative sampling with a
     point-mass draft), so their text is distributed as the one-token mode's;
  4. the row ends at end-of-fill, after a token of `Steering.stop_after`, where
     `Steering.echo` says the fill repeats the suffix, or at `length` tokens.

Every round decodes at least one token, so a row takes at most `length` rounds. Where
the mode replaced one drafted token, the rest of the draft is tried first in the next
round, as it stands (a wrong name or operator leaves the code after it in place): that
round costs one verification pass and no draft, and a new draft is made only when the
rest fails at once. The one-token mode's state is cut back to the accepted tokens
(`_Row.accept`; `cut`: a prefix of its cache); the token it adds itself is encoded with
the next round's verification.
`passes` counts the sequential forward passes (draft encodes, canvas steps,
verifications, plus one for the context), `rounds` and `accepted` the drafts and how
many of their tokens were kept: the acceptance length is accepted / rounds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from engine.decoding import SamplerConfig, StopReason
from engine.denoisers.base import EncodedContext, Prompt, RandomSource
from engine.local.one_token import OneToken
from engine.local.sampler import initial_canvas, run
from engine.local.steering import SampleResult, Steering, to_numpy


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
    steer: Steering = Steering(),  # noqa: B008 (frozen: one shared default is safe)
    fit: Callable[[EncodedContext, int], int] | None = None,
    stats: VerifyStats | None = None,
    propose: Callable[[list[int], int], list[int]] | None = None,
) -> SampleResult:
    """Verified decoding of `batch` rows after `state` (the context the one-token mode
    continues, which also serves the first draft); `prompt` is what it encodes, and
    `prompt.extended(accepted)` what the canvas drafts the rest against; `fit(state,
    room)` the canvas draft's length within `room` (default: all of it); `propose(accepted,
    room)` the drafts instead of the canvas (at most `room` tokens); `steer` as in
    `run_autoregressive` (the drafts themselves are not steered). The result has the
    canvas's shape, as `run_autoregressive`'s; `steps` is the number of sequential
    passes."""
    info = denoiser.info
    stats = stats if stats is not None else VerifyStats()
    tokens = np.full((batch, length), info.pad_id, dtype=np.int64)
    confidence = np.ones((batch, length), dtype=np.float32)
    draft_cfg = replace(
        cfg,
        strategy=cfg.draft_strategy,
        max_steps=cfg.draft_steps,
        block_length=None,  # a draft is draft_steps passes over the whole canvas, in no blocks
        greedy=True,
        t_max=1.0,
        t_min=1.0,
        stability_threshold=0,
    )
    shared = _Shared(denoiser, prompt, draft_cfg, rng, fit, steer, tokens, propose)
    reason: StopReason = "complete"
    row_steps = []
    for r, (temp, greedy) in enumerate(steer.one_token_rows(batch, cfg)):
        chooser = _Chooser(denoiser, cfg, temp, greedy, rng)
        before = stats.passes
        row = _Row(shared, chooser, tokens[r], confidence[r], stats, ar_state=state, canvas_state=state)
        reason = row.decode()
        row_steps.append(stats.passes - before)
        if reason != "complete":
            break
    return SampleResult(
        tokens=tokens, confidence=confidence, steps=max(stats.passes, 1), stop_reason=reason, row_steps=row_steps
    )


@dataclass(frozen=True)
class _Shared:
    """What the rows of one `run_verified` call share."""

    den: Any
    prompt: Prompt
    draft_cfg: SamplerConfig  # the canvas's settings for a draft (min_tokens set per draft)
    rng: RandomSource
    fit: Callable[[EncodedContext, int], int] | None
    steer: Steering
    view: np.ndarray  # every row's tokens, which the observer sees
    propose: Callable[[list[int], int], list[int]] | None = None  # the drafts, where not the canvas's


@dataclass
class _Round:
    """One round of a row: the draft tried, and what the one-token mode made of it."""

    draft: list[int]  # the draft's tokens, its end-of-fill included when it drafted one
    body: list[int]  # the draft without its end-of-fill
    fresh: bool  # a new draft (not the rest of the last one)
    ext: EncodedContext | None = None  # the mode's state after the pending tokens and the body
    new: list[int] = field(default_factory=list)  # the tokens the round decoded
    done: bool = False  # the row ends with this round
    missed: int | None = None  # the draft position whose token the mode replaced


@dataclass
class _Row:
    """One row of verified decoding, decoded round by round (the module docstring's
    steps: `decode` 1 and 4, `draft` 2, `verify` 3, `accept` what follows a round)."""

    run: _Shared
    chooser: _Chooser
    out: np.ndarray  # the row's tokens (length,), a row of run.view
    conf: np.ndarray  # each token's probability when it was chosen (length,)
    stats: VerifyStats
    ar_state: EncodedContext  # the one-token mode's: the context and accepted[: len(accepted) - len(pending)]
    canvas_state: EncodedContext  # the canvas's: the prompt with the accepted tokens of the last draft
    accepted: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)  # accepted tokens not yet in ar_state (the mode's own last token)
    leftover: list[int] = field(default_factory=list)  # the last draft after the token the mode replaced

    def decode(self) -> StopReason:
        """Rounds until the row ends (or the steering stops it)."""
        self.stats.passes += 1  # the context's pass (it also gives the first next-token logits)
        while True:
            if (stop := self.run.steer.stopped()) is not None:
                return stop
            rnd = self.draft()
            self.verify(rnd)
            self.accept(rnd)
            self.run.steer.show_rows(self.stats.passes - 1, self.run.den, self.run.view)
            if rnd.done or not rnd.new:
                return "complete"

    def draft(self) -> _Round:
        """2. The rest of the last draft where the mode replaced one of its tokens (it may
        still fit: free to try), else a new draft with the accepted tokens in the prompt."""
        den, info = self.run.den, self.run.den.info
        room = len(self.out) - len(self.accepted)
        if self.leftover:
            draft, self.leftover = self.leftover[:room], []
            return _Round(draft, _body(draft, info.eof_id), fresh=False)
        if self.run.propose is not None:
            draft = self.run.propose(self.accepted, room)[:room]
            return _Round(draft, _body(draft, info.eof_id), fresh=True)
        if self.accepted:
            self.canvas_state = den.prefill(self.run.prompt.extended(self.accepted), self.canvas_state)
            self.stats.passes += 1
        fit = self.run.fit
        n = max(1, min(room, fit(self.canvas_state, room) if fit is not None else room))
        cfg = replace(self.run.draft_cfg, min_tokens=max(0, self.chooser.cfg.min_tokens - len(self.accepted)))
        drafted = run(den, self.canvas_state, initial_canvas(den, 1, n, self.run.rng), cfg, self.run.rng)
        self.stats.passes += drafted.steps
        row = [int(t) for t in drafted.tokens[0]]
        end = next((i for i, t in enumerate(row) if t in (info.eof_id, info.pad_id)), None)
        draft = row[:end] + [info.eof_id] if end is not None else row
        return _Round(draft, _body(draft, info.eof_id), fresh=True)

    def verify(self, rnd: _Round) -> None:
        """3. Score the whole draft in one pass of the mode and take its tokens, position
        by position, while it keeps the drafted ones (`_take`)."""
        den = self.run.den
        # row j of `scored` predicts the token after (pending + body)[j]
        fed = self.pending + rnd.body
        rnd.ext, scored = self.ar_state, None
        if fed:
            rnd.ext, out_logits = den.extend(self.ar_state, fed)
            scored = to_numpy(out_logits)
            self.stats.passes += 1
        self.stats.rounds += 1
        self.stats.drafted += len(rnd.draft)
        for i in range(len(rnd.body) + 1):  # the body, then its end-of-fill or the mode's next token
            if len(self.accepted) + len(rnd.new) >= len(self.out):
                rnd.done = True
                return
            j = len(self.pending) + i - 1  # the row of `scored` that predicts this token; -1: the state's own
            logits = scored[j] if scored is not None and j >= 0 else to_numpy(den.next_logits(self.ar_state))
            if not self._take(rnd, i, logits):
                return

    def _take(self, rnd: _Round, i: int, logits: np.ndarray) -> bool:
        """The mode's token at the round's position `i`, checking the drafted one there,
        written out; False when the round ends with it (4. the row's end, or a token the
        mode replaced)."""
        info = self.run.den.info
        pos = len(self.accepted) + len(rnd.new)
        d = rnd.draft[i] if i < len(rnd.draft) else None
        tok, p, agreed = self.chooser.check(logits, pos, d)
        self.conf[pos] = p
        self.stats.accepted += int(agreed)
        if tok in (info.eof_id, info.pad_id):
            self.out[pos] = info.eof_id
            rnd.done = True
            return False
        rnd.new.append(tok)
        self.out[pos] = tok
        if self.run.steer.ended_by_echo(self.out, pos + 1, info):
            rnd.done = True
            return False
        if tok in self.run.steer.stop_after or pos == len(self.out) - 1:
            rnd.done = True
            return False
        if not agreed:
            rnd.missed = i if d is not None else None
            return False
        return True

    def accept(self, rnd: _Round) -> None:
        """The round's tokens accepted; the rest of the draft kept for the next round
        where the mode replaced a token (a leftover that fails at once is not tried
        again); the mode's state cut back to the context, the accepted tokens before
        this round and the drafted ones it kept (a prefix of `ext`, free): the rest
        waits for the next pass."""
        assert rnd.ext is not None
        kept = _agreed_prefix(rnd.new, rnd.body)
        if rnd.missed is not None and (rnd.fresh or kept > 0):
            self.leftover = rnd.draft[rnd.missed + 1 :]
        prefix_len = len(self.ar_state.token_ids) + len(self.pending) + kept
        self.ar_state = self.run.den.cut(rnd.ext, prefix_len)
        self.pending = rnd.new[kept:]
        self.accepted.extend(rnd.new)


def _body(draft: list[int], eof_id: int) -> list[int]:
    """The draft without its end-of-fill."""
    return draft[:-1] if draft and draft[-1] == eof_id else draft


def _agreed_prefix(new: list[int], body: list[int]) -> int:
    """How many of the round's tokens are drafted ones (they are in the verifier's state)."""
    k = 0
    while k < len(new) and k < len(body) and new[k] == body[k]:
        k += 1
    return k
