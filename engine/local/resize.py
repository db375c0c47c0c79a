"""Canvases that change length: the one mechanism the canvas loop has for it.

A length change (`Change`) says, for each row of the new canvas, where each position
comes from: a position of the old canvas (`src >= 0`), a fresh mask (`NEW`), or padding
past the row's end (`END`, only at the end of a row). `remap` moves any per-position
array by it, so the loop moves the canvas, its locks, confidences, argmax canvas and
stability history alike (`engine.local.sampler`, `_CanvasState.remap`).

Rows of a batch may differ in length: the array is as wide as the longest row, and a
shorter row's positions past its length hold padding, locked (given). The embedded
model's canvas ends there as training taught it (padding after the fill); the dream
backend with DreamOn's tokens lays such a row out with the padding after the suffix,
unseen (engine/denoisers/dream.py), as DreamOn's own generation pads its sequence.

Who changes lengths, all through `Change`:
- the length head (engine/local/length.py): once, before the first step, each row
  sized to its fitted length (`sized`; the generator's `_sized_rows`);
- DreamOn (`Edits`, where the denoiser has `length_edits`), following its published
  generation: a fill starts with a few masks (`LengthEdits.start`); between steps, a
  position decided as `<|expand|>` becomes two masks, one decided as `<|delete|>` is
  removed together with the masks right of it (DreamOn's "pad delete to right"), and an
  end-of-fill or padding the loop locked ends the row there (the canvas's end is the
  fill's end). The span's budget (the canvas's width when the loop starts) bounds the
  growth: `<|expand|>` is barred in a row at the budget, and expansions decided together
  past it stay one mask. `<|delete|>` is barred before `min_tokens`, as end-of-fill is.
  What a stopped loop leaves of the two tokens is taken out of the answer (`clean`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import array_api_compat
import numpy as np

from engine.denoisers.base import Denoiser, DenoiserInfo
from engine.denoisers.layouts import LengthEdits

NEW = -1  # a fresh mask
END = -2  # padding past the row's end


@dataclass(frozen=True)
class Change:
    """A length change: `src` (B, W) int64 on the host, per row the old position each new
    position takes, or NEW, or END (trailing)."""

    src: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        """(B,) each row's length after the change."""
        return np.asarray(np.sum(self.src != END, axis=1), dtype=np.int64)


def truncation(lengths: Sequence[int] | np.ndarray, width: int) -> Change:
    """Each row keeps its first lengths[r] positions, padding after them, in `width`."""
    idx = np.arange(width)[None, :]
    return Change(np.where(idx < np.asarray(lengths, dtype=np.int64)[:, None], idx, END).astype(np.int64))


def remap(x: Any, change: Change, new: float | int | bool, end: float | int | bool) -> Any:
    """`x` (B, C) or (B, C, V), a backend array, moved by `change` along its second axis:
    (B, W) or (B, W, V); NEW positions take `new`, END positions `end`."""
    xp = array_api_compat.array_namespace(x)
    dev = array_api_compat.device(x)
    src = change.src
    idx = xp.asarray(np.clip(src, 0, None), device=dev)
    moved = xp.stack([xp.take(x[r], idx[r], axis=0) for r in range(src.shape[0])])
    is_new = xp.asarray(src == NEW, device=dev)
    is_end = xp.asarray(src == END, device=dev)
    if x.ndim == 3:
        is_new, is_end = xp.expand_dims(is_new, axis=-1), xp.expand_dims(is_end, axis=-1)
    fill_new = xp.asarray(new, dtype=x.dtype, device=dev)
    fill_end = xp.asarray(end, dtype=x.dtype, device=dev)
    return xp.where(is_end, fill_end, xp.where(is_new, fill_new, moved))


def sized(denoiser: Denoiser, canvas: Any, lengths: Sequence[int]) -> tuple[Any, Any]:
    """(canvas, fixed): row r of `canvas` (B, C) sized to lengths[r] within its width,
    its positions past it padding, given. The length head's change, before step 0."""
    change = truncation(lengths, int(canvas.shape[1]))
    pad = denoiser.info.pad_id
    return remap(canvas, change, pad, pad), denoiser.as_array(change.src == END)


def row_lengths(canvas: np.ndarray, fixed: np.ndarray, pad_id: int) -> np.ndarray:
    """(B,) each row's length: where its trailing run of given padding starts."""
    trailing = np.logical_and(fixed, canvas == pad_id)[:, ::-1]
    run = np.argmin(trailing, axis=1)  # the first position (from the end) that is not
    run = np.where(np.all(trailing, axis=1), canvas.shape[1], run)
    return np.asarray(canvas.shape[1] - run, dtype=np.int64)


@runtime_checkable
class Resizing(Protocol):
    """A denoiser whose model changes its canvas's length (DreamOn), or says it does not
    (None)."""

    length_edits: LengthEdits | None


