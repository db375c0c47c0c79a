"""Fixed-shape denoising step for DiffusionGemma: context K/V in preallocated buffers.

The default path hands transformers a `DynamicCache` whose tensors are exactly as long as
the context, so every prompt length gives new shapes: nothing can be captured as a CUDA
graph and the allocator churns. Here each decoder layer gets one key and one value buffer
of a fixed length (`max_prompt` for full-attention layers; `min(max_prompt, window - 1)`
for sliding layers, which is all a sliding `DynamicCache` layer ever keeps), the encoded
context is copied into their front, and a boolean mask marks the used slots. The step
itself is still transformers' own `DiffusionGemmaForBlockDiffusion.forward`: it is given
a cache *view* whose layers hold the whole buffers (so its `torch.cat` of context and
canvas keys has the same shape for every prompt), an explicit 4D mask per layer type, and
canvas positions computed on the device from a length tensor. Every shape therefore
depends only on (batch, canvas length), and no value is read back to the host.

Masked slots add exactly zero weight to the softmax, so the logits equal the dynamic
path's up to float summation order.

States stay immutable: the buffers are a working copy of whichever `EncodedContext` was
loaded last (`load`), never the state itself.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DiffusionGemmaForBlockDiffusion
from transformers.cache_utils import Cache, DynamicCache

FULL = "full_attention"
SLIDING = "sliding_attention"


class StaticContext:
    """Preallocated context K/V buffers for every decoder layer, plus their validity masks.

    Shapes: keys/values (1, H_kv, L_type, D_layer); valid[type] (1, 1, 1, L_type) bool;
    length (1,) int64 (context tokens, for the canvas positions).
    """

    def __init__(self, model: DiffusionGemmaForBlockDiffusion, max_prompt: int) -> None:
        text = model.config.get_text_config()
        if max_prompt < 1:
            raise ValueError(f"max_prompt must be >= 1; got {max_prompt}")
        self.model = model
        self.max_prompt = int(max_prompt)
        self.layer_types: list[str] = list(text.layer_types)
        window = getattr(text, "sliding_window", None)
        self.capacity: dict[str, int] = {
            FULL: self.max_prompt,
            # a sliding DynamicCache layer keeps the last window - 1 tokens
            SLIDING: self.max_prompt if window is None else min(self.max_prompt, int(window) - 1),
        }
        device = model.device
        dtype = model.dtype
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        for i, kind in enumerate(self.layer_types):
            layer_cfg = text.per_layer_config[i]
            shape = (1, int(layer_cfg.num_key_value_heads), self.capacity[kind], int(layer_cfg.head_dim))
            self.keys.append(torch.zeros(shape, dtype=dtype, device=device))
            self.values.append(torch.zeros(shape, dtype=dtype, device=device))
        self.valid: dict[str, torch.Tensor] = {
            kind: torch.zeros((1, 1, 1, cap), dtype=torch.bool, device=device) for kind, cap in self.capacity.items()
        }
        self.length = torch.zeros((1,), dtype=torch.long, device=device)
        self.loaded: tuple[int, tuple[int, ...]] | None = None  # (id of the cache, its token ids)
        self._views: dict[int, Cache] = {}

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def fits(self, n_tokens: int) -> bool:
        return 1 <= n_tokens <= self.max_prompt

    def load(self, cache: Cache, token_ids: tuple[int, ...]) -> None:
        """Copy an encoded context (a `DynamicCache` from `prefill`) into the buffers.

        Skipped when the same cache with the same ids is already loaded: a fill's steps
        all denoise against one state, so the copy happens once per request.
        """
        key = (id(cache), token_ids)
        if self.loaded == key:
            return
        if not self.fits(len(token_ids)):
            raise ValueError(f"context of {len(token_ids)} tokens does not fit max_prompt={self.max_prompt}")
        stored: dict[str, int] = {}
        for i, layer in enumerate(cache.layers):
            keys: Any = getattr(layer, "keys", None)
            values: Any = getattr(layer, "values", None)
            if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor) or keys.shape[0] != 1:
                raise TypeError("StaticContext.load wants a batch-1 cache made by DiffusionGemmaDenoiser.prefill")
            n = int(keys.shape[-2])
            kind = self.layer_types[i]
            if stored.setdefault(kind, n) != n:
                raise ValueError(f"{kind} layers hold different numbers of tokens ({stored[kind]} and {n})")
            if n > self.capacity[kind]:
                raise ValueError(f"layer {i} holds {n} tokens; the static buffer has {self.capacity[kind]}")
            self.keys[i][:, :, :n].copy_(keys)
            self.values[i][:, :, :n].copy_(values)
        for kind, n in stored.items():
            self.valid[kind].zero_()
            self.valid[kind][..., :n] = True
        self.length.fill_(len(token_ids))
        self.loaded = key

    def view(self, batch: int) -> Cache:
        """A cache whose layers hold the whole buffers, expanded to `batch` (no copy).

        The decoder only reads it (`torch.cat` of these tensors and the canvas K/V).
        Built once per batch size: the tensors are views of the buffers, so they always
        show the loaded context.
        """
        cache = self._views.get(batch)
        if cache is None:
            cache = DynamicCache(config=self.model.config.get_text_config(decoder=True))
            for i, layer in enumerate(cache.layers):
                slot: Any = layer  # a DynamicLayer or DynamicSlidingWindowLayer
                slot.keys = self.keys[i].expand(batch, -1, -1, -1)
                slot.values = self.values[i].expand(batch, -1, -1, -1)
                slot.is_initialized = True
            self._views[batch] = cache
        return cache

    def masks(self, batch: int, canvas: int) -> dict[str, torch.Tensor]:
        """Per layer type a (B, 1, C, L + C) bool mask: used context slots and the canvas."""
        out: dict[str, torch.Tensor] = {}
        for kind in set(self.layer_types):
            valid = self.valid[kind]
            ones = torch.ones((1, 1, 1, canvas), dtype=torch.bool, device=valid.device)
            row = torch.cat([valid, ones], dim=-1)  # (1, 1, 1, L + C)
            out[kind] = row.expand(batch, 1, canvas, row.shape[-1])
        return out

    def positions(self, canvas: int) -> torch.Tensor:
        """Canvas positions (1, C) int32: context length onwards, computed on the device."""
        steps = torch.arange(canvas, dtype=torch.long, device=self.length.device)
        return (self.length + steps).to(torch.int32).unsqueeze(0)


def static_step(
    model: DiffusionGemmaForBlockDiffusion,
    ctx: StaticContext,
    canvas: torch.Tensor,
    self_cond: torch.Tensor | None,
    self_cond_mask: torch.Tensor | None,
    cache_kw: str,
) -> torch.Tensor:
    """One decoder pass over the loaded context: canvas (B, C) -> float32 logits (B, C, V).

    `self_cond_mask` (B,) bool lets one captured graph serve both the first step (False:
    zero self-conditioning signal, exactly as if no logits were given) and later ones.
    """
    batch, length = canvas.shape
    return model(
        decoder_input_ids=canvas,
        self_conditioning_logits=self_cond,
        self_conditioning_mask=self_cond_mask,
        decoder_attention_mask=ctx.masks(batch, length),
        **{cache_kw: ctx.view(batch)},
        decoder_position_ids=ctx.positions(length),
    ).logits
