"""train -> export-onnx -> eval through the CLI, at toy size: every command works end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.commands.cli import main
from engine.denoisers.loading import load_model

from ..conftest import FIXTURE_CODE

pytest.importorskip("torch")


def toy_recipe(**changes: Any) -> dict[str, Any]:
    """A recipe that trains a one-layer model on the fixture code in seconds."""
    return {
        "corpus": [str(FIXTURE_CODE)],
        "holdout": [],
        "vocab_size": 300,
        "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64, "max_positions": 512},
        "context_tokens": 64,
        "canvas_tokens": 16,
        "batch_size": 4,
        "steps": 3,
        "warmup": 1,
        "eval_every": 100,
        **changes,
    }


def test_train_export_eval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(toy_recipe()))
    out = tmp_path / "model"
    assert main(["train", "--recipe", str(recipe), "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 3 and np.isfinite(summary["train_loss"])
    for name in ("config.json", "tokenizer.json", "model.safetensors", "encode.onnx", "denoise.onnx", "MODEL_CARD.md"):
        assert (out / name).is_file(), name
    assert '"steps": 3' in (out / "MODEL_CARD.md").read_text()

    # export-onnx rewrites the graphs from the safetensors: same logits as before
    before = load_model(out)
    ids = before.tokenizer.encode("def f(x):\n    return x\n")
    canvas = np.arange(6).reshape(1, 6)
    want = before.denoiser.denoise(before.denoiser.prefill(ids), canvas)
    exported = tmp_path / "exported"
    assert main(["export-onnx", "--model", str(out), "--out", str(exported)]) == 0
    for name in ("encode.onnx", "denoise.onnx"):
        (out / name).write_bytes((exported / name).read_bytes())
    after = load_model(out)
    np.testing.assert_allclose(after.denoiser.denoise(after.denoiser.prefill(ids), canvas), want, atol=1e-5)
    capsys.readouterr()

    # train --resume continues from the directory's weights and tokenizer
    resumed = tmp_path / "resumed"
    assert main(["train", "--recipe", str(recipe), "--out", str(resumed), "--resume", str(out)]) == 0
    capsys.readouterr()
    assert (resumed / "tokenizer.json").read_text() == (out / "tokenizer.json").read_text()
    from safetensors.numpy import load_file

    a, b = load_file(str(out / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    # the same recipe from scratch reproduces `out` exactly (fixed seed, CPU); so weights
    # that differ were trained further from `out`'s
    assert a.keys() == b.keys() and any(not np.array_equal(a[k], b[k]) for k in a)

    assert main(["eval", "--model", str(out), "--data", str(FIXTURE_CODE), "--tasks", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    for kind in ("rest_of_line", "lines", "random_span"):
        assert report[kind]["tasks"] == 2 and 0.0 <= report[kind]["exact_match"] <= 1.0
    # eval honours the budgets: a 3-token canvas takes at most 3 steps (one lock at least each)
    args = ["eval", "--model", str(out), "--data", str(FIXTURE_CODE), "--tasks", "2", "--canvas-tokens", "3"]
    assert main([*args, "--context-tokens", "20", "--strategy", "left_to_right"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert all(report[kind]["steps_per_fill"] <= 3 for kind in ("rest_of_line", "lines", "random_span"))


def test_a_model_trained_with_the_next_token_loss_decodes_one_token_at_a_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pipeline writes the strategy the shipped model's eval chose: with the
    next-token loss, the autoregressive mode for every span; without it, the canvas."""
    defaults = {}
    for name, weight in (("canvas", 0.0), ("dual", 1.0)):
        recipe = tmp_path / f"{name}.json"
        recipe.write_text(json.dumps(toy_recipe(batch_size=2, steps=1, ar_loss_weight=weight)))
        assert main(["train", "--recipe", str(recipe), "--out", str(tmp_path / name)]) == 0
        defaults[name] = json.loads((tmp_path / name / "config.json").read_text())["defaults"]
    capsys.readouterr()
    assert defaults["canvas"]["strategy"] == "entropy_bound" and "multiline_strategy" not in defaults["canvas"]
    assert defaults["dual"]["strategy"] == "autoregressive" and "multiline_strategy" not in defaults["dual"]


