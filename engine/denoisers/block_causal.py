"""The block_causal backend: Fast-dLLM v2 and SDAR checkpoints run through transformers' own
Qwen2 and Qwen3 modules, with no remote code.

Both are autoregressive models fine-tuned for block diffusion: the sequence is cut into
blocks of a fixed size counted from its first position (config.json's `bd_size`, 32, for
Fast-dLLM v2; `block_size`, 4 in the default SDAR release, for SDAR), attention is
bidirectional within a block and causal across blocks (a query in block b sees the keys of
blocks 0..b), and a mask token marks what is still to be written. They differ in the layers
(Fast-dLLM v2 is Qwen2.5's, with q/k/v biases; SDAR is Qwen3's, with q/k norms), the size,
the mask token, and the shift: Fast-dLLM v2 keeps the autoregressive model's (the hidden
state at position i predicts token i + 1, so the first position of a block is predicted
from the block before it), SDAR predicts token i at position i. One class runs both
(`engine.models.directory.BLOCK_FAMILIES` declares the family from config.json's model_type):
the block-causal attention is a 4D additive mask handed to the stock layers.

Layout. The canvas follows the whole context, which must therefore hold the suffix too:
under causal attention across blocks nothing after the canvas could be seen by it. The
prompt is Qwen's fill-in-the-middle in prefix-suffix-middle order,
`<|fim_prefix|> P <|fim_suffix|> S <|fim_middle|> M [canvas]` (engine.denoisers.layouts.
DreamLayout's causal sequence): the order Qwen2.5-Coder's fill-in-the-middle was trained in
and the one these models' tokenizers carry the tokens for. A keystroke at the cursor
changes the end of P, so the blocks before it are reused and the suffix's blocks are run
again (the other order, suffix first, would reuse them too, but no Qwen model was trained
on it).

The exact cache. A block's keys and values depend only on the tokens of the blocks up to
it, so they are exact for as long as those tokens are. `encode` keeps the keys and values
of the context's complete blocks (reusing a cached state's for the blocks the new context
shares with it: a keystroke reuses the prefix); each `denoise` step reuses those and the
previous step's blocks that are complete and unchanged (no mask in any row), and runs the
rest of the sequence from the first block that changed. `positions_run` counts the
positions run through the model (each row's), which the tests read.

Decoding. `canvas_start` and `settled` make the denoiser a `SequenceBlocks` for the
sampler (engine/local/sampler.py): its blocks are counted from the sequence's start, so
they fall within the model's, and a shifted model's first position of a block, whose
prediction is complete once the blocks before it are, is taken first, alone (Fast-dLLM
v2's generation takes it as an autoregressive token). The families' published decoding is
their sampler defaults (BLOCK_FAMILIES), under generation_config.json's fields and
config.json's diffusion_lsp.defaults. There is no one-token mode.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import torch
    from transformers import PreTrainedModel, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM
    from transformers.cache_utils import Cache, DynamicCache
except ImportError as exc:
    raise ImportError(
        "The block_causal backend needs torch and transformers: pip install 'diffusion-lsp[torch]'"
    ) from exc

from engine.denoisers.base import DenoiserInfo, EncodedContext, Prompt, as_prompt
from engine.denoisers.hf_cache import cache_nbytes, expand_cache, fork_cache
from engine.denoisers.hf_load import load_pretrained
from engine.denoisers.kv import common_prefix_len
from engine.denoisers.layouts import DreamLayout, dream_tokens, settled_positions
from engine.denoisers.loading import LoadedModel
from engine.denoisers.torch import OnModelDevice
from engine.errors import ModelLoadError
from engine.models.directory import (
    TOKENIZER_FILE,
    BlockCausal,
    block_causal,
    decoding_defaults,
    first_id,
    generation_id,
    require,
)

_CACHE_KW = "cache" if "cache" in inspect.signature(Qwen2ForCausalLM.forward).parameters else "past_key_values"
# the mask tokens' names in the families' tokenizers: Fast-dLLM v2's, SDAR's (its
# added_tokens.json and tokenizer_config.json name it differently), the Dream family's
MASK_NAMES = ("|<MASK>|", "<|MASK|>", "<MASK>", "<|mask|>")
ARCHITECTURES: dict[str, tuple[Any, Any]] = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
}


@dataclass(frozen=True)
class BlockPayload:
    """An encoded context: its complete blocks' keys and values (batch 1, `held`
    positions) and, for a shifted model, the logits after its last held position."""

    cache: Cache
    held: int
    last_logits: torch.Tensor | None


@dataclass
class _Steps:
    """What a fill's previous step left reusable: its rows' tokens up to `held` (a block
    boundary, no mask in any row before it), their keys and values, and the logits of
    the canvas positions predicted from held positions (B, n, V)."""

    rows: torch.Tensor
    held: int
    cache: Cache
    logits: torch.Tensor


class BlockCausalDenoiser(OnModelDevice):
    """Denoiser over a Qwen2/Qwen3 model run block-causally (see the module): absorbing
    canvas with the checkpoint's mask token; `denoise` takes any batch of canvases against
    one state and returns float32 logits (B, C, V)."""

    def __init__(self, model: PreTrainedModel, layout: DreamLayout, info: DenoiserInfo, blocks: BlockCausal) -> None:
        self.model = model
        self.layout = layout
        self.info = info
        self.mask = info.mask_id if info.mask_id is not None else -1  # the absorbing canvas always has one
        self.block = blocks.size
        self.shift = 1 if blocks.family.shifted else 0
        self.positions_run = 0  # positions run through the model, each row's (the tests read it)
        self._steps: _Steps | None = None

    # ------------------------------------------------------------------ protocol

    def encode(self, prompt: Prompt | Sequence[int], state: EncodedContext | None = None) -> EncodedContext:
        """Run the context's complete blocks (reusing those it shares with `state`)."""
        ids = self.layout.parts(as_prompt(prompt)).causal
        if len(ids) >= self.info.max_positions:
            raise ValueError(f"context of {len(ids)} tokens exceeds max_positions={self.info.max_positions}")
        held = len(ids) // self.block * self.block
        cache, start = self._reused(ids, held, state)
        last = None
        if held > start:
            with torch.inference_mode():
                hidden = self._run(torch.tensor([ids[start:held]], device=self.device), cache, start)
                last = self.model.lm_head(hidden[:, -1]).float()[0] if self.shift else None
        elif held and self.shift and state is not None:
            last = self._payload(state).last_logits
        return EncodedContext(tuple(ids), BlockPayload(cache, held, last), nbytes=cache_nbytes(cache))

    def denoise(self, state: EncodedContext, canvas_ids: Any, self_cond: Any | None = None) -> torch.Tensor:
        """One step: the sequence `context canvas` for each row, from its first block that
        is not held (the context's, or the previous step's), block-causally: canvas (B, C)
        -> float32 logits (B, C, V), the shift applied."""
        pay = self._payload(state)
        canvas = torch.as_tensor(canvas_ids, device=self.device).long()
        if canvas.ndim != 2:
            raise ValueError(f"canvas_ids must be (B, C); got shape {tuple(canvas.shape)}")
        b, c = canvas.shape
        p = len(state.token_ids)
        if p + c > self.info.max_positions:
            raise ValueError(f"context and canvas ({p + c} tokens) exceed max_positions={self.info.max_positions}")
        rows = torch.cat([torch.tensor(state.token_ids, device=self.device).expand(b, -1), canvas], dim=1)
        with torch.inference_mode():
            cache, start, held_logits = self._step_start(pay, rows, p)
            hidden = self._run(rows[:, start:], cache, start)
            first = p - self.shift + held_logits.shape[1]  # the hidden state of the first canvas position not held
            fresh = self.model.lm_head(hidden[:, first - start : p - self.shift + c - start]).float()
            logits = torch.cat([held_logits, fresh], dim=1)
            self._keep(rows, cache, logits, p)
        return logits

    def canvas_start(self, state: EncodedContext) -> int:
        """Positions of the sequence before the canvas (the sampler counts blocks from 0)."""
        return len(state.token_ids)

    def settled(self, state: EncodedContext, canvas: Any) -> torch.Tensor:
        """(B, C) bool: a shifted model's first mask of a row where it begins a block
        (its logits no mask can change); none for an unshifted model."""
        canvas = torch.as_tensor(canvas, device=self.device)
        if not self.shift:
            return torch.zeros(canvas.shape, dtype=torch.bool, device=self.device)
        return settled_positions(canvas, len(state.token_ids), self.block, self.mask)

    # ------------------------------------------------------------------ internals

    def _payload(self, state: EncodedContext) -> BlockPayload:
        if not isinstance(state.payload, BlockPayload):
            raise TypeError("state was not made by BlockCausalDenoiser.encode")
        return state.payload

    def _reused(self, ids: tuple[int, ...], held: int, state: EncodedContext | None) -> tuple[Cache, int]:
        """(a cache to grow, the positions it holds): `state`'s complete blocks shared with
        `ids`, cropped to a block boundary (a fork: `state` is never written); for a
        shifted model at least one block is run again when the held ones end the context,
        for the logits after them."""
        if state is None or not isinstance(state.payload, BlockPayload):
            return DynamicCache(config=self.model.config), 0
        old = state.payload
        keep = min(common_prefix_len(state.token_ids, ids), old.held, held) // self.block * self.block
        if keep == held and held and self.shift and (held != old.held or old.last_logits is None):
            keep -= self.block
        if keep <= 0:
            return DynamicCache(config=self.model.config), 0
        cache = fork_cache(old.cache)
        _crop(cache, keep)
        return cache, keep

    def _step_start(self, pay: BlockPayload, rows: torch.Tensor, p: int) -> tuple[Cache, int, torch.Tensor]:
        """(a cache to grow for the batch, the positions it holds, the logits of the canvas
        positions predicted from them): the previous step's where it holds more of these
        rows, else the context's."""
        b = rows.shape[0]
        steps = self._steps
        if steps is not None and steps.rows.shape[0] == b and steps.held > pay.held:
            same = (rows[:, : steps.held] == steps.rows).all(dim=0)
            agree = int(same.long().cumprod(0).sum())  # positions equal in every row
            keep = min(agree, rows.shape[1] - 1) // self.block * self.block  # at least one position runs
            if keep > pay.held:
                cache = fork_cache(steps.cache)
                _crop(cache, keep)
                return cache, keep, steps.logits[:, : max(0, keep - p + self.shift)]
        cache = expand_cache(fork_cache(pay.cache), b)
        vocab = int(self.model.config.vocab_size)
        held = torch.zeros((b, 0, vocab), device=self.device)
        if self.shift and pay.held == p and pay.last_logits is not None:  # the context ends a block
            held = pay.last_logits.expand(b, 1, -1)
        return cache, pay.held, held

    def _keep(self, rows: torch.Tensor, cache: Cache, logits: torch.Tensor, p: int) -> None:
        """Keep this step's rows up to their last complete block with no mask in any row
        (the keys and values computed there are exact for as long as those tokens stay)."""
        masked = torch.eq(rows, self.mask).any(dim=0)
        first = int(masked.nonzero()[0]) if bool(masked.any()) else rows.shape[1]
        held = first // self.block * self.block
        if held > p - p % self.block:
            _crop(cache, held)
            n = max(0, min(logits.shape[1], held - p + self.shift))
            self._steps = _Steps(rows[:, :held].clone(), held, cache, logits[:, :n])

    def _run(self, ids: torch.Tensor, cache: Cache, start: int) -> torch.Tensor:
        """Run `ids` (B, T) at positions start.. after the `start` positions in `cache`
        (which grows), block-causally: their hidden states (B, T, D)."""
        b, t = ids.shape
        positions = torch.arange(start, start + t, device=self.device)
        keys = torch.arange(start + t, device=self.device)
        seen = keys[None, :] // self.block <= positions[:, None] // self.block  # (T, start + T)
        mask = torch.zeros(seen.shape, dtype=self.model.dtype, device=self.device)
        mask = mask.masked_fill(~seen, torch.finfo(self.model.dtype).min).expand(b, 1, -1, -1)
        self.positions_run += b * t
        with torch.inference_mode():
            out = self.model.model(
                input_ids=ids,
                position_ids=positions.expand(b, -1),
                attention_mask=mask,
                use_cache=True,
                **{_CACHE_KW: cache},
            )
        return out.last_hidden_state


