"""The one engine: the framing of every fill, written once, over a generator of raw candidates.

`Engine.fill(request, control)` does, for every backend alike:

  1. plan the span (engine.syntax.plan_fill): what the fill completes, one line or many,
     and its length budget, before anything is generated;
  2. size the budget: the span's, within the longest fill the generator makes, grown to
     hold the region a fill replaces, capped by the user's maxFillTokens;
  3. generate raw candidates: the backend's one job (`Generator.generate`): the local
     denoiser (engine.local.generator: the embedded model, DiffusionGemma, any Denoiser) or a
     remote inference server (engine.remote.generator, one class for its dialects);
  4. drop duplicates and blank alternatives, and spell each candidate's tokens (the text
     each writes: engine.candidate.spelled), so that every cut below keeps its tokens, their
     log-probabilities and its text in step (engine.candidate.trimmed, rewritten);
  5. fit the indentation to the cursor's line;
  6. check the syntax (engine.syntax.check_candidates): cut, drop and rank candidates;
  7. when no candidate is left that is not blank and the request allows a retry
     (`retry_candidates`), once more with that many candidates: the greedy fill alone
     costs least, the sampled ones only when it fails (where the span is whole lines
     before a line of code, the usual fill-in-the-middle shape, each at least a token).

What to fill is the `InfillRequest`; how long and how to sample (budgets, sampler
settings) are the engine's `FillOptions`, set once when it is made (from the server's
settings or the CLI's flags); how the caller steers a run (deadline, cancel flag, drafts)
is the `FillControl` of each call. A model knows the languages it was trained on
(`Generator.languages`): a request in another language gets no fill, and one log line per
language says why, unless the options name that language.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from engine.candidate import Candidate, Shown, spelled, trimmed
from engine.decoding import SamplerConfig
from engine.models.tokenizer import Tokenizer
from engine.spans import language_for
from engine.spans.document import valid_unicode
from engine.spans.lines import line_start
from engine.spans.select import WHOLE_LINE_BUDGET
from engine.syntax import FillPlan, check_candidates, plan_fill

log = logging.getLogger(__name__)

REGION_SLACK_TOKENS = 16  # a fill in place of a region may grow this much past it
REPOSITORY_CHARS = 4000  # repository context for a generator that does not say how much it takes


@dataclass(frozen=True)
class FillControl:
    """How the caller steers a fill while it runs, apart from what to fill."""

    deadline: float | None = None  # time.monotonic() value: stop with what there is
    cancel: Callable[[], bool] | None = None  # checked between steps; True stops the fill
    on_draft: Callable[[int, list[str]], None] | None = None  # each step: its number, each candidate's text


@dataclass(frozen=True)
class FillOptions:
    """Budgets and sampling, set when the engine is made (the server maps its Settings
    here once per change; the CLI its flags). None: the model's or the span's value."""

    canvas_tokens: int | None = None  # the fill's budget; None: the span's, else the model's default
    max_canvas_tokens: int | None = None  # a cap on the span's budget (the user's maxFillTokens)
    context_tokens: int | None = None
    sampler: SamplerConfig | None = None  # a whole sampler; None: the model's default for the span's shape
    strategy: str | None = None  # ... or only these over that default
    max_steps: int | None = None
    use_drafter: bool | None = None
    fit_canvas: bool | None = None  # size the canvas by the model's length head (None: the model's default, on)
    # the cursor's line as the fill's given start, its last piece healed (engine.local.heal); None: the model's default
    middle_priming: bool | None = None
    seed: int | None = 0
    languages: tuple[str, ...] = ()  # languages filled even when the model was not trained on them


@dataclass
class InfillRequest:
    """What to fill: the text around it, its language, the region it replaces, how many
    candidates (and how many more when they are all blank), each set by the caller that
    knows it (the server's handlers, the CLI's flags); and what the caller knows that
    helps (the fill shown last, other files, the parsed document)."""

    prefix: str
    suffix: str = ""
    language: str | None = None  # a language name or LSP languageId; None: no span, no check
    candidates: int = 1
    region: str = ""  # the text between prefix and suffix the fill takes the place of (a hole, a selection)
    refine: bool = False  # keep the region's tokens the model finds likely, re-fill the rest
    previous: Shown | None = None  # the fill shown last here: typing its start warm-starts the canvas
    extra_files: list[tuple[str, str]] = field(default_factory=list)  # (path, text): repository context
    repository: str = ""  # the repository's name (the workspace folder's), for layouts that state it
    path: str = ""  # the current file's path in it
    document: Any | None = None  # the caller's spans.Document of prefix + suffix, if it keeps one
    check_syntax: bool = True  # with a language that has a grammar: validate and cut candidates
    min_tokens: int | None = None  # None: 1 on a blank line (a line is wanted there), else 0
    retry_candidates: int = 0  # when no candidate is left but blank ones: once more with this many (0: never)
    one_line: bool = False  # end the fill with its first line, whatever the span allows (ghost text while typing)


@dataclass
class InfillResult:
    candidates: list[Candidate]
    steps: int = 0  # forward passes (or tokens decoded, in the autoregressive mode)
    stop_reason: str = "complete"
    context_tokens: int = 0
    reused_tokens: int = 0  # context tokens whose keys/values came from the cache
    encode_ms: float = 0.0
    denoise_ms: float = 0.0
    drafted: int = 0  # canvas positions proposed by the drafter or the warm start
    warm_start: bool = False
    warnings: list[str] = field(default_factory=list)  # set by the engine: its Job's, which generators write to
    canvas_tokens: int = 0  # the fill's budget: the longest it could be
    fitted_tokens: int = 0  # the canvas the length head sized within it (0: not sized)
    span: str | None = None  # the span kind that sized it (engine.spans.SpanKind); None without a language
    error: str | None = None  # why there is no fill (a remote engine's fault), for the user
    passes: int = 0  # sequential forward passes of the model, the context's included
    rounds: int = 0  # verified decoding: drafts made
    accepted: int = 0  # verified decoding: drafted tokens kept (acceptance length: accepted / rounds)
    retried: bool = False  # the first fill left nothing but blanks: these candidates are the retry's

    @property
    def text(self) -> str:
        return self.candidates[0].text if self.candidates else ""

    @property
    def total_ms(self) -> float:
        return self.encode_ms + self.denoise_ms


@dataclass(frozen=True)
class FillLimits:
    """How long a generator's fills may be, in its tokens."""

    default: int  # the fill length without a span (no language)
    longest: int | None  # span budgets are capped at this (the longest canvas a model was trained on)
    hard: int | None  # nothing is longer (what the model holds besides a minimal context)


