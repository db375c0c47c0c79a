"""The one-shot H200 training run of the default model (issue 7, section Compute).

One command, everything included, about 8 minutes on the H200 (docs/training.md):

    python -m engine.training.device --recipe recipes/h200-model.json --out $OUT [--corpus DIR]
    python -m engine.training.device --tiny --out DIR          # the same code on the CPU, < 60 s
    python -m engine.training.device join DIR                  # reassemble model.safetensors

Steps, each timed and recorded in ``$OUT/train_report.json`` (rewritten after every step,
so a run cut short still leaves what it did):

1. corpus     ``engine.training.corpus.build`` offline: the standard library and the installed
              distributions (licence-filtered, near-dedup, capped by ``corpus_max_mb``),
              held-out packages as in the recipe; or ``--corpus DIR``
2. tokenizer  a new byte-level BPE of the recipe's vocabulary, trained on a sample
3. model      DiffusionCoder with the recipe's architecture (tied embeddings)
4. loader     training batches (``engine.training.loop.make_batch``: the dual objective, the mix, SPM
              order, end-of-fill and padding) made by DataLoader worker processes, whole
              batches per worker, pinned memory; its rate alone is probed before training
5. train      ``engine.training.loop.train`` on the recipe's device (bf16, torch.compile on
              CUDA) within the time limit and the run's budget; held-out loss at the end.
              If the compiled run fails, the rest of the time trains eagerly.
6. save       the model directory without ONNX graphs (export-onnx runs later, on a CPU):
              config.json, tokenizer.json, MODEL_CARD.md, DATA_MANIFEST.jsonl, and the
              weights (float16 by default) split into parts of at most ``part_mb`` MB,
              since the device tool returns files of at most 16 MB (and 8 files in all)
7. fill       the parts joined again (sha256 checked), the model loaded with the torch
              backend on the training device, a few held-out fills compared with the truth

The recipe is a TrainConfig (engine/training/loop.py) plus a ``device_run`` object with the
settings of this script (see DEVICE_DEFAULTS).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import hashlib
import json
import math
import os
import platform
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

# Worker processes fork after the tokenizer was used: keep its thread pool out of them.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from torch.utils.data import DataLoader, IterableDataset, get_worker_info  # noqa: E402

from engine.models.directory import CARD_FILE, CONFIG_FILE, FORMAT_VERSION, TOKENIZER_FILE, WEIGHTS_FILE  # noqa: E402
from engine.models.embedded import DiffusionCoder, ModelConfig  # noqa: E402
from engine.models.table import EMBEDDED_MODEL_TYPE as MODEL_TYPE  # noqa: E402
from engine.models.tokenizer import SPECIAL_TOKENS, Tokenizer, train_tokenizer  # noqa: E402
from engine.training.budget import Budget  # noqa: E402
from engine.training.corpus import DATA_MANIFEST, MANIFEST, data_manifest  # noqa: E402
from engine.training.loop import Batch, TrainConfig, make_batch, read_corpus, text_sampler, train  # noqa: E402
from engine.training.pipeline import DEFAULTS, describe_data  # noqa: E402

REPORT = "train_report.json"
MODEL_DIR = "model"
PART = ".part"  # model.safetensors.part00, .part01, ...
STEPS = ("corpus", "tokenizer", "model", "loader", "train", "save", "fill")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
MAX_RETURNED_FILES = 8  # the device tool returns at most 8 files from $OUT

DEVICE_DEFAULTS: dict[str, Any] = {
    "budget_s": 450,  # the whole run, imports excepted; the tool allows 8-10 minutes
    "reserve_s": 45,  # kept back from training for the final evaluation, save and fills
    "stdlib": True,
    "installed": ["*"],
    "corpus_max_mb": 150,
    "tokenizer_sample_mb": 40,
    "num_workers": 14,
    "prefetch_factor": 4,
    "probe_s": 5,
    "part_mb": 15,
    "weights_dtype": "float16",
    "fill_checks": 8,
    "log_every_s": 20,
}

TINY_MODULES = ("bisect", "colorsys", "heapq", "keyword", "fnmatch", "shlex", "textwrap", "string")
TINY: dict[str, Any] = {
    "holdout": ["stdlib:shlex"],
    "vocab_size": 320,
    "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64, "max_positions": 512},
    "context_tokens": 64,
    "canvas_tokens": 16,
    "batch_size": 8,
    "steps": 6,
    "warmup": 2,
    "eval_every": 3,
    "time_limit_s": 20,
    "threads": 1,
    "device": "cpu",
    "bf16": False,
    "compile": False,
}
TINY_RUN: dict[str, Any] = {
    "budget_s": 50,
    "reserve_s": 10,
    "num_workers": 1,
    "prefetch_factor": 2,
    "probe_s": 1,
    "part_mb": 0.025,  # several parts even for a tiny model (3: 8 files in all)
    "fill_checks": 2,
    "tokenizer_sample_mb": 1,
    "log_every_s": 5,
}


# ----------------------------------------------------------------------------- report


class Report:
    """The JSON document, rewritten to disk after every step (and during training)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {
            "schema": 1,
            "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "steps": {name: {"status": "pending"} for name in STEPS},
        }

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(clean(self.data), indent=2, default=str) + "\n")
        tmp.replace(self.path)