def _crop(cache: Cache, length: int) -> None:
    """`cache` cut to its first `length` positions (transformers' crop takes the count to drop)."""
    drop = length - cache.get_seq_length()
    if drop < 0:
        cache.crop(drop)


# ---------------------------------------------------------------------------- loading


def native_config(cls: Any, cfg: dict[str, Any]) -> Any:
    """config.json as the transformers configuration `cls` (Qwen2Config, Qwen3Config): the
    fields it takes by name, and the rotary fields under their older names."""
    takes = {n for n, p in inspect.signature(cls.__init__).parameters.items() if p.kind is p.KEYWORD_ONLY}
    return cls(**{k: v for k, v in cfg.items() if k in takes or k in ("rope_theta", "rope_scaling")})


def block_tokens(path: Path, cfg: dict[str, Any], own: dict[str, Any]) -> tuple[Any, DreamLayout, list[int]]:
    """(tokenizer, layout, ids never sampled): the Dream family's readers with the mask of
    config.json's mask_token_id, else generation_config.json's, else the tokenizer's (by the
    families' names), which must be a token the tokenizer has; padding config.json's
    pad_token_id, else generation_config.json's."""
    fields = {}
    for name in ("mask_token_id", "pad_token_id"):
        value = first_id(cfg.get(name))
        fields[name] = value if value is not None else generation_id(path, name)
    tok, specials, suppress = dream_tokens(path, {**cfg, **fields}, own, MASK_NAMES)
    if specials.mask >= tok.vocab_size:
        raise ModelLoadError(f"{path}: no mask token (config.json mask_token_id, or one of {', '.join(MASK_NAMES)})")
    return tok, DreamLayout(specials), suppress


