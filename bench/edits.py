"""Edit benchmark (issue 48): does `diffusion/inlineEdit` fix what is wrong, and only that?

Cases are cut from held-out real code (fixtures/typing/: function bodies from packages the
shipped model never saw, in Python, JavaScript and Go, with their licences) by one fault
each, made the way developers make them (`cut_cases`):

- `rename`, a next edit: the developer renames a variable where it is defined (the server
  sees the document before, then the change), and asks there; the fix: its later uses
  renamed, each edit one of them;
- `typo`: two inner letters of a name swapped at a use;
- `operator`: a comparison or an arithmetic operator changed (`==`/`!=`, `<`/`<=`, `+`/`-`);
- `off_by_one`: a small integer literal moved by one;
- `signature`, a next edit, one a fixture besides the others: the developer drops a
  function's last parameter where it is defined (as a rename, the server sees the change)
  and asks there; the fix: the last argument of its calls in the file dropped, each edit
  one of them.

Typos, operators and off-by-ones are asked at the fault with no edit history (a
refinement). As many clean positions (`clean`: a statement of the same regions left as it
is), and with each next edit a clean one (`clean_next`: the developer changes a small
number, which implies nothing elsewhere): the right answer is no edit. Each case is opened
in the real server over stdio and `diffusion/inlineEdit` asked. Reported per kind and in
total (JSON): the right edit (applying the answer restores the original at the fault; for a
next edit, each edit is one the change implies), the right place (an edit covers or touches
a fault), false edits at clean positions, the widest edit of each answer against the widest
fix (more than 4x: "wider than the fault"), and latency p50. Never asserted in tests.

    python bench/edits.py --model .weights-cache/qwen2.5-coder-0.5b-int8 [--per-file 3] [--timeout-s 60]
    python bench/edits.py --llama .weights-cache/qwen2.5-coder-0.5b-instruct.gguf   (a remote engine)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures" / "typing"
KINDS = ("rename", "typo", "operator", "off_by_one")  # `signature` cases come besides (cut_cases)
CLEAN = ("clean", "clean_next")  # the right answer is no edit: at a clean statement, after a clean edit
OPERATORS = (("==", "!="), ("!=", "=="), ("<=", "<"), (">=", ">"), (" < ", " <= "), (" > ", " >= "), (" + ", " - "))
NAME = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]{3,}\b")
KEYWORDS = frozenset(
    [
        "self",
        "this",
        "return",
        "range",
        "break",
        "continue",
        "false",
        "true",
        "nil",
        "null",
        "None",
        "True",
        "False",
        "func",
        "function",
        "const",
        "while",
        "elif",
        "else",
        "case",
        "default",
        "switch",
        "typeof",
        "string",
        "number",
    ]
)
DEFINITION = {
    "python": r"^\s*([A-Za-z_]\w{2,})\s*=[^=]",
    "javascript": r"\b(?:let|const|var)\s+([A-Za-z_$][\w$]{2,})\s*=",
    "go": r"\b([A-Za-z_]\w{2,})\s*:=",
}


@dataclass(frozen=True)
class EditCase:
    """A document with one fault (or none: a clean position), where to ask, and what the
    text must be once the fault is fixed."""

    name: str
    kind: str  # one of KINDS, or "clean"
    language: str
    text: str  # the document as the developer has it
    at: int  # the offset asked at: the fault's start, or the clean statement's
    span: tuple[int, int]  # the faulty characters in `text` ((at, at) for a clean position)
    fixed: str  # the right text for `span` (for a clean position, the text as it is)
    # a next edit: the document before the developer's edit (opened as this, then changed
    # to `text`), and every edit that edit implies, as (start, end, text) in `text`
    before: str | None = None
    fixes: tuple[tuple[int, int, str], ...] = ()


def _region_lines(text: str, start: int, end: int) -> list[tuple[int, str]]:
    """(offset, line) of the region's non-blank lines."""
    out, at = [], start
    for line in text[start:end].split("\n"):
        if line.strip():
            out.append((at, line))
        at += len(line) + 1
    return out


