"""Training the embedded model: corpus, infill examples, corruption, the loop (torch).

Minimal by design (the default-model issue builds the full pipeline): a corpus of
permissively licensed Python files, infill examples cut as random character spans, whole
lines, and rest-of-line spans, context in suffix-prefix-middle order, the canvas
corrupted at a random rate (absorbing: masks, plus a few random replacements so the
model learns to judge visible tokens, which the drafter relies on), loss on the canvas.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from engine.models.embedded import DiffusionCoder, DualOutput, ModelConfig
from engine.models.tokenizer import Tokenizer
from engine.training.corpus import MANIFEST, read_manifest
from engine.training.tasks import LONG_KINDS, MIX, TaskKind, cut_example

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 200_000  # skip generated or data-like files


@dataclass
class TrainConfig:
    corpus: list[str] = field(default_factory=list)  # directories of .py files
    holdout: list[str] = field(default_factory=list)  # path parts held out for evaluation
    vocab_size: int = 4096
    tokenizer_sample_mb: float = 0.0  # the BPE is trained on this much of the corpus (files drawn by seed); 0: all
    model: dict[str, int | float] = field(default_factory=dict)
    context_tokens: int = 256  # context length in training (left-padded)
    canvas_tokens: int = 32  # canvas of the one-line kinds
    max_middle_chars: int = 160
    long_canvas_tokens: int = 0  # canvas of LONG_KINDS (block bodies...); 0: one canvas for all
    long_max_middle_chars: int = 160
    batch_size: int = 32
    steps: int = 2000
    lr: float = 2e-3
    warmup: int = 100
    # "cosine": warm-up then cosine decay over steps / time_limit_s (one-shot runs).
    # "wsd": warm-up, then constant (the trunk, resumable over many runs: TrainState),
    # and a cool-down (lr x (1 - sqrt(progress))) over cooldown_s for each snapshot shipped.
    schedule: str = "cosine"
    cooldown_s: float = 0.0
    weight_decay: float = 0.01
    replace_rate: float = 0.1  # of visible canvas tokens, replaced by random ones
    visible_loss_weight: float = 0.1
    pad_loss_weight: float = 1.0  # padding after the first pad (canvas_weights)
    ar_loss_weight: float = 0.0  # next-token loss on the context stream and the middle; 0: canvas only
    # The length head (model.length_classes > 0): cross-entropy of the middle's token count
    # at the middle marker, times this weight.
    length_loss_weight: float = 0.0
    # Share of rows whose canvas is cut to the middle's length + 1 (its end-of-fill) + a
    # slack drawn from 0..fit_canvas_slack, as the engine sizes it from the length head;
    # the other rows keep the budget-sized canvas. Held-out losses always use the latter.
    fit_canvas_share: float = 0.0
    fit_canvas_slack: int = 8
    eval_every: int = 200
    eval_batches: int = 4
    checkpoint_every_s: float = 300.0  # TrainState written this often (wsd runs with a state dir)
    seed: int = 0
    time_limit_s: float = 0.0  # 0: no limit; else stop (and save) after this long
    threads: int = 0  # torch intra-op threads; 0: torch's default
    # Accelerator settings; the defaults train exactly as before. bf16 (autocast) and
    # compile (torch.compile of the training forward, fused AdamW) apply only on CUDA:
    # on CPU they are ignored, so one recipe serves both machines.
    device: str = "cpu"  # cpu | cuda | cuda:N
    bf16: bool = False
    compile: bool = False


def read_corpus(dirs: Sequence[str], holdout: Sequence[str]) -> tuple[list[str], list[str]]:
    """(train, held-out) texts from corpus directories, exact duplicates removed.

    A directory built by ``python -m engine.training.corpus`` (it has a manifest.jsonl) is read
    through its manifest: its train split trains, its heldout split is held out, and a
    package named in ``holdout`` is held out too (a recipe can hold out more, never less).
    Any other directory is read as plain .py files (UTF-8, under MAX_FILE_BYTES, test
    directories skipped), held out when a path part is in ``holdout``."""
    seen: set[str] = set()
    train: list[str] = []
    held: list[str] = []

    def add(raw: bytes, is_held: bool) -> None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return
        if not text.strip() or len(raw) > MAX_FILE_BYTES:
            return
        digest = hashlib.sha256(raw).hexdigest()
        if digest in seen:
            return
        seen.add(digest)
        (held if is_held else train).append(text)

    for d in dirs:
        if (Path(d) / MANIFEST).is_file():
            for entry in read_manifest(Path(d)):
                try:
                    raw = (Path(d) / entry["path"]).read_bytes()
                except OSError:
                    log.warning("%s: listed in the manifest but not readable", entry["path"])
                    continue
                add(raw, entry["split"] == "heldout" or entry["package"] in holdout)
            continue
        for path in sorted(Path(d).rglob("*.py")):
            parts = set(path.parts)
            if parts & {"test", "tests", "idle_test", "site-packages"}:
                continue
            try:
                raw = path.read_bytes()
            except OSError:
                continue
            add(raw, bool(parts & set(holdout)))
    return train, held


def tokenizer_sample(texts: Sequence[str], mb: float, seed: int) -> list[str]:
    """Files drawn at random (by `seed`) until `mb` megabytes: what the BPE is trained on."""
    if mb <= 0:
        return list(texts)
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    out: list[str] = []
    total = 0
    for i in order:
        if total >= mb * 1_000_000:
            break
        out.append(texts[i])
        total += len(texts[i])
    return out


def spm_context(tok: Tokenizer, prefix_ids: list[int], suffix_ids: list[int]) -> list[int]:
    sp = tok.special
    return [sp.suffix, *suffix_ids, sp.prefix, *prefix_ids, sp.middle]


class Example(NamedTuple):
    context: list[int]  # <suf> suffix <pre> prefix <mid>
    middle: list[int]  # the middle's tokens (no end-of-fill)


def make_example(
    tok: Tokenizer,
    text: str,
    rng: random.Random,
    ctx_len: int,
    canvas_len: int,
    kinds: Sequence[tuple[TaskKind, float]] | None = None,
    max_middle_chars: int = 160,
) -> Example | None:
    """An example cut from `text` (kind drawn from `kinds`, default the whole MIX), or
    None when the middle does not fit the canvas with its end-of-fill."""
    prefix, middle, suffix = cut_example(text, rng, max_middle_chars, mix=kinds)
    mid = tok.encode(middle)
    if len(mid) >= canvas_len:
        return None
    budget = ctx_len - 3
    # split the budget between the sides at random; nearest code kept
    suf_share = rng.uniform(0.1, 0.6)
    suf = tok.encode(suffix[: 8 * budget])[: int(budget * suf_share)]
    pre = tok.encode(prefix[-8 * budget :])
    pre = pre[len(pre) - (budget - len(suf)) :] if len(pre) > budget - len(suf) else pre
    return Example(spm_context(tok, pre, suf), mid)


class Batch(NamedTuple):
    """One training batch; every tensor is made on the CPU.

    The sequence the model sees is [context (P) ; canvas (C) ; middle (C - 1)]
    (DiffusionCoder.forward_dual). ``ar_targets`` holds, for every position of that
    sequence, the next token of the causal stream (context, then the middle, then
    end-of-fill) or -100 where there is none (padding, the canvas)."""

    ctx: torch.Tensor  # (B, P) left-padded context ids
    valid: torch.Tensor  # (B, P) bool
    target: torch.Tensor  # (B, C) the canvas target: middle, end-of-fill, padding
    mid: torch.Tensor  # (B, C-1) the middle, right-padded
    mid_valid: torch.Tensor  # (B, C-1) bool
    ar_targets: torch.Tensor  # (B, P + C + C-1) next-token targets, -100 = none
    canvas_valid: torch.Tensor  # (B, C) bool: each row's canvas (a canvas sized to its fill is shorter)


def collate(
    tok: Tokenizer, examples: Sequence[Example], ctx_len: int, canvas_len: int, canvas_lens: Sequence[int] | None = None
) -> Batch:
    """A batch of `examples`; ``canvas_lens`` gives each row's canvas length (<= canvas_len,
    at least its middle and end-of-fill), default the whole canvas."""
    sp = tok.special
    b, p, c, m = len(examples), ctx_len, canvas_len, canvas_len - 1
    canvas_valid = torch.ones((b, c), dtype=torch.bool)
    if canvas_lens is not None:
        canvas_valid = torch.arange(c)[None, :] < torch.tensor(canvas_lens)[:, None]
    ctx = torch.full((b, p), sp.pad, dtype=torch.long)
    valid = torch.zeros((b, p), dtype=torch.bool)
    target = torch.full((b, c), sp.pad, dtype=torch.long)
    mid = torch.full((b, m), sp.pad, dtype=torch.long)
    mid_valid = torch.zeros((b, m), dtype=torch.bool)
    ar = torch.full((b, p + c + m), -100, dtype=torch.long)
    for i, ex in enumerate(examples):
        n, k = len(ex.context), len(ex.middle)
        ctx[i, p - n :] = torch.tensor(ex.context)
        valid[i, p - n :] = True
        target[i, : k + 1] = torch.tensor([*ex.middle, sp.eof])
        if k:
            mid[i, :k] = torch.tensor(ex.middle)
            mid_valid[i, :k] = True
        stream = [*ex.context, *ex.middle, sp.eof]  # the causal stream, then its targets
        ar[i, p - n : p] = torch.tensor(stream[1 : n + 1])  # context token t -> token t + 1
        if k:
            ar[i, p + c : p + c + k] = torch.tensor(stream[n + 1 :])  # middle j -> middle j + 1 / eof
    return Batch(ctx, valid, target, mid, mid_valid, ar, canvas_valid)


def canvas_groups(cfg: TrainConfig) -> list[tuple[int, int, list[tuple[TaskKind, float]], float]]:
    """(canvas length, max middle chars, kinds, share) per batch group: a batch holds one
    group, so short fills do not pay for the long canvas that block bodies need."""
    if cfg.long_canvas_tokens <= 0:  # one canvas for every kind
        return [(cfg.canvas_tokens, cfg.max_middle_chars, list(MIX), 1.0)]
    groups = []
    for canvas, max_chars, kinds in (
        (cfg.canvas_tokens, cfg.max_middle_chars, [(k, w) for k, w in MIX if k not in LONG_KINDS]),
        (cfg.long_canvas_tokens, cfg.long_max_middle_chars, [(k, w) for k, w in MIX if k in LONG_KINDS]),
    ):
        share = sum(w for _, w in kinds)
        if share > 0:
            groups.append((canvas, max_chars, kinds, share))
    return groups


def make_batch(tok: Tokenizer, draw_text: Callable[[], str], cfg: TrainConfig, rng: random.Random) -> Batch:
    """A batch of one canvas group drawn by its share; files drawn by `draw_text`."""
    groups = canvas_groups(cfg)
    canvas, max_chars, kinds, _ = rng.choices(groups, weights=[g[3] for g in groups])[0]
    examples: list[Example] = []
    while len(examples) < cfg.batch_size:
        ex = make_example(tok, draw_text(), rng, cfg.context_tokens, canvas, kinds, max_chars)
        if ex is not None:
            examples.append(ex)
    lens = [
        min(canvas, len(ex.middle) + 1 + rng.randint(0, cfg.fit_canvas_slack))
        if rng.random() < cfg.fit_canvas_share
        else canvas
        for ex in examples
    ]
    return collate(tok, examples, cfg.context_tokens, canvas, lens)


def text_sampler(texts: Sequence[str], rng: random.Random) -> Callable[[], str]:
    """Files drawn with probability proportional to their length."""
    cum = list(itertools.accumulate(len(t) for t in texts))
    total = cum[-1]
    return lambda: texts[min(bisect.bisect(cum, rng.random() * total), len(texts) - 1)]


def batches(tok: Tokenizer, texts: list[str], cfg: TrainConfig, rng: random.Random) -> Iterator[Batch]:
    draw = text_sampler(texts, rng)
    while True:
        yield make_batch(tok, draw, cfg, rng)


def corrupt(
    target: torch.Tensor, mask_id: int, vocab: int, replace_rate: float, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbing corruption at a per-row rate r ~ U(0, 1): returns (canvas, hidden) where
    hidden marks positions whose token the model cannot see (masked or replaced)."""
    b, c = target.shape
    rate = torch.rand(b, 1, generator=gen).clamp_min(1.0 / c)
    masked = torch.rand(b, c, generator=gen) < rate
    replaced = (torch.rand(b, c, generator=gen) < replace_rate) & ~masked
    canvas = target.clone()
    canvas[masked] = mask_id
    canvas[replaced] = torch.randint(0, vocab, (int(replaced.sum()),), generator=gen)
    return canvas, masked | replaced


