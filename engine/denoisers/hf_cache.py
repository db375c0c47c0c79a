"""transformers key/value caches shared between requests: fork, crop, expand, measure.

The transformers backends (diffusion_gemma, dream, llada, block_causal) keep an encoded
context as a transformers `Cache` and hand it to several requests, so a cache in an
`EncodedContext` is never written: extending or cropping works on a *fork* (new layer
objects sharing the key/value tensors, which dynamic layers only ever replace, never write
into), and a batch of canvases sees an expanded view of a batch-1 cache (no copy).
`CACHE_KW` is the name the models' forward gives the cache argument.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch
from transformers import LlamaForCausalLM
from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer

# transformers names the cache argument `cache` from 5.24, `past_key_values` before (the
# Llama, Qwen2 and Qwen3 models alike: one generated signature)
CACHE_KW = "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"


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


def cropped(cache: Cache, length: int) -> Cache | None:
    """A fork of `cache` holding its first `length` positions (all of them when it holds no
    more), or None where cutting it would not be exact (`can_crop`: a sliding window that
    dropped older tokens, a layer that cannot say), so that the caller runs them again.
    `cache` itself is never written."""
    held = cache.get_seq_length()
    if length < held and not can_crop(cache):
        return None
    forked = fork_cache(cache)
    if length < held:
        forked.crop(length - held)  # transformers' crop takes a negative count: the positions to drop
    return forked


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