def test_train_without_a_recipe_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--recipe", str(tmp_path / "nope.json"), "--out", str(tmp_path / "m")]) == 2
    assert "recipe not found" in capsys.readouterr().err


def test_eval_on_a_missing_directory_is_a_clear_error(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", "--model", str(tiny_model_dir), "--data", str(tmp_path / "none")]) == 2
    assert "eval data directory not found" in capsys.readouterr().err


def test_train_on_a_built_corpus_ships_its_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A corpus from engine.training.corpus trains through its manifest, and the model directory
    gets DATA_MANIFEST.jsonl (the corpus manifest, small enough here to copy whole)."""
    from engine.training.corpus import build

    from .test_corpus import MIT, code, fake_stdlib, make_wheel

    corpus = tmp_path / "corpus"
    make_wheel(corpus / ".cache" / "goodpkg", "goodpkg", "1.0", {"goodpkg/core.py": code("good")}, *MIT)
    build(corpus, ["goodpkg"], ["stdlib:email"], stdlib=True, stdlib_dir=fake_stdlib(tmp_path / "stdlib"))
    recipe = tmp_path / "recipe.json"
    recipe.write_text(
        json.dumps(
            {
                "corpus": [str(corpus)],
                "vocab_size": 300,
                "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32, "max_positions": 256},
                "context_tokens": 48,
                "canvas_tokens": 16,
                "batch_size": 2,
                "steps": 2,
                "warmup": 1,
            }
        )
    )
    out = tmp_path / "model"
    assert main(["train", "--recipe", str(recipe), "--out", str(out)]) == 0
    capsys.readouterr()
    shipped = (out / "DATA_MANIFEST.jsonl").read_text()
    assert shipped == (corpus / "manifest.jsonl").read_text()
    assert {json.loads(line)["package"] for line in shipped.splitlines()} >= {"goodpkg", "stdlib:email"}
    card = (out / "MODEL_CARD.md").read_text()
    assert "3 training files from 1 PyPI packages and 2 standard-library" in card
    assert "2 files held out by package (stdlib:email)" in card and "MIT; PSF-2.0" in card


def test_accelerator_settings_are_ignored_on_cpu() -> None:
    """bf16 and compile apply only on CUDA: a CPU recipe with them trains exactly as
    without them (same seed, same losses), and an unknown device is refused."""
    import torch

    from engine.models.tokenizer import train_tokenizer
    from engine.training.loop import TrainConfig, train

    texts = [p.read_text(encoding="utf-8") for p in sorted(FIXTURE_CODE.glob("*.py"))]
    tok = train_tokenizer(texts * 4, vocab_size=300)
    base: dict[str, Any] = {
        "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32, "max_positions": 256},
        "context_tokens": 48,
        "canvas_tokens": 16,
        "batch_size": 2,
        "steps": 3,
        "warmup": 1,
    }
    plain_model, plain = train(TrainConfig(**base), tok, texts, texts)
    fast_model, fast = train(TrainConfig(**base, device="cpu", bf16=True, compile=True), tok, texts, texts)
    assert fast["steps"] == 3 and np.isfinite(fast["train_loss"])
    assert (fast["train_loss"], fast["held_out_loss"]) == (plain["train_loss"], plain["held_out_loss"])
    plain_w, fast_w = plain_model.state_dict(), fast_model.state_dict()
    assert plain_w.keys() == fast_w.keys() and all(torch.equal(plain_w[k], fast_w[k]) for k in plain_w)
    assert next(fast_model.parameters()).device.type == "cpu"
    with pytest.raises(ValueError, match="device"):
        train(TrainConfig(**base, device="tpu"), tok, texts, [])
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            train(TrainConfig(**base, device="cuda"), tok, texts, [])
