"""The diffusion_gemma backend: runs transformers' DiffusionGemmaForBlockDiffusion as a Denoiser.

`prefill` runs the causal encoder (`model.model.encoder`) over the context into a
transformers `DynamicCache`; `denoise` runs one decoder forward pass (`model.forward` with
`decoder_input_ids`, `self_conditioning_logits`, the decoder mask mapping, the encoder cache
and `decoder_position_ids`) for a canvas placed right after the context. Both calls are
made exactly as `DiffusionGemmaGenerationMixin.generate` makes them for the first canvas
after a prompt, so the logits equal the ones generate() computes, and `TorchRandomSource`
draws random numbers with the same torch calls in the same order, so a seeded sampler run
reproduces a generate() call seeded with `torch.manual_seed(seed)`.

Cache sharing: an `EncodedContext` built here is never mutated. The decoder only reads the
cache (it concatenates the canvas keys/values into new tensors), and `prefill` extends or
crops a *fork* of a given state's cache: new layer objects that share the (never
modified in place) key/value tensors of the original.

GPU options (all off by default; see docs/gpu.md): `static_cache=True` denoises against
fixed-size context buffers (`dg_static`), so every step for a (batch, canvas) shape has
the same tensor shapes; `cuda_graph=True` (CUDA only, implies the static cache) captures
the whole step for each shape in `graph_shapes` at construction, so that capture never
lands on an editor request (`warmup_s` says how long it took); `experts` picks
transformers' MoE implementation ("grouped_mm", its default and graph-safe; "batched_mm";
"eager", a Python loop over the experts that are hit).
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    import torch
    from transformers import DiffusionGemmaForBlockDiffusion
    from transformers.cache_utils import Cache, DynamicCache
except ImportError as exc:
    raise ImportError(
        "The diffusion_gemma backend needs torch and transformers (>= 5.23, with DiffusionGemma). "
        "Install them with: pip install 'diffusion-lsp[torch]'"
    ) from exc

from engine.denoisers import quant
from engine.denoisers.base import DenoiserInfo, EncodedContext, Prompt, PromptLayout, as_prompt
from engine.denoisers.dg_graph import StepGraph, graph_unavailable_reason
from engine.denoisers.dg_static import StaticContext, static_step
from engine.denoisers.hf_cache import cache_nbytes, cropped, expand_cache
from engine.denoisers.hf_device import compute_dtype, resolve_device
from engine.denoisers.kv import common_prefix_len
from engine.denoisers.layouts import Plain, suffix_first
from engine.denoisers.loading import LoadedModel
from engine.denoisers.torch import OnModelDevice, TorchRandomSource
from engine.errors import ModelLoadError
from engine.models.directory import DG_SPECIAL_TOKENS, TOKENIZER_FILE, first_id, require
from engine.models.tokenizer import Tokenizer


def _as_dtype(value: Any) -> torch.dtype:
    """A config's dtype (a torch dtype or its name) as a torch dtype (bfloat16 when unknown)."""
    if isinstance(value, torch.dtype):
        return value
    resolved = getattr(torch, str(value).removeprefix("torch."), None)
    return resolved if isinstance(resolved, torch.dtype) else torch.bfloat16


def _cache_keyword() -> str:
    """The name transformers gives the cache argument: `past_key_values` up to 5.23,
    `cache` from 5.24 (where the old name is deprecated, and refused by the mask helpers)."""
    from transformers.models.diffusion_gemma.modeling_diffusion_gemma import DiffusionGemmaDecoderModel

    params = inspect.signature(DiffusionGemmaDecoderModel.create_diffusion_decoder_attention_mask).parameters
    return "cache" if "cache" in params else "past_key_values"


_CACHE_KW = _cache_keyword()

__all__ = ["DiffusionGemmaDenoiser", "ModelLoadError", "TorchRandomSource"]

_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")

# Static-cache context buffers cover this many tokens unless told otherwise: the engine's
# context budget is far below it, and full-attention buffers grow linearly with it.
DEFAULT_MAX_PROMPT = 4096
EXPERTS_IMPLEMENTATIONS = ("grouped_mm", "batched_mm", "eager")

log = logging.getLogger(__name__)


