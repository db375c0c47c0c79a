"""`diffusion-infill train`: corpus -> tokenizer -> model -> a complete model directory."""

from __future__ import annotations

import logging
import sys
import sysconfig
import time
from pathlib import Path

from engine.corpus import DATA_MANIFEST, MANIFEST, data_manifest, read_manifest
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
    corpora = [Path(d) for d in dirs if (Path(d) / MANIFEST).is_file()]
    card = MODEL_CARD.format(
        params=n_params,
        data=describe_data(corpora, len(train_texts), len(held), cfg.holdout),
        recipe=recipe_json(cfg),
        recipe_file=recipe.as_posix(),
        **{k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in summary.items()},
    )
    save_model_dir(out, model, tok, "absorbing", DEFAULTS, card)
    if corpora:  # what the weights were trained on ships with them, next to the card
        (out / DATA_MANIFEST).write_text(data_manifest(corpora), encoding="utf-8")
    return summary


def describe_data(corpora: list[Path], files: int, held: int, holdout: list[str]) -> str:
    """The model card's data line: from the corpus manifests when there are any (the
    licences actually present), else the standard-library description of the first model."""
    if not corpora:
        return (
            "the Python standard library of CPython 3.11 (PSF licence), test directories\n"
            f"  excluded, exact duplicates removed; {files} training files; {held} files held out by\n"
            f"  package ({', '.join(holdout) or 'none'}) and never trained on."
        )
    entries = [e for c in corpora for e in read_manifest(c)]
    train_pkgs = sorted({e["package"] for e in entries if e["split"] == "train"})
    held_pkgs = sorted({e["package"] for e in entries if e["split"] == "heldout"} | set(holdout))
    licences = sorted({e["license"] for e in entries})
    n_stdlib = sum(p.startswith("stdlib:") for p in train_pkgs)
    return (
        f"{files} training files from {len(train_pkgs) - n_stdlib} PyPI packages and {n_stdlib} standard-library\n"
        "  modules, permissively licensed only (" + "; ".join(licences) + "), test suites and\n"
        "  vendored code excluded, exact and near duplicates removed (python -m engine.corpus);\n"
        f"  {held} files held out by package ({', '.join(held_pkgs) or 'none'}) and never trained on.\n"
        f"  {DATA_MANIFEST} lists every package with its version and licence."
    )


MODEL_CARD = """# diffusion-lsp first model (placeholder quality)

A small masked-diffusion (absorbing canvas) infill model of the embedded architecture,
trained briefly on CPU so that every command works end to end. It is not a good code
model: the default-model issue trains the real one.

- Parameters: {params:,} (tied embeddings), fp32 weights; ONNX graphs encode.onnx and
  denoise.onnx hold the same weights.
- Data: {data}
- Training: {steps} steps, {tokens_seen:,} tokens seen (context + canvas), {seconds} s on a
  2-core CPU. Final training loss {train_loss}, held-out loss {held_out_loss}
  (cross-entropy on the corrupted canvas, nats).
- Recipe ({recipe_file}):

```json
{recipe}
```
"""
