"""Typing benchmark: what a developer gets from ghost text while typing. A simulated
developer retypes held-out regions of real code (fixtures/typing/, function bodies from
packages the shipped model never saw, in Python, JavaScript and Go) through `diffusion-lsp`
over stdio, the way VS Code drives it, and presses Tab whenever the suggestion on screen is
exactly the text about to be typed. Prints JSON; never asserted in tests. (Not
`bench/typing.py`: a script in bench/ runs with bench/ first on its path, and a file named
typing.py there would stand in for the standard library's `typing` in every one of them.)

    python bench/typing_bench.py [--model DIR] [--llama GGUF] [--modes pace,wait,llama] [--only NAME,...]
                           [--pace-ms 120] [--pause-ms 600] [--pause-after CHARS]
                           [--settings JSON] [--cases FILE]

`--cases fixtures/typing/crossfile.json`: the first functions of the 8 small projects of
fixtures/crossfile/ (bench/crossfile.py's), each project a workspace folder, so that the
server's repository context has the files they import (compare with `--settings
'{"repositoryContext": false}'`).

The typist, per key:
- one `didChange` (the character; Enter inserts the newline with the next line's
  indentation, as an editor's auto-indent does) and one Automatic
  `textDocument/inlineCompletion`; a request still open when the next key comes gets
  `$/cancelRequest`, as VS Code sends it;
- at the pace (`--pace-ms` a key, `--pause-ms` after a newline and after any of
  `--pause-after`, by default `. ( , :`), or waiting for every answer before the next key
  (`wait`: the ceiling; saved-at-pace over saved-when-waiting is what latency costs);
- before each key, if a non-empty suggestion for the text as it stands is on screen and the
  text still to type starts with it, Tab: the suggestion is inserted (one `didChange`) and
  a new request follows, as after any edit.

Reported per case and in total, per run, in the order `--modes` gives (`pace`, `wait`, and
`llama`: the paced run with llama.cpp's server on the `--llama` GGUF behind the same language
server, dialect `llama-infill`, 2 threads, as bench/server_bench.py --llama; reported as
`llama_cpp_pace`):
- `saved`: the share of the characters that came from Tab (strict: the suggestion equals
  the next characters), `tab_chars`, `accepts`;
- `suggestions_shown`: distinct suggestions on screen at a key (a type-through answer, the
  rest of the suggestion after the typed start, continues the same suggestion),
  `accepted_suggestions`, `shown_not_accepted`, `acceptance` (accepted over shown);
- `on_screen`: the share of keys before which a suggestion was on screen;
- `requests`, `cancelled` (overtaken by the next key), `empty` answers, and the answers by
  source (`diffusion.stats`: `model` fills, `type_through`), each with its latency p50/p95;
- `word_coverage`: the share of characters that some shown suggestion predicted in whole
  leading words (the most that accepting word by word could save, an upper bound: the
  suggestions overlap);
- `server_peak_rss_mb`, `first_answer_s` (server start to the first answer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lsp_bench import peak_rss_mb, start_server
from lsprotocol import types
from pytest_lsp.client import LanguageClient

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "fixtures" / "typing" / "cases.json"
PAUSE_AFTER = ".(,:"  # besides a newline: where the typist pauses (reads, thinks)
WAIT_CAP_S = 60.0  # the waiting typist gives up on an answer after this long
WORD = re.compile(r"\w+|\s+|[^\w\s]")


@dataclass(frozen=True)
class Case:
    """A held-out region: the file, and the span of it the typist retypes. A case of a
    project (`workspace`: its folder, given to the server as a workspace folder) opens the
    file at its own path, so that the server finds the files it imports there."""

    name: str
    language: str
    text: str
    start: int
    end: int
    path: Path | None = None
    workspace: Path | None = None

    @property
    def region(self) -> str:
        return self.text[self.start : self.end]

    @property
    def uri(self) -> str:
        if self.path is not None:
            return self.path.as_uri()
        return (
            f"file:///typing/{self.name}.{ {'python': 'py', 'javascript': 'js', 'go': 'go'}.get(self.language, 'txt') }"
        )


def load_cases(path: Path, only: set[str] | None = None) -> list[Case]:
    out = []
    for row in json.loads(path.read_text(encoding="utf-8")):
        if only and row["name"] not in only:
            continue
        workspace = (path.parent / row["workspace"]).resolve() if "workspace" in row else None
        file = (workspace or path.parent) / row["file"]
        text = file.read_text(encoding="utf-8")
        start, end = row["region"]["start"], row["region"]["end"]
        out.append(
            Case(row["name"], row["language"], text, start, end, file.resolve() if workspace else None, workspace)
        )
    return out


def next_key(region: str, i: int) -> str:
    """The text one key inserts at `i`: a character, or a newline with the next line's
    indentation (the editor's auto-indent)."""
    if region[i] != "\n":
        return region[i]
    rest = region[i + 1 :]
    return "\n" + rest[: len(rest) - len(rest.lstrip(" \t"))]


def word_prefix(suggestion: str, todo: str) -> int:
    """How many characters of `suggestion`, in whole leading words, match `todo`."""
    n = 0
    for word in WORD.findall(suggestion):
        if not todo.startswith(word, n):
            break
        n += len(word)
    return n


def position(text: str, offset: int) -> types.Position:
    line = text.count("\n", 0, offset)
    col = offset - (text.rfind("\n", 0, offset) + 1)
    return types.Position(line, len(text[offset - col : offset].encode("utf-16-le")) // 2)


@dataclass
class Answer:
    text: str
    latency_ms: float
    source: str  # model, type_through, ... (diffusion.stats' answers; "unknown" for a stale one)


@dataclass
class Tally:
    """What one run of one case (or all of them) gave."""

    chars: int = 0
    keys: int = 0  # typed keys and Tabs
    tab_chars: int = 0
    accepts: int = 0
    on_screen: int = 0  # keys before which a suggestion was on screen
    shown: int = 0  # distinct suggestions on screen at a key
    accepted_suggestions: int = 0
    requests: int = 0
    cancelled: int = 0
    empty: int = 0
    covered: int = 0  # characters some shown suggestion predicted in whole leading words
    latency: dict[str, list[float]] = field(default_factory=dict)

    def add(self, other: Tally) -> None:
        for name in self.__dataclass_fields__:
            if name == "latency":
                for source, xs in other.latency.items():
                    self.latency.setdefault(source, []).extend(xs)
            else:
                setattr(self, name, getattr(self, name) + getattr(other, name))

    def report(self) -> dict[str, Any]:
        def share(a: int, b: int) -> float | None:
            return round(a / b, 4) if b else None

        return {
            "saved": share(self.tab_chars, self.chars),
            "chars": self.chars,
            "tab_chars": self.tab_chars,
            "accepts": self.accepts,
            "keys": self.keys,
            "on_screen": share(self.on_screen, self.keys),
            "suggestions_shown": self.shown,
            "accepted_suggestions": self.accepted_suggestions,
            "shown_not_accepted": self.shown - self.accepted_suggestions,
            "acceptance": share(self.accepted_suggestions, self.shown),
            "requests": self.requests,
            "cancelled": self.cancelled,
            "empty": self.empty,
            "word_coverage": share(self.covered, self.chars),
            "latency_ms": {
                source: {"n": len(xs), "p50": round(statistics.median(xs), 1), "p95": round(_p95(xs), 1)}
                for source, xs in sorted(self.latency.items())
            },
        }


def _p95(xs: list[float]) -> float:
    return sorted(xs)[int(0.95 * (len(xs) - 1))]


@dataclass
class Pending:
    """A request sent: its id, when it went out, when its answer came in, the answer."""

    msg_id: str
    sent: float
    arrived: float | None = None
    future: asyncio.Future[Any] = field(default_factory=asyncio.Future)

    @property
    def answered(self) -> bool:
        f = self.future
        return f.done() and not f.cancelled() and f.exception() is None

    @property
    def latency_s(self) -> float:
        return (self.arrived or time.perf_counter()) - self.sent


class Session:
    """One language server over stdio, and the typist's view of one document in it."""

    def __init__(self, client: LanguageClient) -> None:
        self.client = client
        self.version = 0
        self.answers: dict[str, int] = {}

    async def stats(self) -> dict[str, Any]:
        got = await self.client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
        return dict(got)

    async def source_of_last(self) -> str:
        """Where the answer just received came from: the source whose count grew."""
        now = dict((await self.stats()).get("answers") or {})
        grew = [k for k, v in now.items() if v > self.answers.get(k, 0)]
        self.answers = now
        return grew[0] if len(grew) == 1 else "+".join(sorted(grew)) or "unknown"

    def change(self, uri: str, text: str, offset: int, inserted: str) -> None:
        self.version += 1
        at = position(text, offset)
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                types.VersionedTextDocumentIdentifier(version=self.version, uri=uri),
                [types.TextDocumentContentChangePartial(range=types.Range(at, at), text=inserted)],
            )
        )

    def ask(self, uri: str, text: str, offset: int) -> Pending:
        """Send an Automatic inline completion request at `offset`."""
        msg_id = str(uuid.uuid4())
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri),
            position=position(text, offset),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
        )
        pending = Pending(msg_id, time.perf_counter())
        future = self.client.protocol.send_request(types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=msg_id)
        future.add_done_callback(lambda _: setattr(pending, "arrived", time.perf_counter()))
        pending.future = asyncio.wrap_future(future)
        pending.future.add_done_callback(
            lambda f: f.cancelled() or f.exception()
        )  # a cancelled one's error is expected
        return pending

    def cancel(self, msg_id: str) -> None:
        self.client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))


