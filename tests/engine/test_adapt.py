"""adapt at tiny size: the batch layouts, the attention masks, the objective against the
dream backend's own inference layout, and a run end to end through the CLI."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch.nn.functional as F  # noqa: E402

from engine.commands.cli import main  # noqa: E402
from engine.denoisers.base import Prompt  # noqa: E402
from engine.denoisers.loading import load_model  # noqa: E402
from engine.fill import FillOptions, InfillRequest  # noqa: E402
from engine.local.generator import local_engine  # noqa: E402
from engine.training.adapt import IGNORE, PAD_WEIGHT, AdaptConfig, Sides, canvas_mask, collate, losses  # noqa: E402
from tests import dream_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dream_checkpoint.write(tmp_path_factory.mktemp("adapt") / "tiny-qwen", "qwen2", mask=False)


@pytest.fixture(scope="module")
def loaded(source: Path) -> Any:
    return load_model(source)


def test_collate_lays_out_both_passes(loaded: Any) -> None:
    sp = loaded.denoiser.sp
    rows = [Sides([11, 12, 13], [21, 22], [31]), Sides([14], [23], [32])]
    b = collate(rows, sp, 5, [1.0, 1.0], random.Random(0))
    # row 0: start P canvas S eos, no padding (the longest row)
    assert b.canvas_ids[0].tolist() == [sp.start, 11, 12, 13, *[sp.mask] * 5, 31, sp.eof]
    assert b.canvas_keys[0].all() and b.canvas_pos[0].tolist() == list(range(11))
    # hidden state 3 (the last prefix token) predicts canvas position 0: the shift
    assert b.canvas_targets[0, 3:8].tolist() == [21, 22, sp.eof, sp.pad, sp.pad]
    assert b.canvas_weights[0, 3:8].tolist() == [1.0, 1.0, 1.0, 1.0, pytest.approx(PAD_WEIGHT)]
    assert (b.canvas_targets[0, 8:] == IGNORE).all() and b.canvas_targets[0, :3].eq(IGNORE).all()
    # row 1 is left-padded: pads are no keys, positions start at its first real token
    assert not b.canvas_keys[1, :2].any() and b.canvas_pos[1, 2].item() == 0 and b.canvas_ids[1, 2] == sp.start
    # the causal stream: <fim_middle> predicts the middle, its last token the end
    stream = b.causal_ids[0][b.causal_keys[0]].tolist()
    assert stream == [sp.fim_prefix, 11, 12, 13, sp.fim_suffix, 31, sp.fim_middle, 21, 22, sp.eof]
    targets = b.causal_targets[0][b.causal_keys[0]].tolist()
    assert targets == [IGNORE] * 6 + [21, 22, sp.eof, IGNORE]


def test_canvas_mask_anneals_from_causal_to_full() -> None:
    keys = torch.tensor([[False, True, True, True]])
    full = canvas_mask(keys, 1.0, None, torch.float32)[0, 0] == 0
    assert full.tolist() == [[False, True, True, True]] * 4
    causal = canvas_mask(keys, 0.0, torch.Generator().manual_seed(0), torch.float32)[0, 0] == 0
    assert causal[2].tolist() == [False, True, True, False] and causal[1].tolist() == [False, True, False, False]


def test_the_canvas_loss_is_the_backends_inference_layout(loaded: Any) -> None:
    """The loss adapt trains is the cross-entropy of what the dream backend's denoise
    computes for the same context and canvas: training and inference agree on the
    layout and the shift."""
    den, tok = loaded.denoiser, loaded.tokenizer
    sp = den.sp
    pre, mid, suf = tok.encode("def add(a, b):\n    return "), tok.encode("a + b"), tok.encode("\n\nprint(1)\n")
    b = collate([Sides(pre, mid, suf)], sp, 8, [1.0], random.Random(0))
    got = losses(den.model, b, AdaptConfig(ar_weight=0.0), 1.0, None)
    ctx = Prompt(prefix=tuple(pre), suffix=tuple(suf))
    logits = den.denoise(den.prefill(ctx), torch.full((1, 8), den.info.mask_id))[0]
    target = torch.tensor([*mid, sp.eof] + [sp.pad] * (8 - len(mid) - 1))
    weights = torch.tensor([1.0] * (len(mid) + 2) + [PAD_WEIGHT] * (8 - len(mid) - 2))
    want = (F.cross_entropy(logits, target, reduction="none") * weights).sum() / weights.sum()
    assert got.canvas == pytest.approx(float(want), rel=1e-4)


def test_adapt_end_to_end_lowers_the_held_out_loss(source: Path, tmp_path: Path, capsys: Any) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for f in [*(ROOT / "fixtures" / "code").glob("*.py"), *(ROOT / "fixtures" / "e2e").glob("*.py")]:
        shutil.copy(f, data / f.name)
    out = tmp_path / "adapted"
    argv = ["adapt", "--model", str(source), "--out", str(out), "--data", str(data), "--steps", "12"]
    argv += ["--lr", "3e-3", "--batch-size", "4", "--context-tokens", "64", "--canvas-tokens", "16", "--threads", "1"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 12 and summary["tokens"] > 0
    assert summary["held_out_after"]["canvas"] < summary["held_out_before"]["canvas"]
    assert summary["held_out_after"]["next_token"] < summary["held_out_before"]["next_token"]
    model = load_model(out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["diffusion_lsp"]["adapted"]["steps"] == 12 and cfg["model_type"] == "qwen2"
    assert model.denoiser.info.autoregressive and model.defaults["strategy"] == "entropy_bound"
    r = local_engine(model, FillOptions(canvas_tokens=6)).fill(InfillRequest(prefix="x = ", suffix="\n"))
    assert r.steps >= 1


def test_adapt_refuses_what_it_cannot_train(tmp_path: Path, capsys: Any) -> None:
    assert (
        main(
            [
                "adapt",
                "--model",
                str(ROOT / "engine" / "weights"),
                "--out",
                str(tmp_path / "o"),
                "--data",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "adapt takes model_type qwen2, llama, Dream, dream" in capsys.readouterr().err  # the table's types
    assert (
        main(["adapt", "--model", str(tmp_path), "--out", str(tmp_path / "o"), "--data", str(tmp_path / "none")]) == 2
    )
    assert "data folder not found" in capsys.readouterr().err
