"""Training the embedded model: corpus, infill examples, corruption, the loop (torch).

Minimal by design (the default-model issue builds the full pipeline): a corpus of
permissively licensed Python files, infill examples cut as random character spans, whole
lines, and rest-of-line spans, context in suffix-prefix-middle order, the canvas
corrupted at a random rate (absorbing: masks, plus a few random replacements so the
model learns to judge visible tokens, which the drafter relies on), loss on the canvas.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.corpus import MANIFEST, read_manifest
from engine.model import DiffusionCoder, ModelConfig
from engine.tasks import cut_example
from engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 200_000  # skip generated or data-like files


@dataclass
class TrainConfig:
    corpus: list[str] = field(default_factory=list)  # directories of .py files
    holdout: list[str] = field(default_factory=list)  # path parts held out for evaluation
    vocab_size: int = 4096
    model: dict[str, int | float] = field(default_factory=dict)
    context_tokens: int = 256  # context length in training (left-padded)
    canvas_tokens: int = 32
    batch_size: int = 32
    steps: int = 2000
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.01
    replace_rate: float = 0.1  # of visible canvas tokens, replaced by random ones
    visible_loss_weight: float = 0.1
    eval_every: int = 200
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

    A directory built by ``python -m engine.corpus`` (it has a manifest.jsonl) is read
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


def spm_context(tok: Tokenizer, prefix_ids: list[int], suffix_ids: list[int]) -> list[int]:
    sp = tok.special
    return [sp.suffix, *suffix_ids, sp.prefix, *prefix_ids, sp.middle]


def make_example(
    tok: Tokenizer, text: str, rng: random.Random, ctx_len: int, canvas_len: int
) -> tuple[list[int], list[int]] | None:
    """(context ids, canvas target ids) or None when the middle does not fit the canvas."""
    prefix, middle, suffix = cut_example(text, rng)
    mid = tok.encode(middle)
    if len(mid) >= canvas_len:
        return None
    budget = ctx_len - 3
    # split the budget between the sides at random; nearest code kept
    suf_share = rng.uniform(0.1, 0.6)
    suf = tok.encode(suffix[: 8 * budget])[: int(budget * suf_share)]
    pre = tok.encode(prefix[-8 * budget :])
    pre = pre[len(pre) - (budget - len(suf)) :] if len(pre) > budget - len(suf) else pre
    sp = tok.special
    target = [*mid, sp.eof] + [sp.pad] * (canvas_len - len(mid) - 1)
    return spm_context(tok, pre, suf), target


def batches(
    tok: Tokenizer, texts: list[str], cfg: TrainConfig, rng: random.Random
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    weights = [len(t) for t in texts]
    while True:
        ctxs: list[list[int]] = []
        tgts: list[list[int]] = []
        while len(ctxs) < cfg.batch_size:
            text = rng.choices(texts, weights=weights)[0]
            ex = make_example(tok, text, rng, cfg.context_tokens, cfg.canvas_tokens)
            if ex is None:
                continue
            ctxs.append(ex[0])
            tgts.append(ex[1])
        p = cfg.context_tokens
        ctx = torch.full((len(ctxs), p), tok.special.pad, dtype=torch.long)
        valid = torch.zeros((len(ctxs), p), dtype=torch.bool)
        for i, c in enumerate(ctxs):
            ctx[i, p - len(c) :] = torch.tensor(c)
            valid[i, p - len(c) :] = True
        yield ctx, valid, torch.tensor(tgts, dtype=torch.long)


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


def loss_fn(
    model: DiffusionCoder,
    batch: tuple[torch.Tensor, ...],
    mask_id: int,
    cfg: TrainConfig,
    gen: torch.Generator,
    forward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Canvas loss of one batch. Batches and corruption are made on the CPU (one
    generator, so a seed means the same data on every device) and moved to the model's
    device here; ``forward`` is model.forward_train or a compiled version of it."""
    ctx, valid, target = batch
    canvas, hidden = corrupt(target, mask_id, model.cfg.vocab_size, cfg.replace_rate, gen)
    device = next(model.parameters()).device
    ctx, valid, canvas, target, hidden = (t.to(device, non_blocking=True) for t in (ctx, valid, canvas, target, hidden))
    use_bf16 = cfg.bf16 and device.type == "cuda"
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_bf16):
        logits = (forward or model.forward_train)(ctx, valid, canvas)  # (B, C, V)
    ce = F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), reduction="none").view_as(target)
    w = torch.where(hidden, 1.0, cfg.visible_loss_weight)
    return (ce * w).sum() / w.sum()


