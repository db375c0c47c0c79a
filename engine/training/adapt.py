"""adapt: train a pretrained autoregressive Qwen2 or Llama checkpoint into a Dream-style
infiller: the same layers denoise a canvas in place under full attention, with logits
shifted by one, and still decode one token at a time.

The objective, per batch of editor-shaped tasks (engine.training.tasks: the same mix the
embedded model trains on), on one set of weights:
- the canvas loss: `start P [canvas] S eos` with full attention (engine/denoisers/dream.py's
  layout), the canvas the middle, end-of-fill and padding, absorbed by the mask token at a
  rate r ~ U(0, 1) per row; cross-entropy of each hidden position, read from the hidden
  state before it (the shift: the model keeps predicting the next position, as it did
  autoregressively); padding after the first pad weighs PAD_WEIGHT (the first pad says
  where the fill ends);
- the autoregressive loss, kept: `<fim_prefix> P <fim_suffix> S <fim_middle> M eof`
  causal, next-token cross-entropy on the middle and its end (the one-token mode and the
  verifier of verified decoding, engine/local/verify.py);
- optionally, attention-mask annealing (DiffuLLaMA): for the first `anneal_steps` steps
  the canvas pass sees each future position with a probability growing from 0 to 1,
  from the causal mask the model knows to full attention.
Full fine-tuning with AdamW (no LoRA: a 0.5-1.5B model and its optimizer state fit one
accelerator, and the canvas needs every layer to change its attention; LoRA is the way
for 7B models on small cards and is not written). The result is a checkpoint directory
of the source's model type whose config.json says, under "diffusion_lsp", that its
canvas is trained (`defaults.strategy`) and its one-token mode kept (`autoregressive`).
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from engine.denoisers.base import Prompt
from engine.denoisers.layouts import DreamLayout, Specials
from engine.denoisers.loading import LoadedModel, load_model
from engine.errors import InputError
from engine.models.directory import read_config
from engine.models.table import AUTOREGRESSIVE_MODEL_TYPES, DREAM_MODEL_TYPES
from engine.models.tokenizer import Tokenizer
from engine.training.tasks import cut_example

log = logging.getLogger(__name__)

PAD_WEIGHT = 0.1  # canvas loss weight of padding after the first pad
SUFFIX_SHARE = 0.3  # of the context budget for the suffix
IGNORE = -100


@dataclass(frozen=True)
class AdaptConfig:
    steps: int = 100
    minutes: float | None = None  # stop after this long (whichever comes first)
    lr: float = 2e-5
    warmup: int = 10
    batch_size: int = 4
    context_tokens: int = 256  # prefix + suffix
    canvas_tokens: int = 32
    max_middle_chars: int = 120
    ar_weight: float = 1.0
    anneal_steps: int = 0
    eval_batches: int = 2
    seed: int = 0
    device: str = "cpu"
    bf16: bool = False  # autocast on an accelerator


class Sides(NamedTuple):
    prefix: list[int]
    middle: list[int]
    suffix: list[int]


class AdaptBatch(NamedTuple):
    """Both passes of one batch (B rows), made on the CPU."""

    canvas_ids: torch.Tensor  # (B, T) pads, start, P, canvas, S, eos, pads
    canvas_keys: torch.Tensor  # (B, T) bool: real tokens (the others are never attended to)
    canvas_pos: torch.Tensor  # (B, T) position ids
    canvas_targets: torch.Tensor  # (B, T) the token each hidden state predicts (shifted), IGNORE elsewhere
    canvas_weights: torch.Tensor  # (B, T)
    causal_ids: torch.Tensor  # (B, U) left-padded <fim_prefix> P <fim_suffix> S <fim_middle> M eof
    causal_keys: torch.Tensor  # (B, U) bool
    causal_pos: torch.Tensor  # (B, U) position ids
    causal_targets: torch.Tensor  # (B, U) next tokens of the middle and its end, IGNORE elsewhere


def sides(tok: Tokenizer, text: str, rng: random.Random, cfg: AdaptConfig) -> Sides | None:
    """A task cut from `text`, tokenized within the budgets; None when its middle does not
    fit the canvas with its end."""
    prefix, middle, suffix = cut_example(text, rng, cfg.max_middle_chars)
    mid = tok.encode(middle)
    if len(mid) >= cfg.canvas_tokens:
        return None
    room = cfg.context_tokens
    suf = tok.encode(suffix[: 8 * room])[: int(room * SUFFIX_SHARE)]
    pre = tok.encode(prefix[-8 * room :])
    return Sides(pre[max(0, len(pre) - (room - len(suf))) :], mid, suf)


def collate(
    rows: Sequence[Sides], sp: Specials, canvas: int, mask_rate: Sequence[float], gen: random.Random
) -> AdaptBatch:
    """Both layouts of `rows`; canvas row i absorbs each position with probability mask_rate[i]."""
    seqs, targets, weights, causal, causal_t = [], [], [], [], []
    for row, rate in zip(rows, mask_rate, strict=True):
        target = [*row.middle, sp.eof] + [sp.pad] * (canvas - len(row.middle) - 1)
        hidden = [gen.random() < rate for _ in range(canvas)]
        if not any(hidden):
            hidden[gen.randrange(canvas)] = True
        noised = [sp.mask if h else t for t, h in zip(target, hidden, strict=True)]
        parts = DreamLayout(sp).parts(Prompt(prefix=tuple(row.prefix), suffix=tuple(row.suffix)))
        before = parts.before  # the inference layout, exactly (engine/denoisers/dream.py)
        seqs.append([*before, *noised, *parts.after])
        # hidden state at position p - 1 + j predicts canvas position j
        tgt = [IGNORE] * len(seqs[-1])
        wts = [0.0] * len(seqs[-1])
        first_pad = len(row.middle) + 1
        for j, (t, h) in enumerate(zip(target, hidden, strict=True)):
            if h:
                tgt[len(before) - 1 + j] = t
                wts[len(before) - 1 + j] = PAD_WEIGHT if j > first_pad else 1.0
        targets.append(tgt)
        weights.append(wts)
        stream = [*parts.causal, *row.middle, sp.eof]
        causal.append(stream)
        start = len(stream) - len(row.middle) - 2  # <fim_middle> predicts the first middle token
        causal_t.append([IGNORE] * start + stream[start + 1 :] + [IGNORE])
    c_ids, c_keys, c_pos = _left_pad(seqs, sp.pad)
    u_ids, u_keys, u_pos = _left_pad(causal, sp.pad)
    return AdaptBatch(
        c_ids,
        c_keys,
        c_pos,
        _left_pad(targets, IGNORE)[0],
        _left_pad(weights, 0.0, torch.float32)[0],
        u_ids,
        u_keys,
        u_pos,
        _left_pad(causal_t, IGNORE)[0],
    )


def _left_pad(rows: Sequence[Sequence[Any]], fill: Any, dtype: torch.dtype = torch.long) -> tuple[torch.Tensor, ...]:
    """(values, real, position ids): rows left-padded to the longest; positions count real tokens from 0."""
    t = max(len(r) for r in rows)
    values = torch.full((len(rows), t), fill, dtype=dtype)
    real = torch.zeros((len(rows), t), dtype=torch.bool)
    for i, r in enumerate(rows):
        values[i, t - len(r) :] = torch.tensor(list(r), dtype=dtype)
        real[i, t - len(r) :] = True
    positions = (real.long().cumsum(dim=1) - 1).clamp_min(0)
    return values, real, positions


def canvas_mask(keys: torch.Tensor, future: float, gen: torch.Generator | None, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, T, T) additive mask: real keys only; a query sees a later key with
    probability `future` (1: full attention; 0: causal)."""
    b, t = keys.shape
    visible = keys[:, None, None, :].expand(b, 1, t, t)
    if future < 1.0:
        causal = torch.ones((t, t), dtype=torch.bool).tril()
        later = torch.rand((b, 1, t, t), generator=gen) < future
        visible = visible & (causal | later)
        visible = visible | torch.eye(t, dtype=torch.bool)  # every query sees itself
    zero = torch.zeros((), dtype=dtype)
    return torch.where(visible, zero, torch.tensor(torch.finfo(dtype).min, dtype=dtype))