def canvas_weights(target: torch.Tensor, hidden: torch.Tensor, cfg: TrainConfig, pad_id: int) -> torch.Tensor:
    """Per-position weights of the canvas loss: hidden tokens 1, visible ones
    visible_loss_weight; padding after the first pad (the one that says the fill has
    ended, which the sampler's end rule reads) only pad_loss_weight, so the loss is
    spent on the fill and its length, not on the padding that fills the canvas."""
    w = torch.where(hidden, 1.0, cfg.visible_loss_weight)
    is_pad = target == pad_id
    first_pad = is_pad & (is_pad.cumsum(dim=1) == 1)
    return torch.where(is_pad & ~first_pad, w * cfg.pad_loss_weight, w)


class Losses(NamedTuple):
    canvas: torch.Tensor
    ar: torch.Tensor | None  # None: the recipe trains no next-token loss
    length: torch.Tensor | None  # None: the model has no length head


def loss_terms(
    model: DiffusionCoder,
    batch: Batch,
    tok: Tokenizer,
    cfg: TrainConfig,
    gen: torch.Generator,
    forward: Callable[..., DualOutput] | None = None,
) -> Losses:
    """The canvas, next-token and length losses of one batch. Batches and corruption are
    made on the CPU (one generator, so a seed means the same data on every device) and
    moved to the model's device here; ``forward`` is model.forward_dual or a compiled
    version of it."""
    mask_id = tok.special.mask
    assert mask_id is not None
    canvas, hidden = corrupt(batch.target, mask_id, model.cfg.vocab_size, cfg.replace_rate, gen)
    device = next(model.parameters()).device
    b = Batch(*(t.to(device, non_blocking=True) for t in batch))
    canvas, hidden = canvas.to(device), hidden.to(device)
    dual = cfg.ar_loss_weight > 0
    select = b.ar_targets != -100 if dual else None
    use_bf16 = cfg.bf16 and device.type == "cuda"
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_bf16):
        if dual:
            out = (forward or model.forward_dual)(b.ctx, b.valid, canvas, b.mid, b.mid_valid, select, b.canvas_valid)
        else:
            out = (forward or model.forward_dual)(b.ctx, b.valid, canvas, canvas_valid=b.canvas_valid)
    ce = F.cross_entropy(out.canvas.float().flatten(0, 1), b.target.flatten(), reduction="none").view_as(b.target)
    w = canvas_weights(b.target, hidden, cfg, tok.special.pad) * b.canvas_valid
    canvas_loss = (ce * w).sum() / w.sum()
    length_loss = None
    if out.length is not None:
        n_mid = b.mid_valid.sum(dim=1).clamp_max(out.length.shape[1] - 1)  # (B,) the middle's token count
        length_loss = F.cross_entropy(out.length.float(), n_mid)
    ar_loss = None
    if out.ar is not None and select is not None:
        ar_loss = F.cross_entropy(out.ar.float(), b.ar_targets[select])
    return Losses(canvas_loss, ar_loss, length_loss)


