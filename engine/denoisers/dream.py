"""The dream backend: Dream-architecture checkpoints run through transformers' own modules.

The Dream family (Dream-v0, DiffuCoder, Dream-Coder, DreamOn) are Qwen2 decoders adapted
from autoregressive models: the same layers with full (bidirectional) attention, a mask
token, and logits shifted by one position (the hidden state at position i predicts token
i + 1, as in the autoregressive model they came from). This backend builds them from
transformers' Qwen2 (or Llama) classes, with no remote code: a full-attention mask is a
4D mask of zeros handed to the same layers, and the shift is `_canvas_logits`, the one
place that reads logits for canvas positions. The same class runs a plain Qwen2 or Llama
checkpoint (an autoregressive model, e.g. one converted from GGUF by
`diffusion-infill convert-gguf`), whose one-token mode is the model itself and whose
canvas is untrained until `diffusion-infill adapt` trains it.

Layouts. The engine hands every backend a `Prompt` (prefix P, suffix S, and M: the
tokens of the fill accepted so far, empty at first); this backend's `DreamLayout` lays it
out as the family was trained, and nothing is parsed back:
- the canvas (bidirectional): `start P M [canvas] S eos`, in place, as Dream-Coder and
  DreamOn infill (they use no fill-in-the-middle tokens), where `start` is the
  tokenizer's `<|beginoftext|>` (else the config's BOS, else its end-of-text token), so
  that the first canvas position has a hidden state before it to be predicted from;
- the one-token mode (causal): `<fim_prefix> P <fim_suffix> S <fim_middle> M`, the
  prefix-suffix-middle format of Qwen2.5-Coder's fill-in-the-middle training.
A plain prompt (bare token ids) is all prefix, after `start`, in both.

Context reuse. Under full attention every context token attends to the canvas, so no
exact cache of the context survives a denoising step: `cache="exact"` (the default) runs
the whole `start P M canvas S` sequence at every step, as Dream's own generate() does.
`cache="dual"` is Fast-dLLM's approximation: the keys and values of the prefix and the
suffix come from one full pass at the first step of a fill (canvas as it was then) and
are reused by the later steps, which run only the canvas and the last prefix token
(C + 1 queries instead of the whole sequence). The one-token mode's causal cache is exact
and is reused across keystrokes like the other backends' (the longest common prefix of
the causal sequence). A cached state is never written (engine.denoisers.hf_cache).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM
    from transformers.cache_utils import Cache, DynamicCache
except ImportError as exc:
    raise ImportError("The dream backend needs torch and transformers: pip install 'diffusion-lsp[torch]'") from exc

from engine.denoisers.base import EncodedContext, Prompt, as_prompt
from engine.denoisers.hf_cache import CACHE_KW, cache_nbytes, cropped, expand_cache, fork_cache
from engine.denoisers.hf_load import load_pretrained, qwen_config
from engine.denoisers.kv import common_prefix_len
from engine.denoisers.layouts import (
    ONE_TOKEN_OFF,
    DreamLayout,
    LengthEdits,
    Parts,
    Specials,
    decoding_type,
    dream_mode,
    dream_tokens,
    length_edits,
)
from engine.denoisers.loading import LoadedModel
from engine.denoisers.torch import OnModelDevice
from engine.errors import ModelLoadError
from engine.models.directory import (
    CONFIG_FILE,
    TOKENIZER_FILE,
    decoding_defaults,
    generation_mask_id,
    require,
)
from engine.models.table import DREAM_MODEL_TYPES
from engine.models.tokenizer import Tokenizer

log = logging.getLogger(__name__)

CACHE_MODES = ("exact", "dual")


@dataclass(frozen=True)
class DreamPayload:
    parts: Parts
    cache: Cache | None  # the one-token mode's keys and values over parts.causal
    next_logits: torch.Tensor | None  # (V,) after parts.causal


class DreamDenoiser(OnModelDevice):
    """Denoiser (and Autoregressive) over a Qwen2/Llama model: absorbing canvas with the
    checkpoint's mask token, shifted logits; `prefill` returns a batch-1 state and
    `denoise` takes any batch of canvases against it, returning float32 logits (B, C, V)."""

    def __init__(
        self,
        model: PreTrainedModel,
        specials: Specials,
        *,
        autoregressive: bool,
        cache: str = "exact",
        suppress_ids: Sequence[int] = (),
        edits: LengthEdits | None = None,
    ) -> None:
        if cache not in CACHE_MODES:
            raise ValueError(f"cache must be one of {', '.join(CACHE_MODES)}; got {cache!r}")
        self.model = model
        self.sp = specials
        self.layout = DreamLayout(specials)
        self.cache_mode = cache
        self.length_edits = edits  # DreamOn's <|expand|>/<|delete|>: the sampler changes the canvas's length
        cfg = model.config
        self.info = specials.info(int(cfg.vocab_size), int(cfg.max_position_embeddings), suppress_ids, autoregressive)
        self._dual: tuple[tuple[tuple[int, ...], int], Cache] | None = None  # (state ids, canvas length) -> K/V

    # ------------------------------------------------------------------ protocol

    def prefill(self, prompt: Prompt | Sequence[int], state: EncodedContext | None = None) -> EncodedContext:
        """Lay the prompt out; with the one-token mode, run its causal pass now (reusing
        the longest common prefix of `state`'s), so that the cached state's size is known."""
        parts = self.layout.parts(as_prompt(prompt))
        longest = max(len(parts.before) + len(parts.after), len(parts.causal))
        if longest >= self.info.max_positions:
            raise ValueError(f"context of {longest} tokens exceeds max_positions={self.info.max_positions}")
        cache = next_logits = None
        if self.info.autoregressive:
            old = state.payload if state is not None and isinstance(state.payload, DreamPayload) else None
            cache, logits = self._causal(parts.causal, old)
            next_logits = logits[-1]
        payload = DreamPayload(parts, cache, next_logits)
        return EncodedContext(parts.causal, payload, nbytes=cache_nbytes(cache) if cache is not None else 0)

    def prefill_part(self, ids: Sequence[int], state: EncodedContext | None = None) -> EncodedContext:
        """The one-token mode's cache over `ids`, the start of a causal sequence (PartEncoder);
        nothing to cache without that mode."""
        seq = tuple(int(t) for t in ids)
        if len(seq) >= self.info.max_positions:
            raise ValueError(f"context of {len(seq)} tokens exceeds max_positions={self.info.max_positions}")
        if not self.info.autoregressive or not seq:
            return EncodedContext(seq, DreamPayload(Parts((), (), seq), None, None), nbytes=0)
        old = state.payload if state is not None and isinstance(state.payload, DreamPayload) else None
        cache, logits = self._causal(seq, old)
        return EncodedContext(seq, DreamPayload(Parts((), (), seq), cache, logits[-1]), nbytes=cache_nbytes(cache))

    def denoise(self, state: EncodedContext, canvas_ids: Any, self_cond: Any | None = None) -> torch.Tensor:
        """One bidirectional pass: canvas (B, C) -> float32 logits (B, C, V), the canvas in
        place between the prefix and the suffix."""
        parts = self._parts(state)
        canvas = self.canvas_tensor(canvas_ids, len(parts.before) + len(parts.after))
        with torch.inference_mode():
            if self.length_edits is not None and (lengths := self._row_lengths(canvas)).min() < canvas.shape[1]:
                return self._ragged_step(parts, canvas, lengths)
            if self.cache_mode == "dual":
                return self._dual_step(state.token_ids, parts, canvas)
            return self._exact_step(parts, canvas)

    # ------------------------------------------------ the one-token mode (Autoregressive)

    def next_logits(self, state: EncodedContext) -> torch.Tensor:
        """(V,) logits of the token after the state's causal sequence."""
        pay = self._payload(state)
        if pay.next_logits is None:
            raise NotImplementedError(ONE_TOKEN_OFF)
        return pay.next_logits

    def extend(self, state: EncodedContext, new_ids: Sequence[int]) -> tuple[EncodedContext, torch.Tensor]:
        """`state` with `new_ids` appended to the fill, and the next-token logits after
        each of them (T, V). Never mutates `state`."""
        pay = self._payload(state)
        if pay.cache is None:
            raise NotImplementedError(ONE_TOKEN_OFF)
        new = tuple(int(t) for t in new_ids)
        if not new:
            raise ValueError("extend needs at least one token")
        cache = fork_cache(pay.cache)
        logits = self._run_causal(cache, new, len(pay.parts.causal))
        parts = pay.parts.extended(new)
        out = EncodedContext(parts.causal, DreamPayload(parts, cache, logits[-1]), cache_nbytes(cache))
        return out, logits

    def cut(self, state: EncodedContext, length: int) -> EncodedContext:
        """`state` without the tokens `extend` appended after its first `length`: its
        cache cropped (or the kept sequence run again where it cannot be), and the last
        kept token run again for its next-token logits."""
        pay = self._payload(state)
        if length >= len(pay.parts.causal):
            return state
        if pay.cache is None:
            raise NotImplementedError(ONE_TOKEN_OFF)
        parts = pay.parts.cut(length)
        cache, logits = self._causal(parts.causal, pay)
        return EncodedContext(parts.causal, DreamPayload(parts, cache, logits[-1]), cache_nbytes(cache))

    # ------------------------------------------------------------------ internals

    def _payload(self, state: EncodedContext) -> DreamPayload:
        if not isinstance(state.payload, DreamPayload):
            raise TypeError("state was not made by DreamDenoiser.prefill")
        return state.payload

    def _parts(self, state: EncodedContext) -> Parts:
        return self._payload(state).parts

    def _causal(self, seq: tuple[int, ...], old: DreamPayload | None) -> tuple[Cache, torch.Tensor]:
        """The causal cache over `seq` and the next-token logits of its new tokens (at
        least the last one is run, for its logits)."""
        cache: Cache | None = None
        start = 0
        if old is not None and old.cache is not None:
            keep = min(common_prefix_len(old.parts.causal, seq), len(seq) - 1)
            if keep > 0 and (cache := cropped(old.cache, keep)) is not None:
                start = keep
        if cache is None:
            cache = DynamicCache(config=self.model.config)
        return cache, self._run_causal(cache, seq[start:], start)

    def _run_causal(self, cache: Cache, new: Sequence[int], start: int) -> torch.Tensor:
        """Run `new` causally after the `start` tokens in `cache` (which grows): (T, V) logits."""
        ids = torch.tensor([list(new)], dtype=torch.long, device=self.device)
        positions = torch.arange(start, start + len(new), device=self.device).unsqueeze(0)
        with torch.inference_mode():
            out = self.model(input_ids=ids, position_ids=positions, use_cache=True, **{CACHE_KW: cache})
        return out.logits[0].float()

    def _full_mask(self, batch: int, queries: int, keys: int) -> torch.Tensor:
        """Every query sees every key: an additive 4D mask of zeros, which the mask builders
        of transformers' Qwen2 and Llama models take as given (a mapping of masks, which
        Qwen2 also takes, makes LlamaModel fail in transformers 5.25)."""
        return torch.zeros((batch, 1, queries, keys), dtype=self.model.dtype, device=self.device)

    def _canvas_logits(self, hidden: torch.Tensor, first: int, length: int) -> torch.Tensor:
        """The shift, in one place: the logits of canvas position j come from the hidden
        state before it; `first` indexes the hidden state before canvas position 0."""
        return self.model.lm_head(hidden[:, first : first + length]).float()

    def _sequence(self, parts: Parts, canvas: torch.Tensor) -> torch.Tensor:
        """(B, T) ids of `before canvas after` for each canvas row."""
        b = canvas.shape[0]
        before = torch.tensor(parts.before, dtype=torch.long, device=self.device).expand(b, -1)
        after = torch.tensor(parts.after, dtype=torch.long, device=self.device).expand(b, -1)
        return torch.cat([before, canvas, after], dim=1)

    def _row_lengths(self, canvas: torch.Tensor) -> torch.Tensor:
        """(B,) each DreamOn row's length: the canvas before its trailing padding (the
        sampler pads a row shorter than the batch's longest, engine/local/resize.py)."""
        trailing = torch.cumprod((canvas == self.sp.pad).flip(1).long(), dim=1).sum(dim=1)
        return canvas.shape[1] - trailing

    def _ragged_step(self, parts: Parts, canvas: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Rows of different lengths (DreamOn): row r is `before canvas[r, :n] after`,
        in place as any canvas, and its padding goes after the suffix, unseen by every
        position (a key mask), as DreamOn's own generation pads its sequence. The logits
        at a row's padding are read but never used (those positions are locked)."""
        b, c = canvas.shape
        p, t = len(parts.before), len(parts.before) + c + len(parts.after)
        ids = torch.full((b, t), self.sp.pad, dtype=torch.long, device=self.device)
        seen = torch.zeros((b, t), dtype=torch.bool, device=self.device)
        before = torch.tensor(parts.before, dtype=torch.long, device=self.device)
        after = torch.tensor(parts.after, dtype=torch.long, device=self.device)
        for r, n in enumerate(int(v) for v in lengths):
            ids[r, : p + n + len(after)] = torch.cat([before, canvas[r, :n], after])
            seen[r, : p + n + len(after)] = True
        mask = self._full_mask(b, t, t).masked_fill(~seen[:, None, None, :], torch.finfo(self.model.dtype).min)
        hidden = self.model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        return self._canvas_logits(hidden, p - 1, c)

    def _exact_step(self, parts: Parts, canvas: torch.Tensor) -> torch.Tensor:
        b, c = canvas.shape
        ids = self._sequence(parts, canvas)
        t = ids.shape[1]
        hidden = self.model.model(input_ids=ids, attention_mask=self._full_mask(b, t, t)).last_hidden_state
        return self._canvas_logits(hidden, len(parts.before) - 1, c)

    def _dual_step(self, ids: tuple[int, ...], parts: Parts, canvas: torch.Tensor) -> torch.Tensor:
        """The canvas and the last prefix token against the prefix's and suffix's keys and
        values from the fill's first step (Fast-dLLM's dual cache)."""
        b, c = canvas.shape
        p = len(parts.before)
        key = (ids, c)
        if self._dual is None or self._dual[0] != key:
            self._dual = (key, self._context_kv(parts, canvas[:1]))
        cache = expand_cache(self._dual[1], b) if b > 1 else fork_cache(self._dual[1])  # a copy to grow
        last = torch.full((b, 1), parts.before[-1], dtype=torch.long, device=self.device)
        queries = torch.cat([last, canvas], dim=1)  # (B, C + 1) at positions p - 1 .. p + C - 1
        positions = torch.arange(p - 1, p + c, device=self.device).unsqueeze(0)
        held = cache.get_seq_length()
        out = self.model.model(
            input_ids=queries,
            position_ids=positions,
            attention_mask=self._full_mask(b, c + 1, held + c + 1),
            use_cache=True,
            **{CACHE_KW: cache},
        )
        return self._canvas_logits(out.last_hidden_state, 0, c)

    def _context_kv(self, parts: Parts, canvas: torch.Tensor) -> Cache:
        """One full pass of `before canvas after` (batch 1); the keys and values of all
        but the canvas and the last prefix token (those are run at every step)."""
        p, c = len(parts.before), canvas.shape[1]
        ids = self._sequence(parts, canvas)
        t = ids.shape[1]
        cache = DynamicCache(config=self.model.config)
        self.model.model(input_ids=ids, attention_mask=self._full_mask(1, t, t), use_cache=True, **{CACHE_KW: cache})
        for layer in cache.layers:
            held: Any = layer  # a DynamicLayer: (1, H, T, D) keys and values, rotary positions applied
            held.keys = torch.cat([held.keys[:, :, : p - 1], held.keys[:, :, p + c :]], dim=2)
            held.values = torch.cat([held.values[:, :, : p - 1], held.values[:, :, p + c :]], dim=2)
        return cache


# ---------------------------------------------------------------------------- loading


def qwen2_config(cfg: dict[str, Any]) -> Qwen2Config:
    """A Dream config.json as the Qwen2 configuration of the same layers (hf_load.qwen_config)."""
    return qwen_config(Qwen2Config, cfg)


def load_causal_model(
    path: Path, cfg: dict[str, Any], device: str, dtype: torch.dtype | None = None, quantization: str = "none"
) -> PreTrainedModel:
    """The checkpoint's layers as a transformers causal LM: Qwen2ForCausalLM for a Dream
    config, the native class for qwen2/llama; on `device` at `quantization` after the
    memory check (engine.denoisers.hf_load: safetensors only, local files only, no remote
    code; every weight must be found)."""
    if cfg.get("model_type") in DREAM_MODEL_TYPES:
        return load_pretrained(
            path, Qwen2ForCausalLM, qwen2_config(cfg), cfg, device=device, quantization=quantization, dtype=dtype
        )
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"could not load the checkpoint in {path}: {exc}") from exc
    return load_pretrained(
        path,
        AutoModelForCausalLM,
        config,
        cfg,
        device=device,
        quantization=quantization,
        dtype=dtype,
        build=AutoModelForCausalLM.from_config,
    )


def load_dir(path: Path, cfg: dict[str, Any], *, device: str = "cpu", quantization: str = "none") -> LoadedModel:
    """A Dream-family or plain Qwen2/Llama checkpoint directory. Special ids come from
    config.json (eos, pad, bos, mask_token_id; else generation_config.json's mask) and
    the tokenizer (the fill-in-the-middle markers); the decoding defaults from
    generation_config.json where it has them (engine.models.directory.decoding_defaults);
    config.json's optional "diffusion_lsp" section may set "special_tokens" (names),
    "autoregressive", "cache" ("exact" or "dual") and "defaults" (over
    generation_config.json's). A Qwen2/Llama checkpoint that is diffusion-trained
    (`diffusion_signal`) is decoded on the canvas, as a Dream checkpoint is."""
    require(path, TOKENIZER_FILE)
    own = cfg.get("diffusion_lsp", {})
    mask = generation_mask_id(path)
    if cfg.get("mask_token_id") is None and mask is not None:
        cfg = {**cfg, "mask_token_id": mask}
    tok, specials, suppress = dream_tokens(path, cfg, own)
    cache = own.get("cache", "exact")
    if cache not in CACHE_MODES:
        raise ModelLoadError(f"{path / CONFIG_FILE}: diffusion_lsp.cache must be one of {', '.join(CACHE_MODES)}")
    autoregressive, defaults = dream_mode(decoding_type(path, cfg["model_type"], cfg, tok), own)
    defaults = {**decoding_defaults(path).defaults, **defaults}  # config.json's own defaults win
    model = load_causal_model(path, cfg, device, quantization=quantization)
    edits = _edits(path, tok, cfg, own, autoregressive)
    if edits is not None:
        suppress = [i for i in suppress if i not in (edits.expand, edits.delete)]
    den = DreamDenoiser(model, specials, autoregressive=autoregressive, cache=cache, suppress_ids=suppress, edits=edits)
    return LoadedModel(path=path, tokenizer=tok, denoiser=den, backend="dream", defaults=defaults)


def _edits(
    path: Path, tok: Tokenizer, cfg: dict[str, Any], own: dict[str, Any], autoregressive: bool
) -> LengthEdits | None:
    """DreamOn's length tokens where the checkpoint has both (`length_edits`), on the
    canvas only: with the one-token mode on (config.json says so), they stay unwritten."""
    edits = length_edits(tok.hf, cfg, own)
    if edits is None or autoregressive:
        return None
    log.info("%s: DreamOn's <|expand|> and <|delete|>: the canvas changes length (starts at %d)", path, edits.start)
    return edits
