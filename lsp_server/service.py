"""The fill service between the LSP handlers and the engine: one engine, one worker thread,
one record per open document, and one entry, `fill`, for every feature. It knows LSP only
as far as document URIs.

- `fill(uri, request, kind, holes=...)`: a feature says what it wants filled (an
  `InfillRequest`: the text, how many candidates, the retry with more when the greedy
  fill is blank; and, for the joint fill, the holes) and how the fill is run (`FillKind`:
  debounce, deadline, type-through, whether a newer request supersedes it); the service
  waits for the engine, runs the fill on the worker and drops an answer that a newer
  request or an edit made stale.
- One worker runs fills one at a time (the engine and the machine's cores are shared).
- One record per open document (`OpenDocument`): its syntax tree (`tree`, reparsed
  incrementally), the cancel flag of its newest request, and the suggestion last shown;
  `forget` drops it when it closes.
- One cancellation mechanism, that flag: a new request (`begin`), an edit, a close or
  $/cancelRequest sets the previous request's flag; the sampler checks it between
  denoising steps, a debounced request before it starts, and an answer before it goes out.
- Type-through: when the text typed since the last suggestion is the start of that
  suggestion, the rest is the answer at once, with no engine call.
- The engine is an `engine.fill.Engine`, whatever it fills with (the local model or a
  remote server): its options are mapped from the settings here, once per change.
- What the user must be told (an engine fault, once) goes to `notify`: the server's one
  path for telling (DiffusionServer.tell); without a server it is logged.
- Confidence (docs/confidence.md): a fill shown unasked (`FillKind.gated`: the Automatic
  trigger) keeps only the candidates whose confidence reaches the threshold
  (`min_confidence`: the setting, or with `auto` the model's calibrated one for a fill of
  one line or of several, else DEFAULT_MIN_CONFIDENCE); a candidate without a confidence
  (a remote engine that returned no logprobs) is kept. A fill held back is logged: at info level (window/logMessage, the
  log file) at most once per HELD_LOG_INTERVAL_S, at debug level every time.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from engine.candidate import Candidate, Shown
from engine.errors import EngineError
from engine.fill import Engine, FillControl, FillOptions, InfillRequest
from engine.opener import EngineSource, open_engine
from engine.remote.generator import CHARS_PER_TOKEN, CONTEXT_CHARS, RemoteConfig
from engine.spans import Document, Language, Span, fill_holes_jointly, language_for
from lsp_server.settings import AUTO, LOGPROBS_SWITCH, Settings

log = logging.getLogger(__name__)

# minConfidence `auto` for a model without a calibrated threshold (docs/confidence.md):
# Qwen2.5-Coder-0.5B's int8 export's threshold that keeps nine in ten of its right fills,
# chosen on one draw (0.16, rounded down) and checked on another (11 of 12 kept)
DEFAULT_MIN_CONFIDENCE = 0.15
HELD_LOG_INTERVAL_S = 60.0  # a fill held back is logged at info level at most this often

Drafts = Callable[[int, list[str]], None]

# where an answer came from (FillService.answers, diffusion.stats): a fill the engine ran, or
# the rest of the suggestion on screen when the user typed its start
MODEL, TYPE_THROUGH = "model", "type_through"


@dataclass
class OpenDocument:
    """What the server keeps for one open document."""

    tree: Document | None = None  # its syntax tree, reparsed incrementally (FillService.tree)
    request: threading.Event | None = None  # the cancel flag of its newest request
    shown: Shown | None = None  # the last suggestion returned, for type-through
    asked: bool = False  # the user asked for a suggestion (diffusion.suggestNow): the next is Invoked


@dataclass(frozen=True)
class FillKind:
    """How a feature wants its fill run. What to fill, and how many candidates, are the
    request's (`InfillRequest.candidates`, `retry_candidates`), set by the handler."""

    debounce: bool = False  # wait debounceMs first, and give up if a newer request or an edit came
    timed: bool = True  # the settings' deadline applies (typing); a command the user asked for runs to its end
    type_through: bool = False  # answer from the last suggestion when the user typed its start (and remember it)
    supersede: bool = False  # the document's newest request: an edit, a newer one or $/cancelRequest stops it
    gated: bool = False  # shown unasked: candidates below the confidence threshold are held back