def edits_of(denoiser: Any) -> LengthEdits | None:
    """The denoiser's length tokens, if its model has them."""
    return denoiser.length_edits if isinstance(denoiser, Resizing) else None


class Edits:
    """DreamOn's length changes within one run of the canvas loop (see the module): the
    rows' lengths, the budget (the canvas's starting width) and the decisions applied."""

    def __init__(self, ids: LengthEdits, info: DenoiserInfo, lengths: np.ndarray, min_tokens: int) -> None:
        self.ids, self.info, self.min_tokens = ids, info, min_tokens
        self.lengths = lengths.astype(np.int64)
        self.budget = int(lengths.max()) if lengths.size else 0
        self.removed = (ids.expand, ids.delete)

    def start(self, given: np.ndarray) -> Change | None:
        """Before step 0: each row starts with `start` masks (at least min_tokens, and
        all of its given or drafted positions, `given` (B, C) bool), within its length."""
        last = np.where(np.any(given, axis=1), given.shape[1] - np.argmax(given[:, ::-1], axis=1), 0)
        first = np.maximum(max(self.ids.start, self.min_tokens), last)
        return self._to(lambda r: list(range(int(min(self.lengths[r], first[r])))))

    def bar(self, logits: Any) -> Any:
        """`logits` (B, C, V) with `<|expand|>` barred in rows at the budget, and
        `<|delete|>`, end-of-fill and padding at positions before min_tokens (the row's
        end is its length: the min_tokens positions may all be content)."""
        full = self.lengths >= self.budget
        if not full.any() and self.min_tokens <= 0:
            return logits
        xp = array_api_compat.array_namespace(logits)
        dev = array_api_compat.device(logits)
        b, c, v = logits.shape
        vocab = xp.arange(v, device=dev)
        rows = xp.reshape(xp.asarray(full, device=dev), (b, 1, 1))
        barred = xp.logical_and(rows, xp.reshape(vocab == self.ids.expand, (1, 1, v)))  # (B, 1, V)
        early = xp.reshape(xp.arange(c, device=dev) < self.min_tokens, (1, c, 1))
        ends = xp.logical_or(
            vocab == self.ids.delete, xp.logical_or(vocab == self.info.eof_id, vocab == self.info.pad_id)
        )
        barred = xp.logical_or(barred, xp.logical_and(early, xp.reshape(ends, (1, 1, v))))
        return xp.where(barred, xp.asarray(-1.0e30, dtype=logits.dtype, device=dev), logits)

    def edit(self, canvas: np.ndarray, locked: np.ndarray) -> Change | None:
        """After a step: the change its decisions make (None: none)."""
        return self._to(lambda r: self._sources(canvas[r], locked[r], int(self.lengths[r])))

    def _sources(self, tokens: np.ndarray, locked: np.ndarray, length: int) -> list[int]:
        """One row's new positions (old indices or NEW) after its decisions."""
        ends = [j for j in range(length) if locked[j] and int(tokens[j]) in (self.info.eof_id, self.info.pad_id)]
        length = ends[0] if ends else length
        deleted = [j for j in range(length) if locked[j] and int(tokens[j]) == self.ids.delete]
        first = deleted[0] if deleted else length
        kept = [j for j in range(length) if j < first or (locked[j] and int(tokens[j]) != self.ids.delete)]
        room = self.budget - len(kept)
        out: list[int] = []
        for j in kept:
            if locked[j] and int(tokens[j]) == self.ids.expand:
                grow = room > 0
                room -= int(grow)
                out += [NEW, NEW] if grow else [NEW]
            else:
                out.append(j)
        return out

    def _to(self, sources: Callable[[int], list[int]]) -> Change | None:
        """The change whose rows are `sources(r)`, or None when no row changes."""
        rows = [sources(r) for r in range(self.lengths.size)]
        if all(row == list(range(int(n))) for row, n in zip(rows, self.lengths, strict=True)):
            return None
        width = max(1, *(len(row) for row in rows))
        src = np.full((len(rows), width), END, dtype=np.int64)
        for r, row in enumerate(rows):
            src[r, : len(row)] = row
        change = Change(src)
        self.lengths = change.lengths
        return change

    def clean(self, tokens: np.ndarray, confidence: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The answer without the length tokens a stopped loop left undecided (B, W)."""
        keep = ~np.isin(tokens, self.removed)
        if keep.all():
            return tokens, confidence
        out, conf = np.full_like(tokens, self.info.pad_id), np.ones_like(confidence)
        for r in range(tokens.shape[0]):
            n = int(keep[r].sum())
            out[r, :n], conf[r, :n] = tokens[r][keep[r]], confidence[r][keep[r]]
        return out, conf
