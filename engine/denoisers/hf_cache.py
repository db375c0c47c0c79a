"""transformers key/value caches shared between requests: fork, crop, expand, measure.

The transformers backends (diffusion_gemma, dream) keep an encoded context as a
transformers `Cache` and hand it to several requests, so a cache in an `EncodedContext`
is never written: extending or cropping works on a *fork* (new layer objects sharing the
key/value tensors, which dynamic layers only ever replace, never write into), and a
batch of canvases sees an expanded view of a batch-1 cache (no copy).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer


def fork_cache(cache: Cache) -> Cache:
    """A cache that can be extended or cropped without touching `cache`: new layer
    objects sharing the tensors for dynamic layers; any other layer type is deep-copied."""
    if all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in cache.layers):
        forked = copy.copy(cache)
        forked.layers = [copy.copy(layer) for layer in cache.layers]
        return forked
    return copy.deepcopy(cache)


def can_crop(cache: Cache) -> bool:
    """Whether every layer still holds all its tokens, so that cropping is exact."""
    for layer in cache.layers:
        if type(layer) is DynamicSlidingWindowLayer:
            if layer.get_seq_length() >= layer.sliding_window:  # older tokens were dropped
                return False
        elif type(layer) is not DynamicLayer:
            return False
    return True


def expand_cache(cache: Cache, batch: int) -> Cache:
    """A view of a batch-1 cache as batch `batch` (no copy: tensors are expanded)."""
    if batch == 1:
        return cache
    forked = fork_cache(cache)
    for layer in forked.layers:
        keys: Any = getattr(layer, "keys", None)
        values: Any = getattr(layer, "values", None)
        if getattr(layer, "is_initialized", False) and isinstance(keys, torch.Tensor):
            if keys.shape[0] != 1:
                raise ValueError(f"the encoded context has batch {keys.shape[0]}; expected 1")
            layer.keys = keys.expand(batch, -1, -1, -1)  # type: ignore[union-attr]
            layer.values = values.expand(batch, -1, -1, -1)  # type: ignore[union-attr]
    return forked


def cache_nbytes(cache: Cache) -> int:
    """Bytes held by the cache's key and value tensors."""
    total = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total