class Losses(NamedTuple):
    total: torch.Tensor
    canvas: float
    causal: float


def losses(model: Any, batch: AdaptBatch, cfg: AdaptConfig, future: float, gen: torch.Generator | None) -> Losses:
    """The canvas loss (full attention, shifted) plus ar_weight x the causal loss."""
    dev = model.device
    mask = canvas_mask(batch.canvas_keys, future, gen, model.dtype).to(dev)
    hidden = model.model(
        input_ids=batch.canvas_ids.to(dev),
        position_ids=batch.canvas_pos.to(dev),
        attention_mask={"full_attention": mask, "sliding_attention": mask},
    ).last_hidden_state
    at = (batch.canvas_targets != IGNORE).to(dev)
    logits = model.lm_head(hidden[at]).float()  # only the positions that predict a hidden canvas token
    w = batch.canvas_weights.to(dev)[at]
    ce = F.cross_entropy(logits, batch.canvas_targets.to(dev)[at], reduction="none")
    canvas = (ce * w).sum() / w.sum()
    out = model(
        input_ids=batch.causal_ids.to(dev),
        position_ids=batch.causal_pos.to(dev),
        attention_mask=batch.causal_keys.long().to(dev),
    )
    causal = F.cross_entropy(
        out.logits.float().flatten(0, 1), batch.causal_targets.to(dev).flatten(), ignore_index=IGNORE
    )
    return Losses(canvas + cfg.ar_weight * causal, float(canvas.detach()), float(causal.detach()))


def make_batches(
    tok: Tokenizer, sp: Specials, texts: Sequence[str], cfg: AdaptConfig, seed: int
) -> Callable[[], AdaptBatch]:
    rng = random.Random(seed)

    def draw() -> AdaptBatch:
        rows: list[Sides] = []
        while len(rows) < cfg.batch_size:
            got = sides(tok, rng.choice(texts), rng, cfg)
            if got is not None:
                rows.append(got)
        rates = [max(rng.random(), 1.0 / cfg.canvas_tokens) for _ in rows]
        return collate(rows, sp, cfg.canvas_tokens, rates, rng)

    return draw


