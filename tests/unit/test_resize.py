"""Canvases that change length (engine/local/resize.py): DreamOn's expand and delete in the
canvas loop against a fake denoiser with known logits, on numpy and on torch; the length
head's sizing through the same change."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.decoding import SamplerConfig
from engine.denoisers.base import DenoiserInfo, EncodedContext
from engine.denoisers.layouts import LengthEdits
from engine.denoisers.onnx import NumpyRandomSource
from engine.local.resize import END, NEW, Change, remap, row_lengths, sized, truncation
from engine.local.sampler import initial_canvas, run
from engine.local.steering import Steering, StepView

V = 24
PAD, EOF, EXPAND, DELETE, MASK = 0, 1, 21, 22, 23
SURE, LIKELY = 20.0, 5.0  # a length token's logit beats a content token's


class ResizingFake:
    """Row r's logits follow targets[r] and the row's current length L (its positions
    before the trailing padding): position j < L predicts targets[r][j]; a row shorter
    than its target predicts <|expand|> at its last position, a longer one <|delete|>
    past its target. `edits=None`: a model without the tokens (they are suppressed)."""

    def __init__(self, targets: list[list[int]], lib: str, edits: LengthEdits | None) -> None:
        self.targets, self.lib, self.length_edits = targets, lib, edits
        suppress = (MASK,) if edits is not None else (MASK, EXPAND, DELETE)
        self.info = DenoiserInfo(
            vocab_size=V, regime="absorbing", eof_id=EOF, pad_id=PAD, mask_id=MASK, max_positions=512,
            suppress_ids=suppress,
        )  # fmt: skip
        self.widths: list[list[int]] = []  # each call: each row's length

    def prefill(self, ids: Any, state: Any = None) -> EncodedContext:
        return EncodedContext(token_ids=tuple(ids), payload=None)

    def denoise(self, state: EncodedContext, canvas: Any, self_cond: Any = None) -> Any:
        host = np.asarray(canvas) if self.lib == "numpy" else canvas.numpy()
        b, c = host.shape
        lengths = row_lengths(host, host == PAD, PAD)
        self.widths.append([int(n) for n in lengths])
        logits = np.zeros((b, c, V), dtype=np.float32)
        for r, (target, n) in enumerate(zip(self.targets, lengths, strict=True)):
            for j in range(min(n, len(target))):
                logits[r, j, target[j]] = LIKELY
            if n < len(target) and n > 0:
                logits[r, n - 1, EXPAND] = SURE
            logits[r, len(target) : n, DELETE] = SURE
        if self.lib == "torch":
            import torch

            return torch.from_numpy(logits)
        return logits

    def as_array(self, values: Any) -> Any:
        if self.lib == "torch":
            import torch

            return torch.as_tensor(np.asarray(values))
        return np.asarray(values)

    def random_source(self, seed: int | None) -> Any:
        if self.lib == "torch":
            from engine.denoisers.torch import TorchRandomSource

            return TorchRandomSource(seed)
        return NumpyRandomSource(seed)


ONE_AT_A_TIME = SamplerConfig(strategy="fixed_k", k=1, max_steps=64)


def fill(den: ResizingFake, budget: int, cfg: SamplerConfig = ONE_AT_A_TIME) -> tuple[Any, list[int]]:
    """(the result, the canvas's width after each step) of a run over a `budget`-wide canvas."""
    rng = den.random_source(None)
    canvas = initial_canvas(den, len(den.targets), budget, rng)  # type: ignore[arg-type]
    widths: list[int] = []

    def on_step(view: StepView) -> None:
        widths.append(int(view.canvas.shape[1]))

    res = run(den, den.prefill([2]), canvas, cfg, rng, steer=Steering(on_step=on_step))  # type: ignore[arg-type]
    return res, widths


def fill_of(row: np.ndarray) -> list[int]:
    ids = row.tolist()
    return ids[: next((i for i, t in enumerate(ids) if t in (EOF, PAD)), len(ids))]


TARGET = [5, 6, 7, 8, 9, 10, 11, 12]


def test_expand_grows_the_canvas_from_its_start_to_the_fill(lib: str) -> None:
    den = ResizingFake([TARGET], lib, LengthEdits(EXPAND, DELETE, start=4))
    res, widths = fill(den, budget=12)
    assert den.widths[0] == [4]  # the canvas starts with DreamOn's 4 masks, not the budget's 12
    assert widths[:4] == [5, 6, 7, 8]  # each <|expand|> made two masks of one
    assert max(widths) == len(TARGET) and widths[-1] == len(TARGET)
    assert fill_of(res.tokens[0]) == TARGET
    assert res.stop_reason == "complete"
    assert EXPAND not in res.tokens and DELETE not in res.tokens


def test_the_budget_bounds_the_growth(lib: str) -> None:
    den = ResizingFake([[*TARGET, 13, 14]], lib, LengthEdits(EXPAND, DELETE, start=4))
    res, widths = fill(den, budget=6)
    assert max(widths) == 6 and max(max(w) for w in den.widths) == 6  # never past the budget
    assert fill_of(res.tokens[0]) == TARGET[:6]  # <|expand|> barred at the budget: content there
    assert res.tokens.shape[1] == 6


def test_delete_shrinks_the_canvas_with_the_masks_right_of_it(lib: str) -> None:
    den = ResizingFake([[5, 6, 7]], lib, LengthEdits(EXPAND, DELETE, start=8))
    res, widths = fill(den, budget=8)
    assert den.widths[0] == [8]
    assert widths[0] == 3  # one <|delete|> at position 3 took the masks 4..7 with it
    assert fill_of(res.tokens[0]) == [5, 6, 7]
    assert res.stop_reason == "complete"


def test_rows_of_a_batch_change_length_apart(lib: str) -> None:
    den = ResizingFake([TARGET[:6], [5, 6]], lib, LengthEdits(EXPAND, DELETE, start=4))
    res, _ = fill(den, budget=8)
    assert [len(fill_of(row)) for row in res.tokens] == [6, 2]
    assert fill_of(res.tokens[0]) == TARGET[:6] and fill_of(res.tokens[1]) == [5, 6]
    assert [6, 2] in den.widths  # the short row was padded while the long one grew
    assert res.tokens[1, 2:].tolist() == [PAD] * (res.tokens.shape[1] - 2)


def test_several_decisions_in_one_step(lib: str) -> None:
    den = ResizingFake([[5, 6, 7, 8, 9, 10]], lib, LengthEdits(EXPAND, DELETE, start=4))
    res, _ = fill(den, budget=16, cfg=SamplerConfig(strategy="entropy_bound", entropy_bound=50.0, max_steps=32))
    assert fill_of(res.tokens[0]) == [5, 6, 7, 8, 9, 10]


def test_a_model_without_the_tokens_keeps_its_canvas(lib: str) -> None:
    den = ResizingFake([[5, 6, 7]], lib, None)
    res, widths = fill(den, budget=8)
    assert set(widths) == {8} and all(w == [8] for w in den.widths)
    assert EXPAND not in res.tokens and DELETE not in res.tokens  # suppressed, as any special token


def test_a_stopped_loop_leaves_no_length_token(lib: str) -> None:
    den = ResizingFake([TARGET], lib, LengthEdits(EXPAND, DELETE, start=4))
    res, _ = fill(den, budget=12, cfg=SamplerConfig(strategy="fixed_k", k=1, max_steps=2))
    assert res.stop_reason == "max_steps"
    assert EXPAND not in res.tokens and DELETE not in res.tokens


def test_min_tokens_bars_delete_before_it(lib: str) -> None:
    den = ResizingFake([[5, 6]], lib, LengthEdits(EXPAND, DELETE, start=6))
    res, _ = fill(den, budget=6, cfg=SamplerConfig(strategy="fixed_k", k=1, max_steps=32, min_tokens=4))
    assert len(fill_of(res.tokens[0])) == 4
    assert fill_of(res.tokens[0])[:2] == [5, 6]


# ---------------------------------------------------------------- the change itself


def test_a_change_moves_positions_makes_masks_and_pads(lib: str) -> None:
    den = ResizingFake([[5]], lib, None)
    x = den.as_array(np.array([[5, 6, 7, 8], [9, 10, 11, 12]]))
    change = Change(np.array([[0, NEW, NEW, 2, 3], [1, 3, END, END, END]]))
    out = np.asarray(remap(x, change, MASK, PAD) if lib == "numpy" else remap(x, change, MASK, PAD).numpy())
    assert out.tolist() == [[5, MASK, MASK, 7, 8], [10, 12, PAD, PAD, PAD]]
    assert change.lengths.tolist() == [5, 2]


def test_the_length_heads_sizing_is_a_truncation(lib: str) -> None:
    den = ResizingFake([[5], [5]], lib, None)
    canvas = initial_canvas(den, 2, 5, den.random_source(None))  # type: ignore[arg-type]
    sized_canvas, fixed = sized(den, canvas, [3, 5])  # type: ignore[arg-type]
    host = np.asarray(sized_canvas) if lib == "numpy" else sized_canvas.numpy()
    fixed_host = np.asarray(fixed) if lib == "numpy" else fixed.numpy()
    assert host.tolist() == [[MASK] * 3 + [PAD] * 2, [MASK] * 5]
    assert fixed_host.tolist() == [[False] * 3 + [True] * 2, [False] * 5]
    assert row_lengths(host, fixed_host, PAD).tolist() == [3, 5]
    assert truncation([3, 5], 5).src.tolist() == [[0, 1, 2, END, END], [0, 1, 2, 3, 4]]