def train(
    cfg: TrainConfig,
    tok: Tokenizer,
    train_texts: list[str],
    held_texts: list[str],
    resume: DiffusionCoder | None = None,
    progress: Callable[[int, float, float | None], None] | None = None,
    data: Iterator[tuple[torch.Tensor, ...]] | None = None,
) -> tuple[DiffusionCoder, dict[str, float]]:
    """Train and return the model plus a summary (final losses, tokens seen, seconds).

    ``data`` replaces the in-process batch generator (e.g. a DataLoader with worker
    processes, engine/device_training.py); its batches must look like ``batches``'s."""
    torch.manual_seed(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rng = random.Random(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    mcfg = ModelConfig(vocab_size=tok.vocab_size, **cfg.model)  # type: ignore[arg-type]
    model = resume if resume is not None else DiffusionCoder(mcfg)
    device = training_device(cfg.device)
    on_cuda = device.type == "cuda"
    model.to(device)
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        betas=(0.9, 0.95),
        **({"fused": True} if on_cuda else {}),
    )
    forward = torch.compile(model.forward_train) if cfg.compile and on_cuda else None
    mask_id = tok.special.mask
    assert mask_id is not None
    eval_batches: list[tuple[torch.Tensor, ...]] = []
    if held_texts:
        erng = random.Random(1234)
        it = batches(tok, held_texts, cfg, erng)
        eval_batches = [next(it) for _ in range(4)]
    if data is None:
        data = batches(tok, train_texts, cfg, rng)
    start = time.monotonic()
    held_loss: float | None = None
    loss_v = math.nan
    step = 0
    for step in range(1, cfg.steps + 1):
        # cosine decay over the steps or the time limit, whichever runs out first
        progress_frac = step / cfg.steps
        if cfg.time_limit_s:
            progress_frac = max(progress_frac, (time.monotonic() - start) / cfg.time_limit_s)
        lr = cfg.lr * min(1.0, step / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress_frac)))
        for group in opt.param_groups:
            group["lr"] = max(lr, cfg.lr * 0.05)
        model.train()
        loss = loss_fn(model, next(data), mask_id, cfg, gen, forward)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_v = loss.item()
        if eval_batches and (step % cfg.eval_every == 0 or step == cfg.steps):
            held_loss = evaluate(model, eval_batches, mask_id, cfg)
        if progress is not None:
            progress(step, loss_v, held_loss)
        if cfg.time_limit_s and time.monotonic() - start >= cfg.time_limit_s:
            log.info("time limit reached at step %d", step)
            break
    if eval_batches:
        held_loss = evaluate(model, eval_batches, mask_id, cfg)
    summary = {
        "steps": step,
        "train_loss": loss_v,
        "held_out_loss": held_loss if held_loss is not None else math.nan,
        "seconds": time.monotonic() - start,
        "tokens_seen": step * cfg.batch_size * (cfg.context_tokens + cfg.canvas_tokens),
    }
    return model.cpu().eval(), summary  # export and safetensors expect CPU weights


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
    model: DiffusionCoder, eval_batches: Sequence[tuple[torch.Tensor, ...]], mask_id: int, cfg: TrainConfig
) -> float:
    model.eval()
    gen = torch.Generator().manual_seed(99)
    losses = [float(loss_fn(model, b, mask_id, cfg, gen)) for b in eval_batches]
    return sum(losses) / len(losses)


def load_recipe(path: Path) -> TrainConfig:
    data = json.loads(path.read_text(encoding="utf-8"))
    return TrainConfig(**data)


def recipe_json(cfg: TrainConfig) -> str:
    return json.dumps(asdict(cfg), indent=2)
