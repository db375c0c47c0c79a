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
  incrementally), the fill running for it (`job`, a `reuse.Job`) and its recent fills
  (`recall`, a `reuse.Recall`); `forget` drops it when it closes.
- One cancellation mechanism, the job's flag: a new fill for the document (`begin`), an
  edit that disagrees with what the fill has written (`edited`), a dismissal or a close
  sets it; the sampler checks it between denoising steps, a debounced request before it
  starts, and an answer before it goes out. $/cancelRequest answers the request at once
  and leaves a typing fill running, for the next request to use.
- Reuse while typing (lsp_server/reuse.py): a request is answered from the document's
  recent fills (type-through, a fill at this very place, the fill made ahead) or from its
  running fill before a fill of its own; while a suggestion is on screen the next one is
  filled ahead (`_ahead`).
- Repository context (docs/server.md, Repository context): a document's block is chosen at
  its first fill and kept on every keystroke (`pieces`); at a pause (`_paused`), it is
  chosen again at the last request's place, and a new one is encoded ahead on the worker
  in the idle time (`_warm`, Engine.warm), which any work the user waits for stops.
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
import contextlib
import copy
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from engine.candidate import Candidate, confident_head
from engine.edits import Edit, EditRequest, suggest_edits
from engine.errors import EngineError
from engine.fill import Engine, FillControl, FillOptions, InfillRequest
from engine.opener import EngineSource, open_engine
from engine.remote.generator import CHARS_PER_TOKEN, CONTEXT_CHARS, RemoteConfig
from engine.repository import select
from engine.spans import Document, Language, Span, fill_holes_jointly, language_for
from lsp_server.history import Change, EditHistory
from lsp_server.repository import Repository
from lsp_server.reuse import KEPT, MODEL, TYPE_THROUGH, Job, Recall
from lsp_server.settings import AUTO, LOGPROBS_SWITCH, Settings

log = logging.getLogger(__name__)

# minConfidence `auto` for a model without a calibrated threshold (docs/confidence.md): for
# Qwen2.5-Coder-0.5B's int8 export, the threshold at which a typist gets the most from Tab
# (bench/typing_bench.py, middle priming on: 31.3% of the characters and 35% of the shown
# suggestions accepted at 0.25, against 30.5% and 31% at 0.15 and 30.3% and 33% at 0.2;
# docs/server.md, While you type). The held-out eval's 0.16 kept nine in ten right fills.
DEFAULT_MIN_CONFIDENCE = 0.25
HELD_LOG_INTERVAL_S = 60.0  # a fill held back is logged at info level at most this often
TYPING_PAUSE_S = 2.0  # no request or edit in a document for this long: a pause (its repository context is chosen again)

Drafts = Callable[[int, list[str]], None]
T = TypeVar("T")


@dataclass
class OpenDocument:
    """What the server keeps for one open document."""

    tree: Document | None = None  # its syntax tree, reparsed incrementally (FillService.tree)
    job: Job | None = None  # the fill running for its newest request (or made ahead), kept while typed into
    recall: Recall = field(default_factory=Recall)  # its recent fills: type-through, retyping, fills made ahead
    edits: int = 0  # edits so far: an answer for a text the document has left is dropped
    asked: bool = False  # the user asked for a suggestion (diffusion.suggestNow): the next is Invoked
    history: EditHistory | None = None  # its recent edits (next edit suggestions read the last)
    context: list[tuple[str, str]] | None = None  # the repository context its fills get now (FillService.pieces)
    choose: Callable[[], list[tuple[str, str]]] | None = None  # ... as chosen at its last request's place
    last: InfillRequest | None = None  # its last request with repository context: a pause encodes ahead there
    pause: asyncio.TimerHandle | None = None  # the look for a pause after its last request (`_paused`)
    edited_at: float = float("-inf")  # time.monotonic() of its last edit


