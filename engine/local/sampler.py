"""Sampling: encoded context in, fill tokens out; knows no model, only the Denoiser protocol.

Two loops, chosen by the sampler's strategy (a model directory's config.json sets it in
`defaults`; engine/local/generator.py's `_sample` picks the loop):

- `run_autoregressive` (engine/local/one_token.py), the default today: the shipped model
  decodes one token at a time (strategy "autoregressive"), through the causal context
  encoder of the same weights (the denoiser is also an `Autoregressive`).
- `run`, the canvas: every other strategy, a region being refined, and a model without
  the autoregressive mode. A canvas of C tokens is denoised against the cached context,
  many tokens per step. A canvas default is planned.

Both loops take the caller's `Steering` alike (engine/local/steering.py) (greedy rows, per-row temperature,
deadline, cancel, a step observer, and for one token at a time the tokens that end a
row), and stop early on the same check between steps (`Steering.stopped`): the cancel
callback first, then the deadline.

The canvas loop is written once against the array API standard (array-api-compat), so the
same code samples numpy arrays for the onnx backend and torch tensors on any device (the
DiffusionGemma path samples on the GPU). Random numbers come from the backend's
`RandomSource`. Two canvas regimes (a model's config says which):

- absorbing (MDLM / LLaDA): the canvas starts as mask tokens; each step the strategy
  picks positions to lock; locked tokens never change. Positions after a locked
  end-of-fill or padding token become padding and are locked too.
- uniform (DiffusionGemma): the canvas starts as random tokens; each step the strategy
  accepts positions from the sampled prediction and every other position is renoised
  with fresh random tokens; the answer is the argmax canvas. This mirrors transformers'
  `EntropyBoundSampler` + `_denoising_step` call for call, so a seeded run reproduces
  `DiffusionGemmaForBlockDiffusion.generate`.

The canvas loop, step by step (`run`):
  1. stop if the steering says so (`Steering.stopped`);
  2. one forward pass of the canvas against the cached context -> logits (B, C, V);
  3. divide by the step's temperature (linear schedule from t_max down to t_min);
  4. draw the denoiser canvas (sampled, or argmax when greedy) and the argmax canvas;
  5. the strategy picks which positions to accept (engine/local/strategies.py: entropy
     bound, confidence threshold, fixed k, low_confidence, or one token left to right), within the row's
     block (`_Blocks`: with cfg.block_length, LLaDA's semi-autoregressive blocks);
  6. update the canvas by the regime's rule (lock / accept-and-renoise);
  7. for a model that changes its canvas's length (DreamOn's <|expand|> and <|delete|>),
     apply the length change the step decided (engine/local/resize.py, the one mechanism
     for canvases that change length: the length head's sizing before step 0 is one too);
  8. stop a row when it is fully locked (absorbing) or stable and confident.

Blocks (cfg.block_length; the absorbing regime): the canvas is cut into blocks of that
many positions, decoded in order: a row's masks are open to the strategy only in its
first block that still has any, which gets max_steps // blocks steps, at least one
(LLaDA's generate: `low_confidence` spreads the block's masks over them), and whose last
step takes what is left of it. Blocks count from the canvas's start, or, for a model
whose attention blocks are fixed by sequence positions (DenoiserInfo.block_size:
block-causal attention), from its sequence's start, so that they fall within the model's
(a block length that divides the model's block size: the block_causal backend refuses
any other at load). For a shifted block-causal model (DenoiserInfo.block_start_settled)
the sampler also finds the positions whose prediction no mask can change any more (a
block's first position once the blocks before it are complete: an autoregressive next
token), and a row takes such a position first, alone, as Fast-dLLM v2's generation does,
in a step of its own that its block's share does not pay for. Without block_length the
canvas is one block of max_steps steps and nothing is forced. The uniform regime has no
blocks (a block_length is ignored, logged at debug level).

The loop's step budget is therefore max_steps, or with blocks per-block steps times
blocks, plus one step for each settled position the canvas can hold: with more blocks than
max_steps, or with settled positions, a fill may run more than max_steps forward passes
(SamplerConfig.max_steps says so).

A denoiser that reuses one step's work in the next (`StepReuse`: the block_causal
backend's completed blocks) is asked for a fill's own state at the start of `run`; the
state is dropped when `run` returns, and what it held with it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import array_api_compat
import numpy as np

from engine.decoding import ONE_TOKEN_STRATEGIES, SamplerConfig, StopReason
from engine.denoisers.base import Denoiser, DenoiserInfo, EncodedContext, RandomSource, StepReuse
from engine.local.resize import Change, Edits, edits_of, remap, row_lengths
from engine.local.steering import SampleResult, Steering, to_numpy
from engine.local.strategies import (
    StableAndConfident,
    _barred,
    _Scores,
    _scores,
    _scores_at,
    leftmost_end,
    pad_after_end,
    select_positions,
)

log = logging.getLogger(__name__)


def initial_canvas(
    denoiser: Denoiser,
    batch: int,
    length: int,
    rng: RandomSource,
) -> Any:
    """A fresh canvas for the denoiser's regime: all mask, or uniform random tokens."""
    info = denoiser.info
    if info.regime == "absorbing":
        assert info.mask_id is not None, "absorbing regime needs a mask token"
        return denoiser.as_array(np.full((batch, length), info.mask_id, dtype=np.int64))
    return rng.uniform_tokens((batch, length), info.vocab_size)


