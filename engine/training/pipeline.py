"""`diffusion-infill train`: corpus -> tokenizer -> model -> a complete model directory."""

from __future__ import annotations

import copy
import logging
import math
import shutil
import signal
import sys
import sysconfig
import time
from pathlib import Path

from engine.models.tokenizer import train_tokenizer
from engine.training.corpus import DATA_MANIFEST, MANIFEST, data_manifest, read_manifest
from engine.training.grow import grow_state
from engine.training.loop import (
    STATE_JSON,
    TrainConfig,
    TrainState,
    load_recipe,
    load_state,
    read_corpus,
    recipe_json,
    save_state,
    tokenizer_sample,
    train,
)
from engine.training.save import save_model_dir

log = logging.getLogger(__name__)

# Infill and sampling defaults written into the model's config.json: the context it was
# trained on; the entropy bound chosen with bench/sampler_sweep.py for the run-1 default
# model (100 held-out tasks per kind: bound 1.0 kept single-line syntax-valid-and-non-empty
# at 66% in 10.9 steps, where 16 fell to 41.5% in 3.2 steps;
# bench/results/2026-12-01-sampler-sweep-model-1.log). The drafter is off (it did not
# save steps for the first model).
DEFAULTS = {
    "canvas_tokens": 32,
    "context_tokens": 256,
    "max_steps": 32,
    "strategy": "entropy_bound",
    "entropy_bound": 1.0,
    "drafter": False,
}


# A model trained with the next-token loss decodes one token at a time by default (its
# autoregressive mode; a request or `multiline_strategy` may still ask for the canvas).
# Measured on the held-out eval, 200 tasks per kind, the same weights both ways:
# - run 4 (bench/results/2026-12-02-eval-model-run4-same-code.json): single lines exact
#   match 2.5% vs 1.8% on the canvas, valid and non-empty 72.0% vs 69.3%, edit similarity
#   0.293 vs 0.291; block bodies the other way, 59.5% vs 65.5%, similarity 0.241 vs 0.293.
# - run 5 (bench/results/2026-12-02-eval-model-run5.json): single lines 2.5% vs 1.3%, 75.5%
#   vs 67.5%, 0.312 vs 0.291; block bodies 79.0% vs 38.5%, similarity 0.283 vs 0.261;
#   function bodies 74.4% vs 24.4%, p50 52 ms vs 1,034 ms a fill.
AUTOREGRESSIVE_DEFAULTS = {"strategy": "autoregressive"}


def resolve_corpus(entries: list[str]) -> list[str]:
    """'stdlib' names this Python's standard library (PSF licence); others are paths."""
    return [sysconfig.get_paths()["stdlib"] if e == "stdlib" else e for e in entries]


