"""The sampler against a fake denoiser with known logits, on numpy and on torch."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from engine.decoding import SamplerConfig
from engine.denoisers.base import DenoiserInfo, EncodedContext
from engine.denoisers.onnx import NumpyRandomSource
from engine.local.one_token import run_autoregressive
from engine.local.sampler import initial_canvas, run
from engine.local.steering import Steering, StepView, stop_requested
from engine.local.strategies import select_positions
from tests.fakes import EOF, MASK, PAD, FakeAutoregressive, V


class FakeDenoiser:
    """Logits peaked on target[i] with a per-position sharpness (higher = more certain).

    It counts its calls and records the canvases it saw.
    """

    def __init__(self, target: list[int], sharp: list[float], lib: str = "numpy", regime: str = "absorbing") -> None:
        self.lib = lib
        self.info = DenoiserInfo(
            vocab_size=V,
            regime=regime,
            eof_id=EOF,
            pad_id=PAD,
            mask_id=MASK if regime == "absorbing" else None,
            max_positions=512,
            uses_self_conditioning=regime == "uniform",
        )
        logits = np.full((len(target), V), 0.0, dtype=np.float32)
        for i, (t, s) in enumerate(zip(target, sharp, strict=True)):
            logits[i, t] = s
        self.logits = logits
        self.calls = 0
        self.seen: list[np.ndarray] = []
        self.self_conds: list[Any] = []

    def prefill(self, ids: Any, state: Any = None) -> EncodedContext:
        return EncodedContext(token_ids=tuple(ids), payload=None)

    def denoise(self, state: EncodedContext, canvas: Any, self_cond: Any = None) -> Any:
        self.calls += 1
        self.seen.append(np.asarray(canvas).copy() if self.lib == "numpy" else canvas.numpy().copy())
        self.self_conds.append(self_cond)
        out = np.broadcast_to(self.logits, (canvas.shape[0], *self.logits.shape)).copy()
        return self.as_float(out)

    def as_float(self, x: np.ndarray) -> Any:
        if self.lib == "torch":
            import torch

            return torch.from_numpy(x)
        return x

    def as_array(self, values: Any) -> Any:
        if self.lib == "torch":
            import torch

            return torch.as_tensor(np.asarray(values), dtype=torch.long)
        return np.asarray(values, dtype=np.int64)

    def random_source(self, seed: int | None) -> Any:
        if self.lib == "torch":
            from engine.denoisers.torch import TorchRandomSource

            return TorchRandomSource(seed)
        return NumpyRandomSource(seed)


def sample(den: FakeDenoiser, cfg: SamplerConfig, b: int = 1, **steer: Any) -> tuple[Any, list[np.ndarray]]:
    rng = den.random_source(cfg.seed)
    canvas = initial_canvas(den, b, den.logits.shape[0], rng)
    views: list[np.ndarray] = []

    def on_step(v: StepView) -> None:
        views.append(np.asarray(v.canvas).copy() if den.lib == "numpy" else v.canvas.numpy().copy())

    res = run(den, den.prefill([2, 3]), canvas, cfg, rng, steer=Steering(on_step=on_step, **steer))
    return res, views


TARGET = [5, 6, 7, 8, 9, 10, EOF, PAD]


def test_entropy_bound_locks_lowest_entropy_first(lib: str) -> None:
    sharp = [20.0, 2.0, 20.0, 1.0, 20.0, 0.5, 20.0, 20.0]  # positions 0, 2, 4, 6, 7 near-certain
    den = FakeDenoiser(TARGET, sharp, lib)
    res, views = sample(den, SamplerConfig(strategy="entropy_bound", entropy_bound=0.01))
    first = views[0]
    locked = set(np.flatnonzero(first[0] != MASK).tolist())
    # the certain ones (eof at 6 and the padding after it among them) plus the most
    # certain of the rest: sum(H) - max(H) <= bound excludes the largest one from the sum
    assert locked == {0, 2, 4, 6, 7, 1}
    assert res.tokens[0].tolist() == TARGET
    assert res.stop_reason == "complete"
    # the uncertain ones lock one per step afterwards, most certain first
    order = [int(np.flatnonzero((v[0] != MASK) & (p[0] == MASK))[0]) for p, v in zip(views, views[1:], strict=False)]
    assert order == [3, 5]


def test_entropy_bound_accepts_more_with_a_larger_bound(lib: str) -> None:
    sharp = [3.0] * 6 + [20.0, 20.0]
    small, _ = sample(FakeDenoiser(TARGET, sharp, lib), SamplerConfig(entropy_bound=0.01))
    large, _ = sample(FakeDenoiser(TARGET, sharp, lib), SamplerConfig(entropy_bound=50.0))
    assert large.steps == 1
    assert small.steps > large.steps
    assert small.tokens.tolist() == large.tokens.tolist() == [TARGET]


def test_confidence_threshold_locks_only_confident_positions(lib: str) -> None:
    sharp = [20.0, 1.0, 20.0, 1.0, 20.0, 1.0, 20.0, 20.0]
    den = FakeDenoiser(TARGET, sharp, lib)
    _, views = sample(den, SamplerConfig(strategy="confidence", confidence_threshold=0.9))
    assert set(np.flatnonzero(views[0][0] != MASK).tolist()) == {0, 2, 4, 6, 7}
    # nothing above the threshold: still one position per step, so it progresses
    assert int((views[1][0] != MASK).sum()) == 6


def test_fixed_k_and_left_to_right_step_counts(lib: str) -> None:
    sharp = [2.0] * 8
    target = [5, 6, 7, 8, 9, 10, 11, 12]  # no end-of-fill: every position is filled
    k3, _ = sample(FakeDenoiser(target, sharp, lib), SamplerConfig(strategy="fixed_k", k=3, stop_entropy=1e-9))
    assert k3.steps == math.ceil(8 / 3)
    l2r, views = sample(FakeDenoiser(target, sharp, lib), SamplerConfig(strategy="left_to_right", stop_entropy=1e-9))
    assert l2r.steps == 8
    assert [int((v[0] != MASK).sum()) for v in views] == list(range(1, 9))
    assert all(v[0, i] == target[i] for i, v in enumerate(views))


def test_end_of_fill_pads_the_rest_and_stops(lib: str) -> None:
    target = [5, EOF, 9, 9, 9, 9, 9, 9]  # after eof the model would say 9: the sampler pads
    sharp = [20.0, 20.0] + [0.1] * 6
    res, _ = sample(FakeDenoiser(target, sharp, lib), SamplerConfig(strategy="confidence"))
    assert res.steps == 1
    assert res.tokens[0].tolist() == [5, EOF] + [PAD] * 6


def test_cancel_is_checked_between_steps(lib: str) -> None:
    den = FakeDenoiser(TARGET, [2.0] * 8, lib)
    calls = {"n": 0}

    def cancel() -> bool:
        calls["n"] += 1
        return calls["n"] > 2

    res, _ = sample(den, SamplerConfig(strategy="left_to_right"), cancel=cancel)
    assert res.stop_reason == "cancelled"
    assert den.calls == 2 == res.steps


def test_deadline_stops_the_loop(lib: str) -> None:
    den = FakeDenoiser(TARGET, [2.0] * 8, lib)
    res, _ = sample(den, SamplerConfig(strategy="left_to_right"), deadline=time.monotonic() - 1)
    assert res.stop_reason == "deadline"
    assert den.calls == 0
    # no step ran: the canvas is still all mask, which infill decodes as an empty fill
    assert res.tokens.tolist() == [[MASK] * 8]


def test_uniform_regime_stops_when_stable_and_confident(lib: str) -> None:
    den = FakeDenoiser(TARGET, [30.0] * 8, lib, regime="uniform")
    res, _ = sample(
        den,
        SamplerConfig(
            max_steps=10, stability_threshold=1, stop_entropy=0.01, seed=3, greedy=False, t_max=1.0, t_min=0.5
        ),
    )
    assert res.tokens[0].tolist() == TARGET
    assert res.stop_reason == "stable"
    assert res.steps == 2  # step 1 sets the history, step 2 confirms it
    assert den.self_conds[0] is None and den.self_conds[1] is not None  # self-conditioning passed on


def test_seeded_sampling_is_deterministic(lib: str) -> None:
    sharp = [0.5] * 8  # flat: sampling matters
    cfg = SamplerConfig(strategy="fixed_k", k=2, greedy=False, seed=7, stop_entropy=1e-9)
    a, _ = sample(FakeDenoiser(TARGET, sharp, lib, regime="uniform"), cfg, b=3)
    b, _ = sample(FakeDenoiser(TARGET, sharp, lib, regime="uniform"), cfg, b=3)
    c, _ = sample(FakeDenoiser(TARGET, sharp, lib, regime="uniform"), SamplerConfig(**{**cfg.__dict__, "seed": 8}), b=3)
    assert a.tokens.tolist() == b.tokens.tolist()
    assert a.confidence.tolist() == b.confidence.tolist()
    # the answer is the argmax canvas, the same for any seed; the path (confidences) is not
    assert a.tokens.tolist() == c.tokens.tolist()
    den_a = FakeDenoiser(TARGET, sharp, lib, regime="uniform")
    den_c = FakeDenoiser(TARGET, sharp, lib, regime="uniform")
    sample(den_a, cfg, b=3)
    sample(den_c, SamplerConfig(**{**cfg.__dict__, "seed": 8}), b=3)
    assert not all((x == y).all() for x, y in zip(den_a.seen, den_c.seen, strict=False))


def test_drafts_are_kept_only_where_the_model_agrees(lib: str) -> None:
    sharp = [1.0] * 6 + [20.0, 20.0]
    canvas = np.full((1, 8), MASK)
    canvas[0, :4] = [5, 6, 99 % V, 3]  # agrees at 0, 1; disagrees at 2, 3
    draft = np.zeros((1, 8), dtype=bool)
    draft[0, :4] = True

    def with_draft(draft_confidence: float) -> tuple[Any, list[np.ndarray]]:
        den = FakeDenoiser(TARGET, sharp, lib)
        views: list[np.ndarray] = []
        res = run(
            den,
            den.prefill([1]),
            den.as_array(canvas),
            SamplerConfig(entropy_bound=0.01, draft_confidence=draft_confidence),
            den.random_source(0),
            draft=den.as_array(draft.astype(np.int64)) == 1,
            steer=Steering(on_step=lambda v: views.append(np.asarray(v.canvas))),
        )
        return res, views

    res, views = with_draft(0.1)
    first = views[0][0]
    assert first[0] == 5 and first[1] == 6  # verified drafts locked at once
    assert first[3] == MASK  # rejected draft went back to mask
    assert res.tokens[0].tolist() == TARGET
    no_draft, _ = sample(FakeDenoiser(TARGET, sharp, lib), SamplerConfig(entropy_bound=0.01))
    assert res.steps < no_draft.steps
    # an agreement below draft_confidence does not count: no steps saved
    strict, _ = with_draft(0.9)
    assert strict.steps == no_draft.steps


def test_numpy_and_torch_give_the_same_tokens() -> None:
    pytest.importorskip("torch")
    sharp = [3.0, 1.0, 2.0, 0.5, 4.0, 1.5, 20.0, 20.0]
    cfg = SamplerConfig(entropy_bound=0.5)
    a, _ = sample(FakeDenoiser(TARGET, sharp, "numpy"), cfg)
    b, _ = sample(FakeDenoiser(TARGET, sharp, "torch"), cfg)
    assert a.tokens.tolist() == b.tokens.tolist()
    assert a.steps == b.steps
    np.testing.assert_allclose(a.confidence, b.confidence, rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"strategy": "nope"},
        {"max_steps": 0},
        {"entropy_bound": 0},
        {"confidence_threshold": 1.5},
        {"k": 0},
        {"t_min": 0.0},
        {"t_min": 2.0, "t_max": 1.0},
        {"stability_threshold": -1},
    ],
)
def test_invalid_config_is_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        SamplerConfig(**kwargs)


def test_temperature_schedule_runs_from_t_max_to_t_min() -> None:
    cfg = SamplerConfig(max_steps=4, t_max=0.8, t_min=0.4)
    assert cfg.temperature(4) == pytest.approx(0.8)
    assert cfg.temperature(1) == pytest.approx(0.5)


def test_select_positions_never_picks_closed_positions() -> None:
    ent = np.asarray([[0.0, 0.0, 5.0, 5.0]], dtype=np.float32)
    conf = np.asarray([[1.0, 1.0, 0.2, 0.2]], dtype=np.float32)
    open_ = np.asarray([[False, True, True, True]])
    for strategy in ("entropy_bound", "confidence", "fixed_k", "left_to_right"):
        cfg = SamplerConfig(strategy=strategy, k=2)  # type: ignore[arg-type]
        sel = select_positions(cfg.strategy, cfg, ent, conf, open_)
        assert not sel[0, 0]
        assert sel[0, 1]


class RowsDenoiser(FakeDenoiser):
    """Different logits per row: one fake per row, stacked."""

    def __init__(self, rows: list[FakeDenoiser]) -> None:
        super().__init__(TARGET, [1.0] * len(TARGET), rows[0].lib)
        self.rows = rows

    def denoise(self, state: EncodedContext, canvas: Any, self_cond: Any = None) -> Any:
        self.calls += 1
        return self.as_float(np.stack([r.logits for r in self.rows]))


def test_a_row_that_finishes_early_is_left_as_it_was(lib: str) -> None:
    certain = FakeDenoiser(TARGET, [20.0] * 8, lib)  # done in one step
    unsure = FakeDenoiser([5, 6, 7, 8, 9, 10, 11, 12], [1.0] * 8, lib)  # one token per step
    den = RowsDenoiser([certain, unsure])
    res, views = sample(den, SamplerConfig(strategy="entropy_bound", entropy_bound=0.01, stop_entropy=1e-9), b=2)
    assert res.row_steps == [1, 8]
    assert res.tokens[0].tolist() == TARGET  # no mask left behind in the early row
    assert res.tokens[1].tolist() == [5, 6, 7, 8, 9, 10, 11, 12]
    assert all((v[0] == views[0][0]).all() for v in views)  # row 0 never changed after step 1
    assert float(res.confidence[0].min()) > 0.99


def test_seeded_sampling_is_deterministic_on_the_absorbing_canvas(lib: str) -> None:
    sharp = [0.5] * 6 + [20.0, 20.0]
    cfg = SamplerConfig(strategy="fixed_k", k=2, greedy=False, seed=11)
    runs = [sample(FakeDenoiser(TARGET, sharp, lib), cfg, b=2)[0] for _ in range(2)]
    assert runs[0].tokens.tolist() == runs[1].tokens.tolist()
    other = sample(FakeDenoiser(TARGET, sharp, lib), replace(cfg, seed=12), b=2)[0]
    assert other.tokens.tolist() != runs[0].tokens.tolist()  # flat logits: the seed matters


def test_a_row_that_stops_early_keeps_no_mask(lib: str) -> None:
    # row 0 becomes stable and confident enough (mean entropy < 2) at step 2 with open
    # positions left; row 1 (mean entropy > 2) goes on locking one position a step
    early = FakeDenoiser([5, 6, 7, 8, 9, 10, 11, 12], [20.0, 20.0] + [3.0] * 6, lib)
    late = FakeDenoiser([5, 6, 7, 8, 9, 10, 11, 12], [1.0] * 8, lib)
    den = RowsDenoiser([early, late])
    cfg = SamplerConfig(strategy="entropy_bound", entropy_bound=0.01, stop_entropy=2.0, stability_threshold=1)
    res, views = sample(den, cfg, b=2)
    assert res.row_steps[0] == 2 and res.row_steps[1] > 2
    # its confidences are those it had when it stopped: set where it had locked, else 0
    locked_at_stop = views[1][0] != MASK
    assert ((res.confidence[0] > 0) == locked_at_stop).all()
    assert res.tokens[0].tolist() == [5, 6, 7, 8, 9, 10, 11, 12]  # open positions took the argmax
    assert MASK not in res.tokens.tolist()[0]


def test_min_tokens_bars_end_of_fill_before_it(lib: str) -> None:
    """A model sure the fill is empty (end-of-fill first) gives an empty fill, unless
    min_tokens asks for at least that many tokens: then the next likeliest ones."""
    den = FakeDenoiser([EOF, PAD, PAD, PAD], [9.0, 9.0, 9.0, 9.0], lib)
    den.logits[0, 7] = 5.0  # the likeliest token that is not an end
    den.logits[1, 8] = 5.0
    state = den.prefill([3])
    for min_tokens, want in ((0, [EOF, PAD, PAD, PAD]), (1, [7, EOF, PAD, PAD]), (2, [7, 8, EOF, PAD])):
        cfg = SamplerConfig(max_steps=8, min_tokens=min_tokens)
        out = run(den, state, initial_canvas(den, 1, 4, den.random_source(0)), cfg, den.random_source(0))
        got = out.tokens[0].tolist()
        # position min_tokens is where the end may come; 8 at position 1 only when barred
        assert got[:min_tokens] == want[:min_tokens] and EOF not in got[:min_tokens], (min_tokens, got)
        assert (got == [EOF, PAD, PAD, PAD]) == (min_tokens == 0)


@pytest.mark.parametrize(("strategy", "loop"), [("autoregressive", "run_autoregressive"), ("verified", "run_verified")])
def test_the_one_token_strategies_need_their_own_loop(strategy: Any, loop: str) -> None:
    den = FakeDenoiser([EOF], [1.0])
    with pytest.raises(ValueError, match=loop):
        run(
            den,
            den.prefill([3]),
            initial_canvas(den, 1, 1, den.random_source(0)),
            SamplerConfig(strategy=strategy),
            den.random_source(0),
        )


def test_scores_at_the_open_positions_match_the_whole_canvas(lib: str) -> None:
    """The absorbing loop scores only the open positions of unfinished rows; there it
    gives what scoring the whole canvas gives (temperature per row, suppressed tokens
    and min_tokens included), and elsewhere the canvas's own token with entropy 0."""
    from engine.local.strategies import _barred, _scores, _scores_at

    den = FakeDenoiser(TARGET, [3.0, 1.0, 0.5, 2.0, 4.0, 0.2, 6.0, 6.0], lib)
    b, c = 3, len(TARGET)
    rs = np.random.default_rng(0)
    logits = den.as_float(rs.normal(size=(b, c, V)).astype(np.float32) * 3)
    canvas = den.as_array(rs.integers(2, 14, size=(b, c)))
    live_np = rs.random((b, c)) < 0.5
    live_np[2] = False  # a finished row
    live = den.as_array(live_np) != 0
    temps = den.as_float(np.array([1.0, 0.8, 0.8], dtype=np.float32).reshape(b, 1, 1))
    xp_bool = den.as_array(np.zeros(V, dtype=np.int64)) != 0
    suppress = xp_bool | (den.as_array(np.arange(V)) == 4)
    ends = (den.as_array(np.arange(V)) == EOF) | (den.as_array(np.arange(V)) == PAD)
    early = den.as_array(np.arange(c)) < 2
    cfg = SamplerConfig(greedy=True)
    got = _scores_at(logits, live, canvas, 0.9, temps, suppress, early, ends, None, cfg, den.random_source(0), PAD)
    proc = _barred(logits / (temps * 0.9), suppress, early, ends)
    want = _scores(proc, None, cfg, den.random_source(0), PAD)
    for name in ("ent", "argmax", "pred", "top_lp", "pred_lp", "pad_lp"):
        g, w = np.asarray(getattr(got, name)), np.asarray(getattr(want, name))
        np.testing.assert_allclose(g[live_np], w[live_np], rtol=1e-5, atol=1e-5, err_msg=name)
    assert (np.asarray(got.argmax)[~live_np] == np.asarray(canvas)[~live_np]).all()
    assert (np.asarray(got.ent)[~live_np] == 0).all()
    assert (np.asarray(got.pad_lp)[~live_np] < -1e29).all()
    assert not (np.asarray(got.argmax)[live_np] == 4).any()  # suppressed


