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
it, so they are exact for as long as those tokens are. `prefill` keeps the keys and values
of the context's complete blocks (reusing a cached state's for the blocks the new context
shares with it: a keystroke reuses the prefix). A fill's steps run against the fill's own
state (`fill_state`, which the sampler asks for: engine.denoisers.base.StepReuse): each
`denoise` keeps in it the blocks of its rows that are complete and hold no mask, with
their keys and values and the logits predicted from them, keyed by their tokens at their
sequence positions; the next step of the fill reuses those its rows still share and runs
the rest from the first block that changed. The fill's state goes with the fill, and
what it held with it; a `denoise` against the context's own state reuses the context
alone. Cropping a cache is exact or not done (hf_cache.cropped). `positions_run` counts
the positions run through the model (each row's), which the tests read.

Decoding. The denoiser's info declares the model's blocks (`DenoiserInfo.block_size`,
counted from the sequence's start) and, for a shifted model, that a block's first
position settles once the blocks before it are complete (`block_start_settled`): the
sampler (engine/local/sampler.py) counts its blocks from the sequence's start, so that
they fall within the model's, and takes such a position first, alone (Fast-dLLM v2's
generation takes it as an autoregressive token). The families' published decoding is
their sampler defaults (BLOCK_FAMILIES), under generation_config.json's fields and
config.json's diffusion_lsp.defaults; a block length that does not divide the model's
block size is refused at load (`block_defaults`). There is no one-token mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
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
from engine.denoisers.hf_cache import CACHE_KW, cache_nbytes, cropped, expand_cache, fork_cache
from engine.denoisers.hf_load import load_pretrained, qwen_config
from engine.denoisers.kv import common_prefix_len
from engine.denoisers.layouts import DreamLayout, dream_tokens
from engine.denoisers.loading import LoadedModel
from engine.denoisers.torch import OnModelDevice
from engine.errors import ModelLoadError
from engine.models.directory import (
    BLOCK_FIELDS,
    CONFIG_FILE,
    GENERATION_FILE,
    TOKENIZER_FILE,
    BlockCausal,
    block_causal,
    decoding_defaults,
    first_id,
    generation_id,
    require,
)

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


@dataclass(frozen=True)
class _Steps:
    """What a step left for the next of its fill: its rows' tokens at sequence positions
    0..held (a block boundary, no mask in any row before it), their keys and values, and the
    logits (B, n, V) of the fill's first n canvas positions (those predicted from held
    positions; a fill's context, and so where its canvas starts, never changes)."""

    rows: torch.Tensor
    held: int
    cache: Cache
    logits: torch.Tensor


@dataclass
class _Fill:
    """One fill's state (`fill_state`): the context it runs against and what its latest
    step left reusable; it lives as long as the fill, so nothing outlives it."""

    context: BlockPayload
    steps: _Steps | None = None


class BlockCausalDenoiser(OnModelDevice):
    """Denoiser over a Qwen2/Qwen3 model run block-causally (see the module): absorbing
    canvas with the checkpoint's mask token; `denoise` takes any batch of canvases against
    one state and returns float32 logits (B, C, V)."""

    def __init__(self, model: PreTrainedModel, layout: DreamLayout, info: DenoiserInfo, blocks: BlockCausal) -> None:
        self.model = model
        self.layout = layout
        self.info = replace(info, block_size=blocks.size, block_start_settled=blocks.family.shifted)
        self.mask = info.mask_id if info.mask_id is not None else -1  # the absorbing canvas always has one
        self.block = blocks.size
        self.shift = 1 if blocks.family.shifted else 0
        self.positions_run = 0  # positions run through the model, each row's (the tests read it)

    # ------------------------------------------------------------------ protocol

    def prefill(self, prompt: Prompt | Sequence[int], state: EncodedContext | None = None) -> EncodedContext:
        """Run the context's complete blocks (reusing those it shares with `state`)."""
        ids = self.layout.parts(as_prompt(prompt)).causal
        if len(ids) >= self.info.max_positions:
            raise ValueError(f"context of {len(ids)} tokens exceeds max_positions={self.info.max_positions}")
        held = len(ids) // self.block * self.block
        old = _context(state)
        cache, start = self._reused(ids, held, state.token_ids if state is not None else (), old)
        last = None
        if held > start:
            with torch.inference_mode():
                hidden = self._run(torch.tensor([ids[start:held]], device=self.device), cache, start)
                last = self.model.lm_head(hidden[:, -1]).float()[0] if self.shift else None
        elif held and self.shift and old is not None:
            last = old.last_logits
        return EncodedContext(tuple(ids), BlockPayload(cache, held, last), nbytes=cache_nbytes(cache))

    def fill_state(self, state: EncodedContext) -> EncodedContext:
        """A state for one fill (`StepReuse`): each step keeps in it the blocks that no
        longer change, for the next step of the same fill."""
        return EncodedContext(state.token_ids, _Fill(self._payload(state)), nbytes=state.nbytes)

    def denoise(self, state: EncodedContext, canvas_ids: Any, self_cond: Any | None = None) -> torch.Tensor:
        """One step: the sequence `context canvas` for each row, from its first block that
        is not held (the context's, or, in a fill's state, the fill's previous step's),
        block-causally: canvas (B, C) -> float32 logits (B, C, V), the shift applied."""
        pay = self._payload(state)
        fill = state.payload if isinstance(state.payload, _Fill) else None
        p = len(state.token_ids)
        canvas = self.canvas_tensor(canvas_ids, p)
        b, c = canvas.shape
        rows = torch.cat([torch.tensor(state.token_ids, device=self.device).expand(b, -1), canvas], dim=1)
        with torch.inference_mode():
            reused = self._from_steps(fill.steps, pay, rows, p) if fill is not None else None
            cache, start, held_logits = reused if reused is not None else self._from_context(pay, b, p)
            hidden = self._run(rows[:, start:], cache, start)
            first = p - self.shift + held_logits.shape[1]  # the hidden state of the first canvas position not held
            fresh = self.model.lm_head(hidden[:, first - start : p - self.shift + c - start]).float()
            logits = torch.cat([held_logits, fresh], dim=1)
            if fill is not None:
                self._keep(fill, rows, cache, logits, p)
        return logits

    # ------------------------------------------------------------------ internals

    def _payload(self, state: EncodedContext) -> BlockPayload:
        pay = _context(state)
        if pay is None:
            raise TypeError("state was not made by BlockCausalDenoiser.prefill")
        return pay

    def _reused(
        self, ids: tuple[int, ...], held: int, old_ids: tuple[int, ...], old: BlockPayload | None
    ) -> tuple[Cache, int]:
        """(a cache to grow, the positions it holds): the old state's complete blocks shared
        with `ids`, cropped to a block boundary (a fork: the old state is never written); for
        a shifted model at least one block is run again when the held ones end the context,
        for the logits after them."""
        if old is None:
            return DynamicCache(config=self.model.config), 0
        keep = min(common_prefix_len(old_ids, ids), old.held, held) // self.block * self.block
        if keep == held and held and self.shift and (held != old.held or old.last_logits is None):
            keep -= self.block
        cache = cropped(old.cache, keep) if keep > 0 else None
        if cache is None:
            return DynamicCache(config=self.model.config), 0
        return cache, keep

    def _from_context(self, pay: BlockPayload, b: int, p: int) -> tuple[Cache, int, torch.Tensor]:
        """(a cache to grow for the batch, the positions it holds, the logits of the canvas
        positions predicted from them): the context's complete blocks."""
        cache = expand_cache(fork_cache(pay.cache), b)
        held = torch.zeros((b, 0, int(self.model.config.vocab_size)), device=self.device)
        if self.shift and pay.held == p and pay.last_logits is not None:  # the context ends a block
            held = pay.last_logits.expand(b, 1, -1)
        return cache, pay.held, held

    def _from_steps(
        self, steps: _Steps | None, pay: BlockPayload, rows: torch.Tensor, p: int
    ) -> tuple[Cache, int, torch.Tensor] | None:
        """As `_from_context`, from the fill's previous step where it holds more of these
        rows (the same tokens at the same sequence positions); None where it does not."""
        b, t = rows.shape
        if steps is None or steps.rows.shape[0] != b or steps.held > t or steps.held <= pay.held:
            return None
        same = (rows[:, : steps.held] == steps.rows).all(dim=0)
        agree = int(same.long().cumprod(0).sum())  # positions equal in every row
        keep = min(agree, t - 1) // self.block * self.block  # at least one position runs
        end = max(p, keep + self.shift)  # the canvas's positions p..end are predicted from held ones
        if keep <= pay.held or end > p + steps.logits.shape[1]:
            return None
        cache = cropped(steps.cache, keep)
        if cache is None:
            return None
        return cache, keep, steps.logits[:, : end - p]

    def _keep(self, fill: _Fill, rows: torch.Tensor, cache: Cache, logits: torch.Tensor, p: int) -> None:
        """Keep in the fill this step's rows up to their last complete block with no mask in
        any row (the keys and values computed there are exact for as long as those tokens
        stay), and the logits predicted from them."""
        masked = torch.eq(rows, self.mask).any(dim=0)
        first = int(masked.nonzero()[0]) if bool(masked.any()) else rows.shape[1]
        held = first // self.block * self.block
        kept = cropped(cache, held) if held > p - p % self.block else None
        if kept is not None:
            n = max(0, min(logits.shape[1], held - p + self.shift))
            fill.steps = _Steps(rows[:, :held].clone(), held, kept, logits[:, :n])

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
                **{CACHE_KW: cache},
            )
        return out.last_hidden_state