def load_dir(path: Path, cfg: dict[str, Any], *, device: str = "cpu", quantization: str = "none") -> LoadedModel:
    """A Fast-dLLM v2 or SDAR checkpoint directory: the family and its block size from
    config.json (engine.models.directory.block_causal), the layers as transformers'
    Qwen2 or Qwen3 (safetensors only, local files only, no remote code, every tensor
    found), on `device` at `quantization` after the memory check. Decoding defaults: the
    family's published decoding, generation_config.json's fields over it, config.json's
    diffusion_lsp.defaults over both."""
    require(path, TOKENIZER_FILE)
    blocks = block_causal(path, cfg)
    if blocks is None:
        raise ModelLoadError(f"{path}: model_type {cfg.get('model_type')!r} is not a block-causal family")
    own = cfg.get("diffusion_lsp", {})
    tok, layout, suppress = block_tokens(path, cfg, own)
    config_cls, model_cls = ARCHITECTURES[blocks.family.architecture]
    config = native_config(config_cls, cfg)
    model = load_pretrained(path, model_cls, config, cfg, device=device, quantization=quantization)
    info = layout.sp.info(int(config.vocab_size), int(config.max_position_embeddings), suppress, False)
    published = {
        **blocks.family.defaults,
        "block_length": min(blocks.family.defaults.get("block_length", blocks.size), blocks.size),
    }
    defaults = {**published, **decoding_defaults(path).defaults, **own.get("defaults", {})}
    den = BlockCausalDenoiser(model, layout, info, blocks)
    return LoadedModel(path=path, tokenizer=tok, denoiser=den, backend="block_causal", defaults=defaults)
