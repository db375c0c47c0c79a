"""Prompt-lookup drafter and the bounded context cache."""

from __future__ import annotations

import numpy as np

from engine.denoisers.base import EncodedContext
from engine.local import drafter
from engine.local.cache import ContextCache


def test_drafter_copies_what_followed_the_longest_match() -> None:
    context = [1, 2, 3, 4, 5, 6, 9, 2, 3, 4, 7, 8, 0, 2, 3, 4]
    # tail [2, 3, 4] occurs twice earlier; the nearest (latest) one is followed by 7, 8
    assert drafter.propose(context, context, 2) == [7, 8]
    # a longer tail disambiguates: [9, 2, 3, 4] only occurs once
    assert drafter.propose([9, 2, 3, 4, 5, 6, 1, 9, 2, 3, 4], [1, 9, 2, 3, 4], 3) == [5, 6, 1]


def test_drafter_stops_at_sentinels_and_respects_limits() -> None:
    assert drafter.propose([5, 6, 7, 99, 1, 5, 6], [5, 6], 4, stop_ids=[99]) == [7]
    assert drafter.propose([5, 6, 7, 5, 6], [5, 6], 0) == []
    assert drafter.propose([1, 2, 3], [4, 5], 3) == []  # no match
    assert drafter.propose([], [], 3) == []


def _state(ids: list[int], nbytes: int = 10) -> EncodedContext:
    return EncodedContext(token_ids=tuple(ids), payload=np.zeros(1), nbytes=nbytes)


def test_cache_returns_the_longest_common_prefix() -> None:
    cache = ContextCache(max_bytes=1000)
    cache.put(_state([1, 2, 3]))
    cache.put(_state([1, 2, 9, 9]))
    state, n = cache.lookup([1, 2, 9, 9, 5])
    assert state is not None and state.token_ids == (1, 2, 9, 9) and n == 4
    state, n = cache.lookup([7])
    assert state is None and n == 0


def test_cache_is_bounded_and_evicts_least_recently_used() -> None:
    cache = ContextCache(max_bytes=30)
    for i in range(3):
        cache.put(_state([i], nbytes=10))
    cache.lookup([0])  # touch 0: now 1 is the oldest
    cache.put(_state([3], nbytes=10))
    assert len(cache) == 3 and cache.nbytes == 30
    assert cache.lookup([1])[0] is None
    assert cache.lookup([0])[0] is not None
    cache.put(_state([4], nbytes=31))  # larger than the whole cache: not kept
    assert cache.lookup([4])[0] is None
