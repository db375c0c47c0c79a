"""Cross-file benchmark (issue 43): does repository context give the fills the names, fields,
argument names and constants that another file of the project defines?

The projects are in fixtures/crossfile/: small multi-file projects in Python and JavaScript,
written for this benchmark (so no model has seen them), each a module that defines things
with names no one would guess and a module that uses them. Cases are cut from every line
of a file that uses a name defined only in another file of its project (`cut_cases`): the
line is cut just before that name's first use in the file (outside its import lines), and
the right fill is the rest of the line.

Each case is asked through the real server over stdio, the projects its workspace folders,
as an Invoked inline completion on the file with the rest of the line removed; the server
finds the other file by the import (lsp_server/repository.py). Twice: `repositoryContext`
off, then on. Reported (JSON): exact match of the fill's first line with the rest of the
line, edit similarity (difflib's ratio), per language and in total; latency p50 of the
request, and of a keystroke (the suggestion dismissed, the first character of the right fill
typed, and asked again: what a keystroke's fresh fill costs once the context is warm), and
the ratios of context on to off. Fills run to their end (`deadlineMs` 30000 unless the
settings say otherwise), so that what is measured is what the model writes, not what a
deadline on a busy machine lets it write.
Never asserted in tests.

    python bench/crossfile.py --model .weights-cache/qwen2.5-coder-0.5b-int8
    python bench/crossfile.py --model .weights-cache/qwen2.5-coder-0.5b-int8 --keystrokes 16
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures" / "crossfile"
LANGUAGES = {".py": "python", ".js": "javascript"}
IDENT = re.compile(r"[A-Za-z_$][\w$]*")
DEFINES = re.compile(
    r"(?:\b(?:def|class|function|const|let|var)\s+([A-Za-z_$][\w$]*))"  # a function, class or constant
    r"|(?:^\s+([a-z_][\w]*)\s*:\s*[\w\[\]|. ]+(?:=.*)?$)"  # a dataclass field
    r"|(?:\bthis\.([A-Za-z_$][\w$]*)\s*=)"  # a JavaScript field
    r"|(?:^\s*([A-Z][A-Z0-9_]+)\s*=)"  # a Python constant
    r"|(?:\(([\w, =.]+)\)\s*(?:->|\{|:))",  # parameters (names of arguments)
    re.M,
)
COMMON = frozenset({"self", "this", "return", "const", "function", "import", "from", "export", "lines", "items"})


@dataclass(frozen=True)
class Case:
    name: str
    project: str
    file: str  # relative to the project
    language: str
    text: str  # the file with the rest of the cut line removed
    at: int  # the cut
    want: str  # the rest of the line


def defined(text: str) -> set[str]:
    """The names a file defines: functions, classes, constants, fields, parameters."""
    out: set[str] = set()
    for m in DEFINES.finditer(text):
        for group in m.groups():
            if group:
                out |= {w for w in IDENT.findall(group) if len(w) >= 4}
    return out - COMMON


def cut_cases(root: Path = FIXTURES) -> list[Case]:
    """A case for each line of a file whose first use (outside imports) of a name another
    file of its project defines, and the file does not, comes on it."""
    cases = []
    for project in sorted(p for p in root.iterdir() if p.is_dir()):
        files = {p.name: p.read_text(encoding="utf-8") for p in sorted(project.iterdir()) if p.suffix in LANGUAGES}
        for name, text in files.items():
            others = set().union(*(defined(t) for n, t in files.items() if n != name)) - defined(text)
            seen: set[str] = set()
            offset = 0
            for line in text.splitlines(keepends=True):
                body = line.rstrip("\n")
                code = not body.lstrip().startswith(("import ", "from ", "#", "//", '"""'))
                if code:
                    uses = [m for m in IDENT.finditer(body) if m.group() in others and m.group() not in seen]
                    if uses and body[uses[0].start() :].strip():
                        m = uses[0]
                        at = offset + m.start()
                        cut = text[:at] + text[offset + len(body) :]
                        cases.append(
                            Case(
                                f"{project.name}/{name}:{text.count(chr(10), 0, at) + 1}",
                                project.name,
                                name,
                                LANGUAGES[Path(name).suffix],
                                cut,
                                at,
                                body[m.start() :],
                            )
                        )
                    seen |= {m.group() for m in IDENT.finditer(body)}
                offset += len(line)
    return cases


def similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


async def _run(settings: dict[str, Any], cases: list[Case], timeout_s: float) -> list[dict[str, Any]]:
    sys.path.insert(0, str(ROOT / "bench"))
    from lsp_bench import start_server  # noqa: E402 (bench/ on the path)
    from lsprotocol import types

    projects = sorted({FIXTURES / c.project for c in cases})
    client = await start_server(settings, projects)
    rows = []
    try:
        for c in cases:
            uri = (FIXTURES / c.project / c.file).resolve().as_uri()
            item = types.TextDocumentItem(uri=uri, language_id=c.language, version=1, text=c.text)
            client.text_document_did_open(types.DidOpenTextDocumentParams(item))
            line = c.text.count("\n", 0, c.at)
            col = c.at - (c.text.rfind("\n", 0, c.at) + 1)
            t = time.perf_counter()
            answer = await _ask(client, uri, line, col, timeout_s)
            ms = (time.perf_counter() - t) * 1000
            # a keystroke: the first character of the right fill typed, and asked again, the
            # suggestion dismissed first (so that a fresh fill answers, not type-through)
            await client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.dismiss", [uri]))
            typed = c.text[: c.at] + c.want[0] + c.text[c.at :]
            change = types.TextDocumentContentChangeWholeDocument(text=typed)
            client.text_document_did_change(
                types.DidChangeTextDocumentParams(types.VersionedTextDocumentIdentifier(version=2, uri=uri), [change])
            )
            t = time.perf_counter()
            await _ask(client, uri, line, col + 1, timeout_s)
            keystroke_ms = (time.perf_counter() - t) * 1000
            items = answer if isinstance(answer, list) else getattr(answer, "items", None) or []
            text = items[0].insert_text if items else ""
            text = text if isinstance(text, str) else getattr(text, "value", "")
            got = text.split("\n", 1)[0].rstrip()
            want = c.want.rstrip()
            rows.append(
                {
                    "name": c.name,
                    "language": c.language,
                    "ms": round(ms, 1),
                    "keystroke_ms": round(keystroke_ms, 1),
                    "exact": got == want,
                    "similarity": round(similarity(got, want), 4),
                    "got": got,
                    "want": want,
                }
            )
            client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri)))
            print(f"{c.name}: {rows[-1]['exact']} {got!r} / {want!r}", file=sys.stderr)
    finally:
        await client.shutdown_session()
    return rows


