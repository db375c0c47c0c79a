"""Prompt-lookup drafter: cheap proposals for the canvas, copied from the context.

Code repeats itself. Find the longest n-gram that ends the prefix and also occurs earlier
in the context, and propose the tokens that followed it there. The sampler shows the
proposals to the model on the first step and keeps them only where the model's argmax
agrees, so a bad draft costs nothing but a wasted position.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MAX_NGRAM = 8  # longest suffix n-gram tried
MIN_NGRAM = 2  # shorter matches are mostly noise


def propose(context: Sequence[int], tail: Sequence[int], max_tokens: int, stop_ids: Sequence[int] = ()) -> list[int]:
    """Tokens that followed the latest earlier occurrence of the longest n-gram ending `tail`.

    context: where to look (suffix and prefix tokens); tail: the tokens just before the
    cursor; stop_ids: tokens a proposal must not cross (sentinels).
    """
    if max_tokens <= 0 or len(tail) < MIN_NGRAM or len(context) <= MIN_NGRAM:
        return []
    ctx = np.asarray(context, dtype=np.int64)
    for n in range(min(MAX_NGRAM, len(tail)), MIN_NGRAM - 1, -1):
        pattern = np.asarray(tail[-n:], dtype=np.int64)
        if len(ctx) <= n:
            continue
        # windows that have a follower; the tail itself, at the very end, is never one
        windows = np.lib.stride_tricks.sliding_window_view(ctx[:-1], n)
        hits = np.flatnonzero((windows == pattern).all(axis=1))
        for start in hits[::-1]:  # latest occurrence first: nearest code is most relevant
            follow = ctx[start + n : start + n + max_tokens]
            out: list[int] = []
            for t in follow.tolist():
                if t in stop_ids:
                    break
                out.append(int(t))
            if out:
                return out
    return []