def loss_fn(
    model: DiffusionCoder,
    batch: Batch,
    tok: Tokenizer,
    cfg: TrainConfig,
    gen: torch.Generator,
    forward: Callable[..., DualOutput] | None = None,
) -> torch.Tensor:
    """The training loss: canvas loss + ar_loss_weight x next-token loss + length_loss_weight
    x length loss."""
    terms = loss_terms(model, batch, tok, cfg, gen, forward)
    loss = terms.canvas
    if terms.ar is not None:
        loss = loss + cfg.ar_loss_weight * terms.ar
    if terms.length is not None and cfg.length_loss_weight > 0:
        loss = loss + cfg.length_loss_weight * terms.length
    return loss


@dataclass
class TrainState:
    """Everything a run needs to continue another: the weights, the optimizer's moments,
    and the counters (training that adds up over several runs, on fresh machines)."""

    model: DiffusionCoder
    opt: torch.optim.AdamW
    step: int = 0
    tokens: int = 0
    seconds: float = 0.0
    curve: list[dict[str, float]] = field(default_factory=list)  # one point per held-out eval
    runs: list[dict[str, Any]] = field(default_factory=list)  # one entry per run that added to it


def warm_start_step(state: TrainState) -> int:
    """The step the learning-rate warm-up counts from: the last growth of the model
    (engine/training/grow.py), whose new blocks start with fresh moments; else 0."""
    return max((int(r.get("grown_at", 0)) for r in state.runs), default=0)


