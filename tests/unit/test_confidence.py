"""A fill's confidence (engine.candidate.scored, docs/confidence.md) from each local source,
against a fake model with known logits in both modes (tests/unit/test_verify.py's
TwoModes): the one-token mode's likelihood with end-of-fill counted, the verifier's,
the canvas's lock confidences, and the teacher-forced likelihood that ranks alternatives."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from engine.candidate import LOGPROB_FLOOR, Candidate, scored
from engine.decoding import SamplerConfig
from engine.denoisers.loading import LoadedModel
from engine.fill import FillOptions, InfillRequest
from engine.local.generator import local_engine
from engine.local.one_token import sequence_logprob, token_logprobs
from engine.local.steering import log_softmax
from tests.fakes import EOF, MASK, MID, NL, PAD, STATE, TwoModes

TARGET = [6, 7, 8]  # the one-token mode's greedy fill: "ghi"
ALLOWED = 14  # tokens the one-token mode may choose: the vocabulary less the mask and the middle marker


class CharTokenizer:
    """Token i >= 5 is the letter chr(ord('a') + i), NL a line break; the TwoModes ids."""

    special = SimpleNamespace(pad=PAD, eof=EOF, mask=MASK, suffix=3, prefix=4, middle=MID)
    line_break_ids = frozenset({NL})
    blank_ids = frozenset({NL})

    def encode(self, text: str) -> list[int]:
        return [NL if ch == "\n" else ord(ch) - ord("a") for ch in text]

    def decode(self, ids: Any) -> str:
        return "".join("\n" if i == NL else chr(ord("a") + int(i)) for i in ids if int(i) >= 5)


def engine_over(model: TwoModes, strategy: str, defaults: dict[str, Any] | None = None) -> Any:
    loaded = LoadedModel(Path("fake"), CharTokenizer(), model, "fake", dict(defaults or {}))  # type: ignore[arg-type]
    cfg = SamplerConfig(strategy=strategy, max_steps=8)  # type: ignore[arg-type]
    return local_engine(loaded, FillOptions(canvas_tokens=6, sampler=cfg, use_drafter=False, fit_canvas=False))


def p_of(peak: float, second: float | None = None) -> float:
    """The probability the one-token mode gives its peak token (logit `peak`, one other at
    `second`, the rest of the allowed tokens at 0)."""
    rest = ALLOWED - 1 - (second is not None)
    return math.exp(peak) / (math.exp(peak) + (math.exp(second) if second is not None else 0.0) + rest)


def test_scored_takes_the_mean_and_the_least_likely_token() -> None:
    cand = scored(Candidate("x", [1, 2], [0.5, 0.25]), [math.log(0.5), math.log(0.25), math.log(0.8)])
    assert cand.mean_logprob == pytest.approx((math.log(0.5) + math.log(0.25) + math.log(0.8)) / 3)
    assert cand.min_logprob == pytest.approx(math.log(0.25))
    assert cand.score == pytest.approx(0.25)
    assert scored(Candidate("x", [], []), []).score is None  # no log-probabilities: no confidence
    zero = scored(Candidate("x", [1], [0.0]), [-math.inf])
    assert zero.min_logprob == LOGPROB_FLOOR and zero.mean_logprob == LOGPROB_FLOOR  # no -inf in the mean


def test_token_logprobs_count_end_of_fill_and_sum_to_the_sequence_likelihood() -> None:
    model = TwoModes(TARGET, TARGET)
    per_token = token_logprobs(model, STATE, TARGET, EOF)
    assert per_token.shape == (len(TARGET) + 1,)  # the fill's tokens, then end-of-fill
    full = log_softmax(np.full(16, 0.0, dtype=np.float32) + np.eye(16, dtype=np.float32)[6] * 3.0)
    assert per_token[0] == pytest.approx(float(full[6]))  # teacher-forced: nothing barred
    total, n = sequence_logprob(model, STATE, TARGET, EOF)
    assert (total, n) == (pytest.approx(float(per_token.sum())), 4)
    wrong = token_logprobs(model, STATE, [6, 9], EOF)
    assert wrong[1] < per_token[1]  # a token the model did not expect costs likelihood


@pytest.mark.parametrize("strategy", ["autoregressive", "verified"])
def test_the_one_token_and_verified_fills_carry_their_likelihood_with_end_of_fill(strategy: str) -> None:
    """Position 1 has a second choice: its probability is the least, and end-of-fill's
    counts in the mean (four tokens, not three)."""
    model = TwoModes(TARGET, TARGET, second={1: 9})  # token 9 at 2.5 after "g"
    r = engine_over(model, strategy).fill(InfillRequest(prefix="", suffix="", min_tokens=0))
    best = r.candidates[0]
    assert best.text == "ghi"
    sure, unsure = p_of(3.0), p_of(3.0, 2.5)
    assert best.score == pytest.approx(unsure, rel=1e-5)
    assert best.mean_logprob == pytest.approx((3 * math.log(sure) + math.log(unsure)) / 4, rel=1e-5)


def test_the_canvas_fill_carries_its_lock_confidences() -> None:
    """The canvas's drafts peak at 8.0, the one-token mode's at 3.0: a canvas fill's
    confidence is the canvas's, not the one-token mode's."""
    model = TwoModes(TARGET, TARGET)
    r = engine_over(model, "confidence").fill(InfillRequest(prefix="", suffix="", min_tokens=0))
    best = r.candidates[0]
    assert best.text == "ghi"
    assert best.score is not None and best.score > 0.99 > p_of(3.0)
    assert best.logprob is None  # one candidate: no teacher-forced scoring pass


def test_alternatives_are_ranked_by_the_likelihood_that_is_their_confidence() -> None:
    model = TwoModes(TARGET, TARGET, second={0: 9, 1: 10})
    r = engine_over(model, "autoregressive").fill(InfillRequest(prefix="", suffix="", candidates=4, min_tokens=0))
    assert len(r.candidates) >= 2
    for c in r.candidates:  # teacher-forced: the confidence is the likelihood that ranks them
        assert c.logprob is not None and c.mean_logprob == pytest.approx(c.logprob)
        assert c.score == pytest.approx(math.exp(c.min_logprob or 0.0))
    means = [c.mean_logprob or 0.0 for c in r.candidates[1:]]
    assert means == sorted(means, reverse=True)


def test_a_model_directory_carries_its_calibrated_threshold() -> None:
    model = TwoModes(TARGET, TARGET)
    assert engine_over(model, "autoregressive").min_confidence() is None
    one = engine_over(model, "autoregressive", {"min_confidence": 0.42})
    assert (one.min_confidence(), one.min_confidence(multiline=True)) == (0.42, 0.42)  # one for both
    both = engine_over(model, "autoregressive", {"min_confidence": 0.42, "min_confidence_multiline": 1.01})
    assert (both.min_confidence(), both.min_confidence(multiline=True)) == (0.42, 1.01)
    assert engine_over(model, "autoregressive", {"min_confidence": "high"}).min_confidence() is None
