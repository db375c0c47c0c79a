"""Model directories: what a model is on disk and how to load one safely (the training
side writes them: engine/training/save.py).

An embedded-architecture model directory holds:
    config.json        format_version, model_type "diffusion_coder", architecture, regime,
                       special token ids, defaults for infill and sampling
    tokenizer.json     the byte-level BPE
    model.safetensors  the weights (torch backend)
    encode.onnx, denoise.onnx   the graphs the default onnx backend runs
    MODEL_CARD.md      data, licences, recipe, evaluation

A directory whose config.json has model_type "diffusion_gemma" is a transformers
checkpoint and loads through the diffusion_gemma backend; model_type "Dream" (Dream,
DiffuCoder, Dream-Coder, DreamOn), "qwen2" or "llama" loads through the dream backend
(engine/denoisers/dream.py, docs/models.md).

Weights load only from safetensors and ONNX files, never from pickles, and only from the
local directory: nothing is fetched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.denoisers.base import Denoiser, DenoiserInfo
from engine.errors import ModelLoadError
from engine.models.tokenizer import Tokenizer

FORMAT_VERSION = 1
MODEL_TYPE = "diffusion_coder"
DG_MODEL_TYPE = "diffusion_gemma"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
WEIGHTS_FILE = "model.safetensors"
CARD_FILE = "MODEL_CARD.md"
ENCODE_FILE = "encode.onnx"
DENOISE_FILE = "denoise.onnx"

DREAM_MODEL_TYPES = ("Dream", "dream")  # the Dream family: a diffusion-trained Qwen2
AUTOREGRESSIVE_MODEL_TYPES = ("qwen2", "llama")  # plain checkpoints, run by the dream backend too

BACKENDS: tuple[str, ...] = ("auto", "onnx", "torch", "diffusion_gemma", "dream")
QUANTIZATIONS = ("none", "int8", "4bit")  # DiffusionGemma weights (engine/denoisers/dg_quant.py)

# The shipped default model lives inside the package.
DEFAULT_MODEL_DIR = Path(__file__).resolve().parents[1] / "weights"


@dataclass
class LoadedModel:
    """A ready-to-use model: tokenizer, denoiser and the directory's defaults."""

    path: Path
    tokenizer: Tokenizer
    denoiser: Denoiser
    backend: str
    defaults: dict[str, Any] = field(default_factory=dict)
    languages: frozenset[str] | None = None  # what it was trained on (config.json `languages`); None: any


def _languages(cfg: dict[str, Any], path: Path) -> frozenset[str] | None:
    """config.json's `languages`: the languages the model was trained on (a list of
    names); absent: any language."""
    names = cfg.get("languages")
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ModelLoadError(f"{path / CONFIG_FILE}: `languages` must be a list of language names")
    return frozenset(names)


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


def _require(path: Path, *names: str) -> None:
    missing = [n for n in names if not (path / n).is_file()]
    if missing:
        raise ModelLoadError(f"model directory {path} is missing {', '.join(missing)}")


def _check_embedded(path: Path, cfg: dict[str, Any]) -> None:
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


def _check_tokenizer(path: Path, cfg: dict[str, Any], tok: Tokenizer) -> None:
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


def denoiser_info(cfg: dict[str, Any]) -> DenoiserInfo:
    ids = cfg["special_ids"]
    return DenoiserInfo(
        vocab_size=int(cfg["architecture"]["vocab_size"]),
        regime=cfg["regime"],
        eof_id=int(ids["eof"]),
        pad_id=int(ids["pad"]),
        mask_id=int(ids["mask"]) if ids.get("mask") is not None else None,
        max_positions=int(cfg["architecture"]["max_positions"]),
        suppress_ids=tuple(int(ids[k]) for k in ("mask", "suffix", "prefix", "middle") if ids.get(k) is not None),
        # trained with the next-token loss (the dual objective): the backend may then
        # decode one token at a time; a model trained on the canvas alone has no such head
        autoregressive=bool(cfg.get("autoregressive", False)),
        length_classes=int(cfg["architecture"].get("length_classes", 0)),
    )


