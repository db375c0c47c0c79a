"""Model directories: what a model is on disk, read safely (the training side writes
them: engine/training/save.py; engine.denoisers.loading loads them through the backend table).

An embedded-architecture model directory holds:
    config.json        format_version, model_type "diffusion_coder", architecture, regime,
                       special token ids, defaults for infill and sampling
    tokenizer.json     the byte-level BPE
    model.safetensors  the weights (torch backend)
    encode.onnx, denoise.onnx   the graphs the default onnx backend runs
    MODEL_CARD.md      data, licences, recipe, evaluation

A directory whose config.json has another model_type is a transformers checkpoint that
another backend loads (engine.models.table: DiffusionGemma, the Dream family, Qwen2,
Llama; docs/models.md).

Weights load only from safetensors and ONNX files, never from pickles, and only from the
local directory: nothing is fetched.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from engine.errors import ModelLoadError
from engine.models.table import FAST_DLLM_MODEL_TYPE, SDAR_MODEL_TYPE
from engine.models.tokenizer import Tokenizer

FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
WEIGHTS_FILE = "model.safetensors"
CARD_FILE = "MODEL_CARD.md"
ENCODE_FILE = "encode.onnx"
DENOISE_FILE = "denoise.onnx"
LM_GRAPH_FILE = "model.onnx"  # an exported Qwen2/Llama/Dream checkpoint (engine/training/export_lm.py)

# The shipped default model lives inside the package.
DEFAULT_MODEL_DIR = Path(__file__).resolve().parents[1] / "weights"


def read_config(path: Path) -> dict[str, Any]:
    """config.json of a model directory, with errors that name the path and the problem."""
    if not path.exists():
        raise ModelLoadError(f"model directory not found: {path}")
    if not path.is_dir():
        raise ModelLoadError(f"model path is not a directory: {path}")
    cfg_path = path / CONFIG_FILE
    if not cfg_path.is_file():
        raise ModelLoadError(f"model directory {path} has no {CONFIG_FILE}")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {cfg_path}: {exc}") from exc
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{cfg_path} is not a JSON object")
    return cfg


def require(path: Path, *names: str) -> None:
    missing = [n for n in names if not (path / n).is_file()]
    if missing:
        raise ModelLoadError(f"model directory {path} is missing {', '.join(missing)}")


def languages(cfg: dict[str, Any], path: Path) -> frozenset[str] | None:
    """config.json's `languages`: the languages the model was trained on (a list of
    names); absent: any language."""
    names = cfg.get("languages")
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ModelLoadError(f"{path / CONFIG_FILE}: `languages` must be a list of language names")
    return frozenset(names)


def check_embedded(path: Path, cfg: dict[str, Any]) -> None:
    version = cfg.get("format_version")
    if version != FORMAT_VERSION:
        raise ModelLoadError(
            f"{path / CONFIG_FILE}: unknown format_version {version!r} (this diffusion-lsp reads {FORMAT_VERSION})"
        )
    for key in ("architecture", "regime", "special_ids"):
        if key not in cfg:
            raise ModelLoadError(f"{path / CONFIG_FILE} lacks the field {key!r}")
    if cfg["regime"] not in ("absorbing", "uniform"):
        raise ModelLoadError(f"{path / CONFIG_FILE}: unknown regime {cfg['regime']!r}")


def check_tokenizer(path: Path, cfg: dict[str, Any], tok: Tokenizer) -> None:
    """The checkpoint and its tokenizer must agree on vocabulary size and special ids."""
    vocab = int(cfg["architecture"]["vocab_size"])
    if tok.vocab_size != vocab:
        raise ModelLoadError(
            f"{path}: tokenizer.json has {tok.vocab_size} tokens but the model expects {vocab}: "
            "the tokenizer does not belong to this checkpoint"
        )
    for name, want in cfg["special_ids"].items():
        got = getattr(tok.special, name, None)
        if got != want:
            raise ModelLoadError(
                f"{path}: special token {name!r} is id {got} in tokenizer.json but {want} in config.json: "
                "the tokenizer does not belong to this checkpoint"
            )


def first_id(value: Any) -> int | None:
    """A token id from a config field that holds an id, a list of ids, or null."""
    if isinstance(value, (list, tuple)):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def first_known(*ids: int | None, fallback: int) -> int:
    """The first of `ids` that is not None, else `fallback`."""
    return next((i for i in ids if i is not None), fallback)


# Gemma's tokenizer names for the infill sentinels; a checkpoint may override them in
# config.json under "diffusion_lsp": {"special_tokens": {...}}.
DG_SPECIAL_TOKENS: dict[str, str] = {
    "pad": "<pad>",
    "eof": "<eos>",
    "mask": "",
    "suffix": "<|fim_suffix|>",
    "prefix": "<|fim_prefix|>",
    "middle": "<|fim_middle|>",
}


# ---------------------------------------------------------------------------- decoding defaults

GENERATION_FILE = "generation_config.json"
# A diffusion checkpoint's generation_config.json names its decoding by its family's fields:
# Dream's generate() (steps, alg, temperature), LLaDA's (steps, block_length, remasking),
# Fast-dLLM v2's (block_size, small_block_size, threshold), SDAR's (block_length). Only a
# file with one of these is read: an autoregressive checkpoint's temperature is for its
# chat sampling, not for a canvas.
DIFFUSION_FIELDS = ("steps", "diffusion_steps", "alg", "remasking", "block_length", "block_size", "small_block_size")
# the block the canvas is decoded in, first found: Fast-dLLM v2's sub-block (its blocks of
# block_size are decoded in sub-blocks of small_block_size), LLaDA's and SDAR's block_length
BLOCK_FIELDS = ("small_block_size", "block_length", "block_size")
# their unmasking orders that are ours: the same positions first; how many a step is ours
ALGORITHMS = {"entropy": "entropy_bound", "maskgit_plus": "confidence", "low_confidence": "confidence"}


@dataclass(frozen=True)
class Decoding:
    """A checkpoint's own decoding defaults (generation_config.json): what was read, and
    the sampler defaults it gives (SamplerConfig fields); `notes` says what was not taken."""

    read: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for `diffusion-infill models`: each field read, and what it set."""
        if not self.read:
            return ""
        set_ = ", ".join(f"{k} {v}" for k, v in self.defaults.items())
        read = ", ".join(f"{k} {v}" for k, v in self.read.items())
        return f"{GENERATION_FILE}: {read}" + (f" -> {set_}" if set_ else "") + "".join(f"; {n}" for n in self.notes)


