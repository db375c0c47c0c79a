"""One fill: a `FillAsk` through the engine into an `Outcome` the replies render.

The mapping, in one place (docs/serve.md, "What the fields do"):

- `language` (or the extension of `filename`) names the language: the engine plans the
  span by its tree-sitter rules and `max_tokens` caps the span's budget, as the
  language server's maxFillTokens does. Without one there is no span: `max_tokens` is the
  fill's budget (the model's default when absent), which is what a client that planned
  the span itself (the language server through a remote dialect) sends.
- `n` candidates come from one batch of the engine; the first is the greedy fill,
  `temperature` is the temperature of the others (the engine's rule; 0: the model's).
  Duplicates and blank alternatives are dropped, so a reply may hold fewer than `n`.
- `stop` strings cut each candidate after the engine (not included, as OpenAI does).
- `t_max_predict_ms` is a deadline from the fill's start; `min_tokens` bars the end
  of the fill before that many tokens; `seed` seeds the sampled candidates.
- `logprobs` / `n_probs`: each choice's tokens' log-probabilities, the engine's own
  (fill_server.logprobs), cut where its stop string cut the text.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from engine.decoding import CANDIDATE_TEMPERATURE
from engine.fill import Engine, FillControl, InfillRequest, InfillResult
from engine.spans import language_for
from fill_server.logprobs import TokenLogprobs, token_logprobs
from fill_server.schema import FillAsk

LENGTH_STOPS = frozenset({"max_steps", "deadline"})  # the engine stopped before the fill ended


@dataclass
class Outcome:
    """A finished fill, whatever the endpoint."""

    texts: list[str]  # the choices, best first; at least one (possibly empty)
    finish: list[str]  # per choice: "stop" (ended, or cut at a stop string) or "length"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    steps: int = 0  # the engine's steps (tokens decoded, in the one-token mode)
    stop_reason: str = "complete"  # the engine's
    span: str | None = None  # the span kind that sized the fill (None: no language)
    fill_s: float = 0.0
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    logprobs: list[TokenLogprobs | None] | None = None  # per choice, when asked (None in it: the engine gave none)

    def extension(self) -> dict[str, Any]:
        """What the engine says beyond OpenAI's fields (the replies' `diffusion` object)."""
        return {
            "span": self.span,
            "steps": self.steps,
            "stop_reason": self.stop_reason,
            "fill_ms": round(self.fill_s * 1000, 2),
            "warnings": self.warnings,
        }


def language_of(ask: FillAsk) -> str | None:
    """The request's language: named, or by its file name's extension (a grammar's only)."""
    if ask.language:
        return ask.language
    if ask.filename:
        found = language_for(path=ask.filename)
        return found.name if found.grammar else None
    return None


def request_for(ask: FillAsk) -> InfillRequest:
    return InfillRequest(
        prefix=ask.prefix,
        suffix=ask.suffix,
        language=language_of(ask),
        candidates=ask.n,
        extra_files=list(ask.extra_files),
        min_tokens=ask.min_tokens,
    )


def engine_for(engine: Engine, ask: FillAsk, language: str | None) -> Engine:
    """The engine with this request's budget, temperature and seed over its options."""
    changes: dict[str, Any] = {}
    if ask.max_tokens is not None:
        changes["max_canvas_tokens" if language else "canvas_tokens"] = ask.max_tokens
    default_sampler = engine.default_sampler() if ask.n > 1 and ask.temperature > 0 else None
    if default_sampler is not None:
        # the engine tempers the sampled rows by CANDIDATE_TEMPERATURE: they run at `temperature`
        t = ask.temperature / CANDIDATE_TEMPERATURE
        changes["sampler"] = replace(engine.options.sampler or default_sampler, t_max=t, t_min=t)
    if ask.seed is not None:
        changes["seed"] = ask.seed
    return engine.configured(**changes) if changes else engine


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """`text` up to the first stop string (excluded), and whether one was found."""
    ends = [i for i in (text.find(s) for s in stops) if i != -1]
    return (text[: min(ends)], True) if ends else (text, False)


def run_fill(engine: Engine, ask: FillAsk, control: FillControl) -> Outcome:
    """The fill `ask` asks for, on the calling thread (the scheduler's worker)."""
    t0 = time.perf_counter()
    language = language_of(ask)
    result = engine_for(engine, ask, language).fill(request_for(ask), control)
    return outcome_of(engine, ask, result, time.perf_counter() - t0)


def outcome_of(engine: Engine, ask: FillAsk, result: InfillResult, seconds: float) -> Outcome:
    texts: list[str] = []
    finish: list[str] = []
    logprobs: list[TokenLogprobs | None] = []
    for cand in result.candidates[: ask.n] or []:
        text, stopped = cut_at_stop(cand.text, ask.stop)
        if text in texts:  # a stop string can make two candidates the same
            continue
        texts.append(text)
        finish.append("stop" if stopped or result.stop_reason not in LENGTH_STOPS else "length")
        if ask.logprobs is not None:
            logprobs.append(token_logprobs(cand, text, top=ask.logprobs > 0))
    if not texts:
        texts, finish = [""], ["length" if result.stop_reason in LENGTH_STOPS else "stop"]
    warnings = list(result.warnings)
    if result.stop_reason == "language":
        warnings.append(f"no fill: the model was not trained on {language_of(ask)} (docs/serve.md)")
    if result.error:
        warnings.append(result.error)
    return Outcome(
        texts=texts,
        finish=finish,
        prompt_tokens=result.context_tokens,
        completion_tokens=sum(engine.count_tokens(t) for t in texts if t),
        steps=result.steps,
        stop_reason=result.stop_reason,
        span=result.span,
        fill_s=seconds,
        warnings=warnings,
        error=result.error,
        logprobs=(logprobs or [None]) if ask.logprobs is not None else None,
    )
