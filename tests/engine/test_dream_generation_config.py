"""The dream backend takes a checkpoint's decoding defaults from its generation_config.json
(tests/unit/test_generation_config.py has the reading), under config.json's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine.denoisers.loading import load_model  # noqa: E402
from engine.fill import FillOptions, InfillRequest  # noqa: E402
from engine.local.generator import local_engine  # noqa: E402
from engine.models.directory import GENERATION_FILE  # noqa: E402
from tests import dream_checkpoint  # noqa: E402
from tests.dream_checkpoint import DREAM_GENERATION as DREAM  # noqa: E402


def test_the_dream_backend_takes_them_under_its_own_config(tmp_path: Path) -> None:
    root = dream_checkpoint.write(tmp_path / "d")
    (root / GENERATION_FILE).write_text(json.dumps({**DREAM, "steps": 3}))
    model = load_model(root)
    assert model.defaults == {"max_steps": 3, "t_max": 0.2, "t_min": 0.2, "strategy": "entropy_bound"}
    engine = local_engine(model, FillOptions(canvas_tokens=8, use_drafter=False))
    r = engine.fill(InfillRequest(prefix="def add(a, b):\n    return ", suffix="\n"))
    assert 1 <= r.steps <= 3  # the checkpoint's steps bound the fill
    own = dream_checkpoint.write(tmp_path / "own", defaults={"max_steps": 5})
    (own / GENERATION_FILE).write_text(json.dumps(DREAM))
    assert load_model(own).defaults["max_steps"] == 5  # config.json's diffusion_lsp.defaults win