def decoding_defaults(path: Path) -> Decoding:
    """The decoding defaults in `path`'s generation_config.json (none when the file is
    absent, unreadable, or not a diffusion model's): steps -> max_steps, temperature
    (> 0) -> t_max and t_min, alg or remasking -> strategy where the order is ours, the
    block length (`BLOCK_FIELDS`) -> block_length (the canvas decoded block after block),
    threshold (in (0, 1]) -> confidence_threshold."""
    try:
        raw = json.loads((path / GENERATION_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return Decoding()
    if not isinstance(raw, dict) or not any(k in raw for k in DIFFUSION_FIELDS):
        return Decoding()
    fields = ("steps", "diffusion_steps", *BLOCK_FIELDS, "alg", "remasking", "temperature", "threshold")
    read = {k: raw[k] for k in fields if raw.get(k) is not None}
    defaults: dict[str, Any] = {}
    notes: list[str] = []
    steps = read.get("steps", read.get("diffusion_steps"))
    if _count(steps):
        defaults["max_steps"] = steps
    temperature = read.get("temperature")
    if _number(temperature) and temperature > 0:
        defaults["t_max"] = defaults["t_min"] = float(temperature)
    alg = read.get("alg", read.get("remasking"))
    if isinstance(alg, str):
        if alg in ALGORITHMS:
            defaults["strategy"] = ALGORITHMS[alg]
        else:
            notes.append(f"{alg!r} is not an order this engine decodes in: its strategy is kept")
    block = next((read[k] for k in BLOCK_FIELDS if k in read), None)
    if _count(block):
        defaults["block_length"] = block
    threshold = read.get("threshold")
    if _number(threshold) and 0 < threshold <= 1:
        defaults["confidence_threshold"] = float(threshold)
    return Decoding(read, defaults, tuple(notes))


def _count(value: object) -> TypeGuard[int]:
    """A positive int (not a bool) read from a JSON file."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _number(value: object) -> TypeGuard[float]:
    """A number (not a bool) read from a JSON file."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# A Qwen2 or Llama config.json whose checkpoint was trained for diffusion (an open diffusion
# coder ships that way: Qwen2's own layers, a mask token, bidirectional attention at
# generation) is run on the canvas, not one token at a time. What says so:
MASK_TOKEN_NAMES = ("<|mask|>", "<|mdm_mask|>")  # the Dream family's; LLaDA's


def generation_mask_id(path: Path) -> int | None:
    """generation_config.json's mask_token_id (where a diffusion checkpoint keeps it)."""
    return generation_id(path, "mask_token_id")


def generation_id(path: Path, name: str) -> int | None:
    """A token id generation_config.json names under `name` (the first of a list)."""
    try:
        raw = json.loads((path / GENERATION_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    value = raw.get(name) if isinstance(raw, dict) else None
    value = value[0] if isinstance(value, list) and value else value
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# ---------------------------------------------------------------------------- block-causal checkpoints


@dataclass(frozen=True)
class BlockFamily:
    """A block-causal family as its config.json declares it: the model_type, the field that
    holds the block size (and its default when absent), whether position i's logits come
    from hidden state i - 1 (`shifted`, the autoregressive model's shift kept), the
    transformers architecture of its layers, and its published decoding (sampler defaults)."""

    name: str
    size_field: str
    default_size: int
    shifted: bool
    architecture: str  # "qwen2" (q/k/v biases) or "qwen3" (q/k norms)
    defaults: dict[str, Any]


# Fast-dLLM v2's generate(): blocks of 32 decoded in sub-blocks of 8, each step the masks of
# the sub-block above its threshold (0.9 in its chatbot), at least the most probable; the
# first token of a block taken alone from the block before (engine/local/sampler.py).
# SDAR's block_diffusion_generate(): blocks of 4 in 4 steps, low_confidence_dynamic at 0.85
# (the masks above it, at least as many as its static schedule: one a step here).
# max_steps bounds neither: a block is done in at most its length of steps.
BLOCK_FAMILIES: dict[str, BlockFamily] = {
    FAST_DLLM_MODEL_TYPE: BlockFamily(
        "Fast-dLLM v2",
        "bd_size",
        32,
        True,
        "qwen2",
        {"strategy": "confidence", "confidence_threshold": 0.9, "block_length": 8, "max_steps": 1024},
    ),
    SDAR_MODEL_TYPE: BlockFamily(
        "SDAR",
        "block_size",
        4,
        False,
        "qwen3",
        {"strategy": "confidence", "confidence_threshold": 0.85, "max_steps": 1024},
    ),
}


@dataclass(frozen=True)
class BlockCausal:
    """What a block-causal checkpoint declares: its family and its blocks' size."""

    family: BlockFamily
    size: int


def block_causal(path: Path, cfg: dict[str, Any]) -> BlockCausal | None:
    """The blocks a checkpoint's config.json declares (None: not a block-causal family):
    its model_type names the family, the family's field the block size; a size that is
    not a positive integer is a ModelLoadError naming the field."""
    model_type = cfg.get("model_type")
    family = BLOCK_FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        return None
    size = cfg.get(family.size_field, family.default_size)
    if not _count(size):
        raise ModelLoadError(f"{path / CONFIG_FILE}: {family.size_field} must be a positive integer; got {size!r}")
    return BlockCausal(family, size)


def describe_blocks(path: Path) -> str:
    """One line for `diffusion-infill models`: the blocks a block-causal checkpoint's
    config.json declares ("" for any other, or one that cannot be read)."""
    try:
        cfg = read_config(path)
        blocks = block_causal(path, cfg)
    except ModelLoadError:
        return ""
    if blocks is None:
        return ""
    declared = f"{blocks.family.size_field} {blocks.size}" if blocks.family.size_field in cfg else "no size field"
    return f"{CONFIG_FILE}: {declared} -> {blocks.family.name}, block-causal attention in blocks of {blocks.size}"


def diffusion_signal(path: Path, cfg: dict[str, Any], token_id: Callable[[str], int | None]) -> str | None:
    """Why a checkpoint with an autoregressive model_type is diffusion-trained (None: it is
    not): config.json `is_causal: false`; generation_config.json with a mask token or a
    diffusion model's decoding fields; or a mask token in the tokenizer (`token_id` looks
    a name up). A converted GGUF's `mask_token_id` in config.json is not a sign: that row
    is added for `adapt` to train (engine/commands/convert.py)."""
    if cfg.get("is_causal") is False:
        return f"{CONFIG_FILE} says is_causal: false"
    if generation_mask_id(path) is not None:
        return f"{GENERATION_FILE} names a mask_token_id"
    if decoding_defaults(path).read:
        return f"{GENERATION_FILE} has a diffusion model's decoding fields"
    named = next((n for n in MASK_TOKEN_NAMES if token_id(n) is not None), None)
    return f"the tokenizer has the mask token {named}" if named else None