def run(
    denoiser: Denoiser,
    state: EncodedContext,
    canvas: Any,
    cfg: SamplerConfig,
    rng: RandomSource,
    *,
    fixed: Any | None = None,
    draft: Any | None = None,
    steer: Steering = Steering(),  # noqa: B008 (frozen: one shared default is safe)
) -> SampleResult:
    """Denoise `canvas` (B, C) against the encoded context `state`.

    fixed: (B, C) bool, positions whose tokens in `canvas` are given (typed text on a
        warm start) and never change.
    draft: (B, C) bool, positions holding drafter proposals: visible to the model on the
        first step and kept there only where its argmax agrees (absorbing regime); in
        the uniform regime they are simply the starting tokens.
    steer: greedy rows, per-row temperature, deadline, cancel and the step observer
        (`Steering`).
    """
    if cfg.strategy in ONE_TOKEN_STRATEGIES:
        loop = "run_autoregressive" if cfg.strategy == "autoregressive" else "engine.local.verify.run_verified"
        raise ValueError(f"the {cfg.strategy} strategy decodes through {loop}, not a canvas")
    xp = array_api_compat.array_namespace(canvas)
    regime, st, stopper, draft, edits = _setup(denoiser, canvas, cfg, rng, fixed, draft, steer)
    blocks = _Blocks(denoiser.info, len(state.token_ids), st.canvas, cfg)
    if isinstance(denoiser, StepReuse):
        state = denoiser.fill_state(state)  # this fill's own: what a step leaves for the next, dropped with it
    reason: StopReason = "max_steps"
    steps = 0
    for step in range(blocks.steps):
        # 1. cancel and deadline, checked between steps
        if (stop := steer.stopped()) is not None:
            reason = stop
            break
        # 2. forward pass of the canvas only
        logits = denoiser.denoise(state, st.canvas, regime.self_cond)
        logits = logits if edits is None else edits.bar(logits)
        steps += 1
        st.row_steps = st.row_steps + xp.astype(xp.logical_not(st.finished), xp.int64)
        # 3-4. temperature, the denoiser canvas (sampled, or argmax when greedy), and each
        # position's entropy and log-probabilities
        sc = regime.score(logits, cfg.temperature(max(cfg.max_steps - step, 1)), st.canvas, st.locked, st.finished)
        # 5. which positions to accept: within each row's block
        window = blocks.window(regime.open(st.locked))
        accept, pred = _accepted(regime, sc, st, draft if step == 0 else None, window)
        # 6. update the canvas
        st.update(regime, accept, pred, sc)
        # 7. a length change the step's decisions make (DreamOn's), then stopping
        ent = sc.ent if edits is None else st.edited(edits, regime, stopper, sc.ent)
        st.finished = xp.logical_or(st.finished, regime.stop(stopper(st.argmax_canvas, ent), st.locked))
        steer.show(step, st.argmax_canvas, st.canvas)
        if bool(xp.all(st.finished)):
            reason = "complete" if regime.complete(st.locked) else "stable"
            break
    return st.result(regime, steps, reason, edits)