def clean(value: Any) -> Any:
    """NaN and infinities as null: the report stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class StepFailed(Exception):
    pass


def run_step(report: Report, name: str, fn: Callable[[dict[str, Any]], Any]) -> Any:
    """Run one step; ``fn`` fills its report entry. An error is recorded and raised as StepFailed."""
    entry: dict[str, Any] = {"status": "running"}
    report.data["steps"][name] = entry
    report.save()
    start = time.perf_counter()
    say(f"[{name}] ...")
    try:
        result = fn(entry)
    except Exception as exc:
        entry.update(
            status="error", error=f"{type(exc).__name__}: {exc}"[:2000], traceback=traceback.format_exc()[-4000:]
        )
        entry["seconds"] = round(time.perf_counter() - start, 2)
        report.save()
        say(f"[{name}] error: {entry['error']}")
        raise StepFailed(name) from exc
    entry["status"] = entry.get("status") if entry.get("status") not in (None, "running") else "ok"
    entry["seconds"] = round(time.perf_counter() - start, 2)
    report.save()
    say(f"[{name}] {entry['status']} in {entry['seconds']} s")
    return result


# ----------------------------------------------------------------------------- split / join


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def split_file(path: Path, part_bytes: int) -> list[dict[str, Any]]:
    """Cut ``path`` into path.part00, path.part01, ... of at most part_bytes each and remove it."""
    if part_bytes <= 0:
        raise ValueError("part size must be positive")
    parts: list[dict[str, Any]] = []
    with path.open("rb") as f:
        for i in range(1000):
            chunk = f.read(part_bytes)
            if not chunk and i:
                break
            part = path.with_name(f"{path.name}{PART}{i:02d}")
            part.write_bytes(chunk)
            parts.append({"name": part.name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
            if len(chunk) < part_bytes:
                break
    path.unlink()
    return parts


def part_files(directory: Path, name: str = WEIGHTS_FILE) -> list[Path]:
    return sorted(p for p in directory.glob(f"{name}{PART}*") if p.name[len(name) + len(PART) :].isdigit())


def join_file(directory: Path, sha256: str | None, name: str = WEIGHTS_FILE, keep_parts: bool = False) -> Path:
    """Reassemble ``directory/name`` from its parts; with ``sha256``, verify it (a mismatch
    removes the joined file and raises ValueError)."""
    parts = part_files(directory, name)
    if not parts:
        raise FileNotFoundError(f"no {name}{PART}NN files in {directory}")
    numbers = [int(p.name[len(name) + len(PART) :]) for p in parts]
    if numbers != list(range(len(parts))):
        raise ValueError(f"parts of {name} in {directory} are not numbered 00..{len(parts) - 1:02d}: {numbers}")
    target = directory / name
    tmp = target.with_name(target.name + ".joining")
    with tmp.open("wb") as out:
        for p in parts:
            out.write(p.read_bytes())
    got = sha256_file(tmp)
    if sha256 is not None and got != sha256:
        tmp.unlink()
        raise ValueError(f"joined {name} has sha256 {got}, expected {sha256}: a part is missing or damaged")
    tmp.replace(target)
    if not keep_parts:
        for p in parts:
            p.unlink()
    return target


def recorded_sha256(model_dir: Path) -> str | None:
    """The weights' sha256 from the run's report (next to or inside the model directory)."""
    for report in (model_dir.parent / REPORT, model_dir / REPORT):
        if report.is_file():
            data = json.loads(report.read_text(encoding="utf-8"))
            sha = data.get("steps", {}).get("save", {}).get("weights", {}).get("sha256")
            return str(sha) if sha else None
    return None


# ----------------------------------------------------------------------------- data


class ExampleBatches(IterableDataset[Batch]):
    """Endless training batches exactly as engine.training.loop.batches makes them (the same
    objective, mix and canvas groups as the CPU recipe); each DataLoader worker builds
    whole batches with its own seed."""

    def __init__(self, tok: Tokenizer, texts: list[str], cfg: TrainConfig, seed: int) -> None:
        self.tok = tok
        self.texts = texts
        self.cfg = cfg
        self.seed = seed

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        rng = random.Random(self.seed * 1000 + (info.id if info is not None else 0) + 1)
        draw = text_sampler(self.texts, rng)
        while True:
            yield make_batch(self.tok, draw, self.cfg, rng)


def make_loader(
    tok: Tokenizer, texts: list[str], cfg: TrainConfig, workers: int, prefetch: int, pin: bool
) -> DataLoader[Batch]:
    extra: dict[str, Any] = {}
    if workers > 0:
        extra = {"prefetch_factor": prefetch, "persistent_workers": True}
        if sys.platform == "linux":  # fork: the corpus is shared with the workers, not pickled
            extra["multiprocessing_context"] = "fork"
    return DataLoader(
        ExampleBatches(tok, texts, cfg, cfg.seed), batch_size=None, num_workers=workers, pin_memory=pin, **extra
    )


# ----------------------------------------------------------------------------- the run


def load_run_recipe(path: Path | None, tiny: bool) -> tuple[TrainConfig, dict[str, Any], dict[str, Any]]:
    """(TrainConfig, device_run settings, the recipe as written) from the recipe file."""
    raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path is not None else {}
    data = dict(raw)
    run = {**DEVICE_DEFAULTS, **data.pop("device_run", {})}
    if tiny:
        data.update(TINY)
        run.update(TINY_RUN)
    return TrainConfig(**data), run, raw


def tiny_stdlib(work: Path) -> Path:
    """A standard-library directory of a few small modules, for --tiny."""
    import sysconfig

    src = Path(sysconfig.get_paths()["stdlib"])
    dst = work / "tiny_stdlib"
    dst.mkdir(parents=True, exist_ok=True)
    for name in TINY_MODULES:
        if (src / f"{name}.py").is_file():
            shutil.copy(src / f"{name}.py", dst / f"{name}.py")
    return dst


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    from engine.spans.languages import parser_for

    info["tree_sitter_python"] = parser_for("python") is not None
    return info


def main_run(args: argparse.Namespace) -> int:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    report = Report(out / REPORT)
    cfg, run, raw_recipe = load_run_recipe(args.recipe, args.tiny)
    if args.budget_s:
        run["budget_s"] = args.budget_s
    budget = Budget(float(run["budget_s"]))
    work = Path(tempfile.mkdtemp(prefix="device_training_", dir=args.work))
    report.data.update(
        recipe=str(args.recipe) if args.recipe else None,
        tiny=args.tiny,
        device_run=run,
        train_config=dataclasses.asdict(cfg),
        machine=machine(),
    )
    report.save()
    state: dict[str, Any] = {}
    failed: str | None = None
    try:
        run_step(report, "corpus", lambda e: step_corpus(e, args, cfg, run, work, state))
        run_step(report, "tokenizer", lambda e: step_tokenizer(e, cfg, run, state))
        run_step(report, "model", lambda e: step_model(e, cfg, state))
        run_step(report, "loader", lambda e: step_loader(e, cfg, run, state))
        run_step(report, "train", lambda e: step_train(e, cfg, run, budget, report, state))
        run_step(report, "save", lambda e: step_save(e, cfg, run, raw_recipe, args, out, report, state))
    except StepFailed as exc:
        failed = str(exc)
    if failed is None:
        try:
            run_step(report, "fill", lambda e: step_fill(e, cfg, run, budget, out, work, state))
        except StepFailed:
            failed = "fill"
    for name in STEPS:
        if report.data["steps"][name]["status"] == "pending":
            report.data["steps"][name] = {"status": "skipped", "reason": f"after the failure of {failed}"}
    state.clear()  # the loader's persistent workers end with it
    shutil.rmtree(work, ignore_errors=True)
    returned = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    report.data["returned_files"] = returned
    if len(returned) > MAX_RETURNED_FILES:
        report.data["warning"] = f"{len(returned)} files under --out; the device tool returns only {MAX_RETURNED_FILES}"
    report.data["total_s"] = round(time.perf_counter() - budget.start, 1)
    report.data["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    report.save()
    say(f"wrote {report.path} ({'ok' if failed is None else 'failed at ' + failed}, {report.data['total_s']} s)")
    return 0 if failed is None else 1


def step_corpus(
    e: dict[str, Any], args: argparse.Namespace, cfg: TrainConfig, run: dict[str, Any], work: Path, st: dict[str, Any]
) -> None:
    if args.corpus is not None:
        dirs = [str(args.corpus)]
        e["built"] = False
    else:
        from engine.training.corpus import build

        corpus = work / "corpus"
        stdlib_dir = tiny_stdlib(work) if args.tiny else None
        installed = [] if args.tiny else list(run["installed"])
        result = build(
            corpus,
            holdout=cfg.holdout,
            stdlib=bool(run["stdlib"]),
            max_mb=run["corpus_max_mb"],
            stdlib_dir=stdlib_dir,
            installed=installed,
        )
        dirs = [str(corpus)]
        e.update(built=True, max_mb=run["corpus_max_mb"], installed=installed, stats=result.stats)
    train_texts, held = read_corpus(dirs, cfg.holdout)
    if not train_texts:
        raise ValueError(f"no training files under {dirs}")
    st.update(dirs=dirs, train_texts=train_texts, held=held)
    corpora = [Path(d) for d in dirs if (Path(d) / MANIFEST).is_file()]
    st["corpora"] = corpora
    e.update(
        dirs=dirs,
        train_files=len(train_texts),
        train_mb=round(sum(len(t) for t in train_texts) / 1e6, 2),
        held_files=len(held),
        held_mb=round(sum(len(t) for t in held) / 1e6, 2),
        holdout=cfg.holdout,
    )


def step_tokenizer(e: dict[str, Any], cfg: TrainConfig, run: dict[str, Any], st: dict[str, Any]) -> None:
    texts: list[str] = list(st["train_texts"])
    random.Random(cfg.seed).shuffle(texts)
    limit = float(run["tokenizer_sample_mb"]) * 1e6
    sample: list[str] = []
    size = 0
    for t in texts:
        if size >= limit:
            break
        sample.append(t)
        size += len(t)
    tok = train_tokenizer(sample, cfg.vocab_size)
    st["tok"] = tok
    probe = (st["held"] or st["train_texts"])[:200]
    chars = sum(len(t) for t in probe)
    tokens = sum(len(tok.encode(t)) for t in probe)
    e.update(vocab_size=tok.vocab_size, sample_files=len(sample), sample_mb=round(size / 1e6, 2))
    e["chars_per_token"] = round(chars / max(tokens, 1), 3)


def step_model(e: dict[str, Any], cfg: TrainConfig, st: dict[str, Any]) -> None:
    torch.manual_seed(cfg.seed)
    mcfg = ModelConfig(vocab_size=st["tok"].vocab_size, **cfg.model)  # type: ignore[arg-type]
    model = DiffusionCoder(mcfg)
    st["model"] = model
    e.update(architecture=mcfg.to_dict(), parameters=sum(p.numel() for p in model.parameters()))


def step_loader(e: dict[str, Any], cfg: TrainConfig, run: dict[str, Any], st: dict[str, Any]) -> None:
    workers = int(run["num_workers"])
    pin = cfg.device.startswith("cuda") and torch.cuda.is_available()
    loader = make_loader(st["tok"], st["train_texts"], cfg, workers, int(run["prefetch_factor"]), pin)
    it = iter(loader)
    t0 = time.perf_counter()
    next(it)
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    n = 0
    while time.perf_counter() - t1 < float(run["probe_s"]):
        next(it)
        n += 1
    secs = time.perf_counter() - t1
    per_s = n * cfg.batch_size / secs
    # batches the workers had ready when the probe began are counted too: a lower bound without them
    low = max(0, n - workers) * cfg.batch_size / secs
    st.update(loader=loader, data=it)
    e.update(
        workers=workers,
        pin_memory=pin,
        first_batch_s=round(first, 2),
        probe_s=round(secs, 2),
        examples_per_s=round(per_s, 1),
        examples_per_s_lower_bound=round(low, 1),
        tokens_per_s=round(per_s * (cfg.context_tokens + cfg.canvas_tokens)),
    )


def step_train(
    e: dict[str, Any], cfg: TrainConfig, run: dict[str, Any], budget: Budget, report: Report, st: dict[str, Any]
) -> None:
    limit = budget.left() - float(run["reserve_s"])
    if cfg.time_limit_s:
        limit = min(limit, cfg.time_limit_s)
    if limit <= 1:
        raise RuntimeError(f"no time left to train ({budget.left():.0f} s of the budget)")
    e["time_limit_s"] = round(limit, 1)
    progress: list[dict[str, Any]] = []
    e["progress"] = progress
    last = [time.perf_counter()]
    t0 = time.perf_counter()

    def on_step(step: int, loss: float, held_loss: float | None) -> None:
        now = time.perf_counter()
        if now - last[0] >= float(run["log_every_s"]):
            last[0] = now
            row = {"step": step, "s": round(now - t0, 1), "loss": round(loss, 4), "held_out_loss": held_loss}
            progress.append(row)
            say(f"  step {step} loss {loss:.3f} held-out {held_loss} {now - t0:.0f} s")
            report.save()

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    run_cfg = dataclasses.replace(cfg, time_limit_s=limit)
    try:
        model, summary = train(
            run_cfg, st["tok"], st["train_texts"], st["held"], resume=st["model"], progress=on_step, data=st["data"]
        )
    except Exception as exc:
        if not (cfg.compile and cfg.device.startswith("cuda")):
            raise
        # the compiled run failed: record why and spend the rest of the time training eagerly
        e["compile_error"] = f"{type(exc).__name__}: {exc}"[:2000]
        e["compile_traceback"] = traceback.format_exc()[-3000:]
        rest = limit - (time.perf_counter() - t0)
        if rest <= 5:
            raise
        run_cfg = dataclasses.replace(cfg, time_limit_s=rest, compile=False)
        e["status"] = "ok_without_compile"
        model, summary = train(
            run_cfg, st["tok"], st["train_texts"], st["held"], resume=st["model"], progress=on_step, data=st["data"]
        )
    st["model"] = model
    st["summary"] = summary
    e.update(summary)
    e["tokens_per_s"] = round(summary["tokens_seen"] / max(summary["seconds"], 1e-9))
    if torch.cuda.is_available():
        e["peak_gpu_memory_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)


def step_save(
    e: dict[str, Any],
    cfg: TrainConfig,
    run: dict[str, Any],
    raw_recipe: dict[str, Any],
    args: argparse.Namespace,
    out: Path,
    report: Report,
    st: dict[str, Any],
) -> None:
    from safetensors.torch import save_file

    model: DiffusionCoder = st["model"]
    tok: Tokenizer = st["tok"]
    dest = out / MODEL_DIR
    dest.mkdir(parents=True, exist_ok=True)
    sp = tok.special
    defaults = {
        **DEFAULTS,
        "context_tokens": cfg.context_tokens,
        "canvas_tokens": cfg.canvas_tokens,
        "max_canvas_tokens": max(cfg.canvas_tokens, cfg.long_canvas_tokens),  # the longest it trained on
    }
    config = {  # as engine.training.save.save_model_dir writes it
        "format_version": FORMAT_VERSION,
        "model_type": MODEL_TYPE,
        "architecture": model.cfg.to_dict(),
        "regime": "absorbing",
        "special_tokens": SPECIAL_TOKENS,
        "special_ids": {k: getattr(sp, k) for k in SPECIAL_TOKENS},
        "defaults": defaults,
    }
    (dest / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    tok.hf.save(str(dest / TOKENIZER_FILE))
    dtype = DTYPES[str(run["weights_dtype"])]
    weights = dest / WEIGHTS_FILE
    save_file({k: v.detach().to(dtype).contiguous().cpu() for k, v in model.state_dict().items()}, str(weights))
    size = weights.stat().st_size
    sha = sha256_file(weights)
    parts = split_file(weights, max(1, int(float(run["part_mb"]) * 1_000_000)))
    e["weights"] = {"file": WEIGHTS_FILE, "dtype": str(run["weights_dtype"]), "bytes": size, "sha256": sha}
    e["weights"]["parts"] = parts
    corpora: list[Path] = st["corpora"]
    if corpora:
        (dest / DATA_MANIFEST).write_text(data_manifest(corpora), encoding="utf-8")
    card = model_card(cfg, run, raw_recipe, args, report, st, size, sha)
    (dest / CARD_FILE).write_text(card, encoding="utf-8")
    e["files"] = sorted(p.name for p in dest.iterdir())


def model_card(
    cfg: TrainConfig,
    run: dict[str, Any],
    raw_recipe: dict[str, Any],
    args: argparse.Namespace,
    report: Report,
    st: dict[str, Any],
    size: int,
    sha: str,
) -> str:
    s = st["summary"]
    steps = report.data["steps"]
    m = report.data["machine"]
    n_params = sum(p.numel() for p in st["model"].parameters())
    data = describe_data(st["corpora"], len(st["train_texts"]), len(st["held"]), cfg.holdout)
    where = m.get("gpu") or f"CPU ({m['cpus']} cores)"
    return CARD.format(
        params=n_params,
        dtype=run["weights_dtype"],
        size=size,
        sha=sha,
        data=data,
        steps=s["steps"],
        tokens=int(s["tokens_seen"]),
        seconds=f"{s['seconds']:.0f}",
        where=where,
        torch=m["torch"],
        tps=steps["train"].get("tokens_per_s"),
        eps=steps["loader"].get("examples_per_s"),
        workers=steps["loader"].get("workers"),
        train_loss=f"{s['train_loss']:.3f}",
        held_loss=f"{s['held_out_loss']:.3f}",
        recipe_file=args.recipe.as_posix() if args.recipe else "(built in, --tiny)",
        recipe=json.dumps({**raw_recipe, **({"tiny": True} if args.tiny else {})}, indent=2),
        compile=steps["train"].get("status"),
    )


CARD = """# diffusion-lsp default model (trained by engine/training/device.py)

