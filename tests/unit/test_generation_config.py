"""A checkpoint's own decoding defaults from its generation_config.json
(engine.models.directory.decoding_defaults): what each family's fields set, what is only
shown, what is ignored; the dream backend's defaults and `diffusion-infill models`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.models.directory import GENERATION_FILE, decoding_defaults
from tests.dream_checkpoint import DREAM_GENERATION as DREAM

LLADA = {"steps": 128, "block_length": 32, "remasking": "low_confidence", "temperature": 0.0}


def _dir(root: Path, gen: Any, name: str = "m") -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / GENERATION_FILE).write_text(gen if isinstance(gen, str) else json.dumps(gen))
    return d


@pytest.mark.parametrize(
    ("gen", "defaults"),
    [
        (DREAM, {"max_steps": 128, "t_max": 0.2, "t_min": 0.2, "strategy": "entropy_bound"}),
        (LLADA, {"max_steps": 128, "block_length": 32, "strategy": "confidence"}),  # temperature 0: greedy
        # Fast-dLLM v2's generate(): blocks of 32 decoded in sub-blocks of 8 over a threshold
        (
            {"block_size": 32, "small_block_size": 8, "threshold": 0.9},
            {"block_length": 8, "confidence_threshold": 0.9},
        ),
        ({"block_size": 4, "threshold": 1.5}, {"block_length": 4}),  # no threshold above 1
        ({"alg": "maskgit_plus", "diffusion_steps": 64}, {"max_steps": 64, "strategy": "confidence"}),
        ({"alg": "origin", "steps": 16}, {"max_steps": 16}),  # random order: not ours
        ({"steps": 0, "temperature": -1, "alg": 3}, {}),  # nonsense is not taken
        ({"temperature": 0.7, "top_p": 0.8, "eos_token_id": 2}, None),  # an autoregressive model's
        ("{not json", None),
        ([1, 2], None),
    ],
)
def test_each_familys_fields_set_the_sampler_defaults(tmp_path: Path, gen: Any, defaults: Any) -> None:
    got = decoding_defaults(_dir(tmp_path, gen))
    if defaults is None:
        assert got.read == {} and got.defaults == {} and got.describe() == ""
    else:
        assert got.defaults == defaults


def test_what_is_not_used_is_said(tmp_path: Path) -> None:
    llada = decoding_defaults(_dir(tmp_path, LLADA, "llada"))
    assert llada.read["block_length"] == 32
    line = llada.describe()
    assert line.startswith("generation_config.json: steps 128, block_length 32, remasking low_confidence")
    assert "-> max_steps 128, strategy confidence, block_length 32" in line
    origin = decoding_defaults(_dir(tmp_path, {"alg": "origin", "steps": 8}, "origin"))
    assert "'origin' is not an order this engine decodes in" in origin.describe()
    assert decoding_defaults(tmp_path / "absent").describe() == ""


def test_the_models_command_shows_them_and_keeps_its_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.commands.cli import main

    d = _dir(tmp_path, DREAM, "dream-7b")
    (d / "config.json").write_text(
        json.dumps({"model_type": "Dream", "hidden_size": 8, "num_hidden_layers": 1, "vocab_size": 10})
    )
    _dir(tmp_path, {"temperature": 0.7}, "qwen").joinpath("config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert main(["models", "--dir", str(tmp_path), "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["models"]}
    assert "steps 128" in rows["dream-7b"]["decoding"] and "strategy entropy_bound" in rows["dream-7b"]["decoding"]
    assert rows["qwen"]["decoding"] is None and rows["qwen"]["backend"] == "dream"
    assert main(["models", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["NAME", "SIZE", "BACKEND", "QUANT", "PARAMS", "KEYSTROKE", "COLD"]
    assert "    generation_config.json: steps 128" in out