INLINE = FillKind(debounce=True, type_through=True, supersede=True, gated=True)  # ghost text while typing
INVOKED = FillKind(type_through=True, supersede=True)  # ghost text the user asked for: no debounce
COMPLETION = FillKind(type_through=True, supersede=True)  # the completion item: no debounce
REGION = FillKind(timed=False)  # code actions and next edit: run to the end


@dataclass
class FillAnswer:
    candidates: list[Candidate]
    holes: list[str | None] = field(default_factory=list)  # per hole: its fill, or None (left as it is)

    @property
    def text(self) -> str:
        """The best non-blank candidate's text, or "" (never a blank fill for a region)."""
        return next((c.text for c in self.candidates if c.text.strip()), "")


def options_from(settings: Settings) -> FillOptions:
    """The engine's budgets and sampler settings from the server's settings."""
    return FillOptions(
        max_canvas_tokens=settings.max_fill_tokens,
        context_tokens=settings.context_tokens,
        strategy=settings.strategy,
        max_steps=settings.max_steps,
        languages=tuple(language_for(name).name for name in settings.languages),
    )


class FillService:
    def __init__(self) -> None:
        self.engine: Engine | None = None
        self.load_error: str | None = None
        self.where = ""  # where fills come from (the model directory and its backend), for the log and $/progress
        self.settings = Settings()
        self.ready = threading.Event()  # set once the engine has loaded (or failed to)
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diffusion-fill")
        self.engine_calls = 0
        self.answers: Counter[str] = Counter()  # answers given, by where they came from (ANSWER_SOURCES)
        self.docs: dict[str, OpenDocument] = {}
        self._lock = threading.Lock()
        self.notify: Callable[[str], None] = _log_warning  # tells the user (the server sets DiffusionServer.tell)
        self._last_error: str | None = None  # an engine fault is told once, until a fill works again
        self._held_logged = -HELD_LOG_INTERVAL_S  # time.monotonic() of the last info line about a fill held back

    # -- engine and settings
    def configure(self, settings: Settings) -> None:
        """Take new settings; the engine's options follow at once (no reload)."""
        self.settings = settings
        if self.engine is not None:
            self.engine.options = options_from(settings)

    def load(self, settings: Settings) -> str | None:
        """Load the engine the settings name (a remote endpoint, or a model directory);
        returns an error message, or None."""
        self.settings = settings
        old, self.engine = self.engine, None
        try:
            if old is not None:
                old.close()
            opened = open_engine(engine_source(settings), options_from(settings))
        except EngineError as exc:
            self.load_error = str(exc)
            return self.load_error
        except Exception as exc:  # a broken model directory must not hang the server
            log.exception("the model failed to load")  # a bug's traceback, for the log
            self.load_error = f"the model failed to load: {exc}"
            return self.load_error
        self.engine, self.load_error, self._last_error, self.where = opened.engine, None, None, opened.where
        log.info("fills from %s", opened.where)
        return None

    async def wait_ready(self) -> None:
        """Wait (off the event loop) until the engine has loaded or failed to."""
        if not self.ready.is_set():
            await asyncio.get_running_loop().run_in_executor(None, self.ready.wait)

    # -- documents and cancellation
    def document(self, uri: str) -> OpenDocument:
        """The record of an open document (made on first use)."""
        with self._lock:
            return self.docs.setdefault(uri, OpenDocument())

    def tree(self, uri: str, text: str, language: Language, version: int) -> Document:
        """The syntax tree of an open document at `version`, reparsed incrementally from
        the previous version's. Each version is a new object, so a fill on the worker
        thread keeps a consistent text and tree while edits arrive."""
        record = self.document(uri)
        cached = record.tree
        if cached is not None and cached.version == version and cached.text == text:
            return cached
        if cached is None:
            tree = Document(text, language, version)
        else:
            tree = copy.copy(cached)
            tree.update(text, version)
        record.tree = tree
        return tree

    def begin(self, uri: str) -> threading.Event:
        """A new request for `uri`: the older one is cancelled; returns the new one's flag."""
        flag = threading.Event()
        with self._lock:
            record = self.docs.setdefault(uri, OpenDocument())
            old, record.request = record.request, flag
        if old is not None:
            old.set()
        return flag

    def cancel(self, uri: str) -> None:
        """Stop the newest request for `uri` (at its fill's next denoising step)."""
        with self._lock:
            record = self.docs.get(uri)
        if record is not None and record.request is not None:
            record.request.set()

    def ask(self, uri: str) -> None:
        """The user asked for a suggestion: the document's next inline request is served
        as Invoked (all candidates, no debounce), whatever trigger kind it carries."""
        self.document(uri).asked = True

    def take_ask(self, uri: str) -> bool:
        """Whether the user asked (see `ask`); the ask is used up."""
        with self._lock:
            record = self.docs.get(uri)
            asked = record is not None and record.asked
            if record is not None:
                record.asked = False
        return asked

    def dismiss(self, uri: str) -> None:
        """The user hid the suggestion: its fill stops and typing does not bring it back."""
        self.cancel(uri)
        with self._lock:
            record = self.docs.get(uri)
            if record is not None:
                record.shown = None

    def forget(self, uri: str) -> None:
        """The document closed: its request stops and its record goes."""
        self.cancel(uri)
        with self._lock:
            self.docs.pop(uri, None)

    def type_through(self, uri: str, prefix: str, suffix: str) -> str | None:
        """The rest of the last suggestion when the user typed its start, else None
        (engine.candidate.Shown.rest_after, the rule the engine's warm start follows)."""
        record = self.docs.get(uri)
        shown = record.shown if record is not None else None
        return shown.rest_after(prefix, suffix) if shown is not None else None

    # -- the one fill entry
    async def fill(
        self,
        uri: str,
        req: InfillRequest,
        kind: FillKind,
        on_draft: Drafts | None = None,
        holes: Sequence[Span] = (),
    ) -> FillAnswer | None:
        """The fill `req` asks for, run as `kind` says, or None: superseded, stale, no
        engine, or an engine bug (logged; the server goes on). `holes`: fill these holes of
        `req.prefix` jointly (engine.spans.fill_holes_jointly), each a request like `req`.
        `on_draft(step, texts)` is called on the worker at each denoising step."""
        flag = self.begin(uri) if kind.supersede else threading.Event()
        if kind.type_through:
            rest = self.type_through(uri, req.prefix, req.suffix)
            if rest is not None:
                self.answers[TYPE_THROUGH] += 1
                return FillAnswer([Candidate(text=rest, token_ids=[], confidence=[])])
        if kind.debounce and self.settings.debounce_ms:
            await asyncio.sleep(self.settings.debounce_ms / 1000)
            if flag.is_set():
                return None
        await self.wait_ready()
        try:
            answer = await asyncio.wrap_future(self.worker.submit(self._run, uri, req, kind, holes, flag, on_draft))
        except asyncio.CancelledError:  # $/cancelRequest: stop this fill (not a newer one) between steps
            flag.set()
            raise
        except Exception:  # an engine bug: logged, an empty answer, the server goes on
            log.exception("fill failed for %s", uri)
            return None
        if answer is None or flag.is_set():
            return None
        self.answers[MODEL] += 1
        return answer

    def _run(
        self,
        uri: str,
        req: InfillRequest,
        kind: FillKind,
        holes: Sequence[Span],
        flag: threading.Event,
        on_draft: Drafts | None,
    ) -> FillAnswer | None:
        """On the worker: the fill (or the joint fill of holes), unless superseded first."""
        if self.engine is None or flag.is_set():
            return None
        control = FillControl(cancel=flag.is_set if kind.supersede else None, on_draft=on_draft)
        if holes:

            def region(prefix: str, suffix: str, refine: str | None, replaced: str) -> str:
                sub = replace(req, prefix=prefix, suffix=suffix, region=replaced, refine=refine is not None)
                return self._once(sub, kind, control).text

            return FillAnswer([], holes=fill_holes_jointly(req.prefix, list(holes), region))
        answer = self._once(req, kind, control)
        if kind.type_through and answer.candidates and not flag.is_set():
            with self._lock:
                record = self.docs.get(uri)
            if record is not None:
                record.shown = Shown(req.prefix, req.suffix, answer.candidates[0].text)
        return answer

    def _once(self, req: InfillRequest, kind: FillKind, control: FillControl) -> FillAnswer:
        """One engine fill, with the settings' deadline when the kind is timed. A request
        with `retry_candidates` (a code action's) is retried inside the engine: its greedy
        fill alone first (the most likely fill is the first candidate anyway, and sampled
        rows cost most of a many-candidate fill's steps), the others only when it is blank."""
        engine = self.engine
        if engine is None:
            return FillAnswer([])
        if kind.timed:
            control = replace(control, deadline=time.monotonic() + self.settings.deadline_ms / 1000)
        self.engine_calls += 1
        result = engine.fill(req, control)
        self.engine_calls += int(result.retried)
        self._report(result.error)
        return FillAnswer(self.confident(result.candidates) if kind.gated else result.candidates)

    def min_confidence(self, multiline: bool = False) -> float:
        """The threshold for fills shown unasked: the setting's number, or with `auto` the
        model's calibrated threshold for a fill of one line or of several, else
        DEFAULT_MIN_CONFIDENCE."""
        setting = self.settings.min_confidence
        if setting != AUTO:
            return float(setting)
        calibrated = self.engine.min_confidence(multiline) if self.engine is not None else None
        return DEFAULT_MIN_CONFIDENCE if calibrated is None else calibrated

    def confident(self, candidates: list[Candidate]) -> list[Candidate]:
        """The candidates whose confidence reaches the threshold for their number of lines
        (all of them at 0; a candidate without a confidence is kept); a fill held back is
        logged."""
        thresholds = [self.min_confidence(len(c.text.strip().splitlines()) > 1) for c in candidates]
        kept = [c for c, t in zip(candidates, thresholds, strict=True) if t <= 0 or c.score is None or c.score >= t]
        if candidates and not kept:
            best = max(c.score or 0.0 for c in candidates)
            threshold = thresholds[0]
            now = time.monotonic()
            level = logging.INFO if now - self._held_logged >= HELD_LOG_INTERVAL_S else logging.DEBUG
            if level == logging.INFO:
                self._held_logged = now
            log.log(
                level,
                "a fill was held back: its confidence %.2f is below minConfidence %.2f%s"
                " (set diffusionLsp.minConfidence to 0 to see every fill, or ask for a suggestion)",
                best,
                threshold,
                " (auto)" if self.settings.min_confidence == AUTO else "",
            )
        return kept

    def _report(self, error: str | None) -> None:
        """Tell the user of an engine fault once (not on every keystroke), and again only
        after a fill has worked in between or the fault changed."""
        if error is None:
            self._last_error = None
            return
        if error != self._last_error:
            self._last_error = error
            self.notify(error)


def _log_warning(message: str) -> None:
    log.warning("%s", message)


def engine_source(settings: Settings) -> EngineSource:
    """Where the settings say fills come from (engine.opener: the policy)."""
    remote = None
    if settings.endpoint:
        remote = RemoteConfig(
            endpoint=settings.endpoint,
            dialect=settings.dialect,  # type: ignore[arg-type]
            model=settings.remote_model,
            path=settings.endpoint_path,
            api_key_env=settings.api_key_env,
            logprobs=LOGPROBS_SWITCH[settings.logprobs],
            timeout_s=settings.request_timeout_ms / 1000,
            verify_tls=settings.tls_verify,
            context_chars=settings.context_tokens * CHARS_PER_TOKEN if settings.context_tokens else CONTEXT_CHARS,
        )
    return EngineSource(
        model=Path(settings.model) if settings.model else None,
        backend=settings.backend,
        device=settings.device,
        quantization=settings.quantization,
        deadline_ms=settings.deadline_ms,
        remote=remote,
    )