def _rename(text: str, lines: list[tuple[int, str]], language: str, rng: random.Random) -> EditCase | None:
    """A next edit: the developer renames a variable where it is defined (the document is
    opened as it was, then changed); asked there, the right edits are its later uses."""
    pattern = re.compile(DEFINITION[language], re.M)
    for off, line in rng.sample(lines, len(lines)):
        m = pattern.search(line)
        if m is None or m.group(1) in KEYWORDS:
            continue
        name, new = m.group(1), m.group(1) + "_all"
        def_at = off + m.start(1)
        renamed = text[:def_at] + new + text[def_at + len(name) :]
        after = def_at + len(new)
        use = rf"(?<![\w$.]){re.escape(name)}(?![\w$])"  # not an attribute: `x.name` is another object's
        uses = [u.start() for u in re.finditer(use, renamed) if u.start() >= after]
        if not uses:
            continue
        fixes = tuple((u, u + len(name), new) for u in uses)
        return EditCase("", "rename", language, renamed, after, (uses[0], uses[0] + len(name)), new, text, fixes)
    return None


SIGNATURE = {
    "python": r"\bdef\s+([A-Za-z]\w*)\s*\(([^()]*)\)",
    "javascript": r"\bfunction\s+([A-Za-z_$][\w$]*)\s*\(([^()]*)\)",
    "go": r"\bfunc\s+(?:\([^()]*\)\s*)?([A-Za-z_]\w*)\s*\(([^()]*)\)",
}


def _signature(text: str, language: str, rng: random.Random) -> EditCase | None:
    """A next edit: the developer drops a function's last parameter (the document is
    opened as it was, then changed); asked there, the right edits drop the last argument
    of its calls in the file (those with as many arguments as it had parameters)."""
    found = []
    for m in re.finditer(SIGNATURE[language], text):
        params = [p for p in m.group(2).split(",") if p.strip()]
        own = [p for p in params if p.split(":")[0].strip() not in ("self", "cls")]
        if len(own) < 2:
            continue
        calls = [
            c
            for c in re.finditer(rf"(?<![\w$]){re.escape(m.group(1))}\(([^()]*)\)", text)
            if c.start() != m.start(1) and len([a for a in c.group(1).split(",") if a.strip()]) == len(own)
        ]
        if calls:
            found.append((m, calls))
    if not found:
        return None
    m, calls = rng.choice(found)
    cut = m.start(2) + m.group(2).rfind(",")  # the last parameter, with its comma
    changed = text[:cut] + text[m.end(2) :]
    shift = m.end(2) - cut
    fixes = []
    for c in calls:
        start = c.start(1) - (shift if c.start() > cut else 0)
        last = start + c.group(1).rfind(",")
        fixes.append((last, start + len(c.group(1)), ""))
    first = min(fixes)
    return EditCase("", "signature", language, changed, cut, (first[0], first[1]), "", text, tuple(fixes))


def _changed_literal(text: str, lines: list[tuple[int, str]], language: str, rng: random.Random) -> EditCase | None:
    """A clean next edit: the developer changes a small number (the document is opened as
    it was, then changed); asked there, the right answer is no edit."""
    case = _off_by_one(text, lines, language, rng)
    if case is None:
        return None
    return EditCase("", "clean_next", language, case.text, case.at + 1, (case.at + 1, case.at + 1), "", text)


def _typo(text: str, lines: list[tuple[int, str]], language: str, rng: random.Random) -> EditCase | None:
    for off, line in rng.sample(lines, len(lines)):
        names = [m for m in NAME.finditer(line) if m.group() not in KEYWORDS and len(set(m.group()[1:-1])) > 1]
        if not names:
            continue
        m = rng.choice(names)
        word = m.group()
        i = rng.randrange(1, len(word) - 2)
        if word[i] == word[i + 1]:
            continue
        wrong = word[:i] + word[i + 1] + word[i] + word[i + 2 :]
        at = off + m.start()
        return EditCase(
            "", "typo", language, text[:at] + wrong + text[at + len(word) :], at, (at, at + len(word)), word
        )
    return None