def _setup(
    denoiser: Denoiser,
    canvas: Any,
    cfg: SamplerConfig,
    rng: RandomSource,
    fixed: Any | None,
    draft: Any | None,
    steer: Steering,
) -> tuple[_Regime, _CanvasState, StableAndConfident, Any, Edits | None]:
    """`run`'s start: the regime, the canvas state, the stop rule and the drafts; for a
    model that changes its canvas's length (engine.local.resize), its edits, whose first
    change (the canvas's starting length) is applied before step 0."""
    xp = array_api_compat.array_namespace(canvas)
    no = xp.zeros(canvas.shape, dtype=xp.bool, device=array_api_compat.device(canvas))
    fixed = no if fixed is None else fixed
    draft = no if draft is None else xp.logical_and(draft, xp.logical_not(fixed))
    regime_type = _Absorbing if denoiser.info.regime == "absorbing" else _Uniform
    regime = regime_type(denoiser.info, cfg, rng, canvas, fixed, steer)
    st = _CanvasState.start(canvas, fixed)
    stopper = StableAndConfident(cfg.stability_threshold, cfg.stop_entropy)
    ids = edits_of(denoiser)
    if ids is None or denoiser.info.regime != "absorbing":
        return regime, st, stopper, draft, None
    lengths = row_lengths(to_numpy(canvas), to_numpy(fixed), denoiser.info.pad_id)
    edits = Edits(ids, denoiser.info, lengths, cfg.min_tokens)
    change = edits.start(to_numpy(xp.logical_or(fixed, draft)))
    if change is not None:
        st.remap(change, regime, stopper)
        draft = remap(draft, change, False, False)
    return regime, st, stopper, draft, edits


def _accepted(regime: _Regime, sc: _Scores, st: _CanvasState, draft: Any | None, window: _Window) -> tuple[Any, Any]:
    """Step 5 of `run`: (the positions to accept, the tokens they take), within each row's
    block (`window`): the strategy's pick (over the steps left in the block), then the
    regime's own rule; at a block's last step, all that is left of it; on the first step
    (`draft` given) also the drafts the model agrees with, confidently (they are verified
    in this one pass). A row whose block holds settled positions takes those alone (a step
    its block's share does not pay for: `_Blocks`)."""
    xp, cfg = regime.xp, regime.cfg
    open_ = xp.logical_and(regime.open(st.locked), window.inside)
    choosable = regime.choosable(open_, sc)
    accept = select_positions(cfg.strategy, cfg, sc.ent, xp.exp(sc.top_lp), choosable, window.remaining)
    accept, pred = regime.decide(accept, sc, open_)
    if window.last is not None:
        accept = xp.logical_or(accept, xp.logical_and(open_, window.last))
    if draft is not None:
        agree = xp.logical_and(pred == st.canvas, xp.exp(sc.pred_lp) >= cfg.draft_confidence)
        accept = xp.logical_or(accept, xp.logical_and(xp.logical_and(draft, window.inside), agree))
    if window.lead is not None:
        accept = xp.where(xp.any(window.lead, axis=-1, keepdims=True), window.lead, accept)
    return accept, pred


def settled_positions(open_: Any, start: int, size: int) -> Any:
    """(B, C) bool, for a shifted block-causal model whose canvas begins at sequence
    position `start`: each row's first open position (every one before it locked) where it
    begins one of the model's blocks (`start` + i a multiple of `size`). Its logits come from
    the last position of the block before, whose tokens are all locked: nothing the loop
    does can change them any more (an autoregressive next token). An unlocked token before
    it (a draft, a typed-through rest) is not locked: then no position is settled."""
    xp = array_api_compat.array_namespace(open_)
    idx = xp.arange(open_.shape[-1], device=array_api_compat.device(open_))
    first = xp.logical_and(open_, xp.cumulative_sum(xp.astype(open_, xp.int32), axis=-1) == 1)
    return xp.logical_and(first, (idx + start) % size == 0)