def _context(state: EncodedContext | None) -> BlockPayload | None:
    """The encoded context a state holds (a fill's state holds one too); None: not one of ours."""
    pay = None if state is None else state.payload
    return pay.context if isinstance(pay, _Fill) else pay if isinstance(pay, BlockPayload) else None


# ---------------------------------------------------------------------------- loading


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


def block_defaults(path: Path, blocks: BlockCausal, own: dict[str, Any]) -> dict[str, Any]:
    """The sampler defaults: the family's published decoding, generation_config.json's
    fields over it, config.json's diffusion_lsp.defaults over both. The sampler's blocks
    must fall within the model's: a block length either file sets that does not divide the
    model's block size is a ModelLoadError naming it; the family's own (Fast-dLLM v2's 8)
    becomes the largest divisor of the block size not above it (8 for 32, 6 for 12)."""
    published = dict(blocks.family.defaults)
    wanted = min(published.get("block_length", blocks.size), blocks.size)
    published["block_length"] = max(d for d in range(1, wanted + 1) if blocks.size % d == 0)
    generation = decoding_defaults(path)
    mine = own.get("defaults", {})
    defaults = {**published, **generation.defaults, **mine}
    length = defaults["block_length"]
    if length is None or _divides(length, blocks.size):  # None: the canvas is one block
        return defaults
    if "block_length" in mine:
        where = f"{CONFIG_FILE}: diffusion_lsp.defaults.block_length {length!r}"
    else:
        field = next(k for k in BLOCK_FIELDS if k in generation.read)
        where = f"{GENERATION_FILE}: {field} {length!r}"
    raise ModelLoadError(
        f"{path}: {where} does not divide the model's blocks ({CONFIG_FILE} {blocks.family.size_field} "
        f"{blocks.size}): the sampler's blocks must fall within the model's"
    )