def run_training(
    recipe: Path,
    out: Path | None,
    resume: Path | None = None,
    state_dir: Path | None = None,
    minutes: float | None = None,
    cooldown_minutes: float | None = None,
    threads: int | None = None,
) -> dict[str, float]:
    """Train from a recipe and write a model directory to `out`.

    With `state_dir` (wsd recipes) training adds up over runs: the TrainState there is
    continued (or started, tokenizer included, when the directory is empty), checkpointed
    every ``checkpoint_every_s`` and when the run ends or gets SIGTERM/SIGINT; then, if a
    cool-down is asked for, a copy of it is cooled down and written to `out`, leaving the
    trunk in `state_dir` for the next run. `minutes` / `cooldown_minutes` override the
    recipe's time_limit_s / cooldown_s; `out` None with a state writes no model."""
    cfg: TrainConfig = load_recipe(recipe)
    if minutes is not None:
        cfg.time_limit_s = minutes * 60
    if cooldown_minutes is not None:
        cfg.cooldown_s = cooldown_minutes * 60
    if threads is not None:
        cfg.threads = threads
    dirs = resolve_corpus(cfg.corpus)
    train_texts, held = read_corpus(dirs, cfg.holdout)
    log.info("corpus: %d training files, %d held out", len(train_texts), len(held))
    if not train_texts:
        raise ValueError(f"no training files found under {', '.join(dirs)}")
    model = None
    state: TrainState | None = None
    if state_dir is not None and (state_dir / STATE_JSON).is_file():
        state, tok = load_state(state_dir, cfg)
        log.info("continuing %s at step %d (%d tokens)", state_dir, state.step, state.tokens)
        have = state.model.cfg
        if (
            cfg.model.get("n_layers", have.n_layers) != have.n_layers
            or cfg.model.get("length_classes", have.length_classes) != have.length_classes
        ):
            if cfg.time_limit_s <= 0:  # a cool-down of an untrained grown model would ship its copies silent
                raise ValueError("the recipe grows the trunk: a cool-down-only run cannot grow it (train it first)")
            state = grow_state(state, cfg)
    elif resume is not None:  # continue from a model directory: its weights and tokenizer
        from engine.denoisers.loading import load_model

        loaded = load_model(resume, backend="torch")
        model = loaded.denoiser.model  # type: ignore[attr-defined]
        tok = loaded.tokenizer
    else:
        tok = train_tokenizer(tokenizer_sample(train_texts, cfg.tokenizer_sample_mb, cfg.seed), cfg.vocab_size)
    t0 = time.monotonic()

    def progress(step: int, loss: float, held_loss: float | None) -> None:
        if step % 20 == 0:
            extra = f" held-out {held_loss:.3f}" if held_loss is not None else ""
            sys.stderr.write(f"step {step}/{cfg.steps} loss {loss:.3f}{extra} {time.monotonic() - t0:.0f}s\n")
            sys.stderr.flush()

    stop = {"now": False}
    if state_dir is not None:

        def on_signal(signum: int, frame: object) -> None:
            stop["now"] = True

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)

    def checkpoint(st: TrainState) -> None:
        assert state_dir is not None
        save_state(state_dir, st, tok, cfg)
        log.info("checkpoint: step %d, %d tokens", st.step, st.tokens)

    summary: dict[str, float] = {}
    if state_dir is None or cfg.time_limit_s > 0 or cfg.schedule != "wsd":
        trained, summary = train(
            cfg,
            tok,
            train_texts,
            held,
            resume=model,
            progress=progress,
            state=state,
            on_checkpoint=checkpoint if state_dir is not None else None,
            should_stop=lambda: stop["now"],
        )
        if state is None and state_dir is not None:
            state, tok = load_state(state_dir, cfg)
        model = trained
    elif state is None:
        raise ValueError(f"{state_dir} holds no training state to cool down")
    if state_dir is not None and cfg.schedule == "wsd":
        assert state is not None
        if out is None or stop["now"]:
            return summary
        if cfg.cooldown_s > 0:
            trunk = copy.deepcopy(state)  # the cool-down never touches the trunk
            model, summary = train(
                cfg,
                tok,
                train_texts,
                held,
                state=trunk,
                phase="cooldown",
                progress=progress,
                should_stop=lambda: stop["now"],
            )
            summary["trunk_step"] = state.step
            if stop["now"]:
                log.warning("stopped during the cool-down: no model written to %s (the trunk is saved)", out)
                return summary
        else:
            log.warning("no cool-down asked for: %s gets the trunk's weights as they are", out)
            model = state.model
            if not summary:  # nothing trained in this run: the trunk's own figures
                last = state.curve[-1] if state.curve else {}
                summary = {
                    "steps": state.step,
                    "run_steps": 0,
                    "train_loss": last.get("train_loss", math.nan),
                    "held_out_loss": last.get("canvas", math.nan),
                    "held_out_ar_loss": last.get("ar", math.nan),
                    "seconds": state.seconds,
                    "tokens_seen": state.tokens,
                }
    elif cfg.schedule == "wsd" and out is not None:
        log.warning("a wsd recipe without --state: the weights are not cooled down (use --state)")
    if out is None:
        return summary
    assert model is not None
    model = model.cpu().eval()  # export and safetensors expect CPU weights
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
    # written next to `out` and renamed into place: a run killed meanwhile leaves no half model
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    defaults = {**DEFAULTS, "max_canvas_tokens": max(cfg.canvas_tokens, cfg.long_canvas_tokens)}
    if cfg.ar_loss_weight > 0:
        defaults.update(AUTOREGRESSIVE_DEFAULTS)
    save_model_dir(
        tmp,
        model,
        tok,
        "absorbing",
        defaults,
        card,
        autoregressive=cfg.ar_loss_weight > 0,
        languages=["python"],  # the corpus is .py files only (engine.training.corpus)
    )
    if corpora:  # what the weights were trained on ships with them, next to the card
        (tmp / DATA_MANIFEST).write_text(data_manifest(corpora), encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
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
        "  vendored code excluded, exact and near duplicates removed (python -m engine.training.corpus);\n"
        f"  {held} files held out by package ({', '.join(held_pkgs) or 'none'}) and never trained on.\n"
        f"  {DATA_MANIFEST} lists every package with its version and licence."
    )


MODEL_CARD = """# diffusion-lsp default model

A small infill model of the embedded architecture (engine/models/embedded.py): one transformer
whose causal context encoder and bidirectional canvas denoiser share every weight,
trained on CPU with the dual objective (every computed token supervised): a next-token
loss on the context stream in suffix-prefix-middle order and on the middle after the
middle marker, and a masked-diffusion loss on the absorbing canvas, which never sees the
middle. So the same weights fill a canvas many tokens per step (diffusion) and also
decode one token at a time (the autoregressive mode, strategy "autoregressive").

- Parameters: {params:,} (tied embeddings). model.safetensors holds the weights once;
  encode.onnx and denoise.onnx read them from it (ONNX external data).
- Data: {data}
- Training: {steps} steps, {tokens_seen:,} tokens through the model (context + canvas +
  middle), last run {seconds} s on a 2-core CPU. Final training loss {train_loss};
  held-out canvas loss {held_out_loss}, held-out next-token loss {held_out_ar_loss} (nats).
- Recipe ({recipe_file}):

```json
{recipe}
```
"""