@dataclass
class Job:
    """One fill for a generator: the request, its planned span and budget, the options
    and the control; `warnings` collects what the user should be told, the one channel for
    it: the engine, the generator and its backend append here, and the result carries it."""

    request: InfillRequest
    options: FillOptions
    control: FillControl
    plan: FillPlan | None
    budget: int  # tokens: the longest fill wanted
    warnings: list[str]


class Generator(Protocol):
    """A backend: raw candidates for a planned fill, best first (not yet deduplicated,
    indentation as the model wrote it, syntax unchecked)."""

    @property
    def limits(self) -> FillLimits: ...

    @property
    def languages(self) -> frozenset[str] | None: ...  # the languages its model knows; None: any

    @property
    def takes_extra_files(self) -> bool: ...  # whether it sends other files as repository context

    @property
    def tokenizer(self) -> Tokenizer | None: ...  # spells candidates' tokens (Candidate.token_texts); None: text only

    def count_tokens(self, text: str) -> int: ...

    def generate(self, job: Job) -> InfillResult: ...

    def reset(self) -> None: ...

    def close(self) -> None: ...


class Engine:
    """Fills with one generator and one set of options; the only engine the server and the
    CLI hold."""

    def __init__(self, generator: Generator, options: FillOptions | None = None) -> None:
        self.generator = generator
        self.options = options if options is not None else FillOptions()
        self._told: set[str] = set()  # languages already logged as not the model's

    @property
    def takes_extra_files(self) -> bool:
        return self.generator.takes_extra_files

    def min_confidence(self, multiline: bool = False) -> float | None:
        """The generator's calibrated threshold for fills shown unasked, of one line or of
        several (a local model's config.json `min_confidence`, `min_confidence_multiline`);
        None: it has none (docs/confidence.md). A generator need not be calibrated
        (`calibrated` is optional), so it is looked up."""
        calibrated = getattr(self.generator, "calibrated", None)
        value = calibrated(multiline) if callable(calibrated) else None
        return value if isinstance(value, float) else None

    def repository_chars(self) -> int:
        """About how many characters of repository context a fill takes (the generator's
        `repository_chars`, else REPOSITORY_CHARS): what the caller selects for it."""
        chars = getattr(self.generator, "repository_chars", None)
        value = chars(self.options) if callable(chars) else None
        return value if isinstance(value, int) else REPOSITORY_CHARS

    def count_tokens(self, text: str) -> int:
        """`text`'s length in the generator's tokens."""
        return self.generator.count_tokens(text)

    def default_sampler(self) -> SamplerConfig | None:
        """The generator's sampler for a fill of one line; None: it samples none of its own
        (a remote engine). Looked up, as `min_confidence` is: not every generator has one."""
        default = getattr(self.generator, "default_sampler", None)
        value = default() if callable(default) else None
        return value if isinstance(value, SamplerConfig) else None

    def configured(self, **changes: Any) -> Engine:
        """The same generator (and its caches) with other options."""
        return Engine(self.generator, replace(self.options, **changes))

    def reset(self) -> None:
        """Forget cached contexts: the next fill is cold."""
        self.generator.reset()

    def close(self) -> None:
        self.generator.close()

    def fill(self, req: InfillRequest, control: FillControl | None = None) -> InfillResult:
        warnings: list[str] = []
        req = replace(
            req,
            prefix=_valid_text(req.prefix, "prefix", warnings),
            suffix=_valid_text(req.suffix, "suffix", warnings),
        )
        if not self._knows(req.language):
            return InfillResult(candidates=[], stop_reason="language", warnings=warnings)
        control = control or FillControl()
        result = self._fill_once(req, control, warnings)
        if req.retry_candidates <= req.candidates or any(c.text.strip() for c in result.candidates):
            return result
        if result.error is not None or result.stop_reason in ("cancelled", "deadline"):
            return result
        more = replace(req, candidates=req.retry_candidates)  # 7
        if result.span == "lines":  # whole lines before a line of code: the retry asks for a line
            more.min_tokens = max(1, req.min_tokens or 0)
        again = self._fill_once(more, control, [])
        again.passes += result.passes
        again.steps += result.steps
        again.encode_ms += result.encode_ms
        again.denoise_ms += result.denoise_ms
        again.retried = True
        return again

    def warm(self, req: InfillRequest, cancel: Callable[[], bool] | None = None) -> bool:
        """Encode ahead, in idle time, what a fill of `req` would encode first (its context,
        laid out as the fill lays it out), so that the fill finds it cached: the generator's
        `warm` (the local model's, in parts, checking `cancel` between them; llama.cpp's
        server's, in one request that writes nothing). True: done, or nothing to do (a
        generator that keeps no cache, a remote dialect that does not warm, a language the
        model does not know); False: cancelled first."""
        warm = getattr(self.generator, "warm", None)
        if not callable(warm) or not self._knows(req.language):
            return True
        warnings: list[str] = []
        req = replace(
            req,
            prefix=_valid_text(req.prefix, "prefix", warnings),
            suffix=_valid_text(req.suffix, "suffix", warnings),
        )
        return bool(warm(self._job(req, FillControl(cancel=cancel), warnings)))

    def _job(self, req: InfillRequest, control: FillControl, warnings: list[str]) -> Job:
        """Steps 1-2: the span planned and the budget sized."""
        plan = plan_fill(req.prefix, req.suffix, req.language, req.document, req.region)  # 1
        if req.one_line and plan is not None and plan.span.multiline:
            plan = replace(
                plan, span=replace(plan.span, multiline=False, budget=min(plan.span.budget, WHOLE_LINE_BUDGET))
            )
        budget = self.budget(req, plan, warnings)  # 2
        return Job(req, self.options, control, plan, budget, warnings)

    def _fill_once(self, req: InfillRequest, control: FillControl, warnings: list[str]) -> InfillResult:
        job = self._job(req, control, warnings)
        plan = job.plan
        result = self.generator.generate(job)  # 3
        tok = self.generator.tokenizer
        cands = [fitted(req.prefix, spelled(c, tok)) for c in distinct(result.candidates)]  # 4, 5
        if plan is not None and req.check_syntax:  # 6
            cands = check_candidates(
                tok,
                cands,
                req.prefix,
                req.suffix,
                req.language,
                plan.document,
                req.region,
                plan.span,
                open_end=req.one_line,
            )
        result.candidates = cands
        for c in cands:
            log.debug("fill %r: confidence %s", c.text, c.score)
        result.span = plan.span.kind if plan is not None else None
        result.warnings = warnings  # the one channel: the job's list, which the generator wrote to too
        for w in warnings:
            log.warning("%s", w)
        return result

    def budget(self, req: InfillRequest, plan: FillPlan | None, warnings: list[str]) -> int:
        """The fill's length budget in the generator's tokens: the options' exact length if
        they give one; else the span's budget within the generator's longest fill, grown
        to hold the region the fill replaces (a shorter one would cut a rewrite short);
        else the generator's default. maxFillTokens caps the last two."""
        lim, opts = self.generator.limits, self.options
        if opts.canvas_tokens is not None:
            n = opts.canvas_tokens
        else:
            if plan is None:
                n = lim.default
            else:
                n = plan.span.budget if lim.longest is None else min(plan.span.budget, lim.longest)
            if req.region:
                n = max(n, self.generator.count_tokens(req.region) + REGION_SLACK_TOKENS)
                n = n if lim.hard is None else min(n, lim.hard)
            if opts.max_canvas_tokens is not None:
                n = min(n, opts.max_canvas_tokens)
        if not 1 <= n <= (lim.hard or n):
            clamped = max(n, 1) if lim.hard is None else min(max(n, 1), lim.hard)
            allowed = "(at least 1)" if lim.hard is None else f"1..{lim.hard}"
            warnings.append(f"canvas length {n} is out of range {allowed}; using {clamped}")
            n = clamped
        return n

    def _knows(self, language: str | None) -> bool:
        """Whether the generator's model was trained on `language` (or the options ask for
        it anyway); a language it does not know is logged once per engine."""
        known = self.generator.languages
        if known is None or not language:
            return True
        name = language_for(language).name
        if name in known or name in {language_for(x).name for x in self.options.languages}:
            return True
        if name not in self._told:
            self._told.add(name)
            log.info(
                "no local fills in %s: the model knows only %s (set `languages` to include %s to try it anyway, "
                "or use a remote engine: docs/remote.md)",
                name,
                ", ".join(sorted(known)),
                name,
            )
        return False


