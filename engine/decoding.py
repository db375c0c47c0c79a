"""How a fill is decoded: the strategies and the sampler settings, plain data that the
frame's options carry (engine.fill.FillOptions) and every local decoding loop reads
(engine.local.sampler, engine.local.verify). Knows no model and no array library."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

Strategy = Literal[
    "entropy_bound", "confidence", "fixed_k", "low_confidence", "left_to_right", "autoregressive", "verified"
]
STRATEGIES: tuple[Strategy, ...] = (
    "entropy_bound",
    "confidence",
    "fixed_k",
    "low_confidence",
    "left_to_right",
    "autoregressive",
    "verified",
)
# strategies that decode outside the canvas loop (engine/local/verify.py, run_autoregressive)
ONE_TOKEN_STRATEGIES: tuple[Strategy, ...] = ("autoregressive", "verified")
CANDIDATE_TEMPERATURE = 0.8  # the extra, sampled candidates of a fill (local rows, remote requests)
DraftSource = Literal["canvas", "lookup"]
DRAFT_SOURCES: tuple[DraftSource, ...] = ("canvas", "lookup")
StopReason = Literal["complete", "stable", "max_steps", "deadline", "cancelled"]


@dataclass(frozen=True)
class SamplerConfig:
    """How to sample one fill. The defaults are the canvas loop's, for an absorbing model;
    a model directory's config.json overrides them (the shipped one: "autoregressive")."""

    strategy: Strategy = "entropy_bound"
    # the canvas loop's forward passes; with block_length each block gets max_steps // blocks
    # of them but at least one, and a shifted block-causal model's settled first token of a
    # block takes one of its own (engine/local/sampler.py): so a fill may run more than
    # max_steps passes, one a block and one a model's block at most
    max_steps: int = 32
    entropy_bound: float = 1.0  # nats: accept the k lowest-entropy tokens within it
    confidence_threshold: float = 0.9  # probability: accept tokens at least this likely
    k: int = 4  # tokens per step for "fixed_k"
    t_max: float = 1.0  # temperature at the first step
    t_min: float = 1.0  # temperature at the last step
    greedy: bool = True  # take the argmax; False samples from the tempered softmax
    stability_threshold: int = 1  # steps the argmax canvas must stay the same ...
    stop_entropy: float = 0.005  # ... while the mean entropy is below this, to stop early
    draft_confidence: float = 0.5  # a drafted token is kept if the model's argmax agrees this surely
    end_confidence: float = 0.9  # absorbing: lock padding at the leftmost position this sure of it
    min_tokens: int = 0  # the fill has at least this many tokens (end-of-fill and padding barred before)
    # semi-autoregressive blocks (absorbing regime): the canvas decoded in blocks of this
    # many positions, in order, each within its share of the steps (engine/local/sampler.py);
    # None: the canvas is one block. The uniform regime ignores it (a debug log line says so).
    block_length: int | None = None
    seed: int | None = None
    # "verified" (engine/local/verify.py): drafts the one-token mode keeps where it agrees,
    # from the canvas (`draft_strategy` in `draft_steps` passes) or copied from the context
    # ("lookup": the prompt-lookup drafter, at most `draft_tokens` a draft)
    drafts: DraftSource = "canvas"
    draft_strategy: Strategy = "entropy_bound"
    draft_steps: int = 1
    draft_tokens: int = 8

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}; got {self.strategy!r}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1; got {self.max_steps}")
        if self.entropy_bound <= 0:
            raise ValueError(f"entropy_bound must be > 0; got {self.entropy_bound}")
        if not 0.0 < self.confidence_threshold <= 1.0:
            raise ValueError(f"confidence_threshold must be in (0, 1]; got {self.confidence_threshold}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1; got {self.k}")
        if self.t_min <= 0 or self.t_max < self.t_min:
            raise ValueError(f"need 0 < t_min <= t_max; got t_min={self.t_min}, t_max={self.t_max}")
        if self.stability_threshold < 0:
            raise ValueError(f"stability_threshold must be >= 0; got {self.stability_threshold}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0; got {self.min_tokens}")
        if self.block_length is not None and self.block_length < 1:
            raise ValueError(f"block_length must be >= 1 (or None: one block); got {self.block_length}")
        if self.draft_strategy not in STRATEGIES or self.draft_strategy in ONE_TOKEN_STRATEGIES:
            raise ValueError(f"draft_strategy must be a canvas strategy; got {self.draft_strategy!r}")
        if self.draft_steps < 1:
            raise ValueError(f"draft_steps must be >= 1; got {self.draft_steps}")
        if self.drafts not in DRAFT_SOURCES:
            raise ValueError(f"drafts must be one of {', '.join(DRAFT_SOURCES)}; got {self.drafts!r}")
        if self.draft_tokens < 1:
            raise ValueError(f"draft_tokens must be >= 1; got {self.draft_tokens}")

    def temperature(self, remaining: int) -> float:
        """Linear schedule as transformers' LinearTemperatureScheduleLogitsProcessor:
        `remaining` counts down from max_steps (first step) to 1 (last step). Computed in
        float32, as transformers does, so seeded runs match it bit for bit."""
        frac = np.float32(remaining) / np.float32(self.max_steps)
        return float(np.float32(self.t_min) + np.float32(self.t_max - self.t_min) * frac)