A small masked-diffusion (absorbing canvas) infill model of the embedded architecture.

- Parameters: {params:,} (tied embeddings); weights stored in {dtype} ({size:,} bytes,
  sha256 {sha}). ONNX graphs are not part of the training run: `diffusion-infill
  export-onnx --model DIR` writes them afterwards.
- Data: {data}
- Training: {steps} steps, {tokens:,} tokens seen (context + canvas), {seconds} s on {where}
  (torch {torch}; training status {compile}), {tps} tokens/s; the example loader alone made
  {eps} examples/s with {workers} worker processes. Final training loss {train_loss},
  held-out loss {held_loss} (cross-entropy on the corrupted canvas, nats).
- Evaluation: not yet run (`diffusion-infill eval`).
- Recipe ({recipe_file}):

```json
{recipe}
```
"""


def step_fill(
    e: dict[str, Any], cfg: TrainConfig, run: dict[str, Any], budget: Budget, out: Path, work: Path, st: dict[str, Any]
) -> None:
    if budget.left() < 10:
        e.update(status="skipped", reason=f"budget: {budget.left():.0f} s left")
        return
    from engine.denoisers.loading import load_model
    from engine.fill import InfillRequest
    from engine.local.generator import local_engine
    from engine.training.tasks import cut_example

    src = out / MODEL_DIR
    joined = work / "joined"
    joined.mkdir()
    for p in src.iterdir():
        shutil.copy(p, joined / p.name)
    sha = recorded_sha256(src) or json.loads((out / REPORT).read_text())["steps"]["save"]["weights"]["sha256"]
    join_file(joined, sha)
    e["joined_sha256_ok"] = True
    device = cfg.device if cfg.device.startswith("cuda") and torch.cuda.is_available() else "cpu"
    loaded = load_model(joined, backend="torch", device=device)
    engine = local_engine(loaded)
    texts = st["held"] or st["train_texts"]
    e["from"] = "held-out" if st["held"] else "train (no held-out files)"
    rng = random.Random(7)
    fills: list[dict[str, Any]] = []
    for _ in range(int(run["fill_checks"])):
        if budget.left() < 5:
            break
        prefix, middle, suffix = cut_example(rng.choice(texts), rng)
        t0 = time.perf_counter()
        r = engine.fill(InfillRequest(prefix=prefix, suffix=suffix, language="python"))
        ms = (time.perf_counter() - t0) * 1000
        fills.append(
            {
                "prefix_tail": prefix[-80:],
                "expected": middle,
                "got": r.text,
                "exact": r.text.strip() == middle.strip(),
                "steps": r.steps,
                "ms": round(ms, 1),
            }
        )
    e.update(device=device, fills=fills, exact=sum(f["exact"] for f in fills), n=len(fills))


# ----------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["join"]:
        j = argparse.ArgumentParser(prog="python -m engine.training.device join")
        j.add_argument("dir", type=Path, help="the model directory holding model.safetensors.partNN")
        j.add_argument("--sha256", default=None, help="expected digest (default: from train_report.json)")
        j.add_argument("--keep-parts", action="store_true")
        a = j.parse_args(argv[1:])
        sha = a.sha256 or recorded_sha256(a.dir)
        if sha is None:
            sys.stderr.write("no sha256 given and no train_report.json found: joining unverified\n")
        target = join_file(a.dir, sha, keep_parts=a.keep_parts)
        say(f"wrote {target} (sha256 {'verified' if sha else 'not verified'})")
        return 0
    p = argparse.ArgumentParser(prog="python -m engine.training.device", description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", type=Path, default=None, help="TrainConfig JSON with a device_run object")
    p.add_argument("--out", type=Path, required=True, help="report and model directory ($OUT on the device)")
    p.add_argument("--corpus", type=Path, default=None, help="an existing corpus directory instead of building one")
    p.add_argument("--work", type=Path, default=None, help="scratch directory (default: the system's temp)")
    p.add_argument("--budget-s", type=float, default=None, help="override device_run.budget_s")
    p.add_argument("--tiny", action="store_true", help="tiny model, few files and steps, on the CPU")
    args = p.parse_args(argv)
    if args.recipe is None and not args.tiny:
        p.error("--recipe is required (except with --tiny)")
    return main_run(args)


if __name__ == "__main__":
    sys.exit(main())
