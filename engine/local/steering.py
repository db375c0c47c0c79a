"""What the decoding loops share: how a caller steers them (`Steering`: greedy rows,
per-row temperature, deadline, cancel, a step observer, the tokens that end a one-token
row, the characters it spells first), what they return (`SampleResult`) and show
(`StepView`), and the array helpers they use on numpy and torch alike. The canvas loop is
engine/local/sampler.py, the one-token loop engine/local/one_token.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import array_api_compat
import numpy as np

from engine.decoding import SamplerConfig, StopReason
from engine.denoisers.base import DenoiserInfo
from engine.local.heal import Heal


@dataclass
class SampleResult:
    """The outcome of one denoising run over a batch of canvases (numpy, on the host)."""

    tokens: np.ndarray  # (B, C) int64
    confidence: np.ndarray  # (B, C) float32: probability of each token when it was chosen
    steps: int  # forward passes run
    stop_reason: StopReason
    row_steps: list[int] = field(default_factory=list)  # forward passes each row needed


@dataclass
class StepView:
    """What an observer (drafts, tests) sees after each step."""

    step: int
    argmax_canvas: Any  # (B, C) backend array
    canvas: Any  # (B, C) backend array


def to_numpy(x: Any) -> np.ndarray:
    """Any backend array -> numpy on the host."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
    return np.asarray(x)


def log_softmax(logits: Any) -> Any:
    """(..., V) -> (..., V) in float32, numerically stable."""
    xp = array_api_compat.array_namespace(logits)
    x = xp.astype(logits, xp.float32)
    shifted = x - xp.max(x, axis=-1, keepdims=True)
    return shifted - xp.log(xp.sum(xp.exp(shifted), axis=-1, keepdims=True))


def softmax(logits: Any) -> Any:
    """(..., V) -> (..., V) probabilities in float32, computed as torch.softmax does."""
    xp = array_api_compat.array_namespace(logits)
    x = xp.astype(logits, xp.float32)
    e = xp.exp(x - xp.max(x, axis=-1, keepdims=True))
    return e / xp.sum(e, axis=-1, keepdims=True)


def entropy(logp: Any) -> Any:
    """(..., V) log-probabilities -> (...) entropy in nats."""
    xp = array_api_compat.array_namespace(logp)
    return -xp.sum(xp.exp(logp) * logp, axis=-1)


def stop_requested(cancel: Callable[[], bool] | None, deadline: float | None) -> StopReason | None:
    """Why a loop must stop before its next step, or None: "cancelled" when the cancel
    callback says so (asked first), "deadline" when time.monotonic() has reached the
    deadline. Every loop asks it between steps (through `Steering.stopped`)."""
    if cancel is not None and cancel():
        return "cancelled"
    if deadline is not None and time.monotonic() >= deadline:
        return "deadline"
    return None


@dataclass(frozen=True)
class Steering:
    """How a caller steers the decoding loops (`run`, `run_autoregressive`, and
    engine.local.verify's `run_verified`) beyond the sampler's settings: which rows are
    greedy and how hot the others are, when to stop early, who watches the steps, and
    (the one-token loops only) which tokens end a row. The default steers nothing.

    greedy_rows: (B,) bool backend array, rows that take the argmax even when cfg.greedy
        is False (the first of several candidates is the most likely fill).
    row_temperature: (B, 1, 1) float backend array, a per-row factor on the schedule's
        temperature (1.0 for the greedy row, higher for sampled candidates); None: 1.0.
    deadline: time.monotonic() value after which the loop stops with what it has.
    cancel: checked between steps; True stops the loop.
    on_step: called after each step with what the loop has so far.
    stop_after: the one-token loops end a row after one of these tokens, keeping it (a
        line break where the span is one line, which the span check cuts at anyway);
        the canvas loop, which has no order to stop in, ignores it.
    line_ends, blanks: past the deadline the one-token loop still finishes a row's first
        line that holds text: until a token of `line_ends` after (or with) one not in
        `blanks`, or the row's end (a slow model's fill is never cut to nothing or
        mid-line by the deadline; cancel still stops it at once).
    echo: the one-token loop asks it after each token with the row so far; a number
        ends the row after that many tokens (engine.local.echo: the fill began to write
        the code after the cursor again).
    heal: the characters each one-token row must write first, in tokens the model
        chooses among those that spell them (engine.local.heal); None: no constraint.
    """

    greedy_rows: Any | None = None
    row_temperature: Any | None = None
    deadline: float | None = None
    cancel: Callable[[], bool] | None = None
    on_step: Callable[[StepView], None] | None = None
    stop_after: frozenset[int] = frozenset()
    line_ends: frozenset[int] = frozenset()
    blanks: frozenset[int] = frozenset()
    echo: Callable[[np.ndarray], int | None] | None = None
    heal: Heal | None = None

    def stopped(self) -> StopReason | None:
        """Why the loop must stop before its next step, or None (`stop_requested`)."""
        return stop_requested(self.cancel, self.deadline)

    def stopped_in_line(self, row: np.ndarray) -> StopReason | None:
        """`stopped` for a one-token row holding `row` so far: the deadline waits for
        the end of its first line (`line_ends`)."""
        stop = self.stopped()
        if stop != "deadline" or not self.line_ends:
            return stop
        text = False  # a token with text seen on the row
        for token in (int(t) for t in row):
            if token in self.line_ends and (text or token not in self.blanks):
                return stop  # a line with text is done
            text = text or token not in self.blanks
        return None

    def ended_by_echo(self, row: np.ndarray, upto: int, info: DenoiserInfo) -> bool:
        """Whether a one-token row's first `upto` tokens end where it began to repeat the
        suffix (`echo`); if so, that end written in place: end-of-fill there, padding after."""
        if self.echo is None or (keep := self.echo(row[:upto])) is None:
            return False
        row[keep] = info.eof_id
        row[keep + 1 : upto] = info.pad_id
        return True

    def show(self, step: int, argmax_canvas: Any, canvas: Any) -> None:
        """Tell the observer, if there is one, what step `step` left."""
        if self.on_step is not None:
            self.on_step(StepView(step=step, argmax_canvas=argmax_canvas, canvas=canvas))

    def show_rows(self, step: int, denoiser: Any, rows: np.ndarray) -> None:
        """The one-token loops' view: the rows decoded so far (on the host) are both the
        canvas and its argmax, made a backend array only when someone watches."""
        if self.on_step is not None:
            view = denoiser.as_array(rows)
            self.on_step(StepView(step=step, argmax_canvas=view, canvas=view))

    def row_settings(self, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """(temperature factor, greedy) per row, on the host."""
        temps = np.ones(batch, dtype=np.float32)
        if self.row_temperature is not None:
            temps = to_numpy(self.row_temperature).reshape(-1)
        greedy = np.zeros(batch, dtype=bool) if self.greedy_rows is None else to_numpy(self.greedy_rows).reshape(-1)
        return temps, greedy

    def one_token_rows(self, batch: int, cfg: SamplerConfig) -> list[tuple[float, bool]]:
        """(temperature, greedy) of each row in the one-token loops: one token at a time
        has no step schedule, so the schedule's first temperature times the row's factor;
        greedy when the sampler or the row says."""
        temps, greedy = self.row_settings(batch)
        temp = cfg.temperature(cfg.max_steps)
        return [(temp * float(temps[r]), bool(cfg.greedy or greedy[r])) for r in range(batch)]