def _divides(value: object, size: int) -> bool:
    """Whether `value` is a positive int (not a bool) that divides `size`."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1 and size % value == 0


def load_dir(path: Path, cfg: dict[str, Any], *, device: str = "cpu", quantization: str = "none") -> LoadedModel:
    """A Fast-dLLM v2 or SDAR checkpoint directory: the family and its block size from
    config.json (engine.models.directory.block_causal), the layers as transformers'
    Qwen2 or Qwen3 (safetensors only, local files only, no remote code, every tensor
    found), on `device` at `quantization` after the memory check. Decoding defaults:
    `block_defaults`."""
    require(path, TOKENIZER_FILE)
    blocks = block_causal(path, cfg)
    if blocks is None:
        raise ModelLoadError(f"{path}: model_type {cfg.get('model_type')!r} is not a block-causal family")
    own = cfg.get("diffusion_lsp", {})
    defaults = block_defaults(path, blocks, own)
    tok, layout, suppress = block_tokens(path, cfg, own)
    config_cls, model_cls = ARCHITECTURES[blocks.family.architecture]
    config = qwen_config(config_cls, cfg)
    model = load_pretrained(path, model_cls, config, cfg, device=device, quantization=quantization)
    info = layout.sp.info(int(config.vocab_size), int(config.max_position_embeddings), suppress, False)
    den = BlockCausalDenoiser(model, layout, info, blocks)
    return LoadedModel(path=path, tokenizer=tok, denoiser=den, backend="block_causal", defaults=defaults)
