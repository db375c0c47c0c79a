"""Shared encode/denoise bookkeeping for backends that keep the context as key/value arrays.

The onnx and torch backends of the embedded model hold the encoded context as keys and
values per layer: stacked (L, 1, H, P, D) tensors (torch) or one (1, H, P, D) array per
layer (onnx). Reusing a cached state is the same for both: keep the longest common token
prefix (`_keep`: a slice, never a copy of the rest) and encode only what follows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from engine.denoisers.base import DenoiserInfo, EncodedContext

# New context tokens go through the encoder this many at a time. Causal attention over T
# new tokens computes a (T, P + T) block of scores of which the kernel then masks half;
# in chunks each call's block is smaller, and the total work drops towards the causal
# triangle. 1,024 tokens, shipped model, this project's 2-core CPU: 188 ms in one call,
# 152 in chunks of 512, 145 of 256, 159 of 128 (per-call overhead takes over).
ENCODE_CHUNK = 256


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class KVDenoiser(ABC):
    """Base of the embedded-model backends: payload is (keys, values, next_logits): keys
    and values per layer (the backend's layout, see the module), and the next-token logits (V,) after the last context
    token when the model has the autoregressive mode (`info.autoregressive`), else None."""

    info: DenoiserInfo

    @abstractmethod
    def _empty(self) -> tuple[Any, Any]: ...

    @abstractmethod
    def _encode(self, new_ids: Sequence[int], keys: Any, values: Any, logits_from: int | None) -> tuple[Any, ...]:
        """Run the context encoder over new_ids after the cached (keys, values); with
        `logits_from`, also return the next-token logits of new_ids[logits_from:] (T', V)."""

    @abstractmethod
    def _denoise(self, canvas_ids: Any, keys: Any, values: Any) -> Any: ...

    @abstractmethod
    def _nbytes(self, keys: Any) -> int: ...

    def _keep(self, kv: Any, keep: int) -> Any:
        """The first `keep` positions of cached keys or values (stacked layout)."""
        return kv[:, :, :, :keep]

    def encode(self, context_ids: Sequence[int], state: EncodedContext | None = None) -> EncodedContext:
        ids = tuple(int(i) for i in context_ids)
        ar = self.info.autoregressive
        if state is not None:
            keep = common_prefix_len(state.token_ids, ids)
            keys, values, next_logits = state.payload
            if ar and 0 < keep == len(ids) < len(state.token_ids):
                keep -= 1  # the cached logits are those after a later token: run the last one again
            keys, values = self._keep(keys, keep), self._keep(values, keep)
        else:
            keep = 0
            keys, values = self._empty()
            next_logits = None
        for start in range(keep, len(ids), ENCODE_CHUNK):
            chunk = ids[start : start + ENCODE_CHUNK]
            out = self._encode(chunk, keys, values, len(chunk) - 1 if ar else None)
            keys, values = out[0], out[1]
            next_logits = out[2][0, -1] if ar else None
        return EncodedContext(token_ids=ids, payload=(keys, values, next_logits), nbytes=2 * self._nbytes(keys))

    def denoise(self, state: EncodedContext, canvas_ids: Any, self_cond: Any | None = None) -> Any:
        keys, values, _ = state.payload
        return self._denoise(canvas_ids, keys, values)

    # ------------------------------------------------ the autoregressive mode (Autoregressive)

    def next_logits(self, state: EncodedContext) -> Any:
        """(V,) next-token logits after the state's last token."""
        if not self.info.autoregressive:
            raise NotImplementedError("this model has no autoregressive mode (export it again)")
        logits = state.payload[2]
        if logits is None:  # an empty context: nothing predicts the first token
            raise ValueError("an empty context has no next-token logits")
        return logits

    def extend(self, state: EncodedContext, new_ids: Sequence[int]) -> tuple[EncodedContext, Any]:
        """`state` followed by `new_ids` (at least one), and the next-token logits after
        each of them, (T, V): row i predicts the token after new_ids[i]."""
        if not self.info.autoregressive:
            raise NotImplementedError("this model has no autoregressive mode (export it again)")
        if not new_ids:
            raise ValueError("extend needs at least one token")
        keys, values, _ = state.payload
        k, v, logits = self._encode(list(new_ids), keys, values, 0)
        ids = (*state.token_ids, *(int(i) for i in new_ids))
        return EncodedContext(ids, (k, v, logits[0, -1]), nbytes=2 * self._nbytes(k)), logits[0]