async def retype(
    session: Session, case: Case, pace_s: float | None, pause_s: float, pause_after: str, trace: Any = None
) -> Tally:
    """The typist retypes `case`'s region at the pace (`pace_s` a key), or waiting for every
    answer (`pace_s` None)."""
    region, tally = case.region, Tally(chars=len(case.region))
    text = case.text[: case.start] + case.text[case.end :]
    offset = case.start
    session.version += 1
    session.client.text_document_did_open(
        types.DidOpenTextDocumentParams(types.TextDocumentItem(case.uri, case.language, session.version, text))
    )
    covered = [False] * len(region)
    i = 0
    pending: Pending | None = None
    on_screen: Answer | None = None
    suggestion_id, accepted_ids = 0, set()
    last_suggestion = ""  # the text of the suggestion current at the last key, for type-through's identity
    inserted = ""
    while i < len(region):
        todo = region[i:]
        if on_screen is not None and on_screen.text:
            tally.on_screen += 1
            if on_screen.source != "type_through" or not last_suggestion.endswith(on_screen.text):
                suggestion_id += 1
                tally.shown += 1
            last_suggestion = on_screen.text
            n = word_prefix(on_screen.text, todo)
            covered[i : i + n] = [True] * n
        accept = on_screen is not None and on_screen.text and todo.startswith(on_screen.text)
        if trace is not None and on_screen is not None and on_screen.text:
            row = {"case": case.name, "at": i, "source": on_screen.source, "ms": round(on_screen.latency_ms)}
            row.update(shown=on_screen.text, todo=todo[: len(on_screen.text) + 10], tab=bool(accept))
            trace.write(json.dumps(row) + "\n")
        if accept:
            assert on_screen is not None
            inserted = on_screen.text
            tally.accepts += 1
            tally.tab_chars += len(inserted)
            accepted_ids.add(suggestion_id)
        else:
            inserted = next_key(region, i)
        tally.keys += 1
        if pending is not None and not pending.future.done():
            session.cancel(pending.msg_id)
            tally.cancelled += 1
        session.change(case.uri, text, offset, inserted)
        text = text[:offset] + inserted + text[offset:]
        offset += len(inserted)
        i += len(inserted)
        on_screen = None
        if i >= len(region):
            break
        pending = session.ask(case.uri, text, offset)
        tally.requests += 1
        if pace_s is None:
            with _quiet():
                await asyncio.wait_for(asyncio.shield(pending.future), WAIT_CAP_S)
        else:
            delay = pause_s if "\n" in inserted or inserted[-1] in pause_after else pace_s
            with _quiet():
                await asyncio.wait_for(asyncio.shield(pending.future), delay)
            remaining = delay - (time.perf_counter() - pending.sent)
            if remaining > 0:
                await asyncio.sleep(remaining)
        if pending.answered:
            on_screen = await _answer(session, pending.future.result(), pending.latency_s, tally)
    for _ in range(50):  # the last request's answer (cancelled or not) before the document closes
        if pending is None or pending.future.done():
            break
        await asyncio.sleep(0.1)
    if pending is not None and not pending.future.done():
        session.cancel(pending.msg_id)
    session.client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(case.uri)))
    tally.covered = sum(covered)
    tally.accepted_suggestions = len(accepted_ids)
    return tally


