"""A local model as a `Scorer` (engine.edits): a region's likelihood as the middle of a
fill, and the model's rewrite of a region from one of its tokens on, both through the
one-token mode of any denoiser that has it (`DenoiserInfo.autoregressive`).

Both lay the prompt out as a fill would (`LocalGenerator.build_context`, the model's own
order) with a short context (EDIT_CONTEXT_TOKENS: an edit is judged near where it is), and
encode it through the generator's context cache: scoring a region and rewriting it from
its k-th token share the encoded code around it, and only the region's tokens are run
again (one pass for a score; one token a step for a rewrite).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from engine.decoding import SamplerConfig
from engine.edits import Scored
from engine.fill import FillOptions, InfillRequest
from engine.local.one_token import OneToken, token_logprobs
from engine.local.steering import to_numpy

EDIT_CONTEXT_TOKENS = 384  # the code around a region that scoring and rewriting see


class LocalScorer:
    """engine.edits.Scorer over a LocalGenerator whose denoiser has the one-token mode."""

    def __init__(self, generator: Any, context_tokens: int = EDIT_CONTEXT_TOKENS) -> None:
        self.gen = generator
        self.den, self.tok = generator.den, generator.tok
        self.context_tokens = context_tokens

    def _state(
        self, prefix: str, suffix: str, middle: tuple[int, ...], room: int, context_tokens: int | None = None
    ) -> Any:
        """The encoded prompt of a fill between `prefix` and `suffix` whose given start is
        `middle`, with room for `room` more tokens, in `context_tokens` of context (None:
        the scorer's); through the context cache."""
        opts = FillOptions(context_tokens=context_tokens or self.context_tokens)
        prompt, _ = self.gen.build_context(opts, InfillRequest(prefix, suffix), [], room + len(middle))
        prompt = replace(prompt, middle=middle)
        ids = list(self.den.layout.ids(prompt))
        cached, _ = self.gen.cache.lookup(ids)
        state = self.den.prefill(prompt, cached)
        self.gen.cache.put(state)
        return state

    def score(self, prefix: str, region: str, suffix: str, context_tokens: int | None = None) -> Scored:
        ids = self.tok.encode(region)
        state = self._state(prefix, suffix, (), len(ids) + 1, context_tokens)
        logprobs = token_logprobs(self.den, state, ids, self.tok.special.eof)
        starts = [len(self.tok.decode(ids[:i])) for i in range(len(ids))]
        return Scored(starts, [float(x) for x in logprobs])

    def rewrite(self, prefix: str, region: str, token: int, suffix: str, most: int, done: Callable[[str], bool]) -> str:
        ids = self.tok.encode(region)
        state = self._state(prefix, suffix, tuple(ids[:token]), most)
        chooser = OneToken(self.den, SamplerConfig(), 1.0, True, self.den.random_source(0))
        eof, pad = self.tok.special.eof, self.tok.special.pad
        logits = to_numpy(self.den.next_logits(state)).astype(np.float32)
        out: list[int] = []
        for _ in range(most):
            tok, _p = chooser.choose(logits, len(out))
            if tok in (eof, pad):
                break
            out.append(tok)
            if done(self.tok.decode(out)):
                break
            state, step = self.den.extend(state, [tok])
            logits = to_numpy(step[-1]).astype(np.float32)
        return self.tok.decode(out)
