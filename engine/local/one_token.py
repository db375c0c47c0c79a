"""The one-token loop: a fill decoded one token at a time through the causal context
encoder (the denoiser is also an `Autoregressive`), and the likelihood of a given fill in
that mode. engine/local/sampler.py has the canvas loop, engine/local/steering.py the
`Steering` both take.

The autoregressive loop, per row (`run_autoregressive`; rows one after the other,
each in `_one_token_row`):
  1. stop if the steering says so (`Steering.stopped`);
  2. temper the next position's logits, bar suppressed tokens and the mask (and
     end-of-fill and padding before min_tokens, counted after the characters the row
     must spell first, `Steering.heal`: until they are spelled, only the tokens that
     spell them may come, engine/local/heal.py);
  3. take the argmax (greedy, or the greedy row) or sample from the softmax;
  4. end the row at end-of-fill or padding (written as end-of-fill), after a token of
     `Steering.stop_after`, or at the canvas length; else extend the encoder's state by
     the token, which gives the next position's logits.
The result has the canvas's shape (the fill, end-of-fill, padding), so everything above
the sampler treats both loops' answers alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.decoding import SamplerConfig, StopReason
from engine.denoisers.base import EncodedContext, RandomSource
from engine.local.steering import SampleResult, Steering, log_softmax, softmax, to_numpy


class OneToken:
    """The one-token mode's choice at one position, for `run_autoregressive` and verified
    decoding (engine/local/verify.py) alike: suppressed tokens and the mask barred, end-of-fill
    and padding barred before `min_tokens`, the logits divided by `temp`; the argmax when
    `greedy`, else a draw from the tempered softmax."""

    def __init__(self, denoiser: Any, cfg: SamplerConfig, temp: float, greedy: bool, rng: RandomSource) -> None:
        info = denoiser.info
        self.den, self.info, self.cfg, self.temp, self.greedy, self.rng = denoiser, info, cfg, temp, greedy, rng
        barred = np.zeros(info.vocab_size, dtype=bool)
        barred[list(info.suppress_ids)] = True
        if info.mask_id is not None:
            barred[info.mask_id] = True
        self.barred = barred

    def probs(self, logits: np.ndarray, position: int) -> tuple[np.ndarray, np.ndarray]:
        """(processed logits, probabilities) at the fill's `position`."""
        proc = np.where(self.barred, -1.0e30, logits.astype(np.float32) / self.temp)
        if position < self.cfg.min_tokens:
            proc[[self.info.eof_id, self.info.pad_id]] = -1.0e30
        return proc, to_numpy(softmax(proc))

    def draw(self, probs: np.ndarray) -> int:
        return int(to_numpy(self.rng.categorical(self.den.as_array(probs[None, None].astype(np.float32))))[0, 0])

    def choose(self, logits: np.ndarray, position: int) -> tuple[int, float]:
        """(token, its probability)."""
        proc, probs = self.probs(logits, position)
        tok = int(np.argmax(proc)) if self.greedy else self.draw(probs)
        return tok, float(probs[tok])