class _quiet:
    """Swallows the timeout of waiting for an answer (the typist goes on)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool:
        return kind is not None and issubclass(kind, asyncio.TimeoutError | asyncio.CancelledError)


async def _answer(session: Session, result: Any, latency_s: float, tally: Tally) -> Answer | None:
    """The answer received: its first item's text, its latency and its source."""
    latency = latency_s * 1000
    items = getattr(result, "items", None) or (result if isinstance(result, list) else [])
    first = items[0] if items else None
    text = str(first.insert_text if hasattr(first, "insert_text") else "") if first is not None else ""
    source = await session.source_of_last()
    tally.latency.setdefault(source, []).append(latency)
    tally.empty += not text
    return Answer(text, latency, source)


async def run(
    args: argparse.Namespace, cases: list[Case], remote: dict[str, object] | None, pace: bool
) -> dict[str, Any]:
    """One server, every case retyped in turn; the report per case and in total."""
    settings: dict[str, object] = dict(args.settings)
    if args.model and not remote:
        settings["model"] = str(args.model)
    settings.update(remote or {})
    t0 = time.perf_counter()
    folders = sorted({c.workspace for c in cases if c.workspace is not None})
    client = await start_server(settings, folders)
    session = Session(client)
    while not (state := await session.stats()).get("model_loaded"):  # the developer starts once the model is up
        if state.get("load_error"):
            raise SystemExit(f"the model did not load: {state['load_error']}")
        await asyncio.sleep(0.2)
    loaded_s = time.perf_counter() - t0
    per_case, total = {}, Tally()
    name = f"{args.trace}.{'pace' if pace else 'wait'}{'.remote' if remote else ''}.jsonl"
    trace = open(name, "w") if args.trace else None  # noqa: SIM115 (closed after the cases)
    for case in cases:
        pace_s = args.pace_ms / 1000 if pace else None
        tally = await retype(session, case, pace_s, args.pause_ms / 1000, args.pause_after, trace)
        per_case[case.name] = {"language": case.language, **tally.report()}
        total.add(tally)
        print(f"{case.name}: {per_case[case.name]['saved']}", file=sys.stderr)
    if trace is not None:
        trace.close()
    stats = await session.stats()
    rss = peak_rss_mb(client)
    await client.shutdown_session()
    return {
        "total": total.report(),
        "cases": per_case,
        "model_loaded_s": round(loaded_s, 2),
        "server_peak_rss_mb": rss,
        "answers": stats.get("answers"),
        "engine_calls": stats.get("engine_calls"),
        "model": stats.get("model"),
        "settings": settings,
    }


