"""Fake models with known logits, for the tests of the decoding loops (one place, so that
no test module imports another). A fake tests the sampler and the server's logic; it is
not a feature."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.denoisers.base import DenoiserInfo, EncodedContext, Prompt, as_prompt
from engine.denoisers.layouts import SuffixFirst
from engine.denoisers.onnx import NumpyRandomSource

V = 16  # the fakes' vocabulary
PAD, EOF, MASK, MID = 0, 1, 15, 14
NL = 13  # a line break
LAYOUT = SuffixFirst(suffix=3, prefix=4, middle=MID)  # <suf> <pre> M <mid>: S and P empty
PROMPT = Prompt()
CONTEXT = LAYOUT.ids(PROMPT)
CONFUSED = 12  # what TwoModes' one-token mode predicts after a history that is not its own


class FakeAutoregressive:
    """One token at a time: the logits after n decoded tokens peak on target[n] (5.0, every
    other token 0). `context`: the tokens of the encoded context the state starts with."""

    def __init__(self, target: list[int], vocab_size: int = V, mask: int | None = MASK, context: int = 2) -> None:
        self.info = DenoiserInfo(
            vocab_size=vocab_size,
            regime="absorbing",
            eof_id=EOF,
            pad_id=PAD,
            mask_id=mask,
            max_positions=512,
            autoregressive=True,
        )
        self.target = target
        self.context = context

    def _logits(self, decoded: int) -> np.ndarray:
        out = np.zeros(self.info.vocab_size, dtype=np.float32)
        out[self.target[decoded]] = 5.0
        return out

    def next_logits(self, state: EncodedContext) -> np.ndarray:
        return self._logits(len(state.token_ids) - self.context)

    def extend(self, state: EncodedContext, ids: list[int]) -> tuple[EncodedContext, np.ndarray]:
        st = EncodedContext(token_ids=(*state.token_ids, *ids), payload=None)
        return st, self._logits(len(st.token_ids) - self.context)[None]

    def as_array(self, values: Any) -> Any:
        return np.asarray(values)


class TwoModes:
    """A fake model of both modes. The one-token mode's greedy fill is `target` (then
    end-of-fill): after the context and a history equal to target[:n] its logits peak on
    target[n] (after any other history, on CONFUSED). The canvas, after a context holding
    `a` accepted tokens before the marker, drafts draft[a + i] at canvas position i.
    `spread` gives the one-token mode's logits a second choice (for sampled rows)."""

    def __init__(self, target: list[int], draft: list[int], second: dict[int, int] | None = None) -> None:
        self.info = DenoiserInfo(
            vocab_size=V,
            regime="absorbing",
            eof_id=EOF,
            pad_id=PAD,
            mask_id=MASK,
            max_positions=512,
            suppress_ids=(MASK, MID),
            autoregressive=True,
        )
        self.target = [*target, EOF]
        self.draft = [*draft, EOF] + [PAD] * 64
        self.second = second or {}
        self.denoise_calls = 0
        self.extend_calls = 0

    # -- the canvas
    layout = LAYOUT

    def prefill(self, prompt: Prompt | Sequence[int], state: Any = None) -> EncodedContext:
        return EncodedContext(token_ids=self.layout.ids(as_prompt(prompt)), payload=None)

    def denoise(self, state: EncodedContext, canvas: Any, self_cond: Any = None) -> np.ndarray:
        self.denoise_calls += 1
        accepted = len(state.token_ids) - len(CONTEXT)
        b, c = canvas.shape
        out = np.zeros((b, c, V), dtype=np.float32)
        for i in range(c):
            out[:, i, self.draft[accepted + i]] = 8.0
        return out

    # -- the one-token mode
    def _logits(self, history: tuple[int, ...]) -> np.ndarray:
        out = np.zeros(V, dtype=np.float32)
        n = len(history)
        if list(history) == self.target[:n] and n < len(self.target):
            out[self.target[n]] = 3.0
            if n in self.second:
                out[self.second[n]] = 2.5
        else:
            out[CONFUSED] = 3.0
        return out

    def next_logits(self, state: EncodedContext) -> np.ndarray:
        return self._logits(state.token_ids[len(CONTEXT) :])

    def extend(self, state: EncodedContext, ids: Sequence[int]) -> tuple[EncodedContext, np.ndarray]:
        self.extend_calls += 1
        st = EncodedContext(token_ids=(*state.token_ids, *ids), payload=None)
        hist = st.token_ids[len(CONTEXT) :]
        first = len(state.token_ids) - len(CONTEXT)
        return st, np.stack([self._logits(hist[: first + j + 1]) for j in range(len(ids))])

    def cut(self, state: EncodedContext, length: int) -> EncodedContext:
        return EncodedContext(token_ids=state.token_ids[:length], payload=None)

    def as_array(self, values: Any) -> Any:
        return np.asarray(values)

    def random_source(self, seed: int | None) -> NumpyRandomSource:
        return NumpyRandomSource(seed)


STATE = EncodedContext(token_ids=CONTEXT, payload=None)
