"""The fill service between the LSP handlers and the engine: one model, one worker thread,
per-document cancellation and type-through. It knows LSP only as far as document URIs.

- One worker runs fills one at a time (the engine and the machine's cores are shared).
- Per document only the newest request matters: a new request or an edit sets the
  previous request's cancel flag, which the sampler checks between denoising steps.
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

from engine.errors import EngineError
from engine.infill import Candidate, InfillEngine, InfillRequest, InfillResult
from engine.modeldir import load_model
from engine.remote import RemoteConfig, RemoteEngine
from lsp_server.settings import Settings

log = logging.getLogger(__name__)

REGION_CANDIDATES = 8  # code actions: candidates to choose a non-blank, parsing fill from


@dataclass
class _Shown:
    """The last suggestion returned for a document."""

    prefix: str
    suffix: str
    text: str


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
        self._flags: dict[str, threading.Event] = {}
        self._shown: dict[str, _Shown] = {}
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

    # -- cancellation
    def cancel(self, uri: str) -> None:
        """Stop the running fill for `uri` at its next denoising step."""
        with self._lock:
            flag = self._flags.pop(uri, None)
        if flag is not None:
            flag.set()

    def forget(self, uri: str) -> None:
        self.cancel(uri)
        self._shown.pop(uri, None)

    # -- fills
    def type_through(self, uri: str, prefix: str, suffix: str) -> str | None:
        """The rest of the last suggestion when the user typed its start, else None."""
        shown = self._shown.get(uri)
        if shown is None or suffix != shown.suffix or not prefix.startswith(shown.prefix):
            return None
        typed = prefix[len(shown.prefix) :]
        if typed and shown.text.startswith(typed) and len(shown.text) > len(typed):
            return shown.text[len(typed) :]
        return None

    def submit(
        self,
        uri: str,
        prefix: str,
        suffix: str,
        language: str | None,
        candidates: int,
        still_current: Callable[[], bool],
        document: Any | None = None,
        on_draft: Callable[[int, list[str]], None] | None = None,
    ) -> tuple[Future[FillAnswer | None], threading.Event]:
        """Run a fill on the worker: (future, its cancel flag). The future gives None when
        the fill was cancelled or the document moved on. A newer request for the same
        document cancels this one. `document`: the spans Document of prefix + suffix;
        `on_draft(step, texts)`: called on the worker at each denoising step."""
        flag = threading.Event()
        rest = self.type_through(uri, prefix, suffix)
        if rest is not None:
            done: Future[FillAnswer | None] = Future()
            done.set_result(FillAnswer([Candidate(text=rest, token_ids=[], confidence=[])], from_type_through=True))
            return done, flag
        self.cancel(uri)
        with self._lock:
            self._flags[uri] = flag
        req = InfillRequest(
            prefix=prefix,
            suffix=suffix,
            language=language,
            candidates=candidates,
            cancel=lambda: flag.is_set() or not still_current(),
            document=document,
            on_draft=on_draft,
        )
        return self.worker.submit(self._run, uri, req, flag), flag

    def _run(self, uri: str, req: InfillRequest, flag: threading.Event) -> FillAnswer | None:
        engine = self.engine
        if engine is None or flag.is_set():
            return None
        result = self._fill(engine, req)
        self._report(result.error)
        with self._lock:
            if self._flags.get(uri) is flag:
                del self._flags[uri]
        if req.cancel is not None and req.cancel() or result.stop_reason == "cancelled":
            return None
        if result.candidates:
            self._shown[uri] = _Shown(req.prefix, req.suffix, result.candidates[0].text)
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
        self.engine_calls += 1
        return engine.fill(
            replace(
                req,
                max_canvas_tokens=s.max_fill_tokens,
                context_tokens=s.context_tokens,
                deadline=time.monotonic() + s.deadline_ms / 1000 if timed and req.deadline is None else req.deadline,
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
        req = InfillRequest(
            prefix=prefix,
            suffix=suffix,
            language=language,
            refine=refine,
            candidates=REGION_CANDIDATES,
            replaced=replaced,
        )
        result = self._fill(engine, req, timed=False)
        self._report(result.error)
        texts = [c.text for c in result.candidates]
        return next((t for t in texts if t.strip()), "")
