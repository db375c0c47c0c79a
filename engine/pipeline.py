"""`diffusion-infill train`: corpus -> tokenizer -> model -> a complete model directory."""

from __future__ import annotations

import logging
import sys
import sysconfig
import time
from pathlib import Path

from engine.modeldir import save_model_dir
from engine.tokenizer import train_tokenizer
from engine.training import TrainConfig, load_recipe, read_corpus, recipe_json, train

log = logging.getLogger(__name__)

# Infill and sampling defaults written into the model's config.json, chosen with
# bench/sampler_sweep.py for the first model (docs/engine.md): the context it was trained
# on, and the entropy bound that gave the fewest steps at the best exact match. The
# prompt-lookup drafter did not save steps for it, so it is off.
DEFAULTS = {
    "canvas_tokens": 32,
    "context_tokens": 256,
    "max_steps": 32,
    "strategy": "entropy_bound",
    "entropy_bound": 16.0,
    "drafter": False,
}


def resolve_corpus(entries: list[str]) -> list[str]:
    """'stdlib' names this Python's standard library (PSF licence); others are paths."""
    return [sysconfig.get_paths()["stdlib"] if e == "stdlib" else e for e in entries]


def run_training(recipe: Path, out: Path, resume: Path | None = None) -> dict[str, float]:
    cfg: TrainConfig = load_recipe(recipe)
    dirs = resolve_corpus(cfg.corpus)
    train_texts, held = read_corpus(dirs, cfg.holdout)
    log.info("corpus: %d training files, %d held out", len(train_texts), len(held))
    if not train_texts:
        raise ValueError(f"no training files found under {', '.join(dirs)}")
    model = None
    if resume is not None:  # continue from a model directory: its weights and tokenizer
        from engine.modeldir import load_model

        loaded = load_model(resume, backend="torch")
        model = loaded.denoiser.model  # type: ignore[attr-defined]
        tok = loaded.tokenizer
    else:
        tok = train_tokenizer(train_texts, cfg.vocab_size)
    t0 = time.monotonic()

    def progress(step: int, loss: float, held_loss: float | None) -> None:
        if step % 20 == 0 or step == cfg.steps:
            extra = f" held-out {held_loss:.3f}" if held_loss is not None else ""
            sys.stderr.write(f"\rstep {step}/{cfg.steps} loss {loss:.3f}{extra} {time.monotonic() - t0:.0f}s")
            sys.stderr.flush()

    model, summary = train(cfg, tok, train_texts, held, resume=model, progress=progress)
    sys.stderr.write("\n")
    n_params = sum(p.numel() for p in model.parameters())
    card = MODEL_CARD.format(
        params=n_params,
        files=len(train_texts),
        held=len(held),
        holdout=", ".join(cfg.holdout) or "none",
        recipe=recipe_json(cfg),
        **{k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in summary.items()},
    )
    save_model_dir(out, model, tok, "absorbing", DEFAULTS, card)
    return summary


MODEL_CARD = """# diffusion-lsp first model (placeholder quality)

A small masked-diffusion (absorbing canvas) infill model of the embedded architecture,
trained briefly on CPU so that every command works end to end. It is not a good code
model: the default-model issue trains the real one.

- Parameters: {params:,} (tied embeddings), fp32 weights; ONNX graphs encode.onnx and
  denoise.onnx hold the same weights.
- Data: the Python standard library of CPython 3.11 (PSF licence), test directories
  excluded, exact duplicates removed; {files} training files; {held} files held out by
  package ({holdout}) and never trained on.
- Training: {steps} steps, {tokens_seen:,} tokens seen (context + canvas), {seconds} s on a
  2-core CPU. Final training loss {train_loss}, held-out loss {held_out_loss}
  (cross-entropy on the corrupted canvas, nats).
- Recipe (recipes/first-model.json):

```json
{recipe}
```
"""
