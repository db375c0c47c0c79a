"""minConfidence (lsp_server/settings.py) and the gate in FillService: fills shown unasked
(the Automatic trigger, INLINE) keep only candidates whose confidence reaches the
threshold; Invoked and completion requests are unchanged; a fill held back is logged.
A fake generator with known confidences behind the real Engine."""

from __future__ import annotations

import asyncio
import logging
import math

import pytest

from engine.candidate import Candidate
from engine.fill import Engine, FillLimits, InfillRequest, InfillResult, Job
from lsp_server.service import COMPLETION, DEFAULT_MIN_CONFIDENCE, INLINE, INVOKED, FillKind, FillService
from lsp_server.settings import Settings, parse_settings


class Sure:
    """A generator whose candidates have the given confidences (None: no log-probabilities,
    as a remote engine without logprobs), best first, each of one line ("x0") or, from
    `multiline` on, of two; `min_confidence` (and `multiline_confidence`): its calibration."""

    limits = FillLimits(default=16, longest=None, hard=None)
    languages = None
    takes_extra_files = False
    tokenizer = None

    def __init__(
        self,
        scores: list[float | None],
        min_confidence: float | None = None,
        multiline_confidence: float | None = None,
        multiline: int = 99,
    ) -> None:
        self.scores = scores
        self.min_confidence, self.multiline_confidence, self.multiline = min_confidence, multiline_confidence, multiline

    def calibrated(self, multiline: bool = False) -> float | None:
        return self.multiline_confidence if multiline and self.multiline_confidence is not None else self.min_confidence

    def count_tokens(self, text: str) -> int:
        return len(text)

    def generate(self, job: Job) -> InfillResult:
        cands = []
        for i, s in enumerate(self.scores[: job.request.candidates]):
            lp = None if s is None else math.log(s)
            text = f"x{i}\ny{i}" if i >= self.multiline else f"x{i}"
            cands.append(Candidate(text, [], [], mean_logprob=lp, min_logprob=lp))
        return InfillResult(candidates=cands)

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass


def texts(scores: list[float | None], kind: FillKind, setting: float | str = "auto", **kw: float | None) -> list[str]:
    """The texts of the answer to a fill with these candidates (`kw`: Sure's calibration)."""
    fills = FillService()
    fills.engine = Engine(Sure(scores, **kw))
    fills.settings = Settings(min_confidence=setting)
    fills.ready.set()
    req = InfillRequest("x = ", "\n", candidates=len(scores))
    answer = asyncio.run(fills.fill("file:///a.py", req, kind))
    assert answer is not None
    return [c.text for c in answer.candidates]


def test_automatic_fills_below_the_models_calibrated_threshold_are_held_back() -> None:
    assert texts([0.5], INLINE, min_confidence=0.6) == []
    assert texts([0.7], INLINE, min_confidence=0.6) == ["x0"]
    assert texts([0.7, 0.2], INLINE, min_confidence=0.6) == ["x0"]  # each candidate judged


def test_fills_of_several_lines_have_their_own_threshold() -> None:
    both = {"min_confidence": 0.5, "multiline_confidence": 0.9}
    assert texts([0.7, 0.8], INLINE, multiline=1, **both) == ["x0"]  # the second has two lines
    assert texts([0.7, 0.95], INLINE, multiline=1, **both) == ["x0", "x1\ny1"]
    assert texts([0.7, 0.8], INLINE, multiline=1, min_confidence=0.5) == ["x0", "x1\ny1"]  # one for both


def test_auto_without_a_calibration_uses_the_documented_default() -> None:
    below, above = DEFAULT_MIN_CONFIDENCE * 0.9, min(1.0, DEFAULT_MIN_CONFIDENCE * 1.1)
    assert texts([below], INLINE) == []
    assert texts([above], INLINE) == ["x0"]


def test_a_number_overrides_the_calibration_and_zero_shows_everything() -> None:
    assert texts([0.5], INLINE, 0.4, min_confidence=0.9) == ["x0"]
    assert texts([0.5], INLINE, 0.55, min_confidence=0.1) == []
    assert texts([0.001], INLINE, 0, min_confidence=0.9) == ["x0"]


@pytest.mark.parametrize("kind", [INVOKED, COMPLETION])
def test_asked_for_fills_are_unchanged(kind: FillKind) -> None:
    assert texts([0.2, 0.01], kind, min_confidence=0.9) == ["x0", "x1"]


def test_a_fill_without_a_confidence_is_shown_as_before() -> None:
    assert texts([None], INLINE, min_confidence=0.9) == ["x0"]


def test_a_fill_held_back_is_logged_once_a_while_at_info(caplog: pytest.LogCaptureFixture) -> None:
    fills = FillService()
    fills.engine = Engine(Sure([0.2], min_confidence=0.6))
    caplog.set_level(logging.DEBUG, logger="lsp_server.service")
    assert fills.confident([Candidate("x", [], [], min_logprob=math.log(0.2))]) == []
    assert fills.confident([Candidate("y", [], [], min_logprob=math.log(0.3))]) == []
    held = [r for r in caplog.records if "held back" in r.getMessage()]
    assert [r.levelno for r in held] == [logging.INFO, logging.DEBUG]  # not a line per keystroke at info
    assert "0.20" in held[0].getMessage() and "0.60" in held[0].getMessage() and "minConfidence" in held[0].getMessage()
    assert fills.confident([Candidate("z", [], [], min_logprob=math.log(0.9))])[0].text == "z"


def test_the_setting_takes_auto_or_a_number_in_range() -> None:
    assert parse_settings({"minConfidence": "auto"}) == (Settings(min_confidence="auto"), [])
    assert parse_settings({"minConfidence": 0.35}) == (Settings(min_confidence=0.35), [])
    assert parse_settings({"minConfidence": 0}) == (Settings(min_confidence=0), [])
    for bad in ("high", 1.5, -0.1, True, None):
        s, problems = parse_settings({"minConfidence": bad})
        assert s == Settings() and len(problems) == 1 and "minConfidence" in problems[0], bad