def _operator(text: str, lines: list[tuple[int, str]], language: str, rng: random.Random) -> EditCase | None:
    for off, line in rng.sample(lines, len(lines)):
        found = [(line.find(a), a, b) for a, b in OPERATORS if line.find(a) > 0]
        if not found:
            continue
        i, right, wrong = min(found)
        at = off + i
        return EditCase(
            "", "operator", language, text[:at] + wrong + text[at + len(right) :], at, (at, at + len(wrong)), right
        )
    return None


def _off_by_one(text: str, lines: list[tuple[int, str]], language: str, rng: random.Random) -> EditCase | None:
    for off, line in rng.sample(lines, len(lines)):
        nums = [
            m for m in re.finditer(r"(?<![\w.])([0-9])(?![\w.])", line) if not line.lstrip().startswith(("#", "//"))
        ]
        if not nums:
            continue
        m = rng.choice(nums)
        right = m.group(1)
        wrong = str(int(right) + 1)
        at = off + m.start(1)
        return EditCase("", "off_by_one", language, text[:at] + wrong + text[at + 1 :], at, (at, at + 1), right)
    return None


MUTATIONS = {"rename": _rename, "typo": _typo, "operator": _operator, "off_by_one": _off_by_one}


def cut_cases(
    cases_file: Path = FIXTURES / "cases.json", per_file: int = 3, seed: int = 0, signatures: bool = True
) -> list[EditCase]:
    """Up to `per_file` faults of different kinds a fixture, and as many clean positions;
    with `signatures`, a changed signature a fixture too, and a clean next edit with it."""
    rng = random.Random(seed)
    out: list[EditCase] = []
    for spec in json.loads(cases_file.read_text(encoding="utf-8")):
        text = (cases_file.parent / spec["file"]).read_text(encoding="utf-8")
        lines = _region_lines(text, spec["region"]["start"], spec["region"]["end"])
        if not lines:
            continue
        kinds = rng.sample(KINDS, len(KINDS))
        faults = [c for k in kinds if (c := MUTATIONS[k](text, lines, spec["language"], rng)) is not None][:per_file]
        used = {text.count("\n", 0, c.at) for c in faults}
        clean = [(o, line) for o, line in lines if text.count("\n", 0, o) not in used]
        for c, (o, line) in zip(faults, rng.sample(clean, min(len(faults), len(clean))), strict=False):
            at = o + len(line) - len(line.lstrip())
            out.append(replace(c, name=f"{spec['name']}:{c.kind}"))
            out.append(EditCase(f"{spec['name']}:clean", "clean", c.language, text, at, (at, at), ""))
        literal = (
            _changed_literal(text, lines, spec["language"], rng) if any(c.kind == "rename" for c in faults) else None
        )
        if literal is not None:  # as many clean next edits as next edits
            out.append(replace(literal, name=f"{spec['name']}:clean_next"))
        if signatures:  # their own random draws: the cases above stay as they were without them
            side = random.Random(f"{seed}:{spec['name']}")
            changed = _signature(text, spec["language"], side)
            other = _changed_literal(text, lines, spec["language"], side) if changed is not None else None
            if changed is not None and other is not None:
                out.append(replace(changed, name=f"{spec['name']}:signature"))
                out.append(replace(other, name=f"{spec['name']}:clean_next"))
    return out


