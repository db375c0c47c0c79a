"""A generator that writes one known text in the shipped model's tokens, behind the real
engine frame: each token's log-probability is known, so a test can follow every token
through the engine's changes to the fill (tests/unit/test_candidate_tokens.py) and into
serve's replies (tests/serve/test_serve_logprobs.py)."""

from __future__ import annotations

from engine.candidate import Candidate, scored
from engine.fill import FillLimits, InfillResult, Job
from engine.models.directory import DEFAULT_MODEL_DIR, TOKENIZER_FILE
from engine.models.tokenizer import Tokenizer

TOK = Tokenizer.from_file(DEFAULT_MODEL_DIR / TOKENIZER_FILE)  # the shipped byte-level BPE


def written(text: str) -> Candidate:
    """`text` as a model writes it: its tokens, each at probability 0.9, token k at
    log-probability -(k + 1) / 100, end-of-fill's last."""
    ids = TOK.encode(text)
    return scored(Candidate(text, ids, [0.9] * len(ids)), [-(k + 1) / 100 for k in range(len(ids) + 1)])


class Writes:
    """A generator whose one candidate is `written(text)`, as `cand`."""

    limits = FillLimits(default=32, longest=None, hard=None)
    languages = None
    takes_extra_files = False
    tokenizer = TOK

    def __init__(self, text: str) -> None:
        self.cand = written(text)

    def count_tokens(self, text: str) -> int:
        return len(TOK.encode(text))

    def generate(self, job: Job) -> InfillResult:
        return InfillResult([self.cand])

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass
