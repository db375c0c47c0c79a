"""Growing a trunk deeper (engine/training/grow.py): the same function, old moments kept,
the warm-up restarted, and no growth in a cool-down-only run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.models.embedded import DiffusionCoder, ModelConfig
from engine.models.tokenizer import train_tokenizer
from engine.training.grow import grow_model, grow_state, insertion_sources
from engine.training.loop import TrainConfig, load_state, save_state, train, warm_start_step
from engine.training.pipeline import run_training

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [
    p.read_text(encoding="utf-8") for p in sorted((ROOT / "fixtures").rglob("*.py")) if "typing" not in p.parts
]  # typing/: held out
BASE = {
    "context_tokens": 48,
    "canvas_tokens": 12,
    "batch_size": 2,
    "lr": 1e-3,
    "warmup": 2,
    "schedule": "wsd",
    "ar_loss_weight": 1.0,
    "model": {"d_model": 32, "n_layers": 3, "n_heads": 2, "d_ff": 64},
    "threads": 1,
}


def test_copies_are_spread_over_the_depth() -> None:
    assert insertion_sources(6, 9) == [0, 1, 1, 2, 3, 3, 4, 5, 5]
    assert insertion_sources(3, 5) == [0, 0, 1, 2, 2]
    assert insertion_sources(2, 7) == [0, 0, 0, 1, 1, 1, 1]
    assert insertion_sources(4, 4) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="shrink"):
        insertion_sources(4, 3)


def test_a_grown_model_computes_the_same_function() -> None:
    torch.manual_seed(0)
    model = DiffusionCoder(ModelConfig(vocab_size=300, d_model=32, n_layers=3, n_heads=2, d_ff=64)).eval()
    grown, _ = grow_model(model, 5)
    grown.eval()
    assert grown.cfg.n_layers == 5 and len(grown.layers) == 5
    ctx = torch.randint(0, 300, (2, 20))
    valid = torch.ones(2, 20, dtype=torch.bool)
    valid[0, :5] = False
    canvas = torch.randint(0, 300, (2, 8))
    mid = torch.randint(0, 300, (2, 7))
    select = torch.zeros(2, 35, dtype=torch.bool)
    select[:, 5:20] = True
    with torch.no_grad():
        a = model.forward_dual(ctx, valid, canvas, mid, torch.ones(2, 7, dtype=torch.bool), select)
        b = grown.forward_dual(ctx, valid, canvas, mid, torch.ones(2, 7, dtype=torch.bool), select)
    torch.testing.assert_close(b[0], a[0])
    assert a[1] is not None and b[1] is not None
    torch.testing.assert_close(b[1], a[1])
    # not a model that ignores its new blocks: each copy trains (its output projection gets a gradient)
    grown.train()
    logits = grown.forward_dual(ctx, valid, canvas).canvas
    logits.square().mean().backward()
    assert grown.layers[1].out.weight.grad is not None and grown.layers[1].out.weight.grad.abs().sum() > 0


def test_grown_state_keeps_old_moments_and_rewarms(tmp_path: Path) -> None:
    tok = train_tokenizer(TEXTS, 300)
    cfg3 = TrainConfig(**{**BASE, "steps": 4})  # type: ignore[arg-type]
    saved: list[int] = []
    train(cfg3, tok, TEXTS, [], on_checkpoint=lambda st: (save_state(tmp_path, st, tok, cfg3), saved.append(st.step)))
    cfg5 = TrainConfig(**{**BASE, "steps": 7, "model": {**BASE["model"], "n_layers": 5}})  # type: ignore[arg-type,dict-item]
    state, _ = load_state(tmp_path, cfg5)
    old = state
    grown = grow_state(state, cfg5)
    assert grown.model.cfg.n_layers == 5 and grown.step == old.step == 4 and warm_start_step(grown) == 4
    old_params = dict(old.model.named_parameters())
    for j, src in enumerate([0, 0, 1, 2, 2]):
        for name, param in grown.model.layers[j].named_parameters():
            if j in (1, 4):  # the copies start with fresh moments
                assert param not in grown.opt.state, (j, name)
            else:
                torch.testing.assert_close(
                    grown.opt.state[param]["exp_avg"], old.opt.state[old_params[f"layers.{src}.{name}"]]["exp_avg"]
                )
    assert grown.opt.state[grown.model.embed.weight]["step"] == 4
    # training goes on from the grown state, with the warm-up counted from the growth
    lrs: list[float] = []
    _, summary = train(
        cfg5, tok, TEXTS, [], state=grown, progress=lambda *_: lrs.append(grown.opt.param_groups[0]["lr"])
    )
    assert summary["steps"] == 7
    assert lrs[0] == pytest.approx(0.5e-3) and lrs[-1] == pytest.approx(1e-3)
    # a wider recipe is refused: width cannot grow without changing the function
    wide = TrainConfig(**{**BASE, "model": {**BASE["model"], "d_model": 64}})  # type: ignore[arg-type,dict-item]
    with pytest.raises(ValueError, match="d_model"):
        grow_state(old, wide)


def test_a_cool_down_only_run_refuses_to_grow(tmp_path: Path) -> None:
    tok = train_tokenizer(TEXTS, 300)
    cfg3 = TrainConfig(**{**BASE, "steps": 2})  # type: ignore[arg-type]
    state_dir = tmp_path / "state"
    train(cfg3, tok, TEXTS, [], on_checkpoint=lambda st: save_state(state_dir, st, tok, cfg3))
    recipe = tmp_path / "recipe.json"
    recipe.write_text(
        json.dumps({**BASE, "corpus": [str(ROOT / "fixtures" / "code")], "model": {**BASE["model"], "n_layers": 5}})
    )
    with pytest.raises(ValueError, match="cool-down-only"):
        run_training(recipe, tmp_path / "out", state_dir=state_dir, minutes=0, cooldown_minutes=0.01)


def test_a_length_head_joins_a_saved_trunk_from_zero(tmp_path: Path) -> None:
    """A recipe that asks for a length head adds one to a trunk saved without: the trunk's
    function and moments are unchanged, the head starts at zero, trains, and is saved."""
    tok = train_tokenizer(TEXTS, 300)
    cfg = TrainConfig(**{**BASE, "steps": 3})  # type: ignore[arg-type]
    train(cfg, tok, TEXTS, [], on_checkpoint=lambda st: save_state(tmp_path, st, tok, cfg))
    want = TrainConfig(
        **{
            **BASE,
            "steps": 6,
            "length_loss_weight": 1.0,
            "fit_canvas_share": 0.5,
            "model": {**BASE["model"], "length_classes": 12},
        }  # type: ignore[arg-type,dict-item]
    )
    state, _ = load_state(tmp_path, want)
    before = {k: v.clone() for k, v in state.model.state_dict().items()}
    moments = {n: state.opt.state[p]["exp_avg"].clone() for n, p in state.model.named_parameters()}
    headed = grow_state(state, want)
    head = headed.model.length_head
    assert head is not None and headed.model.cfg.length_classes == 12
    assert head.weight.abs().sum() == 0 and head.bias.abs().sum() == 0
    for name, param in headed.model.named_parameters():
        if not name.startswith("length_head"):
            torch.testing.assert_close(param.detach(), before[name])
            torch.testing.assert_close(headed.opt.state[param]["exp_avg"], moments[name])
    train(want, tok, TEXTS, [], state=headed, on_checkpoint=lambda st: save_state(tmp_path, st, tok, want))
    assert head.weight.abs().sum() > 0  # the length loss reaches it
    again, _ = load_state(tmp_path, want)
    assert again.model.cfg.length_classes == 12 and again.step == 6
    assert again.model.length_head is not None
    torch.testing.assert_close(again.model.length_head.weight, head.weight.detach())