@dataclass
class _Window:
    """Where one step of `run` may accept positions (`_Blocks.window`): each row's block
    (B, C), the steps left in it, this one included (B, 1), whether this is its last
    ((B, 1); None without blocks: nothing is forced), and the settled positions in it to
    take alone ((B, C); None when the model has none)."""

    inside: Any
    remaining: Any
    last: Any | None
    lead: Any | None


class _Blocks:
    """The canvas's semi-autoregressive blocks (cfg.block_length, the absorbing regime):
    blocks of that many positions, counted from the canvas's start (LLaDA's generate) or,
    for a model with blocks of its own (`DenoiserInfo.block_size`), from its sequence's
    start (`start`: the canvas's position in it); a row decodes only in its first block with
    open positions, which has max_steps // blocks steps (at least one), its last taking
    whatever is left of it. Without blocks the canvas is one block of max_steps steps and
    nothing is forced (the loop ends; what is left takes the argmax). A step in which a row
    takes a settled position (`settled_positions`) is not one of its block's: `steps`, the
    loop's budget, has one more for each such position the canvas can hold."""

    def __init__(self, info: DenoiserInfo, start: int, canvas: Any, cfg: SamplerConfig) -> None:
        xp = array_api_compat.array_namespace(canvas)
        self.xp, self.dev = xp, array_api_compat.device(canvas)
        blocked = cfg.block_length is not None and info.regime == "absorbing"
        if cfg.block_length is not None and not blocked:
            log.debug("block_length %d ignored: the %s regime has no blocks", cfg.block_length, info.regime)
        self.length = cfg.block_length if blocked else None
        self.start = start if info.block_size is not None else 0  # where the blocks count from
        self.phase = 0 if self.length is None else self.start % self.length
        c = int(canvas.shape[-1])
        n = 1 if self.length is None else -(-(self.phase + c) // self.length)
        self.per_block = max(1, cfg.max_steps // n)
        # the model's block size where a block's first position settles (0: none does)
        self.size = info.block_size if info.block_size and info.block_start_settled else 0
        leads = 0  # the model's block starts at sequence positions start..start + c - 1
        if self.size:
            leads = (self.start + c - 1) // self.size - (self.start - 1) // self.size
        self.steps = (cfg.max_steps if self.length is None else self.per_block * n) + leads
        self.current: Any | None = None  # (B, 1) each row's block
        self.spent = xp.zeros((int(canvas.shape[0]), 1), dtype=xp.int64, device=self.dev)  # steps in it

    def window(self, open_: Any) -> _Window:
        """This step's window (a row's block is its first with open positions); counts the
        step against the row's block unless the row takes a settled position in it."""
        xp = self.xp
        idx = xp.arange(open_.shape[-1], device=self.dev)
        if self.length is None:
            inside, cur = xp.ones_like(open_), xp.zeros_like(self.spent)
        else:
            first = xp.min(xp.where(open_, idx, open_.shape[-1]), axis=-1, keepdims=True)  # (B, 1)
            cur = (first + self.phase) // self.length
            inside = (idx + self.phase) // self.length == cur
        if self.current is not None:
            self.spent = xp.where(cur == self.current, self.spent, 0)
        self.current = cur
        remaining = xp.clip(self.per_block - self.spent, 1, None)
        lead = None
        if self.size:
            lead = xp.logical_and(settled_positions(open_, self.start, self.size), inside)
            self.spent = xp.where(xp.any(lead, axis=-1, keepdims=True), self.spent, self.spent + 1)
        else:
            self.spent = self.spent + 1
        return _Window(inside, remaining, None if self.length is None else remaining == 1, lead)


@dataclass
class _CanvasState:
    """What the canvas loop carries from step to step: the canvas, its positions that
    no longer change, each position's confidence and the argmax canvas, each (B, C); the
    rows that are done and the forward passes each row took, (B,)."""

    canvas: Any
    locked: Any  # absorbing: the fixed and the locked positions; uniform: the fixed ones
    confidence: Any
    argmax_canvas: Any
    finished: Any
    row_steps: Any

    @classmethod
    def start(cls, canvas: Any, fixed: Any) -> _CanvasState:
        xp = array_api_compat.array_namespace(canvas)
        dev = array_api_compat.device(canvas)
        b, c = canvas.shape
        confidence = xp.where(fixed, xp.ones((b, c), dtype=xp.float32, device=dev), 0.0)
        finished = xp.zeros((b,), dtype=xp.bool, device=dev)
        return cls(canvas, fixed, confidence, canvas, finished, xp.zeros((b,), dtype=xp.int64, device=dev))

    def update(self, regime: _Regime, accept: Any, pred: Any, sc: _Scores) -> None:
        """Step 6 of `run`: the regime's update; rows that already finished keep their
        values (as transformers does)."""
        xp = regime.xp
        canvas, locked, argmax_canvas, confidence = regime.update(
            self.canvas, self.locked, accept, pred, sc, self.confidence
        )
        keep = xp.expand_dims(self.finished, axis=-1)
        self.argmax_canvas = xp.where(keep, self.argmax_canvas, argmax_canvas)
        self.canvas = xp.where(keep, self.canvas, canvas)
        self.locked = xp.where(keep, self.locked, locked)
        self.confidence = xp.where(keep, self.confidence, confidence)
        regime.keep(keep)

    def remap(self, change: Change, regime: _Regime, stopper: StableAndConfident) -> None:
        """A length change (engine.local.resize) applied to everything the loop carries
        per position: new positions are open masks, positions past a row's end locked
        padding; the stop rule's history is moved too (a new position matches none)."""
        info = regime.info
        mask = info.mask_id if info.mask_id is not None else info.pad_id
        self.canvas = remap(self.canvas, change, mask, info.pad_id)
        self.locked = remap(self.locked, change, False, True)
        self.confidence = remap(self.confidence, change, 0.0, 1.0)
        self.argmax_canvas = remap(self.argmax_canvas, change, mask, info.pad_id)
        stopper.history = [remap(h, change, -1, info.pad_id) for h in stopper.history]
        regime.resized(change)

    def edited(self, edits: Edits, regime: _Regime, stopper: StableAndConfident, ent: Any) -> Any:
        """Step 7 of `run` for a model that changes its canvas's length: the change the
        step's decisions make, applied; `ent` (B, C) moved with it."""
        change = edits.edit(to_numpy(self.canvas), to_numpy(self.locked))
        if change is None:
            return ent
        self.remap(change, regime, stopper)
        return remap(ent, change, 0.0, 0.0)

    def result(self, regime: _Regime, steps: int, reason: StopReason, edits: Edits | None = None) -> SampleResult:
        tokens = to_numpy(regime.tokens(self.canvas, self.locked, self.argmax_canvas)).astype(np.int64)
        confidence = to_numpy(self.confidence).astype(np.float32)
        if edits is not None:
            tokens, confidence = edits.clean(tokens, confidence)
        return SampleResult(
            tokens=tokens,
            confidence=confidence,
            steps=steps,
            stop_reason=reason,
            row_steps=[int(v) for v in to_numpy(self.row_steps)],
        )


class _Regime:
    """What differs between the two canvas regimes, for `run`: how a step's logits are
    scored, which positions the strategy may pick, the rule after it, how the canvas
    is updated, when a row is done, and the answer. Set up once per run."""

    def __init__(
        self,
        info: DenoiserInfo,
        cfg: SamplerConfig,
        rng: RandomSource,
        canvas: Any,
        fixed: Any,
        steer: Steering,
    ) -> None:
        xp = array_api_compat.array_namespace(canvas)
        dev = array_api_compat.device(canvas)
        self.xp, self.info, self.cfg, self.rng, self.fixed = xp, info, cfg, rng, fixed
        self.greedy_rows, self.row_temperature = steer.greedy_rows, steer.row_temperature
        self.self_cond: Any | None = None  # the previous step's logits, for models that want them
        self.suppress = None  # (V,) tokens never written
        vocab = xp.arange(info.vocab_size, device=dev)
        if info.suppress_ids:
            self.suppress = xp.zeros((info.vocab_size,), dtype=xp.bool, device=dev)
            for tok in info.suppress_ids:
                self.suppress = xp.logical_or(self.suppress, vocab == tok)
        # end-of-fill and padding (V,) are barred at positions before min_tokens (C,)
        self.early = self.ends = None
        if cfg.min_tokens > 0:
            c = canvas.shape[-1]
            self.ends = xp.logical_or(vocab == info.eof_id, vocab == info.pad_id)
            self.early = xp.arange(c, device=dev) < min(cfg.min_tokens, c - 1)

    def score(self, logits: Any, temp: float, canvas: Any, locked: Any, finished: Any) -> _Scores:
        """The whole canvas scored (tempered, barred tokens out)."""
        xp = self.xp
        proc = logits / temp if self.row_temperature is None else logits / (self.row_temperature * temp)
        proc = _barred(proc, self.suppress, self.early, self.ends)
        greedy = None if self.greedy_rows is None else xp.expand_dims(self.greedy_rows, axis=-1)
        sc = _scores(proc, greedy, self.cfg, self.rng, self.info.pad_id)
        if self.info.uses_self_conditioning:
            self._proc = proc
        return sc

    def resized(self, change: Change) -> None:
        """The canvas changed length (engine.local.resize): what is kept per position
        moves with it."""
        xp = self.xp
        self.fixed = remap(self.fixed, change, False, True)
        if self.self_cond is not None:
            self.self_cond = remap(self.self_cond, change, 0.0, 0.0)
        if self.early is not None:
            c = int(change.src.shape[1])
            self.early = xp.arange(c, device=array_api_compat.device(self.fixed)) < min(self.cfg.min_tokens, c - 1)

    def keep(self, keep: Any) -> None:
        """Rows marked in `keep` (B, 1) finished before this step: their self-conditioning
        logits stay those of their last step."""
        if self.info.uses_self_conditioning:
            proc = self._proc
            if self.self_cond is not None:
                proc = self.xp.where(self.xp.expand_dims(keep, axis=-1), self.self_cond, proc)
            self.self_cond = proc

    def open(self, locked: Any) -> Any:
        raise NotImplementedError

    def choosable(self, open_: Any, sc: _Scores) -> Any:
        return open_

    def decide(self, accept: Any, sc: _Scores, open_: Any) -> tuple[Any, Any]:
        return accept, sc.pred

    def update(
        self, canvas: Any, locked: Any, accept: Any, pred: Any, sc: _Scores, confidence: Any
    ) -> tuple[Any, Any, Any, Any]:
        raise NotImplementedError

    def stop(self, stable: Any, locked: Any) -> Any:
        return stable

    def complete(self, locked: Any) -> bool:
        return False

    def tokens(self, canvas: Any, locked: Any, argmax_canvas: Any) -> Any:
        return argmax_canvas


class _Absorbing(_Regime):
    """Masks that lock one by one. The strategy picks content; the fill's length is
    padding locked at the leftmost position sure of it, and every position after a
    locked end-of-fill or padding becomes locked padding."""

    def __init__(
        self, info: DenoiserInfo, cfg: SamplerConfig, rng: RandomSource, canvas: Any, fixed: Any, steer: Steering
    ) -> None:
        super().__init__(info, cfg, rng, canvas, fixed, steer)
        assert info.mask_id is not None, "absorbing regime needs a mask token"
        dev = array_api_compat.device(canvas)
        self.mask_tok = self.xp.asarray(info.mask_id, dtype=canvas.dtype, device=dev)
        self.pad_tok = self.xp.asarray(info.pad_id, dtype=canvas.dtype, device=dev)

    def score(self, logits: Any, temp: float, canvas: Any, locked: Any, finished: Any) -> _Scores:
        if self.info.uses_self_conditioning:
            return super().score(logits, temp, canvas, locked, finished)
        # only open positions of unfinished rows matter: locked ones never change and
        # finished rows keep their values, so the (B, C, V) work is done on those alone
        # (most of a long canvas locks as padding within a few steps)
        xp = self.xp
        live = xp.logical_and(xp.logical_not(locked), xp.logical_not(xp.expand_dims(finished, axis=-1)))
        return _scores_at(
            logits,
            live,
            canvas,
            temp,
            self.row_temperature,
            self.suppress,
            self.early,
            self.ends,
            self.greedy_rows,
            self.cfg,
            self.rng,
            self.info.pad_id,
        )

    def open(self, locked: Any) -> Any:
        return self.xp.logical_not(locked)

    def choosable(self, open_: Any, sc: _Scores) -> Any:
        # positions that would be padding wait, unless nothing else is left
        xp = self.xp
        content = xp.logical_and(open_, xp.astype(sc.argmax, self.pad_tok.dtype) != self.pad_tok)
        return xp.where(xp.any(content, axis=-1, keepdims=True), content, open_)

    def decide(self, accept: Any, sc: _Scores, open_: Any) -> tuple[Any, Any]:
        xp = self.xp
        end = self.cfg.end_confidence
        accept = xp.logical_or(accept, leftmost_end(sc.pad_lp, open_, end))
        pred = xp.astype(sc.pred, self.pad_tok.dtype)
        return accept, xp.where(accept & (xp.exp(sc.pad_lp) >= end), self.pad_tok, pred)

    def update(
        self, canvas: Any, locked: Any, accept: Any, pred: Any, sc: _Scores, confidence: Any
    ) -> tuple[Any, Any, Any, Any]:
        xp = self.xp
        new_canvas = xp.where(accept, pred, xp.where(locked, canvas, self.mask_tok))
        confidence = xp.where(accept, xp.exp(sc.pred_lp), confidence)
        new_locked = xp.logical_or(locked, accept)
        new_canvas, new_locked = pad_after_end(new_canvas, new_locked, self.info.eof_id, self.info.pad_id)
        confidence = xp.where(xp.logical_and(new_locked, xp.logical_not(locked | accept)), 1.0, confidence)
        return new_canvas, new_locked, xp.astype(sc.argmax, canvas.dtype), confidence

    def stop(self, stable: Any, locked: Any) -> Any:
        return self.xp.logical_or(stable, self.xp.all(locked, axis=-1))

    def complete(self, locked: Any) -> bool:
        return bool(self.xp.all(locked))

    def tokens(self, canvas: Any, locked: Any, argmax_canvas: Any) -> Any:
        # anything still masked (early stop) takes the latest argmax
        tokens = self.xp.where(locked, canvas, argmax_canvas)
        tokens, _ = pad_after_end(tokens, self.xp.ones_like(locked), self.info.eof_id, self.info.pad_id)
        return tokens


class _Uniform(_Regime):
    """DiffusionGemma's: each step accepts positions from the sampled prediction and
    renoises every other position with fresh random tokens; the answer is the argmax
    canvas (as transformers' EntropyBoundSampler and _denoising_step, call for call)."""

    def open(self, locked: Any) -> Any:
        return self.xp.logical_not(self.fixed)

    def update(
        self, canvas: Any, locked: Any, accept: Any, pred: Any, sc: _Scores, confidence: Any
    ) -> tuple[Any, Any, Any, Any]:
        xp = self.xp
        b, c = canvas.shape
        accepted = xp.where(accept, xp.astype(pred, canvas.dtype), canvas)
        noise = self.rng.uniform_tokens((b, c), self.info.vocab_size)
        new_canvas = xp.where(
            xp.logical_not(xp.logical_or(accept, self.fixed)), xp.astype(noise, canvas.dtype), accepted
        )
        new_argmax = xp.where(self.fixed, canvas, xp.astype(sc.argmax, canvas.dtype))
        confidence = xp.exp(
            xp.squeeze(xp.take_along_axis(sc.logp, xp.expand_dims(new_argmax, axis=-1), axis=-1), axis=-1)
        )
        return new_canvas, locked, new_argmax, confidence
