"""Encoding a fill's context ahead, in idle time (`Engine.warm`, LocalGenerator.warm): on a
tiny random Qwen2 checkpoint exported to onnx (the base install's backend) and through the
dream backend (transformers), both with Qwen's repository markers: the fill after a warm
reads nothing but the last token and writes what a cold fill writes; a warm cancelled part
way leaves its parts cached, one entry, for the fill (or the next warm) to go on from."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine.denoisers.base import PartEncoder  # noqa: E402
from engine.denoisers.loading import LoadedModel, load_model  # noqa: E402
from engine.fill import Engine, FillOptions, InfillRequest  # noqa: E402
from engine.local.generator import WARM_CHUNK, local_engine  # noqa: E402
from engine.training.export_lm import export_lm  # noqa: E402
from tests import dream_checkpoint  # noqa: E402

UTIL = "def add(a, b):\n    return a + b\n\n\nclass Point:\n    def __init__(self, x, y):\n        self.x = x\n" * 3
REQUEST = InfillRequest(
    prefix="for i in range(10):\n    print(i)\n\ndef f(a, b):\n    ret",
    suffix="\n\nprint(1)\n",
    extra_files=[("util.py", UTIL)],
    repository="proj",
    path="main.py",
    min_tokens=2,
)


@pytest.fixture(scope="module", params=["onnx", "dream"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    root = tmp_path_factory.mktemp("warm")
    source = dream_checkpoint.write(root / "src", "qwen2", autoregressive=True, repository=True)
    if request.param == "onnx":
        return load_model(export_lm(source, root / "onnx", "none"))
    return load_model(source, backend="dream")


def engine_of(model: LoadedModel) -> Engine:
    return local_engine(model, FillOptions(canvas_tokens=8, middle_priming=True))


def test_a_fill_after_a_warm_reads_only_its_last_token_and_writes_what_a_cold_fill_writes(model: LoadedModel) -> None:
    assert isinstance(model.denoiser, PartEncoder)
    warmed = engine_of(model)
    assert warmed.warm(REQUEST) is True
    after = warmed.fill(REQUEST)
    assert after.context_tokens > 2 * WARM_CHUNK  # the warm went in several parts
    assert after.reused_tokens == after.context_tokens
    cold = engine_of(model).fill(REQUEST)
    assert cold.reused_tokens == 0
    assert after.text == cold.text and after.text.strip()
    np.testing.assert_allclose(after.candidates[0].confidence, cold.candidates[0].confidence, atol=1e-4)
    assert warmed.warm(REQUEST) is True  # nothing left to encode: done at once
    assert len(warmed.generator.cache) == 1  # the fill's state took the warm's place (the same tokens)


def test_a_cancelled_warm_leaves_one_part_cached_which_the_next_fill_goes_on_from(model: LoadedModel) -> None:
    engine = engine_of(model)
    looks: list[int] = []

    def cancel() -> bool:
        looks.append(1)
        return len(looks) > 2  # two parts, then a keystroke comes

    assert engine.warm(REQUEST, cancel) is False
    assert len(engine.generator.cache) == 1  # the second part replaced the first
    fill = engine.fill(REQUEST)
    assert fill.reused_tokens == 2 * WARM_CHUNK < fill.context_tokens
    again = engine_of(model)
    assert again.warm(REQUEST, cancel=lambda: False) is True
    assert again.fill(REQUEST).text == fill.text