def load_model(
    path: Path | None = None, backend: str = "auto", device: str = "cpu", quantization: str = "none"
) -> LoadedModel:
    """Load a model directory with the chosen backend ("auto": onnx for the embedded
    architecture, diffusion_gemma for DiffusionGemma checkpoints, dream for the Dream
    family and plain Qwen2/Llama checkpoints). `quantization` ("none", "int8", "4bit")
    is for DiffusionGemma checkpoints (docs/gpu.md)."""
    path = Path(path) if path is not None else DEFAULT_MODEL_DIR
    if backend not in BACKENDS:
        raise ModelLoadError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    cfg = read_config(path)
    model_type = cfg.get("model_type")
    if model_type == DG_MODEL_TYPE:
        if backend not in ("auto", "diffusion_gemma"):
            raise ModelLoadError(f"{path} is a DiffusionGemma checkpoint: use backend diffusion_gemma, not {backend}")
        return _load_diffusion_gemma(path, cfg, device, quantization)
    if model_type in DREAM_MODEL_TYPES + AUTOREGRESSIVE_MODEL_TYPES:
        if backend not in ("auto", "dream"):
            raise ModelLoadError(f"{path} is a {model_type} checkpoint: use backend dream, not {backend}")
        if quantization != "none":
            raise ModelLoadError(f"quantization {quantization!r} is for DiffusionGemma checkpoints, not {model_type}")
        return _load_dream(path, cfg, device)
    if backend == "dream":
        raise ModelLoadError(f"{path} is not a Dream, Qwen2 or Llama checkpoint (model_type {model_type!r})")
    if model_type != MODEL_TYPE:
        raise ModelLoadError(f"{path / CONFIG_FILE}: unknown model_type {model_type!r}")
    if backend == "diffusion_gemma":
        raise ModelLoadError(f"{path} is not a DiffusionGemma checkpoint (model_type {model_type!r})")
    if quantization != "none":
        raise ModelLoadError(
            f"quantization {quantization!r} is for DiffusionGemma checkpoints; {path} is the embedded "
            "architecture (already small: use quantization 'none')"
        )
    _check_embedded(path, cfg)
    _require(path, TOKENIZER_FILE)
    tok = Tokenizer.from_file(path / TOKENIZER_FILE)
    _check_tokenizer(path, cfg, tok)
    info = denoiser_info(cfg)
    arch = cfg["architecture"]
    if backend in ("auto", "onnx"):
        _require(path, ENCODE_FILE, DENOISE_FILE)
        from engine.denoisers.onnx import OnnxDenoiser

        providers = _onnx_providers(device)
        head_dim = int(arch["d_model"]) // int(arch["n_heads"])
        shape = (int(arch["n_layers"]), int(arch["n_heads"]), head_dim)
        den: Denoiser = OnnxDenoiser(path / ENCODE_FILE, path / DENOISE_FILE, info, shape, providers)
        chosen = "onnx"
    else:
        _require(path, WEIGHTS_FILE)
        den = _load_torch(path, arch, info, device)
        chosen = "torch"
    return LoadedModel(
        path=path,
        tokenizer=tok,
        denoiser=den,
        backend=chosen,
        defaults=dict(cfg.get("defaults", {})),
        languages=_languages(cfg, path),
    )


def _onnx_providers(device: str) -> list[Any] | None:
    """onnxruntime execution providers for a device; CUDA needs onnxruntime-gpu."""
    if not device.startswith("cuda"):
        return None
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise ModelLoadError(
            f"device {device} needs onnxruntime's CUDA provider: pip install 'diffusion-lsp[gpu]' "
            "(and uninstall the CPU-only onnxruntime)"
        )
    index = device.partition(":")[2] or "0"
    return [("CUDAExecutionProvider", {"device_id": int(index)}), "CPUExecutionProvider"]


def _load_torch(path: Path, arch: dict[str, Any], info: DenoiserInfo, device: str) -> Denoiser:
    try:
        import torch
    except ImportError as exc:
        raise ModelLoadError("the torch backend needs torch: pip install 'diffusion-lsp[torch]'") from exc
    from engine.denoisers.torch import TorchDenoiser
    from engine.models.embedded import DiffusionCoder, ModelConfig

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device} requested, but torch sees no CUDA device")
    model = DiffusionCoder(ModelConfig(**arch))
    load_weights(model, path / WEIGHTS_FILE)
    return TorchDenoiser(model, info, device)


def load_weights(model: Any, file: Path) -> None:
    """safetensors -> model, as float32; a shape or name mismatch is a clear error."""
    from safetensors.torch import load_file

    try:
        state = load_file(str(file))
    except Exception as exc:  # safetensors raises its own error types
        raise ModelLoadError(f"cannot read weights {file}: {exc}") from exc
    state = {k: v.float() for k, v in state.items()}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"weights in {file} do not fit the architecture in config.json: {exc}") from exc


def _load_diffusion_gemma(path: Path, cfg: dict[str, Any], device: str, quantization: str = "none") -> LoadedModel:
    try:
        from engine.denoisers.diffusion_gemma import DiffusionGemmaDenoiser
    except ImportError as exc:
        raise ModelLoadError(
            "DiffusionGemma checkpoints need torch and transformers>=5.23: pip install 'diffusion-lsp[torch]'"
        ) from exc
    _require(path, TOKENIZER_FILE)
    names = dict(cfg.get("diffusion_lsp", {}).get("special_tokens", DG_SPECIAL_TOKENS))
    tok = Tokenizer.from_file(path / TOKENIZER_FILE, names)
    den = DiffusionGemmaDenoiser.from_dir(path, device=device, quantization=quantization)
    if tok.vocab_size > den.info.vocab_size:
        raise ModelLoadError(
            f"{path}: tokenizer.json has {tok.vocab_size} tokens but the model only {den.info.vocab_size}: "
            "the tokenizer does not belong to this checkpoint"
        )
    for name, want in (("eof", den.info.eof_id), ("pad", den.info.pad_id)):
        got = getattr(tok.special, name)
        if got != want:
            raise ModelLoadError(
                f"{path}: the tokenizer's {name} token is id {got} but the model's is {want}: "
                "the tokenizer does not belong to this checkpoint (or set diffusion_lsp.special_tokens in config.json)"
            )
    defaults = {"regime": "uniform", **cfg.get("diffusion_lsp", {}).get("defaults", {})}
    return LoadedModel(path=path, tokenizer=tok, denoiser=den, backend="diffusion_gemma", defaults=defaults)


