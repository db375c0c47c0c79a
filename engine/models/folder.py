"""The models folder: what `diffusion-infill pull` and `export-onnx` leave there, what
`diffusion-infill models` lists, and the model the language server uses when its `model`
setting is left at the default.

A model's fill time is measured on the machine that runs it (`diffusion-infill models
--measure`) and kept in its directory (TIMING_FILE), one entry per machine and device. The
server's default is the largest model measured on this machine whose keystroke fill meets
the latency target (the server's deadline), its weights in 8 bits or more before 4 at the
same size (4 bits cost quality: docs/models.md); without one, the shipped model.
Torch-free and model-free: it reads config.json and the timing file only.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ModelLoadError
from engine.models.directory import CONFIG_FILE, read_config
from engine.models.table import AUTO, choose

MODELS_ENV = "DIFFUSION_LSP_MODELS"  # the models folder
TIMING_FILE = "diffusion-lsp-timing.json"
DEFAULT_DEADLINE_MS = 2000  # the server's default deadlineMs: the keystroke time a default model must meet
LOW_BITS = ("int4", "4bit")  # quantizations that cost quality: chosen after wider ones of the same size


def models_folder(explicit: Path | None = None, env: Mapping[str, str] | None = None) -> Path:
    """--dir, else $DIFFUSION_LSP_MODELS, else diffusion-lsp/models in the XDG data folder."""
    env = os.environ if env is None else env
    if explicit is not None:
        return explicit.expanduser()
    if env.get(MODELS_ENV):
        return Path(env[MODELS_ENV]).expanduser()
    data = Path(env["XDG_DATA_HOME"]) if env.get("XDG_DATA_HOME") else Path.home() / ".local" / "share"
    return data / "diffusion-lsp" / "models"


def machine_key(device: str = "cpu") -> str:
    """What a timing holds for: the processor, its core count and the device."""
    return f"{platform.machine()} {_cpu_name()} x{os.cpu_count() or 1} {device}"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


@dataclass(frozen=True)
class Timing:
    """A model's fill times measured on one machine (`diffusion-infill models --measure`)."""

    keystroke_p50_ms: float  # a fill after one typed character, the context cache warm
    cold_p50_ms: float  # a fill at a new position
    load_s: float  # loading the model
    when: str

    @classmethod
    def of(cls, raw: object) -> Timing | None:
        if not isinstance(raw, dict):
            return None
        try:
            return cls(
                float(raw["keystroke_p50_ms"]), float(raw["cold_p50_ms"]), float(raw["load_s"]), str(raw["when"])
            )
        except (KeyError, TypeError, ValueError):
            return None


def read_timing(path: Path, key: str) -> Timing | None:
    """The timing of the model directory `path` on the machine `key`, if measured."""
    try:
        raw = json.loads((path / TIMING_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return Timing.of(raw.get(key)) if isinstance(raw, dict) else None


def write_timing(path: Path, key: str, timing: Timing) -> None:
    """Keep `timing` for machine `key` in the directory (other machines' entries stay)."""
    file = path / TIMING_FILE
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raw = {}
    raw = raw if isinstance(raw, dict) else {}
    raw[key] = timing.__dict__
    tmp = file.with_suffix(".tmp")
    tmp.write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
    tmp.replace(file)


@dataclass(frozen=True)
class Entry:
    """One model directory in the folder."""

    path: Path
    model_type: str | None
    backend: str | None  # the backend `auto` loads it with; None: not loadable
    quantization: str
    parameters: int | None  # estimated from config.json's shape
    timing: Timing | None  # measured on this machine
    problem: str | None = None  # why it cannot be used
    conversion: dict[str, Any] | None = None  # what making an export cost (engine/export/from_gguf.py), where recorded

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def size_bytes(self) -> int:
        """What its files hold (walked when asked: the server's choice does not need it)."""
        return _size(self.path)


def scan(folder: Path, key: str) -> list[Entry]:
    """The model directories in `folder` (each a directory with a config.json), by name."""
    if not folder.is_dir():
        return []
    return [entry(p, key) for p in sorted(folder.iterdir()) if (p / CONFIG_FILE).is_file()]


def entry(path: Path, key: str) -> Entry:
    try:
        cfg = read_config(path)
        model_type = cfg.get("model_type")
        backend = choose(model_type, AUTO, where=str(path / CONFIG_FILE)).name
    except ModelLoadError as exc:
        return Entry(path, None, None, "none", None, None, str(exc))
    own = cfg.get("diffusion_lsp")
    own = own if isinstance(own, dict) else {}
    quant = str(own.get("quantization", "none"))
    conversion = own.get("conversion") if isinstance(own.get("conversion"), dict) else None
    return Entry(path, str(model_type), backend, quant, parameters(cfg), read_timing(path, key), conversion=conversion)


def _size(path: Path) -> int:
    total = 0
    for f in path.rglob("*"):
        try:
            total += f.stat().st_size if f.is_file() else 0
        except OSError:
            continue
    return total


def parameters(cfg: dict[str, Any]) -> int | None:
    """About how many weights a transformer of this config.json has (embeddings, attention
    with grouped keys and values, a gated MLP, and an untied head); None when it does not say."""
    try:
        h, layers, vocab = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["vocab_size"])
        inter = int(cfg.get("intermediate_size", 4 * h))
        heads = int(cfg.get("num_attention_heads", 1))
        kv = int(cfg.get("num_key_value_heads", heads))
    except (KeyError, TypeError, ValueError):
        return None
    head_dim = int(cfg.get("head_dim") or h // max(heads, 1))
    attention = 2 * h * heads * head_dim + 2 * h * kv * head_dim
    tied = bool(cfg.get("tie_word_embeddings", True))
    return vocab * h * (1 if tied else 2) + layers * (attention + 3 * h * inter)


def best(entries: list[Entry], target_ms: float) -> Entry | None:
    """The model the server uses by default: the largest measured here whose keystroke
    fill meets `target_ms`, wider weights before 4 bits, then the faster."""
    fit = [e for e in entries if e.problem is None and e.timing is not None and e.timing.keystroke_p50_ms <= target_ms]
    if not fit:
        return None
    return max(
        fit,
        key=lambda e: (e.parameters or 0, e.quantization not in LOW_BITS, -e.timing.keystroke_p50_ms),  # type: ignore[union-attr]
    )


def default_model(target_ms: float, device: str = "cpu", env: Mapping[str, str] | None = None) -> Entry | None:
    """The best model in the models folder for this machine (see `best`), or None: the shipped one."""
    return best(scan(models_folder(None, env), machine_key(device)), target_ms)