@dataclass(frozen=True)
class FillKind:
    """How a feature wants its fill run. What to fill, and how many candidates, are the
    request's (`InfillRequest.candidates`, `retry_candidates`), set by the handler."""

    debounce: bool = False  # wait debounceMs first, and give up if a newer request or an edit came
    timed: bool = True  # the settings' deadline applies (typing); a command the user asked for runs to its end
    type_through: bool = False  # answer from the document's earlier fills when they still hold (and remember this one)
    supersede: bool = False  # the document's newest request: a newer one or an edit that disagrees stops its fill
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
        middle_priming=None if settings.middle_priming else False,  # on: where the model has it on
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
        self.answers: Counter[str] = Counter()  # answers given, by where they came from (reuse: MODEL, KEPT, ...)
        self.ahead_fills = 0  # fills made ahead of the user (`_ahead`), apart from engine_calls
        self.encoded_ahead = Counter[str]()  # repository context encoded at a pause (`_warm`): done, stopped
        self._submitted = 0  # work handed to the worker so far: a warm stops when more comes (`_submit`)
        self.docs: dict[str, OpenDocument] = {}
        self.repository = Repository()  # the workspace's files, for repository context
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

    def begin(self, uri: str, job: Job) -> None:
        """`job` is the document's fill now: the one before it is stopped."""
        with self._lock:
            record = self.docs.setdefault(uri, OpenDocument())
            old, record.job = record.job, job
        if old is not None and old is not job:
            old.flag.set()

    def cancel(self, uri: str) -> None:
        """Stop the document's running fill (at its next denoising step)."""
        with self._lock:
            record = self.docs.get(uri)
        if record is not None and record.job is not None:
            record.job.flag.set()

    def pieces(
        self,
        uri: str,
        files: Callable[[], list[tuple[str, str]]],
        prefix: str,
        suffix: str,
        current: str,
        recent: Callable[[], list[tuple[str, int]]] | None = None,
    ) -> list[tuple[str, str]]:
        """The repository context for a fill of the document at `prefix`|`suffix`: the
        block its fills get now, whatever the line (it comes first in the prompt, and a new
        one is encoded again whole; in a real project the windows most like the code around
        the cursor change every few lines). It is chosen at the document's first fill, then
        again only at a pause (`_paused`), at the place of the request before it: the pieces
        of `files()` engine.repository.select chooses there (`recent()`: lines edited
        lately in other documents; both asked only then, never on a keystroke)."""
        engine = self.engine
        budget = engine.repository_chars() if engine is not None else 0

        def choose() -> list[tuple[str, str]]:
            lately = recent() if recent is not None else []
            return select(files(), prefix, suffix, budget, current, lately) if budget > 0 else []

        record = self.document(uri)
        record.choose = choose
        if record.context is None:
            record.context = choose()
        return record.context

    def opened(self, uri: str, text: str) -> None:
        """The document opened as `text`: its edit history starts here."""
        self.document(uri).history = EditHistory(text)

    def edited(self, uri: str, text: str) -> None:
        """The document is now `text`: answers for its old text are dropped, its running
        fill goes on only if the user typed into it (reuse.Job.edited), and the edit joins
        its history."""
        with self._lock:
            record = self.docs.get(uri)
        if record is None:
            return
        record.edits += 1
        record.edited_at = time.monotonic()
        if record.history is None:
            record.history = EditHistory(text)
        else:
            record.history.update(text)
        if record.job is not None:
            record.job.edited(text)

    def last_edit(self, uri: str, text: str) -> Change | None:
        """The document's newest edit (lsp_server.history), while `text` is the document."""
        with self._lock:
            record = self.docs.get(uri)
        history = record.history if record is not None else None
        return history.last if history is not None and history.text == text else None

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
        """The user hid the suggestion: its fill stops, and neither typing its start nor
        coming back brings it (or any earlier fill) back."""
        self.cancel(uri)
        with self._lock:
            record = self.docs.get(uri)
        if record is not None:
            record.recall.clear()

    def forget(self, uri: str) -> None:
        """The document closed: its fill stops and its record goes."""
        self.cancel(uri)
        with self._lock:
            record = self.docs.pop(uri, None)
        if record is not None and record.pause is not None:
            record.pause.cancel()

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
        `on_draft(step, texts)` is called on the worker at each denoising step.

        A request that supersedes is answered, in turn, by the document's earlier fills
        (reuse.Recall), by the fill running for it when the user typed into that
        (reuse.Job), or by a fill of its own, which stops the one before. Its answer is
        dropped if the document changed meanwhile; once shown, the next suggestion is made
        ahead (`_ahead`)."""
        if not kind.supersede:
            job = Job.at(req, kind)
            return await self._run_job(uri, job, holes, on_draft)
        record = self.document(uri)
        if record.choose is None:
            return await self._answer(uri, record, req, kind, on_draft, holes)
        record.last = req  # a document with repository context: a pause is looked for after the answer
        try:
            return await self._answer(uri, record, req, kind, on_draft, holes)
        finally:
            self._pause_later(uri, record, TYPING_PAUSE_S)

    async def _answer(
        self,
        uri: str,
        record: OpenDocument,
        req: InfillRequest,
        kind: FillKind,
        on_draft: Drafts | None,
        holes: Sequence[Span],
    ) -> FillAnswer | None:
        """`fill` for a request that supersedes."""
        seen = record.edits
        answer, source = await self._reused(record, req, kind) if kind.type_through and not holes else (None, MODEL)
        if answer is None:
            job = Job.at(req, kind)
            self.begin(uri, job)
            if kind.debounce and self.settings.debounce_ms:
                await asyncio.sleep(self.settings.debounce_ms / 1000)
                if job.flag.is_set():
                    return None
            answer, source = await self._run_job(uri, job, holes, on_draft), MODEL
        if answer is None or record.edits != seen:
            return None
        self.answers[source] += 1
        if kind.gated and answer.candidates:
            self._ahead(uri, record, req, answer.candidates[0].text)
        return answer

    async def edits(self, uri: str, req: EditRequest) -> list[Edit] | None:
        """The in-line edits the engine suggests for `req` (engine.edits), on the worker; None:
        no engine, an engine bug (logged), or the document changed meanwhile."""
        await self.wait_ready()
        engine = self.engine
        if engine is None:
            return None
        record = self.document(uri)
        seen = record.edits
        try:
            edits = await asyncio.wrap_future(self._submit(suggest_edits, engine, req, FillControl()))
        except Exception:  # an engine bug: logged, no edits, the server goes on
            log.exception("edits failed for %s", uri)
            return None
        return None if record.edits != seen else edits

    async def _reused(self, record: OpenDocument, req: InfillRequest, kind: FillKind) -> tuple[FillAnswer | None, str]:
        """(the answer the document's earlier fills give, or its running fill once it ends
        when the user typed into it, and where it came from); None: a fill of its own is
        needed."""
        single = req.candidates == 1
        shape = Job.at(req, kind).shape if single else None
        got = record.recall.answer(req.prefix, req.suffix, shape)
        job = record.job
        if got is None and single and job is not None and job.shape == shape and job.follows(req.prefix, req.suffix):
            assert job.future is not None  # follows: it runs
            with contextlib.suppress(Exception):  # its failure is its own request's to log
                await asyncio.shield(job.future)
            got = record.recall.answer(req.prefix, req.suffix, shape)
            if got is not None and got[1] == TYPE_THROUGH:
                got = (got[0], KEPT)  # the rest of the fill that was running when the request came
        if got is None:
            return None, MODEL
        text, source = got
        return FillAnswer([Candidate(text=text, token_ids=[], confidence=[])]), source

    def _ahead(self, uri: str, record: OpenDocument, req: InfillRequest, shown: str) -> None:
        """The suggestion `shown` is on screen at `req`'s place: fill, in the idle time, as
        if it had been accepted, so that Tab, Tab finds the next one ready (llama.vim's
        speculative fill, Cody's hot streak). Not when one is there or running already, or
        while another fill runs."""
        if not self.settings.fill_ahead or not shown.strip():
            return
        lead = shown
        if not shown.endswith("\n") and not req.suffix.split("\n", 1)[0].strip():
            lead += "\n"  # the suggestion ends its line: the user goes on on the next one
        prefix = req.prefix + lead
        job = record.job
        if record.recall.has(prefix, req.suffix):
            return
        if job is not None and not job.flag.is_set() and job.future is not None and not job.future.done():
            return  # the worker is busy with this document's fill (or one ahead already)
        ahead = Job.at(replace(req, prefix=prefix, document=None, candidates=1), INLINE, lead, len(shown))
        self.begin(uri, ahead)
        ahead.future = asyncio.wrap_future(self._submit(self._run, uri, ahead, (), None, stops_warm=False))
        ahead.future.add_done_callback(lambda f: f.cancelled() or f.exception())  # logged in _run

    def _submit(self, fn: Callable[..., T], *args: object, stops_warm: bool = True) -> Future[T]:
        """Hand work to the worker (one at a time). Work the user waits for stops a warm
        running or waiting there at its next part (`_warm`); a fill made ahead, idle work
        too, waits its turn."""
        self._submitted += int(stops_warm)
        return self.worker.submit(fn, *args)

    def _pause_later(self, uri: str, record: OpenDocument, delay: float) -> None:
        """Look for a pause in the document `delay` seconds from now (the look set before goes)."""
        if record.pause is not None:
            record.pause.cancel()
        record.pause = asyncio.get_running_loop().call_later(delay, self._paused, uri, record)

    def _paused(self, uri: str, record: OpenDocument) -> None:
        """On the event loop, TYPING_PAUSE_S after the answer to the document's last request:
        unless it was edited since or a fill is running for it (then look again later), the
        user has paused. The repository context is chosen again at that request's place; a
        new block is encoded there on the worker in the idle time (`encodeWhenIdle`) and is
        the document's once it is, so that a keystroke never waits for it; without that, it
        is the document's at once and the next fill encodes it."""
        record.pause = None
        if self.docs.get(uri) is not record or record.choose is None or record.last is None:
            return
        wait = record.edited_at + TYPING_PAUSE_S - time.monotonic()
        job = record.job
        if job is not None and job.future is not None and not job.future.done():
            wait = TYPING_PAUSE_S  # a fill is running for it (a slow answer waited for, or one made ahead)
        if wait > 0:
            self._pause_later(uri, record, wait)
            return
        try:
            chosen = record.choose()
        except Exception:  # a bug choosing context: logged, the block stays, the server goes on
            log.exception("choosing repository context failed for %s", uri)
            return
        if chosen == record.context:
            return
        if not self.settings.encode_when_idle or self.engine is None:
            record.context = chosen
            return
        seen = self._submitted
        req = replace(record.last, extra_files=chosen, candidates=1, retry_candidates=0, previous=None)
        self.worker.submit(self._warm, uri, record, req, lambda: self._submitted != seen)  # idle work: not counted

    def _warm(self, uri: str, record: OpenDocument, req: InfillRequest, stop: Callable[[], bool]) -> None:
        """On the worker: encode a fill of `req` ahead (Engine.warm), stopping when other
        work comes; once it is all encoded, `req`'s repository context is the document's."""
        engine = self.engine
        if engine is None:
            return
        started = time.perf_counter()
        try:
            done = not stop() and engine.warm(req, stop)
        except Exception:  # a bug encoding ahead: logged; the next fill encodes the block itself
            log.exception("encoding repository context ahead failed for %s", uri)
            done = True
        self.encoded_ahead["done" if done else "stopped"] += 1
        log.debug(
            "repository context encoded ahead for %s: %s in %.0f ms", uri, done, 1000 * (time.perf_counter() - started)
        )
        if done and self.docs.get(uri) is record:
            record.context = req.extra_files

    async def _run_job(self, uri: str, job: Job, holes: Sequence[Span], on_draft: Drafts | None) -> FillAnswer | None:
        """Run `job` on the worker and wait for it. A request cancelled ($/cancelRequest)
        stops waiting; a fill that supersedes goes on (the user may be typing into it,
        and the next request waits for it), others stop."""
        await self.wait_ready()
        job.future = asyncio.wrap_future(self._submit(self._run, uri, job, holes, on_draft))
        try:
            answer = await asyncio.shield(job.future)
        except asyncio.CancelledError:
            if not job.kind.supersede:
                job.flag.set()
            raise
        except Exception:  # an engine bug: logged, an empty answer, the server goes on
            log.exception("fill failed for %s", uri)
            return None
        return None if answer is None or job.flag.is_set() else answer

    def _run(self, uri: str, job: Job, holes: Sequence[Span], on_draft: Drafts | None) -> FillAnswer | None:
        """On the worker: the fill (or the joint fill of holes), unless superseded first;
        a fill that may answer while the user types is remembered (reuse.Recall)."""
        req, kind, flag = job.request, job.kind, job.flag
        if self.engine is None or flag.is_set():
            return None

        def watch(step: int, texts: list[str]) -> None:
            if texts:
                job.wrote(texts[0])
            if on_draft is not None:
                on_draft(step, texts)

        control = FillControl(
            cancel=flag.is_set if kind.supersede else None, on_draft=watch if kind.supersede else on_draft
        )
        if holes:

            def region(prefix: str, suffix: str, refine: str | None, replaced: str) -> str:
                sub = replace(req, prefix=prefix, suffix=suffix, region=replaced, refine=refine is not None)
                return self._once(sub, kind, control).text

            return FillAnswer([], holes=fill_holes_jointly(req.prefix, list(holes), region))
        answer = self._once(req, kind, control, ahead=bool(job.lead))
        if kind.type_through and answer.candidates and not flag.is_set():
            with self._lock:
                record = self.docs.get(uri)
            if record is not None:
                record.recall.remember(*job.remembered(answer.candidates[0].text))
        return answer

    def _once(self, req: InfillRequest, kind: FillKind, control: FillControl, ahead: bool = False) -> FillAnswer:
        """One engine fill, with the settings' deadline when the kind is timed. A request
        with `retry_candidates` (a code action's) is retried inside the engine: its greedy
        fill alone first (the most likely fill is the first candidate anyway, and sampled
        rows cost most of a many-candidate fill's steps), the others only when it is blank."""
        engine = self.engine
        if engine is None:
            return FillAnswer([])
        if kind.timed:
            control = replace(control, deadline=time.monotonic() + self.settings.deadline_ms / 1000)
        calls = 1
        result = engine.fill(req, control)
        calls += int(result.retried)
        if ahead:
            self.ahead_fills += calls  # made ahead of the user, apart from the fills requests asked for
        else:
            self.engine_calls += calls
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
        (all of them at 0; a candidate without a confidence is kept); with `endWhereUnsure`,
        the others cut before their first token below it (engine.candidate.confident_head);
        a fill held back is logged."""
        thresholds = [self.min_confidence(len(c.text.strip().splitlines()) > 1) for c in candidates]
        kept = [c for c, t in zip(candidates, thresholds, strict=True) if t <= 0 or c.score is None or c.score >= t]
        if self.settings.end_where_unsure and len(kept) < len(candidates):
            heads = (c if t <= 0 else confident_head(c, t) for c, t in zip(candidates, thresholds, strict=True))
            kept = [h for h in heads if h is not None]
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