def _load_dream(path: Path, cfg: dict[str, Any], device: str) -> LoadedModel:
    """A Dream-family or plain Qwen2/Llama checkpoint through the dream backend. Special
    ids come from config.json (eos, pad, bos, mask_token_id) and the tokenizer (the
    fill-in-the-middle markers); config.json's optional "diffusion_lsp" section may set
    "special_tokens" (names), "autoregressive", "cache" ("exact" or "dual") and "defaults"."""
    try:
        from engine.denoisers import dream
    except ImportError as exc:
        raise ModelLoadError(f"{path} needs torch and transformers: pip install 'diffusion-lsp[torch]'") from exc
    _require(path, TOKENIZER_FILE)
    hf = Tokenizer.read(path / TOKENIZER_FILE)
    own = cfg.get("diffusion_lsp", {})
    model_type = cfg["model_type"]
    vocab = int(cfg.get("vocab_size", 0))
    eos = first_id(cfg.get("eos_token_id"))
    if eos is None:
        raise ModelLoadError(f"{path / CONFIG_FILE} defines no eos_token_id")
    # DiffuCoder pads the canvas after the fill with its own token; the others with pad or eos
    pad = _first_known(hf.token_to_id("<|dlm_pad|>"), first_id(cfg.get("pad_token_id")), fallback=eos)
    mask = first_id(cfg.get("mask_token_id"))
    if mask is None:
        mask = hf.token_to_id("<|mask|>")
    if mask is None and vocab > hf.get_vocab_size():
        mask = hf.get_vocab_size()  # an autoregressive checkpoint: its first unused row (adapt trains it)
    if mask is None:
        raise ModelLoadError(f"{path}: no mask token (config.json mask_token_id) and no unused row to use as one")
    names = {
        "pad": hf.id_to_token(pad) or "",
        "eof": hf.id_to_token(eos) or "",
        "mask": hf.id_to_token(mask) or "",
        "suffix": DG_SPECIAL_TOKENS["suffix"],
        "prefix": DG_SPECIAL_TOKENS["prefix"],
        "middle": DG_SPECIAL_TOKENS["middle"],
        **own.get("special_tokens", {}),
    }
    tok = Tokenizer(hf, names)
    if tok.vocab_size > vocab:
        raise ModelLoadError(
            f"{path}: tokenizer.json has {tok.vocab_size} tokens but the model only {vocab}: "
            "the tokenizer does not belong to this checkpoint"
        )
    # Dream's evaluations and DreamOn put <|beginoftext|> first; Qwen2 configs name a bos
    start = _first_known(hf.token_to_id("<|beginoftext|>"), first_id(cfg.get("bos_token_id")), fallback=eos)
    sp = tok.special
    specials = dream.Specials(
        mask=mask,
        eof=sp.eof,
        pad=sp.pad,
        start=start,
        fim_prefix=sp.prefix,
        fim_suffix=sp.suffix,
        fim_middle=sp.middle,
    )
    # never sampled: the tokenizer's special tokens (but the ends) and the rows it never produces
    special = [i for i, t in hf.get_added_tokens_decoder().items() if t.special and i not in (sp.eof, sp.pad)]
    suppress = [*special, *range(tok.vocab_size, vocab)]
    cache = own.get("cache", "exact")
    if cache not in dream.CACHE_MODES:
        raise ModelLoadError(f"{path / CONFIG_FILE}: diffusion_lsp.cache must be one of {', '.join(dream.CACHE_MODES)}")
    autoregressive = bool(own.get("autoregressive", model_type in AUTOREGRESSIVE_MODEL_TYPES))
    model = dream.load_causal_model(path, cfg, device)
    den = dream.DreamDenoiser(model, specials, autoregressive=autoregressive, cache=cache, suppress_ids=suppress)
    # an autoregressive checkpoint's canvas is untrained: it decodes one token at a time
    defaults = {"strategy": "autoregressive"} if model_type in AUTOREGRESSIVE_MODEL_TYPES else {}
    defaults.update(own.get("defaults", {}))
    return LoadedModel(path=path, tokenizer=tok, denoiser=den, backend="dream", defaults=defaults)


def first_id(value: Any) -> int | None:
    """A token id from a config field that holds an id, a list of ids, or null."""
    if isinstance(value, (list, tuple)):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def _first_known(*ids: int | None, fallback: int) -> int:
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