def read_texts(dirs: Sequence[Path]) -> tuple[list[str], list[str]]:
    """(train, held-out) Python files: a corpus built by engine.training.corpus through its
    manifest, any other folder as its .py files (one in 20, by name, held out)."""
    from engine.training.loop import read_corpus

    train, held = read_corpus([str(d) for d in dirs], [])
    if not held:
        held, train = train[::20], [t for i, t in enumerate(train) if i % 20]
    if not train or not held:
        raise InputError(f"no Python files to adapt on in {', '.join(map(str, dirs))}")
    return train, held


def adapt(source: Path, out: Path, data: Sequence[Path], cfg: AdaptConfig) -> dict[str, Any]:
    """Train `source` (a qwen2/llama or Dream checkpoint directory) and write `out`; returns
    the summary (held-out losses before and after, steps, tokens, seconds)."""
    src_cfg = read_config(source)
    takes = AUTOREGRESSIVE_MODEL_TYPES + DREAM_MODEL_TYPES
    if src_cfg.get("model_type") not in takes:
        raise InputError(f"{source}: adapt takes model_type {', '.join(takes)}, not {src_cfg.get('model_type')!r}")
    loaded: LoadedModel = load_model(source, backend="dream", device=cfg.device)
    den: Any = loaded.denoiser
    model, sp = den.model, den.sp
    train_texts, held_texts = read_texts(data)
    torch.manual_seed(cfg.seed)
    draw = make_batches(loaded.tokenizer, sp, train_texts, cfg, cfg.seed)
    held_draw = make_batches(loaded.tokenizer, sp, held_texts, cfg, cfg.seed + 1)
    held = [held_draw() for _ in range(cfg.eval_batches)]
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.95))

    def evaluate() -> tuple[float, float]:
        model.eval()
        with torch.no_grad(), _autocast(cfg):
            got = [losses(model, b, cfg, 1.0, None) for b in held]
        return sum(g.canvas for g in got) / len(got), sum(g.causal for g in got) / len(got)

    before = evaluate()
    log.info("held-out before: canvas %.3f, next-token %.3f", *before)
    start = time.monotonic()
    curve: list[dict[str, float]] = []
    tokens = 0
    step = 0
    for step in range(1, cfg.steps + 1):
        if cfg.minutes is not None and time.monotonic() - start > cfg.minutes * 60:
            step -= 1
            break
        model.train()
        batch = draw()
        for group in opt.param_groups:
            group["lr"] = cfg.lr * min(1.0, step / max(1, cfg.warmup))
        future = min(1.0, step / cfg.anneal_steps) if cfg.anneal_steps > 0 else 1.0
        with _autocast(cfg):
            got = losses(model, batch, cfg, future, gen)
        opt.zero_grad(set_to_none=True)
        got.total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tokens += int(batch.canvas_keys.sum() + batch.causal_keys.sum())
        curve.append({"step": step, "canvas": round(got.canvas, 4), "next_token": round(got.causal, 4)})
        log.info(
            "step %d: canvas %.3f, next-token %.3f (%.0f s)", step, got.canvas, got.causal, time.monotonic() - start
        )
        if not math.isfinite(float(got.total.detach())):
            raise RuntimeError(f"the loss is not finite at step {step}")
    seconds = time.monotonic() - start
    after = evaluate()
    log.info("held-out after %d steps: canvas %.3f, next-token %.3f", step, *after)
    summary = {
        "source": str(source),
        "steps": step,
        "tokens": tokens,
        "seconds": round(seconds, 1),
        "held_out_before": {"canvas": round(before[0], 4), "next_token": round(before[1], 4)},
        "held_out_after": {"canvas": round(after[0], 4), "next_token": round(after[1], 4)},
        "train_curve": curve,
        "config": asdict(cfg),
    }
    _save(model, source, src_cfg, out, summary)
    return summary


def _autocast(cfg: AdaptConfig) -> Any:
    device = "cuda" if cfg.device.startswith("cuda") else "cpu"
    return torch.autocast(device, dtype=torch.bfloat16, enabled=cfg.bf16)


def _save(model: Any, source: Path, src_cfg: dict[str, Any], out: Path, summary: dict[str, Any]) -> None:
    """The adapted checkpoint: the source's config (its model type) with the diffusion_lsp
    section saying the canvas is trained, the weights, the tokenizer files."""
    from safetensors.torch import save_model

    out.mkdir(parents=True, exist_ok=True)
    save_model(model, str(out / "model.safetensors"), metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (source / name).is_file() and source.resolve() != out.resolve():
            shutil.copyfile(source / name, out / name)
    cfg = dict(src_cfg)
    own = dict(cfg.get("diffusion_lsp", {}))
    own["autoregressive"] = True
    own["defaults"] = {**own.get("defaults", {}), "strategy": "entropy_bound"}
    own["adapted"] = {
        k: summary[k] for k in ("source", "steps", "tokens", "seconds", "held_out_before", "held_out_after")
    }
    cfg["diffusion_lsp"] = own
    cfg["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
