"""The fill service between the LSP handlers and the engine: one model, one worker thread,
one record per open document. It knows LSP only as far as document URIs.

- One worker runs fills one at a time (the engine and the machine's cores are shared).
- One record per open document (`OpenDocument`): its syntax tree, the cancel flag of its
  newest request, and the suggestion last shown; `forget` drops it when it closes.
- One cancellation mechanism, that flag: a new request (`begin`), an edit, a close or
  $/cancelRequest sets the previous request's flag; the sampler checks it between
  denoising steps, a debounced request before it starts, and an answer before it goes out.
- Type-through: when the text typed since the last suggestion is the start of that
  suggestion, the rest is the answer at once, with no engine call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.candidate import Candidate, Shown
from engine.errors import EngineError
from engine.infill import FillControl, InfillEngine, InfillRequest, InfillResult
from engine.modeldir import load_model
from engine.remote import RemoteConfig, RemoteEngine
from lsp_server.settings import Settings

log = logging.getLogger(__name__)

REGION_CANDIDATES = 8  # code actions: candidates to choose a non-blank, parsing fill from


@dataclass
class OpenDocument:
    """What the server keeps for one open document."""

    tree: Any | None = None  # its spans Document, reparsed incrementally (lsp_server.context)
    request: threading.Event | None = None  # the cancel flag of its newest request
    shown: Shown | None = None  # the last suggestion returned, for type-through
    asked: bool = False  # the user asked for a suggestion (diffusion.suggestNow): the next is Invoked


@dataclass
class FillAnswer:
    candidates: list[Candidate]
    from_type_through: bool = False


class FillService:
    def __init__(self) -> None:
        self.engine: InfillEngine | RemoteEngine | None = None
        self.load_error: str | None = None
        self.settings = Settings()
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diffusion-fill")
        self.engine_calls = 0
        self.docs: dict[str, OpenDocument] = {}
        self._lock = threading.Lock()
        self.notify: Callable[[str], None] | None = None  # tells the user (the server's showMessage)
        self._last_error: str | None = None  # an engine fault is told once, until a fill works again

    # -- model
    def load(self, settings: Settings) -> str | None:
        """Load the engine the settings name (a remote endpoint, or a model directory);
        returns an error message, or None."""
        self.settings = settings
        old, self.engine = self.engine, None
        if isinstance(old, RemoteEngine):
            old.close()
        try:
            if settings.endpoint:
                engine: InfillEngine | RemoteEngine = RemoteEngine(
                    RemoteConfig(
                        endpoint=settings.endpoint,
                        dialect=settings.dialect,  # type: ignore[arg-type]
                        model=settings.remote_model,
                        path=settings.endpoint_path,
                        api_key_env=settings.api_key_env,
                        timeout_s=settings.request_timeout_ms / 1000,
                        verify_tls=settings.tls_verify,
                    )
                )
                where = f"{settings.endpoint} ({settings.dialect})"
            else:
                model = load_model(Path(settings.model) if settings.model else None, settings.backend, settings.device)
                engine, where = InfillEngine(model), f"{model.path} ({model.backend} backend)"
        except EngineError as exc:
            self.load_error = str(exc)
            log.error("engine not loaded: %s", exc)
            return self.load_error
        self.engine, self.load_error, self._last_error = engine, None, None
        log.info("fills from %s", where)
        return None

    # -- documents and cancellation
    def document(self, uri: str) -> OpenDocument:
        """The record of an open document (made on first use)."""
        with self._lock:
            return self.docs.setdefault(uri, OpenDocument())

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

    # -- fills
    def type_through(self, uri: str, prefix: str, suffix: str) -> str | None:
        """The rest of the last suggestion when the user typed its start, else None
        (engine.candidate.Shown.rest_after, the rule the engine's warm start follows)."""
        record = self.docs.get(uri)
        shown = record.shown if record is not None else None
        return shown.rest_after(prefix, suffix) if shown is not None else None

    def submit(
        self,
        uri: str,
        prefix: str,
        suffix: str,
        language: str | None,
        candidates: int,
        flag: threading.Event,
        document: Any | None = None,
        on_draft: Callable[[int, list[str]], None] | None = None,
        extra_files: list[tuple[str, str]] | None = None,
    ) -> Future[FillAnswer | None]:
        """Run a fill on the worker for the request whose flag `begin` gave. The future
        gives None when the flag was set (a newer request, an edit) before the answer.
        `document`: the spans Document of prefix + suffix; `on_draft(step, texts)`:
        called on the worker at each denoising step; `extra_files`: (name, text) of other
        open files, for engines that take repository context."""
        rest = self.type_through(uri, prefix, suffix)
        if rest is not None:
            done: Future[FillAnswer | None] = Future()
            done.set_result(FillAnswer([Candidate(text=rest, token_ids=[], confidence=[])], from_type_through=True))
            return done
        req = InfillRequest(
            prefix=prefix,
            suffix=suffix,
            language=language,
            candidates=candidates,
            control=FillControl(cancel=flag.is_set, on_draft=on_draft),
            document=document,
            extra_files=extra_files or [],
        )
        return self.worker.submit(self._run, uri, req, flag)

    def _run(self, uri: str, req: InfillRequest, flag: threading.Event) -> FillAnswer | None:
        engine = self.engine
        if engine is None or flag.is_set():
            return None
        result = self._fill(engine, req)
        self._report(result.error)
        if flag.is_set() or result.stop_reason == "cancelled":
            return None
        if result.candidates:
            with self._lock:
                record = self.docs.get(uri)
            if record is not None:
                record.shown = Shown(req.prefix, req.suffix, result.candidates[0].text)
        return FillAnswer(result.candidates)

    def _report(self, error: str | None) -> None:
        """Tell the user of an engine fault once (not on every keystroke), and again only
        after a fill has worked in between or the fault changed."""
        if error is None:
            self._last_error = None
            return
        if error != self._last_error:
            self._last_error = error
            log.warning("%s", error)
            if self.notify is not None:
                self.notify(error)

    def _fill(self, engine: InfillEngine | RemoteEngine, req: InfillRequest, timed: bool = True) -> InfillResult:
        """engine.fill with the settings' budgets, sampler overrides (a remote endpoint
        decodes as its own server is configured) and, when `timed`, the deadline
        (completions while typing; a command the user asked for runs to its end)."""
        s = self.settings
        overrides: dict[str, Any] = {k: v for k, v in (("strategy", s.strategy), ("max_steps", s.max_steps)) if v}
        sampler = None
        if overrides and isinstance(engine, InfillEngine):
            sampler = replace(engine.default_sampler(), **overrides)
        control = req.control
        if timed and control.deadline is None:
            control = replace(control, deadline=time.monotonic() + s.deadline_ms / 1000)
        self.engine_calls += 1
        return engine.fill(
            replace(
                req,
                max_canvas_tokens=s.max_fill_tokens,
                context_tokens=s.context_tokens,
                control=control,
                sampler=sampler,
            )
        )

    def fill_region(
        self, prefix: str, suffix: str, language: str | None, refine: str | None = None, replaced: str = ""
    ) -> str:
        """A fill between prefix and suffix, on the worker, for code actions (no type-
        through, no cancellation): the best candidate that is not blank, or "" when
        none is (a blank fill would delete the hole or the selection).
        `refine`: the current text there, whose likely tokens are kept; `replaced`: the
        text the fill takes the place of (the fill must parse where it did)."""
        engine = self.engine
        if engine is None:
            return ""
        # the greedy fill alone first: the most likely fill is the first candidate
        # anyway, and sampled rows cost most of a many-candidate fill's steps (they
        # rarely grow sure of their end); the others only when it is blank or fails
        for candidates in (1, REGION_CANDIDATES):
            req = InfillRequest(
                prefix=prefix,
                suffix=suffix,
                language=language,
                refine=refine,
                candidates=candidates,
                replaced=replaced,
            )
            result = self._fill(engine, req, timed=False)
            self._report(result.error)
            text = next((c.text for c in result.candidates if c.text.strip()), "")
            if text or result.error is not None:
                return text
        return ""