def distinct(cands: list[Candidate]) -> list[Candidate]:
    """The candidates without repeats and without blank alternatives (the first, the
    greedy fill, is kept even when blank: it is the answer there is)."""
    seen: set[str] = set()
    out = []
    for i, c in enumerate(cands):
        if c.text in seen or (i > 0 and not c.text.strip()):
            continue
        seen.add(c.text)
        out.append(c)
    return out


def fitted(prefix: str, cand: Candidate) -> Candidate:
    """`cand` without the indentation `fit_indent` drops, its tokens kept in step
    (engine.candidate.trimmed: the dropped characters' tokens stay, writing "")."""
    return trimmed(cand, start=len(cand.text) - len(fit_indent(prefix, cand.text)))


def fit_indent(prefix: str, fill: str) -> str:
    """The fill, without the indentation its first line repeats when the cursor's line
    holds only the indentation the editor already put there (a new line in a block):
    the editor's indentation is kept, the fill's dropped, so the line is not indented
    twice."""
    line = prefix[line_start(prefix, len(prefix)) :]
    if not line or line.strip(" \t"):
        return fill
    return fill.lstrip(" \t")


def _valid_text(text: str, what: str, warnings: list[str]) -> str:
    """`text`, with lone surrogates (not valid Unicode, e.g. from JSON "\\ud800") replaced
    as a spans.Document replaces them (one for one, so the caller's tree still matches)."""
    valid = valid_unicode(text)
    if valid != text:
        warnings.append(f"the {what} holds characters that are not valid Unicode; they were replaced with U+FFFD")
    return valid