def new_optimizer(model: DiffusionCoder, cfg: TrainConfig, on_cuda: bool) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        model.parameters(),
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        betas=(0.9, 0.95),
        **({"fused": True} if on_cuda else {}),
    )


def lr_at(cfg: TrainConfig, step: int, frac: float, phase: str) -> float:
    """The learning rate at `step`; `frac` is the progress of this run (0..1) by steps or
    time, whichever is further. wsd: constant after warm-up; its cool-down decays by
    1 - sqrt(frac) to zero (Hägele et al. 2024: matches cosine at the same compute)."""
    warm = min(1.0, step / max(1, cfg.warmup))
    if cfg.schedule == "wsd":
        if phase == "cooldown":
            return cfg.lr * warm * max(0.0, 1.0 - math.sqrt(min(1.0, frac)))
        return cfg.lr * warm
    return max(cfg.lr * warm * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))), cfg.lr * 0.05)


def train(
    cfg: TrainConfig,
    tok: Tokenizer,
    train_texts: list[str],
    held_texts: list[str],
    resume: DiffusionCoder | None = None,
    progress: Callable[[int, float, float | None], None] | None = None,
    data: Iterator[Batch] | None = None,
    state: TrainState | None = None,
    phase: str = "stable",
    on_checkpoint: Callable[[TrainState], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[DiffusionCoder, dict[str, float]]:
    """Train and return the model plus a summary (final losses, tokens seen, seconds).

    ``state`` continues an earlier run (its weights, optimizer moments and counters, all
    updated in place); without it a new state starts from ``resume``'s weights or fresh
    ones. ``phase`` "stable" runs until ``cfg.steps`` (counted over all runs) or
    ``time_limit_s`` (this run), "cooldown" for ``cooldown_s`` (wsd). ``on_checkpoint``
    is called every ``checkpoint_every_s`` and at the end (not in a cool-down, which
    must never overwrite the trunk); ``should_stop`` ends the run early (a signal).
    ``data`` replaces the in-process batch generator (e.g. a DataLoader with worker
    processes, engine/training/device.py); its batches must look like ``batches``'s."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = training_device(cfg.device)
    on_cuda = device.type == "cuda"
    if state is None:
        torch.manual_seed(cfg.seed)
        mcfg = ModelConfig(vocab_size=tok.vocab_size, **cfg.model)  # type: ignore[arg-type]
        model = resume if resume is not None else DiffusionCoder(mcfg)
        model.to(device)
        state = TrainState(model, new_optimizer(model, cfg, on_cuda))
    model = state.model
    model.to(device)
    # each run draws new data: the seed moves on with the steps already trained
    seed = cfg.seed + state.step
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    forward = torch.compile(model.forward_dual) if cfg.compile and on_cuda else None
    eval_batches: list[Batch] = []
    if held_texts:
        erng = random.Random(1234)
        it = batches(tok, held_texts, replace(cfg, fit_canvas_share=0.0), erng)
        eval_batches = [next(it) for _ in range(cfg.eval_batches)]
    if data is None:
        data = batches(tok, train_texts, cfg, rng)
    start = time.monotonic()
    last_ckpt = start
    first_step = state.step
    warm_from = warm_start_step(state)
    limit_s = cfg.cooldown_s if phase == "cooldown" else cfg.time_limit_s
    run_steps = cfg.steps - first_step if phase == "stable" else 0
    held: dict[str, float] = {}
    loss_v = math.nan
    stop_reason = "steps"

    def record() -> None:
        nonlocal held
        held = evaluate(model, eval_batches, tok, cfg)
        state.curve.append(
            {
                "step": state.step,
                "tokens": state.tokens,
                "train_loss": loss_v,
                "phase_cooldown": float(phase == "cooldown"),
                **held,
            }
        )

    while True:
        elapsed = time.monotonic() - start
        if phase == "stable" and state.step >= cfg.steps:
            break
        if limit_s and elapsed >= limit_s:
            stop_reason = "time"
            break
        if should_stop is not None and should_stop():
            stop_reason = "stopped"
            break
        frac = elapsed / limit_s if limit_s else 0.0
        if run_steps > 0 and cfg.schedule != "wsd":
            frac = max(frac, (state.step - first_step + 1) / run_steps)
        if cfg.schedule != "wsd" and not limit_s and run_steps <= 0:
            frac = 1.0
        lr = lr_at(cfg, state.step + 1 - warm_from, frac, phase)
        for group in state.opt.param_groups:
            group["lr"] = lr
        model.train()
        batch = next(data)
        loss = loss_fn(model, batch, tok, cfg, gen, forward)
        state.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        state.opt.step()
        loss_v = loss.item()
        state.step += 1
        # tokens the forward pass computed: context and canvas, and the middle stream when it is trained
        b_, p_ = batch.ctx.shape
        state.tokens += b_ * (p_ + batch.target.shape[1] + (batch.mid.shape[1] if cfg.ar_loss_weight > 0 else 0))
        if eval_batches and state.step % cfg.eval_every == 0:
            record()
        if progress is not None:
            progress(state.step, loss_v, held.get("canvas") if held else None)
        now = time.monotonic()
        if on_checkpoint is not None and phase != "cooldown" and now - last_ckpt >= cfg.checkpoint_every_s:
            state.seconds += now - last_ckpt
            last_ckpt = now
            on_checkpoint(state)
    if eval_batches and (not state.curve or state.curve[-1]["step"] != state.step):
        record()
    state.seconds += time.monotonic() - last_ckpt
    state.runs.append(
        {
            "phase": phase,
            "first_step": first_step,
            "last_step": state.step,
            "seconds": round(time.monotonic() - start, 1),
            "stop": stop_reason,
            "threads": torch.get_num_threads(),
        }
    )
    if on_checkpoint is not None and phase != "cooldown":
        on_checkpoint(state)
    summary = {
        "steps": state.step,
        "run_steps": state.step - first_step,
        "train_loss": loss_v,
        "held_out_loss": held.get("canvas", math.nan),
        "held_out_ar_loss": held.get("ar", math.nan),
        "seconds": time.monotonic() - start,
        "tokens_seen": state.tokens,
    }
    return model, summary


# -------------------------------------------------------------------- training state


STATE_TENSORS = "state.safetensors"
STATE_JSON = "state.json"
STATE_TOKENIZER = "tokenizer.json"


def save_state(directory: Path, state: TrainState, tok: Tokenizer, cfg: TrainConfig) -> None:
    """Write a TrainState directory atomically (each file replaced by rename): weights in
    float32, the optimizer's moments in bfloat16 (half the bytes; their precision is
    plenty for moments), counters, the loss curve and the recipe in JSON."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    model = state.model
    names = {id(p): n for n, p in model.named_parameters()}
    tensors: dict[str, torch.Tensor] = {
        f"model.{k}": v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()
    }
    opt_steps: dict[str, float] = {}
    for group in state.opt.param_groups:
        for param in group["params"]:
            st = state.opt.state.get(param)
            if not st:
                continue
            name = names[id(param)]
            tensors[f"exp_avg.{name}"] = st["exp_avg"].detach().to(torch.bfloat16).cpu().contiguous()
            tensors[f"exp_avg_sq.{name}"] = st["exp_avg_sq"].detach().to(torch.bfloat16).cpu().contiguous()
            opt_steps[name] = float(st["step"])
    meta = {
        "format": 1,
        "step": state.step,
        "tokens": state.tokens,
        "seconds": round(state.seconds, 1),
        "model": model.cfg.to_dict(),
        "optimizer_steps": opt_steps,
        "recipe": asdict(cfg),
        "runs": state.runs,
        "curve": state.curve,
    }
    tmp = directory / (STATE_TENSORS + ".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(directory / STATE_TENSORS)
    tok.hf.save(str(directory / (STATE_TOKENIZER + ".tmp")))
    (directory / (STATE_TOKENIZER + ".tmp")).replace(directory / STATE_TOKENIZER)
    (directory / (STATE_JSON + ".tmp")).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    (directory / (STATE_JSON + ".tmp")).replace(directory / STATE_JSON)


def load_state(directory: Path, cfg: TrainConfig) -> tuple[TrainState, Tokenizer]:
    """A TrainState written by save_state, on the recipe's device, with the recipe's
    learning-rate settings (the moments and counters carry over; lr is set every step)."""
    from safetensors.torch import load_file

    from engine.models.tokenizer import Tokenizer

    meta = json.loads((directory / STATE_JSON).read_text(encoding="utf-8"))
    tensors = load_file(str(directory / STATE_TENSORS))
    tok = Tokenizer.from_file(directory / STATE_TOKENIZER)
    model = DiffusionCoder(ModelConfig(**meta["model"]))
    model.load_state_dict({k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")})
    device = training_device(cfg.device)
    model.to(device)
    opt = new_optimizer(model, cfg, device.type == "cuda")
    for name, param in model.named_parameters():
        if f"exp_avg.{name}" in tensors:
            opt.state[param] = {
                # fused AdamW (CUDA) wants its step counter on the parameter's device
                "step": torch.tensor(
                    meta["optimizer_steps"][name],
                    dtype=torch.float32,
                    device=device if device.type == "cuda" else "cpu",
                ),
                "exp_avg": tensors[f"exp_avg.{name}"].float().to(device),
                "exp_avg_sq": tensors[f"exp_avg_sq.{name}"].float().to(device),
            }
    state = TrainState(model, opt, meta["step"], meta["tokens"], meta["seconds"], meta["curve"], meta["runs"])
    return state, tok


def training_device(name: str) -> torch.device:
    """The recipe's device, checked up front: a CUDA recipe on a machine without CUDA is
    an error, not a silent CPU run of a model sized for an accelerator."""
    if name != "cpu" and not (name == "cuda" or name.startswith("cuda:")):
        raise ValueError(f"device {name!r}: use cpu, cuda or cuda:N")
    if name != "cpu" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return torch.device(name)


@torch.no_grad()
def evaluate(
    model: DiffusionCoder, eval_batches: Sequence[Batch], tok: Tokenizer, cfg: TrainConfig
) -> dict[str, float]:
    """Held-out losses: the canvas (always) and the next-token stream (whatever the
    recipe trains, so that runs with and without the dual objective compare)."""
    model.eval()
    gen = torch.Generator().manual_seed(99)
    dual = TrainConfig(**{**asdict(cfg), "ar_loss_weight": 1.0})
    canvas, ar, length = [], [], []
    for b in eval_batches:
        terms = loss_terms(model, b, tok, dual, gen)
        canvas.append(float(terms.canvas))
        ar.append(float(terms.ar) if terms.ar is not None else math.nan)
        length.append(float(terms.length) if terms.length is not None else math.nan)
    n = len(canvas)
    return {"canvas": sum(canvas) / n, "ar": sum(ar) / n, "length": sum(length) / n}


def load_recipe(path: Path) -> TrainConfig:
    data = json.loads(path.read_text(encoding="utf-8"))
    return TrainConfig(**data)


def recipe_json(cfg: TrainConfig) -> str:
    return json.dumps(asdict(cfg), indent=2)