async def _ask(client: Any, uri: str, line: int, col: int, timeout_s: float) -> Any:
    """An Invoked inline completion at (line, col); None when it takes longer than `timeout_s`."""
    from lsprotocol import types

    params = types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri),
        position=types.Position(line, col),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
    )
    try:
        return await asyncio.wait_for(client.text_document_inline_completion_async(params), timeout_s)
    except TimeoutError:
        return None


def keystroke_costs(model: Path | None, cases: list[Case], tokens: int) -> dict[str, Any]:
    """In-process, the same work with and without repository context: for each case, a fill
    at the cut (the context encoded), then the first character of the right fill typed and
    a fill of exactly `tokens` tokens timed (end-of-fill barred before, no span to stop
    it): what a keystroke costs once the context is warm, whatever the fills say."""
    from dataclasses import replace

    from engine.denoisers.loading import load_model
    from engine.fill import FillOptions, InfillRequest
    from engine.local.generator import local_engine
    from engine.repository import select

    loaded = load_model(model)
    out: dict[str, Any] = {"tokens": tokens}
    for mode in ("off", "on"):
        engine = local_engine(loaded, FillOptions(canvas_tokens=tokens))
        times, reused = [], []
        for c in cases:
            project = FIXTURES / c.project
            others = [(p.name, p.read_text(encoding="utf-8")) for p in sorted(project.iterdir()) if p.name != c.file]
            prefix, suffix = c.text[: c.at], c.text[c.at :]
            pieces = select(others, prefix, suffix, engine.repository_chars(), c.file) if mode == "on" else []
            req = InfillRequest(prefix, suffix, None, extra_files=pieces, repository=c.project, path=c.file)
            engine.fill(replace(req, min_tokens=tokens))
            typed = replace(req, prefix=prefix + c.want[0], min_tokens=tokens)
            t = time.perf_counter()
            r = engine.fill(typed)
            times.append((time.perf_counter() - t) * 1000)
            reused.append(r.reused_tokens / max(r.context_tokens, 1))
        out[f"context_{mode}"] = {
            "p50_ms": round(statistics.median(times), 1),
            "reused_share_p50": round(statistics.median(reused), 4),
        }
    out["ratio"] = round(out["context_on"]["p50_ms"] / out["context_off"]["p50_ms"], 3)
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def of(group: list[dict[str, Any]]) -> dict[str, Any]:
        if not group:
            return {"cases": 0}
        return {
            "cases": len(group),
            "exact": round(sum(r["exact"] for r in group) / len(group), 4),
            "similarity": round(statistics.mean(r["similarity"] for r in group), 4),
            "p50_ms": round(statistics.median(r["ms"] for r in group), 1),
            "keystroke_p50_ms": round(statistics.median(r["keystroke_ms"] for r in group), 1),
        }

    return {"total": of(rows), **{lang: of([r for r in rows if r["language"] == lang]) for lang in LANGUAGES.values()}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, help="model directory (the server's model setting)")
    p.add_argument("--settings", type=json.loads, default={}, help="diffusionLsp settings (JSON)")
    p.add_argument("--timeout-s", type=float, default=60.0)
    p.add_argument("--only", choices=("off", "on"), help="one run only")
    p.add_argument(
        "--keystrokes",
        type=int,
        metavar="TOKENS",
        help="measure a keystroke's fill of TOKENS tokens in-process instead",
    )
    args = p.parse_args()
    settings = {**({"model": str(args.model)} if args.model else {}), "deadlineMs": 30000, **args.settings}
    cases = cut_cases()
    if args.keystrokes:
        costs = {"when": time.strftime("%Y-%m-%d %H:%M"), "model": str(args.model), "cases": len(cases)}
        json.dump({**costs, **keystroke_costs(args.model, cases, args.keystrokes)}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    report: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "model": str(args.model) if args.model else None,
        "settings": args.settings,
        "cases": len(cases),
    }
    for mode in ("off", "on"):
        if args.only and mode != args.only:
            continue
        rows = asyncio.run(_run({**settings, "repositoryContext": mode == "on"}, cases, args.timeout_s))
        report[f"context_{mode}"] = {**summary(rows), "rows": rows}
    if "context_off" in report and "context_on" in report:
        on, off = report["context_on"]["total"], report["context_off"]["total"]
        report["exact_ratio"] = round(on["exact"] / off["exact"], 3) if off["exact"] else None
        report["keystroke_ratio"] = round(on["keystroke_p50_ms"] / off["keystroke_p50_ms"], 3)
    report["case_specs"] = [{k: v for k, v in asdict(c).items() if k != "text"} for c in cases]
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
