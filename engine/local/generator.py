"""The local generator: raw candidates from a Denoiser (the embedded model through
onnxruntime or torch, a DiffusionGemma checkpoint), behind the one engine (engine.fill).

The steps of `LocalGenerator.generate`, once engine.fill has planned the span and its budget:
  1. tokenize prefix and suffix and trim each to its budget, keeping the code nearest
     the cursor; trims snap to whole lines in steps of TRIM_QUANTUM_LINES so that the
     context stays the same while the user types (cache reuse);
  2. hand them to the backend as a `Prompt` (with middle priming, the cursor's line as the
     fill's given start, its last piece spelled by the fill: engine.local.heal); its layout
     puts them in the order its model was trained on (the shipped model: suffix-prefix-middle, `<suf> S <pre> P <mid>`;
     Qwen2: prefix-suffix-middle; the Dream family's canvas in place);
  3. encode it, reusing the cached state whose laid-out sequence shares the longest
     prefix with this one;
  4. build the canvas: a warm start from the rest of `previous` (the fill shown last
     there) when the user typed its start, else drafter proposals, else empty; sized
     by the model's length head within the budget when it has one (engine.local.length);
  5. run the sampler over B candidate canvases in one batch (the canvas loop), one
     token at a time (the autoregressive mode), or drafts verified by that mode
     (engine.local.verify);
  6. cut each candidate at end-of-fill, decode it, and rank alternatives by likelihood
     (or mean confidence). engine.fill then dedupes, fits and checks them.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from engine.candidate import LOGPROB_FLOOR, Candidate, scored, spelled, trimmed
from engine.decoding import CANDIDATE_TEMPERATURE, ONE_TOKEN_STRATEGIES, SamplerConfig
from engine.denoisers.base import LengthPredictor, PartEncoder, Prompt
from engine.denoisers.loading import LoadedModel
from engine.fill import Engine, FillControl, FillLimits, FillOptions, InfillRequest, InfillResult, Job, distinct
from engine.local import drafter, resize
from engine.local.cache import DEFAULT_MAX_BYTES, ContextCache
from engine.local.echo import Echo
from engine.local.heal import Heal, Spelling, primed
from engine.local.length import DEFAULT_QUANTILE, DEFAULT_SLACK, fitted_length
from engine.local.one_token import run_autoregressive, token_logprobs
from engine.local.sampler import initial_canvas, run
from engine.local.scoring import LocalScorer
from engine.local.steering import SampleResult, Steering, StepView, log_softmax, to_numpy
from engine.local.verify import VerifyStats, run_verified
from engine.spans.lines import line_end, line_start

log = logging.getLogger(__name__)

DEFAULT_CANVAS_TOKENS = 32
MAX_CANVAS_TOKENS = 256  # DiffusionGemma's block; longer fills need several blocks
DEFAULT_CONTEXT_TOKENS = 1024
MIN_CONTEXT_TOKENS = 16
SUFFIX_SHARE = 0.25  # of the context budget for code after the cursor, unless the prefix is short
TRIM_QUANTUM_LINES = 16  # trims move in steps of this many lines (cache-friendly)
MAX_CHARS_PER_TOKEN = 12  # text farther than budget * this from the cursor is never kept
MIDDLE_PRIMING = True  # the default of FillOptions.middle_priming (docs/models.md: measured on the typing benchmark)
MAX_PRIMED_CHARS = 400  # a longer line is not primed (the prompt's budget is the prefix's)
REFINE_KEEP = 0.3  # refine: tokens the model gives at least this probability are kept
WARM_CHUNK = 64  # tokens encoded between two looks at the cancel flag when warming (0.17 s p50 on 2 cores, measured)
REPOSITORY_SHARE = 0.5  # of the context budget for repository context (docs/server.md: measured)
CHARS_PER_CONTEXT_TOKEN = 3.2  # what the caller selects for that share (the block drops what does not fit)
# transformers' DiffusionGemmaGenerationConfig defaults (_get_default_generation_params)
UNIFORM_DEFAULTS: dict[str, Any] = {
    "max_steps": 48,
    "entropy_bound": 0.1,
    "t_min": 0.4,
    "t_max": 0.8,
    "greedy": False,
    "stability_threshold": 1,
    "stop_entropy": 0.005,
}


def trim_prefix(encode: Callable[[str], list[int]], prefix: str, budget: int) -> list[int]:
    """Tokens of the end of `prefix` within `budget`.

    The cut is at the start of a line whose number is a multiple of TRIM_QUANTUM_LINES,
    so it stays put while the user types (the context cache keeps matching). Only a
    window of the text near the cursor is ever tokenized.
    """
    window = max(0, len(prefix) - budget * MAX_CHARS_PER_TOKEN)
    cuts = _quantized_line_starts(prefix, window, len(prefix))  # ascending: most context first
    best = _first_fitting(cuts, lambda cut: encode(prefix[cut:]), budget)
    if best is not None:
        return best
    return encode(prefix[window:])[-budget:]  # one huge line: keep its end


def trim_suffix(encode: Callable[[str], list[int]], suffix: str, budget: int, exact: bool = True) -> list[int]:
    """Tokens of the start of `suffix` within `budget`, ending at a quantized line start;
    when no such cut fits: the first `budget` tokens (exact) or nothing (not exact)."""
    window = min(len(suffix), budget * MAX_CHARS_PER_TOKEN)
    ends = _quantized_line_starts(suffix, 1, window)
    if window == len(suffix):
        ends.append(len(suffix))
    best = _first_fitting(ends[::-1], lambda end: encode(suffix[:end]), budget)  # most context first
    if best is not None:
        return best
    if not exact:
        return []
    return encode(suffix[:window])[:budget]  # the first lines alone are too long: keep their start


def _quantized_line_starts(text: str, lo: int, hi: int) -> list[int]:
    """Offsets in [lo, hi] of line starts whose line number is a multiple of the quantum."""
    start = lo - 1 if lo > 0 else 0  # a newline just before lo starts a line at lo
    line = text.count("\n", 0, start)  # number of the line that contains `start`
    out = [0] if lo == 0 else []
    pos = text.find("\n", start)
    while pos != -1 and pos + 1 <= hi:
        line += 1
        if line % TRIM_QUANTUM_LINES == 0:
            out.append(pos + 1)
        pos = text.find("\n", pos + 1)
    return out


def _first_fitting(cuts: list[int], tokens_of: Callable[[int], list[int]], budget: int) -> list[int] | None:
    """Binary search `cuts` (ordered from most to least text) for the first whose tokens
    fit the budget; token counts shrink along the list."""
    lo, hi = 0, len(cuts)
    found: list[int] | None = None
    while lo < hi:
        mid = (lo + hi) // 2
        ids = tokens_of(cuts[mid])
        if len(ids) <= budget:
            found, hi = ids, mid
        else:
            lo = mid + 1
    return found


class LocalGenerator:
    """Raw candidates from one loaded model; keeps the context cache."""

    def __init__(self, model: LoadedModel, cache_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.model = model
        self.tok = self.tokenizer = model.tokenizer
        self.den = model.denoiser
        self.cache = ContextCache(cache_bytes)
        self.defaults = model.defaults
        self.languages = model.languages

    @functools.cached_property
    def takes_extra_files(self) -> bool:
        """Whether the model's layout has a format for repository context."""
        return bool(self.den.layout.repository(self.tok.encode, [("a", "b")], "r", "p"))

    @property
    def limits(self) -> FillLimits:
        """A line or a body as the span says, within the longest canvas the model was
        trained on (config.json defaults `max_canvas_tokens`) and what it holds."""
        d = self.defaults
        return FillLimits(
            default=int(d.get("canvas_tokens", DEFAULT_CANVAS_TOKENS)),
            longest=int(d.get("max_canvas_tokens", MAX_CANVAS_TOKENS)),
            hard=min(MAX_CANVAS_TOKENS, self.den.info.max_positions - MIN_CONTEXT_TOKENS),
        )

    def calibrated(self, multiline: bool = False) -> float | None:
        """The model's calibrated threshold for fills shown unasked (config.json defaults
        `min_confidence`, and `min_confidence_multiline` for fills of several lines, written
        by engine/evaluation/calibration.py); None: uncalibrated."""
        value = self.defaults.get("min_confidence_multiline") if multiline else None
        value = self.defaults.get("min_confidence") if value is None else value
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def count_tokens(self, text: str) -> int:
        return len(self.tok.encode(text))

    def reset(self) -> None:
        """Forget the cached contexts (the next fill is cold). The generator keeps no other
        state between fills: a warm start comes from the request (`previous`)."""
        self.cache.clear()

    def close(self) -> None:
        pass

    def default_sampler(self, multiline: bool = False) -> SamplerConfig:
        """The model directory's defaults; for uniform-canvas models (DiffusionGemma),
        transformers' generation defaults for DiffusionGemma. A model may decode spans of
        several lines its own way (``multiline_strategy``); a model without an
        autoregressive mode keeps its one strategy."""
        d = self.defaults
        base = SamplerConfig(**UNIFORM_DEFAULTS) if self.den.info.regime == "uniform" else SamplerConfig()
        keys = (
            "strategy",
            "max_steps",
            "entropy_bound",
            "confidence_threshold",
            "k",
            "t_max",
            "t_min",
            "drafts",
            "draft_tokens",
            "block_length",
        )
        changes = {k: d[k] for k in keys if k in d}
        own = d.get("multiline_strategy") if multiline else None
        if own is not None and (own != "autoregressive" or self.den.info.autoregressive):
            changes["strategy"] = own
        return replace(base, **changes)

    # -- 1-2: context
    def build_context(
        self,
        opts: FillOptions,
        req: InfillRequest,
        warnings: list[str],
        canvas: int,
        given: tuple[str, str] | None = None,
    ) -> tuple[Prompt, list[int]]:
        """(the prompt, its laid-out ids) within the budget, the layout's own tokens
        included. `given` (`_priming`): the end of the prefix (the cursor's line) goes to
        the fill's given start instead, but for its last characters, which the fill spells."""
        budget = (
            opts.context_tokens
            if opts.context_tokens is not None
            else int(self.defaults.get("context_tokens", DEFAULT_CONTEXT_TOKENS))
        )
        room = self.den.info.max_positions - canvas
        if budget > room:
            warnings.append(f"context budget {budget} exceeds what the model holds with the canvas; using {room}")
            budget = room
        if budget < MIN_CONTEXT_TOKENS:
            warnings.append(f"context budget {budget} is below {MIN_CONTEXT_TOKENS}; using {MIN_CONTEXT_TOKENS}")
            budget = MIN_CONTEXT_TOKENS
        budget -= self.den.layout.overhead
        context = self._repository(req, int(budget * self._repository_share())) if req.extra_files else ()
        budget -= len(context)
        # the suffix gets at most its share, the prefix the rest; a short prefix (the top of
        # a file) leaves its unused budget to the suffix, in line-aligned steps only, so
        # that typing (which grows the prefix) rarely moves the suffix's cut
        # a model may cap the suffix (config.json defaults `suffix_tokens`): where its layout
        # puts the suffix after the prefix, a keystroke encodes the whole suffix again
        cap = int(self.defaults.get("suffix_tokens", budget))
        prefix = req.prefix
        middle: tuple[int, ...] = ()  # the line's start, where it is primed
        if given is not None:
            kept, tail = given
            prefix = req.prefix[: len(req.prefix) - len(kept) - len(tail)]
            middle = tuple(self.tok.encode(kept))
        suffix_ids = trim_suffix(self.tok.encode, req.suffix, min(cap, int(budget * SUFFIX_SHARE)))
        prefix_ids = trim_prefix(self.tok.encode, prefix, max(0, budget - len(suffix_ids) - len(middle)))
        if req.prefix.count("\n") < TRIM_QUANTUM_LINES:
            room = budget - len(prefix_ids) - len(middle)
            longer = trim_suffix(self.tok.encode, req.suffix, min(cap, room), exact=False)
            if len(longer) > len(suffix_ids):
                suffix_ids = longer
        prompt = Prompt(prefix=tuple(prefix_ids), suffix=tuple(suffix_ids), middle=middle, context=context)
        return prompt, list(self.den.layout.ids(prompt))

    def repository_chars(self, opts: FillOptions) -> int:
        """About how many characters of repository context fit its share of the context
        budget (CHARS_PER_CONTEXT_TOKEN a token: code runs about 3 to 4)."""
        budget = opts.context_tokens or int(self.defaults.get("context_tokens", DEFAULT_CONTEXT_TOKENS))
        return int(budget * self._repository_share() * CHARS_PER_CONTEXT_TOKEN)

    def _repository_share(self) -> float:
        """The share of the context budget repository context may take (config.json
        defaults `repository_share`, else REPOSITORY_SHARE)."""
        return float(self.defaults.get("repository_share", REPOSITORY_SHARE))

    def _repository(self, req: InfillRequest, budget: int) -> tuple[int, ...]:
        """The request's repository context in the layout's format, within `budget` tokens:
        as many of its pieces as fit, in the order given (the server's, stable while the
        user types: the block is a prefix of the cached sequence)."""
        files = tuple(req.extra_files)
        while files:
            ids = self._laid_out(files, req.repository or "repository", req.path or "file")
            if len(ids) <= budget:
                return ids
            files = files[:-1]
        return ()

    @functools.lru_cache(maxsize=32)  # noqa: B019 (one generator per loaded model; a keystroke repeats the block)
    def _laid_out(self, files: tuple[tuple[str, str], ...], name: str, path: str) -> tuple[int, ...]:
        return self.den.layout.repository(self.tok.encode, files, name, path)

    def _priming(self, opts: FillOptions, req: InfillRequest, cfg: SamplerConfig) -> tuple[str, str] | None:
        """Middle priming (engine.local.heal): (the start of the cursor's line given as the
        fill's start, the characters of its last piece that the fill spells first), where
        it is on (FillOptions.middle_priming, else config.json defaults `middle_priming`,
        else MIDDLE_PRIMING) and helps: one token at a time, in a layout whose middle
        follows the suffix (`PromptLayout.primes`), so that typing on the line appends
        to the cached sequence instead of changing the prefix before the suffix. None:
        the exact prefix-suffix-middle prompt."""
        on = opts.middle_priming
        on = bool(self.defaults.get("middle_priming", MIDDLE_PRIMING)) if on is None else on
        if not on or req.refine or cfg.strategy != "autoregressive" or not self.den.info.autoregressive:
            return None
        if not self.den.layout.primes:
            return None
        line = req.prefix[line_start(req.prefix, len(req.prefix)) :]
        if len(line) > MAX_PRIMED_CHARS:
            return None
        return primed(line, self.tok.last_piece_start(line), self.spelling)

    @functools.cached_property
    def scorer(self) -> LocalScorer | None:
        """The model as a scorer of regions for in-line edits (engine.edits), where it has
        the one-token mode; None: edits re-fill the region on the canvas."""
        return LocalScorer(self) if self.den.info.autoregressive else None

    @functools.cached_property
    def spelling(self) -> Spelling:
        """The vocabulary by text, for healing (built on the first primed fill)."""
        return Spelling(self.tok.token_texts)

    # -- 4: warm start or drafts
    def _proposals(self, opts: FillOptions, req: InfillRequest, prompt: Prompt, c: int) -> tuple[list[int], bool]:
        rest = req.previous.rest_after(req.prefix, req.suffix) if req.previous is not None else None
        if rest is not None:
            return self.tok.encode(rest)[:c], True
        use_drafter = opts.use_drafter if opts.use_drafter is not None else bool(self.defaults.get("drafter", True))
        if use_drafter:
            return self._lookup(prompt, c)([], c), False
        return [], False

    def _lookup(self, prompt: Prompt, most: int) -> Callable[[list[int], int], list[int]]:
        """Verified decoding's drafts copied from the context (engine.local.drafter): what
        followed the longest n-gram ending the fill so far, elsewhere in the prefix, the
        suffix or the fill, at most `most` tokens a draft."""
        sp = self.tok.special
        before = [*prompt.prefix, *prompt.middle]
        ctx = [*prompt.suffix, sp.prefix, *before]  # a marker between them: no n-gram spans both
        stops = (sp.suffix, sp.prefix, sp.middle, sp.pad, sp.eof)

        def propose(accepted: list[int], room: int) -> list[int]:
            return drafter.propose([*ctx, *accepted], [*before, *accepted], min(room, most), stops)

        return propose

    def generate(self, job: Job) -> InfillResult:
        req, opts, plan, warnings = job.request, job.options, job.plan, job.warnings
        c = job.budget
        b = max(1, int(req.candidates))
        multiline = plan is not None and plan.span.multiline
        cfg = self._sampler_for(opts, req, b, warnings, multiline)
        # 1-2. the context (the cursor's line as the fill's start, where it is primed)
        given = self._priming(opts, req, cfg)
        heal = Heal(given[1], self.spelling) if given is not None and given[1] else None
        prompt, ctx_ids = self.build_context(opts, req, warnings, c, given)
        # 3. encode, reusing the cache
        t0 = time.perf_counter()
        cached, reused = self.cache.lookup(ctx_ids)
        state = self.den.prefill(prompt, cached)
        self.cache.put(state)
        t1 = time.perf_counter()
        # 4-5. canvas and sampling: one greedy row per fitted length, then the sampled
        # candidates (at the first length)
        proposal, warm = ([], False) if req.refine or given is not None else self._proposals(opts, req, prompt, c)
        lengths = self._fitted(opts, req, cfg, state, c, len(proposal))
        greedy = max(1, len(lengths))
        rows = b + greedy - 1
        row_temperature = self._row_temperature(rows, greedy) if b > 1 else None
        rng = self.den.random_source(cfg.seed)
        width = max(lengths) if lengths else c
        canvas, fixed = self._start_canvas(req, state, rng, rows, width, proposal)
        if greedy > 1:
            canvas, fixed = self._sized_rows(canvas, lengths)
        one_line = plan is not None and not plan.span.multiline
        stats = VerifyStats()
        echo = Echo(self.tok, req.suffix)  # the one-token loops stop where the fill repeats the suffix
        result = self._sample(
            job, cfg, rng, state, canvas, fixed, proposal, row_temperature, prompt, stats, one_line, greedy, heal, echo
        )
        # 6. decode and rank
        ranked, scored = self._ranked(job.control, result, state, greedy, heal.text if heal is not None else "", echo)
        t2 = time.perf_counter()
        passes = result.steps if cfg.strategy in ONE_TOKEN_STRATEGIES else result.steps + 1
        return InfillResult(
            candidates=ranked,
            steps=result.steps,
            stop_reason=result.stop_reason,
            context_tokens=len(ctx_ids),
            reused_tokens=min(reused, len(ctx_ids)),
            encode_ms=(t1 - t0) * 1000,
            denoise_ms=(t2 - t1) * 1000,
            drafted=len(proposal),
            warm_start=warm,
            canvas_tokens=c,
            fitted_tokens=width if lengths else 0,
            passes=passes + scored,
            rounds=stats.rounds,
            accepted=stats.accepted,
        )

    def warm(self, job: Job) -> bool:
        """Steps 1-3 of `generate` ahead of the fill (idle time: the server's `encodeWhenIdle`):
        the context a fill of `job.request` lays out, encoded into the context cache
        WARM_CHUNK tokens at a time, `job.control.cancel` checked before each, so that a
        fill that comes meanwhile waits for one part at most and then finds what was done
        cached. True: all of it is cached (or this model caches nothing ahead); False:
        cancelled first."""
        if not isinstance(self.den, PartEncoder):
            return True
        req, opts, plan, cancel = job.request, job.options, job.plan, job.control.cancel
        cfg = self._sampler_for(opts, req, 1, job.warnings, plan is not None and plan.span.multiline)
        _, ids = self.build_context(opts, req, job.warnings, job.budget, self._priming(opts, req, cfg))
        state, done = self.cache.lookup(ids)
        made: tuple[int, ...] | None = None  # the part this call cached last (the next one replaces it)
        while done < len(ids):
            if cancel is not None and cancel():
                return False
            done = min(len(ids), done + WARM_CHUNK)
            state = self.den.prefill_part(ids[:done], state)
            self.cache.put(state)
            if made is not None:
                self.cache.discard(made)
            made = state.token_ids
        return True

    def _fit_options(self, opts: FillOptions) -> tuple[bool, tuple[float, ...], int]:
        """(fit the canvas, the quantiles of the predicted length to fill at, slack):
        config.json `defaults` `length_quantiles` (a list; `length_quantile`, one, as
        before), `length_slack` and `fit_canvas`, unless the options say."""
        d = self.defaults
        fit = opts.fit_canvas if opts.fit_canvas is not None else bool(d.get("fit_canvas", True))
        fit = fit and self.den.info.length_classes > 0 and isinstance(self.den, LengthPredictor)
        quantiles = d.get("length_quantiles", [d.get("length_quantile", DEFAULT_QUANTILE)])
        return fit, tuple(float(q) for q in quantiles), int(d.get("length_slack", DEFAULT_SLACK))

    def _fitted(
        self, opts: FillOptions, req: InfillRequest, cfg: SamplerConfig, state: Any, budget: int, warm: int
    ) -> list[int]:
        """The canvas lengths the length head gives within `budget`, one per quantile,
        distinct, in the quantiles' order (empty: the model has none, the options turn it
        off, or the fill is not a canvas: one token at a time stops by itself, a
        refinement keeps the region's positions); a warm start keeps room for the rest of
        the fill shown before."""
        fit, quantiles, slack = self._fit_options(opts)
        if not fit or req.refine or cfg.strategy in ONE_TOKEN_STRATEGIES:
            return []
        logits = self.den.length_logits(state)  # type: ignore[attr-defined]
        if logits is None:
            return []
        z = to_numpy(logits)
        sizes = [max(fitted_length(z, budget, q, slack, cfg.min_tokens), min(budget, warm + 1)) for q in quantiles]
        return list(dict.fromkeys(sizes))

    def _sized_rows(self, canvas: Any, lengths: list[int]) -> tuple[Any, Any]:
        """Greedy row i is a canvas of lengths[i] tokens within the batch's width: its
        positions from lengths[i] on are padding, given (fixed), so its fill ends there
        at the latest; the sampled rows after them keep the first length. The length
        change before step 0 of the sampler's one mechanism (engine.local.resize)."""
        b = int(canvas.shape[0])
        return resize.sized(self.den, canvas, [*lengths, *[lengths[0]] * (b - len(lengths))])

    def _draft_length(self, opts: FillOptions) -> Callable[[Any, int], int] | None:
        """How verified decoding sizes each draft: the length head within the room left."""
        fit, quantiles, slack = self._fit_options(opts)
        if not fit:
            return None
        quantile = quantiles[0]

        def size(state: Any, room: int) -> int:
            logits = self.den.length_logits(state)  # type: ignore[attr-defined]
            return room if logits is None else fitted_length(to_numpy(logits), room, quantile, slack)

        return size

    def _sampler_for(
        self, opts: FillOptions, req: InfillRequest, b: int, warnings: list[str], multiline: bool
    ) -> SamplerConfig:
        """The sampler settings of this fill: the model's defaults for the span's shape
        unless the options bring their own, with the options' strategy and steps over
        them; sampled (not greedy) when the request asks for several candidates."""
        cfg = opts.sampler or self.default_sampler(multiline)
        if opts.strategy:
            cfg = replace(cfg, strategy=opts.strategy)  # type: ignore[arg-type]
        if opts.max_steps:
            cfg = replace(cfg, max_steps=opts.max_steps)
        if opts.seed is not None and cfg.seed is None:
            cfg = replace(cfg, seed=opts.seed)
        if b > 1 and cfg.greedy:
            cfg = replace(cfg, greedy=False)
        rule = req.min_tokens if req.min_tokens is not None else int(on_blank_line(req.prefix, req.suffix))
        min_tokens = max(rule, cfg.min_tokens)
        if min_tokens != cfg.min_tokens:
            cfg = replace(cfg, min_tokens=min_tokens)
        if cfg.strategy in ONE_TOKEN_STRATEGIES and not self.den.info.autoregressive:
            warnings.append(
                f"this model has no autoregressive mode for {cfg.strategy}; decoding left to right on the canvas"
            )
            cfg = replace(cfg, strategy="left_to_right")
        return cfg

    def _row_temperature(self, rows: int, greedy: int) -> Any:
        """Per-row temperature factors for several candidates: the greedy rows stay at
        the model's temperature, the sampled ones are tempered by CANDIDATE_TEMPERATURE."""
        factors = np.full((rows, 1, 1), CANDIDATE_TEMPERATURE, dtype=np.float32)
        factors[:greedy] = 1.0
        return self.den.as_array(factors)

    def _start_canvas(
        self, req: InfillRequest, state: Any, rng: Any, b: int, c: int, proposal: list[int]
    ) -> tuple[Any, Any | None]:
        """(canvas, fixed positions): the refined region's likely tokens fixed, or the
        warm start's or the drafter's proposals as drafts."""
        canvas = initial_canvas(self.den, b, c, rng)
        if req.refine:
            return self._refine_canvas(req.region, state, canvas, c)
        if proposal:
            host = to_numpy(canvas).copy()
            host[:, : min(c, len(proposal))] = proposal[:c]
            canvas = self.den.as_array(host)
        return canvas, None

    def _sample(
        self,
        job: Job,
        cfg: SamplerConfig,
        rng: Any,
        state: Any,
        canvas: Any,
        fixed: Any | None,
        proposal: list[int],
        row_temperature: Any | None,
        prompt: Prompt,
        stats: VerifyStats,
        one_line: bool = False,
        greedy: int = 1,
        heal: Heal | None = None,
        echo: Echo | None = None,
    ) -> SampleResult:
        """The sampler's run over the B candidate rows: one token at a time in the
        autoregressive mode, or drafts of the canvas verified by that mode (a row ends
        at its first line break when the span is one line in both), else the canvas
        loop (drafts verified on its first step)."""
        b, c = (int(n) for n in canvas.shape)
        control = job.control
        greedy_rows = np.zeros((b,), dtype=bool)
        greedy_rows[:greedy] = True  # the first candidates are the most likely fill at each length
        on_step = None
        if control.on_draft is not None:
            cb = control.on_draft
            given = len(heal.text) if heal is not None else 0

            def on_step(view: StepView) -> None:
                rows = to_numpy(view.argmax_canvas)
                cb(view.step, [self._decode_row(r)[0][given:] for r in rows])

        steer = Steering(
            greedy_rows=self.den.as_array(greedy_rows),
            row_temperature=row_temperature,
            deadline=control.deadline,
            cancel=control.cancel,
            on_step=on_step,
            stop_after=self.tok.line_break_ids if one_line else frozenset(),  # the one-token loops only
            line_ends=self.tok.line_break_ids,  # the deadline lets one token at a time finish a line of text
            blanks=self.tok.blank_ids,
            echo=echo,
            heal=heal,
        )
        if cfg.strategy == "autoregressive" and not job.request.refine:
            return run_autoregressive(self.den, state, c, cfg, rng, batch=b, steer=steer)
        if cfg.strategy == "verified" and not job.request.refine:
            fit = self._draft_length(job.options)
            propose = self._lookup(prompt, cfg.draft_tokens) if cfg.drafts == "lookup" else None
            return run_verified(
                self.den, state, prompt, c, cfg, rng, batch=b, steer=steer, fit=fit, stats=stats, propose=propose
            )
        draft = None
        if proposal:
            mask = np.zeros((b, c), dtype=bool)
            mask[:, : min(c, len(proposal))] = True
            draft = self.den.as_array(mask)
        if cfg.strategy in ONE_TOKEN_STRATEGIES:  # a refinement keeps tokens in place: on the canvas, left to right
            cfg = replace(cfg, strategy="left_to_right")
        return run(self.den, state, canvas, cfg, rng, fixed=fixed, draft=draft, steer=steer)

    def _ranked(
        self,
        control: FillControl,
        result: SampleResult,
        state: Any,
        greedy: int = 1,
        healed: str = "",
        echo: Echo | None = None,
    ) -> tuple[list[Candidate], int]:
        """(candidates, scoring passes): each row cut at end-of-fill and decoded, with its
        confidence (engine.candidate.scored) from the probabilities its tokens were chosen
        with (`_candidate`); the greedy fills first (one per canvas length), the others
        after them, each group by mean log-probability per token. Where there are
        alternatives and the model has the autoregressive mode, their confidence is the
        likelihood that mode gives them, teacher-forced, end-of-fill counted (a sharper
        judge than the canvas's; each distinct text scored once in one pass); without
        it, greedy row 0 stays first. `healed`: the characters each row spelled first,
        which are not the fill's (engine.local.heal); `echo`: where a row it ended inside a
        token ends its text."""
        rows = zip(result.tokens, result.confidence, strict=True)
        cands = [self._candidate(row, conf, healed, echo) for row, conf in rows]
        late = control.deadline is not None and time.monotonic() >= control.deadline
        unique = distinct(cands)
        scored_passes = 0
        if (
            self.den.info.autoregressive
            and len(unique) > 1
            and not late
            and not (control.cancel is not None and control.cancel())
        ):
            eof = self.tok.special.eof
            likely = {k.text: token_logprobs(self.den, state, k.token_ids, eof) for k in unique}
            scored_passes = len(unique)
            cands = [_likelihood(k, likely[k.text]) if k.text in likely else k for k in cands]

        def best(group: list[Candidate]) -> list[Candidate]:
            return sorted(group, key=lambda k: -(k.mean_logprob if k.mean_logprob is not None else LOGPROB_FLOOR))

        head = best(cands[:greedy]) if scored_passes else cands[:greedy]
        return [*head, *best(cands[greedy:])], scored_passes

    def _candidate(self, row: np.ndarray, conf: np.ndarray, healed: str = "", echo: Echo | None = None) -> Candidate:
        """A decoded row with its confidence from each token's probability when it was
        chosen (the one-token mode's, the verifier's or the canvas's lock), end-of-fill's
        included when the row ended there (not at the canvas's end or a line break).
        A row that spelled `healed` first is the text after it (its tokens kept, as a
        trimmed start keeps them); one stopped before it had spelled it all is empty. A
        row `echo` ended inside a token is cut where its fill ends (engine.local.echo)."""
        text, n = self._decode_row(row)
        probs = [float(x) for x in conf[:n]]
        if n < len(row) and int(row[n]) == self.tok.special.eof:
            probs.append(float(conf[n]))
        cand = Candidate(text, [int(t) for t in row[:n]], probs[:n])
        cand = scored(cand, [float(np.log(max(p, 1e-30))) for p in probs])
        end = echo.text_end(cand.token_ids) if echo is not None else None
        if end is not None:
            cand = trimmed(spelled(cand, self.tok), end=end)
            text = cand.text
        if not healed:
            return cand
        if not text.startswith(healed):
            return Candidate("", [], [])
        return trimmed(spelled(cand, self.tok), start=len(healed))

    def _refine_canvas(self, text: str, state: Any, canvas: Any, c: int) -> tuple[Any, Any]:
        """Score `text` in place (one forward pass with it visible); its tokens the model
        gives at least REFINE_KEEP probability stay fixed, the others are re-filled."""
        sp = self.tok.special
        ids = self.tok.encode(text)[: c - 1]
        visible = np.full((1, c), sp.pad, dtype=np.int64)
        visible[0, : len(ids)] = ids
        visible[0, len(ids)] = sp.eof
        logp = log_softmax(self.den.denoise(state, self.den.as_array(visible)))
        probs = np.exp(to_numpy(logp)[0, np.arange(len(ids)), ids])  # (len(ids),)
        keep = np.zeros(canvas.shape, dtype=bool)
        keep[:, : len(ids)] = probs >= REFINE_KEEP
        host = to_numpy(canvas).copy()
        host[:, : len(ids)] = np.where(keep[:, : len(ids)], ids, host[:, : len(ids)])
        return self.den.as_array(host), self.den.as_array(keep)

    def _decode_row(self, row: np.ndarray) -> tuple[str, int]:
        """The fill's text and length: tokens before the first end-of-fill or padding
        (a mask left by an early stop is dropped from the text)."""
        sp = self.tok.special
        ids = [int(t) for t in row]
        n = next((i for i, t in enumerate(ids) if t in (sp.eof, sp.pad)), len(ids))
        return self.tok.decode([t for t in ids[:n] if t != sp.mask]), n


def _likelihood(cand: Candidate, logprobs: np.ndarray) -> Candidate:
    """`cand` scored by the autoregressive mode's likelihood of it (`logprob`, as before,
    and its confidence from the same log-probabilities)."""
    out = scored(cand, [float(x) for x in logprobs])
    out.logprob = out.mean_logprob
    return out


def local_engine(model: LoadedModel, options: FillOptions | None = None) -> Engine:
    """The engine over a loaded model (the shipped one: `local_engine(load_model())`)."""
    return Engine(LocalGenerator(model), options)


def on_blank_line(prefix: str, suffix: str) -> bool:
    """The cursor is on a line holding nothing but indentation: the user is about to
    write a line, so an empty fill is no answer there."""
    before = prefix[line_start(prefix, len(prefix)) :]
    return not before.strip(" \t") and not suffix[: line_end(suffix, 0)].strip(" \t")