def _cancelled_after(n: int) -> Any:
    """A cancel callback that says yes from its (n + 1)-th call on."""
    calls = {"n": 0}

    def cancel() -> bool:
        calls["n"] += 1
        return calls["n"] > n

    return cancel


@pytest.mark.parametrize(
    ("cancel", "deadline_s", "want"),
    [
        (None, None, None),
        (lambda: False, None, None),
        (lambda: True, None, "cancelled"),
        (None, -1.0, "deadline"),
        (None, 3600.0, None),
        (lambda: False, -1.0, "deadline"),
        (lambda: True, -1.0, "cancelled"),  # the cancel flag is asked first
    ],
)
def test_stop_requested_says_why_a_loop_stops(cancel: Any, deadline_s: float | None, want: str | None) -> None:
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    assert stop_requested(cancel, deadline) == want


def test_the_autoregressive_loop_stops_on_cancel_and_deadline() -> None:
    den = FakeAutoregressive(TARGET)
    st = EncodedContext(token_ids=(2, 3), payload=None)
    cfg = SamplerConfig(strategy="autoregressive")
    whole = run_autoregressive(den, st, 8, cfg, NumpyRandomSource(0))
    assert whole.stop_reason == "complete" and whole.tokens[0].tolist() == [5, 6, 7, 8, 9, 10, EOF, PAD]

    cut = run_autoregressive(den, st, 8, cfg, NumpyRandomSource(0), steer=Steering(cancel=_cancelled_after(2)))
    assert cut.stop_reason == "cancelled" and cut.tokens[0].tolist() == [5, 6] + [PAD] * 6

    late = run_autoregressive(den, st, 8, cfg, NumpyRandomSource(0), steer=Steering(deadline=time.monotonic() - 1))
    assert late.stop_reason == "deadline" and late.tokens[0].tolist() == [PAD] * 8


