"""Verified decoding with drafts copied from the context (prompt lookup) on a real
checkpoint: a tiny random Qwen2 through the dream backend (torch) and its onnx export.
Greedy, the fill equals the one-token mode's; the drafts are proposed and counted."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine.decoding import SamplerConfig  # noqa: E402
from engine.denoisers.loading import load_model  # noqa: E402
from engine.fill import FillOptions, InfillRequest  # noqa: E402
from engine.local.generator import local_engine  # noqa: E402
from tests import dream_checkpoint  # noqa: E402

PREFIX = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n"
SUFFIX = "\nfor i in range(10):\n    print(i)\n"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dream_checkpoint.write(tmp_path_factory.mktemp("q") / "qwen2", "qwen2", autoregressive=True)


def test_lookup_drafts_fill_as_the_one_token_mode(checkpoint: Path) -> None:
    engine = local_engine(load_model(checkpoint), FillOptions(canvas_tokens=24, context_tokens=256))
    req = InfillRequest(prefix=PREFIX, suffix=SUFFIX)
    one = engine.configured(sampler=SamplerConfig(strategy="autoregressive")).fill(req)
    looked = engine.configured(sampler=SamplerConfig(strategy="verified", drafts="lookup", draft_tokens=4)).fill(req)
    assert one.candidates and looked.candidates
    assert looked.candidates[0].token_ids == one.candidates[0].token_ids
    assert looked.rounds >= 1 and looked.accepted <= looked.rounds * 4
    # each kept draft token saves a pass: the context's, then one a round
    assert looked.passes <= 1 + looked.rounds and looked.passes <= one.passes + 1 - looked.accepted