def _position(text: str, offset: int) -> dict[str, int]:
    line = text.count("\n", 0, offset)
    col = offset - (text.rfind("\n", 0, offset) + 1)
    return {"line": line, "character": len(text[offset - col : offset].encode("utf-16-le")) // 2}


def _offset(text: str, pos: dict[str, int]) -> int:
    lines = text.split("\n")
    row = min(int(pos["line"]), len(lines) - 1)
    start = sum(len(s) + 1 for s in lines[:row])
    units, i, line = int(pos["character"]), 0, lines[row]
    while i < len(line) and units > 0:
        units -= 2 if ord(line[i]) > 0xFFFF else 1
        i += 1
    return start + i


def applied(text: str, edits: list[dict[str, Any]]) -> str:
    """`text` with the answer's edits applied, last first."""
    spans = sorted((_offset(text, e["range"]["start"]), _offset(text, e["range"]["end"]), e["text"]) for e in edits)
    for a, b, new in reversed(spans):
        text = text[:a] + new + text[b:]
    return text


def judge(case: EditCase, edits: list[dict[str, Any]]) -> dict[str, Any]:
    """What an answer did at a case: changed anything, fixed it, at the right place, and how
    many characters it replaced."""
    after = applied(case.text, edits)
    changed = after != case.text
    a, b = case.span
    want = case.text[:a] + case.fixed + case.text[b:]
    ranges = [(_offset(case.text, e["range"]["start"]), _offset(case.text, e["range"]["end"])) for e in edits]
    replaced = max((e - s for s, e in ranges), default=0)  # the widest edit of the answer
    fixes = case.fixes or ((a, b, case.fixed),)
    made = {(s, e, edit["text"]) for (s, e), edit in zip(ranges, edits, strict=True)}
    # a next edit is right when each of its edits is one the developer's edit implies
    right = after == want if not case.fixes else bool(made) and made <= set(fixes)
    return {
        "changed": changed,
        "right_edit": case.kind not in CLEAN and right,
        # an edit that covers or touches a fault (an operator's span holds its blanks, the edit may not)
        "right_place": case.kind not in CLEAN and any(s <= f[1] and f[0] <= e for s, e in ranges for f in fixes),
        "replaced_chars": replaced,
        "fault_chars": max(f[1] - f[0] for f in fixes),  # the widest fix
    }


async def _ask(settings: dict[str, Any], cases: list[EditCase], timeout_s: float) -> list[dict[str, Any]]:
    """Each case asked in turn through one server; an answer later than `timeout_s` counts
    as none, and the server is started again (its one worker would still be busy with it)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from lsp_bench import start_server  # noqa: E402 (bench/ on the path)

    client = await start_server(settings)
    rows = []
    try:
        for n, case in enumerate(cases):
            uri = f"file:///work/edits/{n}.{ {'python': 'py', 'javascript': 'js', 'go': 'go'}[case.language] }"
            client.text_document_did_open(_did_open(uri, case.language, case.before or case.text))
            version = 1
            if case.before is not None:  # the developer's edit, which the server sees as it comes
                version = 2
                client.text_document_did_change(_did_change(uri, version, case.text))
            params = {"textDocument": {"uri": uri, "version": version}, "position": _position(case.text, case.at)}
            t = time.perf_counter()
            asked = asyncio.ensure_future(client.protocol.send_request_async("diffusion/inlineEdit", params))
            done, _ = await asyncio.wait({asked}, timeout=timeout_s)
            edits: list[dict[str, Any]] = []
            error = None
            ms = (time.perf_counter() - t) * 1000
            if not done:
                error = f"no answer in {timeout_s:g} s"
                asked.add_done_callback(lambda f: f.cancelled() or f.exception())  # its end is expected
                await _stop(client)
                client = await start_server(settings)
            elif asked.exception() is not None:
                error = f"{type(asked.exception()).__name__}: {asked.exception()}"[:200]
            else:
                edits = [_plain(e) for e in (_field(asked.result(), "edits") or [])]
            rows.append(
                {"name": case.name, "kind": case.kind, "ms": round(ms, 1), "error": error, **judge(case, edits)}
            )
            print(f"{case.name}: {rows[-1]}", file=sys.stderr)
    finally:
        await _stop(client)
    return rows


async def _stop(client: Any) -> None:
    """End the server: politely, else by killing it (a fill may hold its one worker)."""
    try:
        await asyncio.wait_for(client.shutdown_session(), 10)
    except Exception:  # a server busy past the wait, or already gone
        proc = getattr(client, "_server", None)
        if proc is not None and proc.returncode is None:
            proc.kill()


def _did_open(uri: str, language: str, text: str) -> Any:
    from lsprotocol import types

    return types.DidOpenTextDocumentParams(types.TextDocumentItem(uri=uri, language_id=language, version=1, text=text))


def _did_change(uri: str, version: int, text: str) -> Any:
    from lsprotocol import types

    whole = types.TextDocumentContentChangeWholeDocument(text=text)
    return types.DidChangeTextDocumentParams(types.VersionedTextDocumentIdentifier(version=version, uri=uri), [whole])


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def _plain(edit: Any) -> dict[str, Any]:
    """An edit as plain JSON (the client may hand back attribute objects)."""
    rng = _field(edit, "range")

    def pos(p: Any) -> dict[str, int]:
        return {"line": int(_field(p, "line")), "character": int(_field(p, "character"))}

    return {
        "range": {"start": pos(_field(rng, "start")), "end": pos(_field(rng, "end"))},
        "text": str(_field(edit, "text")),
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind and in total: the right edit and the right place at faults, false edits at
    clean positions, answers that replaced more than the fault's span, latency p50."""

    def of(group: list[dict[str, Any]]) -> dict[str, Any]:
        faults = [r for r in group if r["kind"] not in CLEAN]
        clean = [r for r in group if r["kind"] in CLEAN]
        share = lambda k, rs: round(sum(bool(r[k]) for r in rs) / len(rs), 4) if rs else None  # noqa: E731
        return {
            "faults": len(faults),
            "right_edit": share("right_edit", faults),
            "right_place": share("right_place", faults),
            "clean": len(clean),
            "false_edits": share("changed", clean),
            "wider_than_the_fault": sum(
                r["changed"] and r["replaced_chars"] > max(r["fault_chars"], 1) * 4 for r in group
            ),
            "errors": sum(r["error"] is not None for r in group),
            "p50_ms": round(statistics.median(r["ms"] for r in group), 1) if group else None,
        }

    kinds = {k: of([r for r in rows if r["kind"] == k]) for k in (*KINDS, "signature", *CLEAN)}
    return {"total": of(rows), "by_kind": kinds}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, help="model directory (the server's model setting)")
    p.add_argument("--settings", type=json.loads, default={}, help="diffusionLsp settings (JSON)")
    p.add_argument("--per-file", type=int, default=3, help="faults cut from each fixture")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-signatures", action="store_true", help="leave out the changed-signature cases")
    p.add_argument("--timeout-s", type=float, default=60.0, help="an answer later than this counts as none")
    p.add_argument("--llama", type=Path, help="a GGUF: ask through llama.cpp's server (dialect llama-infill) instead")
    args = p.parse_args()
    settings = {**({"model": str(args.model)} if args.model else {}), **args.settings}
    cases = cut_cases(per_file=args.per_file, seed=args.seed, signatures=not args.no_signatures)
    if args.llama:
        sys.path.insert(0, str(ROOT))
        from tests.real_engine import llama_server  # noqa: E402 (the repository on the path)

        with llama_server(args.llama, threads=2, ctx=4096) as engine:
            remote = {**settings, "endpoint": engine.url, "dialect": "llama-infill"}
            rows = asyncio.run(_ask(remote, cases, args.timeout_s))
    else:
        rows = asyncio.run(_ask(settings, cases, args.timeout_s))
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "model": str(args.llama or args.model) if args.llama or args.model else None,
        "engine": "llama.cpp server, llama-infill" if args.llama else "local",
        "settings": args.settings,
        "cases": len(cases),
        **summary(rows),
        "rows": rows,
        "case_specs": [{k: v for k, v in asdict(c).items() if k not in ("text", "before")} for c in cases],
    }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
