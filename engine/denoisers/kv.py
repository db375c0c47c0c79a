"""Shared encode/denoise bookkeeping for backends that keep the context as key/value arrays.

The onnx and torch backends of the embedded model hold the encoded context as two arrays
of shape (L, 1, H, P, D). Reusing a cached state is the same for both: keep the longest
common token prefix (a slice, never a copy of the rest) and encode only what follows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from engine.denoisers.base import DenoiserInfo, EncodedContext


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class KVDenoiser(ABC):
    """Base of the embedded-model backends: payload is (keys, values), each (L, 1, H, P, D)."""

    info: DenoiserInfo

    @abstractmethod
    def _empty(self) -> tuple[Any, Any]: ...

    @abstractmethod
    def _encode(self, new_ids: Sequence[int], keys: Any, values: Any) -> tuple[Any, Any]:
        """Run the context encoder over new_ids after the cached (keys, values)."""

    @abstractmethod
    def _denoise(self, canvas_ids: Any, keys: Any, values: Any) -> Any: ...

    @abstractmethod
    def _nbytes(self, keys: Any) -> int: ...

    def encode(self, context_ids: Sequence[int], state: EncodedContext | None = None) -> EncodedContext:
        ids = tuple(int(i) for i in context_ids)
        if state is not None:
            keep = common_prefix_len(state.token_ids, ids)
            keys, values = state.payload
            keys, values = keys[:, :, :, :keep], values[:, :, :, :keep]
        else:
            keep = 0
            keys, values = self._empty()
        if keep < len(ids):
            keys, values = self._encode(ids[keep:], keys, values)
        return EncodedContext(token_ids=ids, payload=(keys, values), nbytes=2 * self._nbytes(keys))

    def denoise(self, state: EncodedContext, canvas_ids: Any, self_cond: Any | None = None) -> Any:
        keys, values = state.payload
        return self._denoise(canvas_ids, keys, values)
