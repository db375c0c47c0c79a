"""Context cache: encoded contexts keyed by token prefix, least recently used first out.

`lookup` returns the cached state sharing the longest token prefix with a new context, so
the denoiser only encodes what follows (typing at the cursor appends tokens). Memory is
bounded by the sum of the states' sizes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from engine.denoisers.base import EncodedContext
from engine.denoisers.kv import common_prefix_len

DEFAULT_MAX_BYTES = 64 * 1024 * 1024  # about 15 contexts of 1,024 tokens for the shipped model (4 MB each)


class ContextCache:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, max_entries: int = 64) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[int, ...], EncodedContext] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def lookup(self, ids: Sequence[int]) -> tuple[EncodedContext | None, int]:
        """(state with the longest common token prefix, its length); (None, 0) on a miss."""
        best: EncodedContext | None = None
        best_len = 0
        for key, state in self._entries.items():
            n = common_prefix_len(key, ids)
            if n > best_len:
                best, best_len = state, n
        if best is not None:
            self._entries.move_to_end(best.token_ids)
        return best, best_len

    def put(self, state: EncodedContext) -> None:
        key = state.token_ids
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.nbytes
        if state.nbytes > self.max_bytes:
            return
        self._entries[key] = state
        self._bytes += state.nbytes
        while self._bytes > self.max_bytes or len(self._entries) > self.max_entries:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.nbytes

    def discard(self, key: Sequence[int]) -> None:
        """Drop the state cached for exactly `key`, if any (one a longer state replaces)."""
        old = self._entries.pop(tuple(key), None)
        if old is not None:
            self._bytes -= old.nbytes

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0
