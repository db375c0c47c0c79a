"""The remote generator: whole fills from an inference server the user's team runs.

A remote engine is not a Denoiser: it returns whole fills. It is a generator behind the
one engine (engine.fill), so everything around a fill is the same as for a local one: the
span and its length budget (sent as max_tokens) are planned before the request, and the
replies go through the same dedupe, indentation fit, validation and truncation.
`remote_engine(cfg)` is that engine.

This module puts the two halves together for one fill: it cuts the context to its
budget, asks the configured dialect (engine.remote.dialects: one object per dialect,
`DIALECTS` their names) for the request body, sends it over the wire
(engine.remote.wire: the HTTP connection, streaming, cancellation, faults), and turns the
dialect's reading of the reply into candidates, each with its confidence from the
tokens' log-probabilities where the server sent them (engine.candidate.scored; None
otherwise: docs/confidence.md). It keeps the backoff: after an
unreachable endpoint, a timeout or a 5xx, requests in the next second (doubling to 30 s)
get the same message at once, so a dead endpoint is not hammered on every keystroke.
Faults become a `RemoteError` message and an empty answer.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from engine.candidate import Candidate, scored
from engine.fill import Engine, FillControl, FillLimits, FillOptions, InfillResult, Job
from engine.models.tokenizer import Tokenizer
from engine.remote.dialects import BY_NAME, CHAT_SLACK_TOKENS, DIALECTS, FIM_TOKENS, Ask, Dialect, DialectName
from engine.remote.wire import Backoff, Cancelled, Refused, RemoteError, Unreachable, Wire, Written

log = logging.getLogger(__name__)

__all__ = [
    "CHAT_SLACK_TOKENS",
    "DIALECTS",
    "RemoteConfig",
    "RemoteError",
    "RemoteGenerator",
    "remote_engine",
]

DEFAULT_BUDGET = 64  # max_tokens without a span (no language)
CONTEXT_CHARS = 12_000  # characters of context sent (the engine's tokenizer is not here)
# a token budget as characters: Qwen2.5-Coder's tokenizer averages 4.4 characters a token
# on the standard library's email/_header_value_parser.py (measured 2026-12-03)
CHARS_PER_TOKEN = 4
SUFFIX_SHARE = 0.25  # ... of which the code after the cursor gets at most this


@dataclass(frozen=True)
class RemoteConfig:
    endpoint: str  # http(s)://host[:port][/base]
    dialect: DialectName = "vllm"
    model: str | None = None  # the served model's name; None: not sent (llama-server) or the server's
    path: str | None = None  # None: the dialect's
    api_key_env: str | None = None  # the environment variable that holds the API key
    timeout_s: float = 10.0  # connecting, and waiting for each piece of the reply
    verify_tls: bool = True
    context_chars: int = CONTEXT_CHARS
    fim_tokens: tuple[str, str, str] = FIM_TOKENS
    # ask for the tokens' log-probabilities (the fills' confidence); None (`auto`): ask
    # until the endpoint refuses the field (chat never asks; docs/remote.md)
    logprobs: bool | None = None


class RemoteGenerator:
    """Fills through an inference server; one request at a time (the server's worker)."""

    tokenizer: Tokenizer | None = None  # the engine's tokenizer is not here: candidates carry text only
    languages: frozenset[str] | None = None  # a served model is not limited to the embedded model's languages
    # no tokenizer here: about 3 characters a token for a region's length
    CHARS_PER_TOKEN = 3

    def __init__(self, cfg: RemoteConfig) -> None:
        if cfg.dialect not in BY_NAME:
            raise RemoteError(f"unknown dialect {cfg.dialect!r}; choose one of {', '.join(DIALECTS)}")
        self.cfg = cfg
        self.dialect: Dialect = BY_NAME[cfg.dialect]
        self.wire = Wire(cfg.endpoint, cfg.timeout_s, cfg.verify_tls, cfg.api_key_env)
        self._path = cfg.path or self.dialect.path
        self._backoff = Backoff()
        self._logprobs_refused = False  # the endpoint refused the field (asked at `auto`)
        self.limits = FillLimits(default=DEFAULT_BUDGET, longest=None, hard=None)

    @property
    def requests(self) -> int:
        """Requests sent to the engine (for tests and stats)."""
        return self.wire.requests

    @property
    def takes_extra_files(self) -> bool:
        """Whether the dialect sends repository context (llama-server's input_extra)."""
        return self.dialect.takes_extra_files

    def count_tokens(self, text: str) -> int:
        return len(text) // self.CHARS_PER_TOKEN

    def reset(self) -> None:
        pass

    def close(self) -> None:
        self.wire.close()

    def generate(self, job: Job) -> InfillResult:
        """The candidates the server writes for the job's budget; sampling options are
        the server's own (it decodes as its operators configured it)."""
        t0 = time.perf_counter()
        result = InfillResult(candidates=[], canvas_tokens=job.budget)
        try:
            if time.monotonic() < self._backoff.until:  # the same message: the user is told once
                raise RemoteError(self._backoff.reason)
            ask = self._ask(job)
            written = self._post(ask, job)
            self._backoff.ok()
        except Cancelled as why:
            result.stop_reason = str(why)
            return result
        except RemoteError as exc:
            if isinstance(exc, Unreachable):  # a pause before the next request
                self._backoff.fail(str(exc))
            result.stop_reason, result.error = "error", str(exc)
            job.warnings.append(str(exc))
            return result
        finally:
            result.denoise_ms = (time.perf_counter() - t0) * 1000
        result.candidates = [self._candidate(w, ask) for w in written]
        return result

    def warm(self, job: Job) -> bool:
        """Have the server encode the request's repository context ahead, in idle time, as
        llama.vim does: a request that writes nothing (a budget of 0) with the pieces and an
        empty prefix and suffix, so that the server's prompt cache holds what every fill's
        prompt starts with (a dialect that `warms`: llama-infill). True:
        sent, nothing to send, or the server failed (the fill that brings the pieces sends
        them again, and tells the user of a fault); False: cancelled."""
        if not self.dialect.warms or not job.request.extra_files or time.monotonic() < self._backoff.until:
            return True
        ask = replace(self._ask(job), prefix="", suffix="", budget=0, n=1, logprobs=False, deadline=None)
        try:
            self.wire.post(self._path, self.dialect.body(ask), self.dialect, 1, FillControl(cancel=job.control.cancel))
        except Cancelled:
            return False
        except RemoteError as exc:
            log.debug("encoding repository context ahead failed: %s", exc)
        return True

    def _post(self, ask: Ask, job: Job) -> list[Written]:
        """The candidates the server writes. An endpoint that refuses the field asking for
        log-probabilities is, with the switch at `auto`, asked again without it and not
        asked for them again (its fills are shown without a confidence); with the switch
        `on`, the message says how to stop asking."""
        try:
            return self.wire.post(self._path, self.dialect.body(ask), self.dialect, ask.n, self._control(job, ask))
        except Refused as exc:
            if not (ask.logprobs and any(name in exc.detail.lower() for name in self.dialect.logprobs_fields)):
                raise
            fields = " and ".join(self.dialect.logprobs_fields)
            if self.cfg.logprobs is None:
                self._logprobs_refused = True
                log.info("%s refuses %s: its fills are shown without a confidence", self.cfg.endpoint, fields)
                ask = replace(ask, logprobs=False)
                return self.wire.post(self._path, self.dialect.body(ask), self.dialect, ask.n, self._control(job, ask))
            raise RemoteError(
                f"{exc} (this endpoint refuses {fields}: set the `logprobs` setting to off or auto for it;"
                " its fills are then shown without a confidence)"
            ) from exc

    def _candidate(self, written: Written, ask: Ask) -> Candidate:
        """A candidate from the server's text, with its confidence from the tokens'
        log-probabilities where it sent them (the dialect's answer keeps none where it
        changes the text: chat's)."""
        cand = Candidate(text=self.dialect.answer(written.text, ask), token_ids=[], confidence=[])
        return scored(cand, written.logprobs or [])

    def _ask(self, job: Job) -> Ask:
        req, plan = job.request, job.plan
        prefix, suffix = self._trim(req.prefix, req.suffix)
        return Ask(
            prefix=prefix,
            suffix=suffix,
            budget=job.budget,
            n=max(1, int(req.candidates)),
            single_line=plan is not None and not plan.span.multiline,
            language=req.language,
            span=plan.span.kind if plan is not None else None,
            extra_files=list(req.extra_files),
            deadline=job.control.deadline,
            model=self.cfg.model,
            fim_tokens=self.cfg.fim_tokens,
            logprobs=self.dialect.asks_logprobs(self.cfg.logprobs) and not self._logprobs_refused,
        )

    def _control(self, job: Job, ask: Ask) -> FillControl:
        """The job's control, its drafts shown as the fill each holds so far (the code in a
        chat answer)."""
        show = job.control.on_draft
        if show is None:
            return job.control

        def on_draft(step: int, texts: list[str]) -> None:
            show(step, [self.dialect.answer(t, ask) for t in texts])

        return FillControl(deadline=job.control.deadline, cancel=job.control.cancel, on_draft=on_draft)

    def _trim(self, prefix: str, suffix: str) -> tuple[str, str]:
        """The code nearest the cursor within the character budget, cut at line starts."""
        room = self.cfg.context_chars
        if len(suffix) > room * SUFFIX_SHARE:
            cut = suffix.rfind("\n", 0, int(room * SUFFIX_SHARE))
            suffix = suffix[: cut + 1] if cut >= 0 else suffix[: int(room * SUFFIX_SHARE)]
        room -= len(suffix)
        if len(prefix) > room:
            start = len(prefix) - room
            nl = prefix.find("\n", start)
            prefix = prefix[nl + 1 :] if nl != -1 else prefix[start:]
        return prefix, suffix


def remote_engine(cfg: RemoteConfig, options: FillOptions | None = None) -> Engine:
    """The engine over an inference server."""
    return Engine(RemoteGenerator(cfg), options)