def run_autoregressive(
    denoiser: Any,
    state: EncodedContext,
    length: int,
    cfg: SamplerConfig,
    rng: RandomSource,
    *,
    batch: int = 1,
    steer: Steering = Steering(),  # noqa: B008 (frozen: one shared default is safe)
) -> SampleResult:
    """The autoregressive mode: each row decoded one token at a time through the causal
    context encoder (`denoiser` is also an `Autoregressive`), until end-of-fill, a token
    of `steer.stop_after` (kept: e.g. a line break where the span is one line, which the
    span check cuts at anyway, so nothing past it is worth decoding) or `length` tokens.
    The result has the canvas's shape, (B, length): the fill, then end-of-fill and
    padding, so everything above the sampler treats it like a canvas. Rows are decoded
    one after the other (the encoder runs one sequence at a time, `_one_token_row`);
    `steps` counts the tokens decoded by all rows, end-of-fill included (one position of
    a forward pass each; the first comes with encoding the context). Temperature, greedy
    rows, min_tokens, deadline and cancel mean what they do in `run`."""
    info = denoiser.info
    tokens = np.full((batch, length), info.pad_id, dtype=np.int64)
    confidence = np.ones((batch, length), dtype=np.float32)
    row_steps = [0] * batch
    reason: StopReason = "complete"
    for r, (temp, greedy) in enumerate(steer.one_token_rows(batch, cfg)):
        chooser = OneToken(denoiser, cfg, temp, greedy, rng)
        reason, row_steps[r] = _one_token_row(denoiser, state, chooser, r, tokens, confidence, steer, sum(row_steps))
        if reason != "complete":
            break
    return SampleResult(
        tokens=tokens, confidence=confidence, steps=max(sum(row_steps), 1), stop_reason=reason, row_steps=row_steps
    )


def _one_token_row(
    denoiser: Any,
    state: EncodedContext,
    chooser: OneToken,
    r: int,
    tokens: np.ndarray,
    confidence: np.ndarray,
    steer: Steering,
    before: int,
) -> tuple[StopReason, int]:
    """Row `r` of `run_autoregressive`, written into tokens[r] and confidence[r] (the
    steps of the module docstring); `before`: the steps of the rows before it. Returns
    (why the row ended, its forward passes)."""
    info = denoiser.info
    length = tokens.shape[1]
    logits = to_numpy(denoiser.next_logits(state)).astype(np.float32)
    n = 1  # the first token's logits came with the context's last position
    heal = steer.heal
    rest = heal.text if heal is not None else ""  # characters still to spell (steer.heal)
    healing = 0  # tokens that only spelled them: the fill's own positions start after them
    for i in range(length):
        if (stop := steer.stopped_in_line(tokens[r, :i])) is not None:
            return stop, n
        if heal is not None and rest:
            logits = heal.masked(logits, rest)
        tok, confidence[r, i] = chooser.choose(logits, i - healing)
        if tok in (info.eof_id, info.pad_id):
            tokens[r, i] = info.eof_id
            break
        tokens[r, i] = tok
        if heal is not None and rest:
            rest, inside = heal.step(rest, tok)
            healing += inside
        if steer.ended_by_echo(tokens[r], i + 1, info):
            break
        if i == length - 1 or tok in steer.stop_after:
            break
        state, out = denoiser.extend(state, [tok])
        logits = to_numpy(out[-1]).astype(np.float32)
        n += 1
        steer.show_rows(before + n - 1, denoiser, tokens)
    return "complete", n


def sequence_logprob(denoiser: Any, state: EncodedContext, token_ids: list[int], eof_id: int) -> tuple[float, int]:
    """(log-likelihood, tokens scored) of `token_ids` then end-of-fill after `state`,
    teacher-forced in one pass of the causal encoder (the autoregressive mode)."""
    per_token = token_logprobs(denoiser, state, token_ids, eof_id)
    return float(np.sum(per_token, dtype=np.float64)), len(per_token)


def token_logprobs(denoiser: Any, state: EncodedContext, token_ids: list[int], eof_id: int) -> np.ndarray:
    """Each token's log-probability, then end-of-fill's, after `state`: (len(token_ids) + 1,)
    float32, teacher-forced in one pass of the causal encoder (the autoregressive mode)."""
    first = log_softmax(to_numpy(denoiser.next_logits(state)).astype(np.float32))
    seq = [*token_ids, eof_id]
    out = np.empty(len(seq), dtype=np.float32)
    out[0] = first[seq[0]]
    if token_ids:
        _, logits = denoiser.extend(state, token_ids)
        logp = log_softmax(to_numpy(logits).astype(np.float32))  # (T, V): row i predicts seq[i + 1]
        out[1:] = logp[np.arange(len(token_ids)), seq[1:]]
    return out