class DiffusionGemmaDenoiser(OnModelDevice):
    """Denoiser over a DiffusionGemmaForBlockDiffusion model (uniform regime, self-conditioned).

    `prefill` returns a batch-1 state; `denoise` accepts any batch B of canvases against it
    (the cache is expanded, not copied) and returns raw float32 logits (B, C, V), i.e. the
    decoder output after final-logit softcapping and before any temperature.
    """

    def __init__(
        self,
        model: DiffusionGemmaForBlockDiffusion,
        *,
        static_cache: bool = False,
        max_prompt: int | None = None,
        cuda_graph: bool = False,
        graph_shapes: Sequence[tuple[int, int]] = (),
        experts: str | None = None,
        layout: PromptLayout | None = None,
    ) -> None:
        """layout: the prompt format (default: plain, no markers; `load_dir` gives the
            suffix-prefix-middle order with the tokenizer's fill-in-the-middle markers).
        static_cache: denoise against fixed-size context buffers of `max_prompt` tokens
            (default min(DEFAULT_MAX_PROMPT, max_positions)); longer contexts fall back to
            the dynamic path.
        cuda_graph: capture the step for each (batch, canvas) in `graph_shapes` now; off
            CUDA this is skipped (logged, reason in `graph_status`) and the static path runs.
        experts: transformers' experts implementation, one of EXPERTS_IMPLEMENTATIONS.
        """
        self.model = model
        self.layout: PromptLayout = Plain() if layout is None else layout
        config = model.config
        text = config.get_text_config()
        gen = getattr(model, "generation_config", None)
        eos = first_id(getattr(gen, "eos_token_id", None))
        if eos is None:
            eos = first_id(getattr(text, "eos_token_id", None))
        pad = first_id(getattr(gen, "pad_token_id", None))
        if pad is None:
            pad = first_id(getattr(text, "pad_token_id", None))
        if eos is None:
            raise ModelLoadError("the DiffusionGemma config defines no eos_token_id")
        self.info = DenoiserInfo(
            vocab_size=int(text.vocab_size),
            regime="uniform",
            eof_id=eos,
            pad_id=pad if pad is not None else 0,
            mask_id=None,
            max_positions=int(text.max_position_embeddings),
            uses_self_conditioning=True,
        )
        if experts is not None:
            if experts not in EXPERTS_IMPLEMENTATIONS:
                raise ValueError(f"experts must be one of {EXPERTS_IMPLEMENTATIONS}; got {experts!r}")
            model.set_experts_implementation(experts)
        self.static: StaticContext | None = None
        self.graphs: dict[tuple[int, int], StepGraph] = {}
        self.graph_status = "off"
        self.warmup_s = 0.0
        if static_cache or cuda_graph:
            limit = max_prompt if max_prompt is not None else min(DEFAULT_MAX_PROMPT, self.info.max_positions - 1)
            self.static = StaticContext(model, limit)
        if cuda_graph:
            self._capture_graphs(graph_shapes)

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_dir(
        cls,
        path: str | os.PathLike[str],
        device: str = "auto",
        dtype: torch.dtype | str | None = None,
        quantization: str = "none",
        **options: Any,
    ) -> DiffusionGemmaDenoiser:
        """Load a local checkpoint directory (config.json + safetensors weights).

        device: "auto" (cuda when available, else mps, else cpu), "cpu", "cuda", "cuda:N"
            or "mps" (engine.denoisers.hf_device).
        dtype: a torch dtype or its name; None keeps the checkpoint's dtype on cuda, uses
            float32 on cpu and bfloat16 (else float16) on mps. Only safetensors are read (never pickles), only from disk.
        quantization: "none", "int8" or "4bit" (engine.denoisers.quant): the memory it
            needs is checked against the device's free memory first; the checkpoint is
            quantized on the host as it is loaded, then moved to the device.
        options: passed to the constructor (static_cache, max_prompt, cuda_graph,
            graph_shapes, experts); graphs are captured here, at load.
        """
        root = _checkpoint_dir(path)
        device = resolve_device(device, root)
        if isinstance(dtype, str):
            resolved = getattr(torch, dtype, None)
            if not isinstance(resolved, torch.dtype):
                raise ValueError(f"unknown torch dtype {dtype!r}")
            dtype = resolved
        if quantization not in quant.QUANTIZATIONS:
            raise ModelLoadError(
                f"unknown quantization {quantization!r}; choose one of {', '.join(quant.QUANTIZATIONS)}"
            )
        torch_dtype: torch.dtype | str = dtype if dtype is not None else _default_dtype(device)
        model = _load_checked(root, device, torch_dtype, quantization)
        model.eval()
        return cls(model, **options)

    # ------------------------------------------------------------------ protocol

    def prefill(self, prompt: Prompt | Sequence[int], state: EncodedContext | None = None) -> EncodedContext:
        """Encode the laid-out prompt into a batch-1 encoder KV cache, reusing `state`'s common prefix.

        Reuse: the new ids extend the state's ids -> fork its cache and encode the rest;
        they diverge (or are shorter) -> fork, crop to the common prefix and encode the
        rest, when every cache layer still holds all its tokens (sliding-window layers past
        their window do not); otherwise encode from scratch.
        """
        ids = self.layout.ids(as_prompt(prompt))
        if not ids:
            raise ValueError("DiffusionGemma needs at least one context token (e.g. BOS) to denoise against")
        if len(ids) > self.info.max_positions:
            raise ValueError(f"context of {len(ids)} tokens exceeds max_positions={self.info.max_positions}")
        cache: Cache | None = None
        start = 0
        if state is not None and isinstance(state.payload, Cache):
            old = state.token_ids
            common = common_prefix_len(old, ids)
            if common == len(old) == len(ids):
                return EncodedContext(token_ids=ids, payload=state.payload, nbytes=state.nbytes)
            if common > 0 and (cache := cropped(state.payload, common)) is not None:
                start = common
        if cache is None:
            cache = DynamicCache(config=self.model.config.get_text_config(decoder=True))
            start = 0
        if start < len(ids):
            self._run_encoder(cache, ids, start)
        return EncodedContext(token_ids=ids, payload=cache, nbytes=cache_nbytes(cache))

    def denoise(self, state: EncodedContext, canvas_ids: Any, self_cond: Any | None = None) -> torch.Tensor:
        """One decoder pass: canvas (B, C) int ids -> raw float32 logits (B, C, V).

        The canvas occupies positions len(state.token_ids) ... + C - 1. `self_cond` is the
        previous step's processed (temperature-scaled) logits; like generate() it is cast to
        the embedding dtype before the model sees it.
        """
        cache = state.payload
        if not isinstance(cache, Cache):
            raise TypeError("state was not made by DiffusionGemmaDenoiser.prefill")
        device = self.device
        cur_len = len(state.token_ids)
        canvas = self.canvas_tensor(canvas_ids, cur_len)
        batch, length = canvas.shape
        sc = None
        if self_cond is not None:
            sc = torch.as_tensor(self_cond, device=device).to(self.model.model.decoder.embed_tokens.weight.dtype)
            if sc.shape[:2] != canvas.shape:
                raise ValueError(f"self_cond shape {tuple(sc.shape)} does not match canvas {tuple(canvas.shape)}")
        static = self.static
        if static is not None and static.fits(cur_len) and type(cache) is DynamicCache:
            static.load(cache, state.token_ids)
            graph = self.graphs.get((batch, length))
            if graph is not None:
                return graph.run(canvas, sc)
            with torch.no_grad():
                return static_step(self.model, static, canvas, sc, None, _CACHE_KW)
        with torch.no_grad():
            batch_cache = expand_cache(cache, batch)
            decoder_attention_mask = torch.ones((batch, cur_len + length), dtype=torch.bool, device=device)
            decoder_position_ids = torch.arange(cur_len, cur_len + length, dtype=torch.int32, device=device).unsqueeze(
                0
            )
            mask_mapping = self.model.model.decoder.create_diffusion_decoder_attention_mask(
                config=self.model.config,
                inputs_embeds=canvas.unsqueeze(-1),
                **{_CACHE_KW: batch_cache},
                decoder_attention_mask=decoder_attention_mask,
            )
            out = self.model(
                decoder_input_ids=canvas,
                self_conditioning_logits=sc,
                decoder_attention_mask=mask_mapping,
                **{_CACHE_KW: batch_cache},
                decoder_position_ids=decoder_position_ids,
            )
        return out.logits

    # ------------------------------------------------------------------ internals

    def _capture_graphs(self, shapes: Sequence[tuple[int, int]]) -> None:
        """Warm up and capture one CUDA graph per (batch, canvas) shape; record the time."""
        assert self.static is not None
        reason = graph_unavailable_reason(self.device)
        if reason is not None:
            self.graph_status = f"skipped: {reason}"
            log.warning("CUDA graph capture %s; using the static-cache path", self.graph_status)
            return
        start = time.perf_counter()
        for batch, canvas in shapes:
            self.graphs[(int(batch), int(canvas))] = StepGraph(self.model, self.static, batch, canvas, _CACHE_KW)
        self.warmup_s = time.perf_counter() - start
        self.graph_status = f"captured {len(self.graphs)} shape(s) in {self.warmup_s:.2f} s"
        log.info("CUDA graphs %s", self.graph_status)

    def _run_encoder(self, cache: Cache, ids: tuple[int, ...], start: int) -> None:
        """Encode ids[start:] into `cache` (which holds ids[:start]) as generate() does."""
        model = self.model
        device = self.device
        cur_len = len(ids)
        new_ids = torch.tensor([ids[start:]], dtype=torch.long, device=device)
        position_ids = torch.arange(start, cur_len, dtype=torch.int32, device=device).unsqueeze(0)
        attention_mask = torch.ones((1, cur_len), dtype=torch.bool, device=device)
        with torch.no_grad():
            dummy = torch.empty((1, new_ids.shape[1], 0), dtype=model.dtype, device=device)
            mask_mapping = model.model.encoder.create_masks_for_generate(
                config=model.config,
                inputs_embeds=dummy,
                attention_mask=attention_mask,
                **{_CACHE_KW: cache},
                position_ids=position_ids,
                mm_token_type_ids=None,
            )
            model.model.encoder(
                input_ids=new_ids,
                attention_mask=mask_mapping,
                **{_CACHE_KW: cache},
                position_ids=position_ids,
            )