def test_past_the_deadline_one_token_at_a_time_finishes_the_first_line() -> None:
    """A slow model's fill is not cut to nothing: the deadline waits for a line end (here
    token 7), and cancel still stops at once."""
    den = FakeAutoregressive(TARGET)  # 5, 6, 7, 8, ...
    st = EncodedContext(token_ids=(2, 3), payload=None)
    cfg = SamplerConfig(strategy="autoregressive")
    late = Steering(deadline=time.monotonic() - 1, line_ends=frozenset({7}))
    res = run_autoregressive(den, st, 8, cfg, NumpyRandomSource(0), steer=late)
    assert res.stop_reason == "deadline" and res.tokens[0].tolist() == [5, 6, 7] + [PAD] * 5
    # a line break before any text does not end the first line: 5 is white space here
    blank_first = Steering(deadline=time.monotonic() - 1, line_ends=frozenset({5, 7}), blanks=frozenset({5}))
    res = run_autoregressive(den, st, 8, cfg, NumpyRandomSource(0), steer=blank_first)
    assert res.tokens[0].tolist() == [5, 6, 7] + [PAD] * 5
    gone = Steering(deadline=time.monotonic() - 1, line_ends=frozenset({7}), cancel=lambda: True)
    res = run_autoregressive(den, st, 8, cfg, NumpyRandomSource(0), steer=gone)
    assert res.stop_reason == "cancelled" and res.tokens[0].tolist() == [PAD] * 8