def llama_run(args: argparse.Namespace, cases: list[Case]) -> dict[str, Any]:
    """The paced run with llama.cpp's server on `--llama` behind the same language server."""
    sys.path.insert(0, str(ROOT))
    from tests.real_engine import llama_server

    with llama_server(args.llama, threads=2, ctx=4096) as engine:
        remote = {"endpoint": engine.url, "dialect": "llama-infill"}
        return asyncio.run(run(args, cases, remote, pace=True))


def _commit() -> str | None:
    """The checkout's commit (with `+` when it has changes): what the server ran."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model", type=Path, help="model directory (the server's model setting; default: the server's choice)"
    )
    p.add_argument("--llama", type=Path, help="a GGUF for llama.cpp's server: the paced run again through it")
    p.add_argument(
        "--modes", default="pace,wait,llama", help="comma-separated runs, in order: pace, wait, llama (with --llama)"
    )
    p.add_argument("--only", help="comma-separated case names (default: all)")
    p.add_argument("--cases", type=Path, default=CASES)
    p.add_argument("--pace-ms", type=float, default=120.0, help="time between keys")
    p.add_argument("--pause-ms", type=float, default=600.0, help="time after a newline and after --pause-after")
    p.add_argument("--pause-after", default=PAUSE_AFTER)
    p.add_argument("--trace", help="write each suggestion shown to TRACE.<run>.jsonl (what was shown, what came next)")
    p.add_argument("--settings", type=json.loads, default={}, help="diffusionLsp settings (JSON) for both runs")
    args = p.parse_args()
    cases = load_cases(args.cases, set(args.only.split(",")) if args.only else None)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    report: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "commit": _commit(),
        "cases": len(cases),
        "chars": sum(len(c.region) for c in cases),
        "pace_ms": args.pace_ms,
        "pause_ms": args.pause_ms,
        "pause_after": "\\n" + args.pause_after,
        "model": str(args.model) if args.model else None,
        "settings": args.settings,  # over the server's defaults
    }
    for mode in modes:
        if mode == "llama":
            if args.llama:
                report["llama_cpp_pace"] = llama_run(args, cases)
        elif mode in ("pace", "wait"):
            report[mode] = asyncio.run(run(args, cases, None, pace=mode == "pace"))
        else:
            p.error(f"unknown mode {mode!r}")
    if "pace" in report and "wait" in report:
        wait = report["wait"]["total"]["saved"] or 0
        report["saved_pace_over_wait"] = round(report["pace"]["total"]["saved"] / wait, 3) if wait else None
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