def _checkpoint_dir(path: str | os.PathLike[str]) -> Path:
    """The checkpoint directory, with its config and safetensors weights present."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ModelLoadError(f"DiffusionGemma model directory not found: {root}")
    if not (root / "config.json").is_file():
        raise ModelLoadError(f"no config.json in DiffusionGemma model directory {root}")
    if not any((root / name).is_file() for name in _WEIGHT_FILES):
        raise ModelLoadError(
            f"no safetensors weights ({' or '.join(_WEIGHT_FILES)}) in DiffusionGemma model directory {root}"
        )
    return root


def _default_dtype(device: str) -> torch.dtype | str:
    """The checkpoint's own dtype on cuda ("auto"), float32 on cpu, bfloat16 or float16 on mps."""
    if device.startswith("cuda"):
        return "auto"
    return compute_dtype(device, torch.bfloat16)


def _load_checked(
    root: Path, device: str, torch_dtype: torch.dtype | str, quantization: str
) -> DiffusionGemmaForBlockDiffusion:
    """The model, after checking that it fits the device at that quantization (and the
    host, where it is quantized while loading)."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(root), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"could not read the DiffusionGemma config in {root}: {exc}") from exc
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.bfloat16
    compute = torch_dtype if isinstance(torch_dtype, torch.dtype) else _as_dtype(stored)
    meta = quant.meta_model(DiffusionGemmaForBlockDiffusion, config)
    quant.check_before_loading(meta, quantization, compute, compute, device, root)  # type: ignore[arg-type]
    del meta
    kwargs: dict[str, Any] = {
        "local_files_only": True,
        "trust_remote_code": False,
        "use_safetensors": True,
        "dtype": torch_dtype,
    }
    if device.startswith("cuda") and quantization == "none":
        kwargs["device_map"] = device
    try:
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(str(root), **kwargs)
        if quantization != "none":
            quant.quantize_model(model, quantization)  # type: ignore[arg-type]
        if device != "cpu" and (quantization != "none" or not device.startswith("cuda")):
            model.to(device)  # type: ignore[arg-type]
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"could not load DiffusionGemma model from {root}: {exc}") from exc
    return model


def load_dir(path: Path, cfg: dict[str, Any], *, device: str = "cpu", quantization: str = "none") -> LoadedModel:
    """A DiffusionGemma checkpoint directory with its tokenizer (Gemma's fill-in-the-middle
    markers, or config.json's diffusion_lsp.special_tokens), checked against each other."""
    require(path, TOKENIZER_FILE)
    own = cfg.get("diffusion_lsp", {})
    tok = Tokenizer.from_file(path / TOKENIZER_FILE, dict(own.get("special_tokens", DG_SPECIAL_TOKENS)))
    den = DiffusionGemmaDenoiser.from_dir(path, device=device, quantization=quantization, layout=suffix_first(tok))
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
    defaults = {"regime": "uniform", **own.get("defaults", {})}
    return LoadedModel(path=path, tokenizer=tok, denoiser=den, backend="diffusion_gemma", defaults=defaults)