def test_each_block_gets_a_step_even_past_max_steps() -> None:
    """More blocks than steps: each block still gets one (SamplerConfig.max_steps says so)."""
    den = FakeDenoiser([5, 6, 7, 8, 9, 10, 11, 12], [1.0] * 8)
    res, views = sample(den, SamplerConfig(strategy="confidence", max_steps=2, block_length=2))
    assert res.steps == 4 and res.stop_reason == "complete" and res.tokens[0].tolist() == [5, 6, 7, 8, 9, 10, 11, 12]
    assert [int((v[0] != MASK).sum()) for v in views] == [2, 4, 6, 8]


def test_block_length_is_ignored_on_the_uniform_canvas(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    cfg = SamplerConfig(max_steps=6, t_max=1.0, t_min=1.0)
    want, _ = sample(FakeDenoiser(TARGET, [30.0] * 8, regime="uniform"), cfg)
    with caplog.at_level(logging.DEBUG, logger="engine.local.sampler"):
        got, _ = sample(FakeDenoiser(TARGET, [30.0] * 8, regime="uniform"), replace(cfg, block_length=2))
    assert "block_length 2 ignored: the uniform regime has no blocks" in caplog.text
    assert got.tokens.tolist() == want.tokens.tolist() and got.steps == want.steps
