"""FillService.fill of a code action's request (REGION kind, `retry_candidates` set by the
handler), through the engine's retry: the greedy fill alone first, the sampled candidates
only when it gives nothing usable. A fake generator with known answers behind the real
Engine; the real engine's candidates are tested in tests/engine."""

from __future__ import annotations

import asyncio

from engine.candidate import Candidate
from engine.fill import Engine, FillLimits, InfillRequest, InfillResult, Job
from lsp_server.actions import REGION_CANDIDATES
from lsp_server.service import REGION, FillService


class AnswerBook:
    """A generator whose raw candidates are given per number of candidates asked for."""

    limits = FillLimits(default=16, longest=None, hard=None)
    languages = None
    takes_extra_files = False
    tokenizer = None

    def __init__(self, answers: dict[int, list[str]], error: str | None = None) -> None:
        self.answers = answers
        self.error = error
        self.asked: list[int] = []

    def count_tokens(self, text: str) -> int:
        return len(text)

    def generate(self, job: Job) -> InfillResult:
        self.asked.append(job.request.candidates)
        texts = self.answers.get(job.request.candidates, [])
        return InfillResult(
            candidates=[Candidate(text=t, token_ids=[], confidence=[]) for t in texts],
            steps=1,
            error=self.error,
        )

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass


def service(engine: AnswerBook) -> FillService:
    fills = FillService()
    fills.engine = Engine(engine)
    fills.ready.set()
    return fills


def region(fills: FillService, prefix: str, suffix: str, region: str = "") -> str:
    request = InfillRequest(prefix, suffix, "python", region=region, retry_candidates=REGION_CANDIDATES)
    answer = asyncio.run(fills.fill("file:///a.py", request, REGION))
    assert answer is not None
    return answer.text


def test_a_usable_greedy_fill_is_the_answer_without_sampling_more() -> None:
    engine = AnswerBook({1: ["return 0"], REGION_CANDIDATES: ["never asked"]})
    assert region(service(engine), "def f():\n    ", "\n", "pass") == "return 0"
    assert engine.asked == [1]


def test_a_blank_or_failed_greedy_fill_asks_for_more_candidates() -> None:
    engine = AnswerBook({1: ["   "], REGION_CANDIDATES: ["", "  ", "return 1"]})
    assert region(service(engine), "def f():\n    ", "\n", "pass") == "return 1"
    assert engine.asked == [1, REGION_CANDIDATES]
    nothing = AnswerBook({1: [], REGION_CANDIDATES: [" "]})  # no candidate parsed
    assert region(service(nothing), "def f():\n    ", "\n") == ""
    assert nothing.asked == [1, REGION_CANDIDATES]


def test_an_engine_fault_is_not_retried() -> None:
    engine = AnswerBook({}, error="endpoint http://127.0.0.1:9 refused the connection")
    told: list[str] = []
    fills = service(engine)
    fills.notify = told.append
    assert region(fills, "a = ", "\n") == ""
    assert engine.asked == [1] and told == [engine.error]
