"""Idle-time encoding of repository context (issue 43; docs/server.md, Repository context):
what the first keystroke after a pause costs when the pause chose a new block, with the
block encoded in the pause (`encodeWhenIdle` on) and by that keystroke's fill (off), and
without repository context at all.

A developer works through places in a project's files, through `diffusion-lsp` over stdio
with the project as its workspace folder: at each place (a line of code, its text after the
indentation removed), they type its first KEYS characters, a suggestion asked for after each
(Automatic, answered in full before the next key: the suggestion dismissed first, so that
the engine answers, not type-through), then pause for `--pause-s` seconds (reading), then
type one more character. The server chooses the repository context again at each pause, at
the last request's place: in a file that imports much of the project, a new block at most
pauses. Reported per mode (JSON): latency p50/p95 of the key after the pause, of the first
key at a new place, of the other keys; the blocks encoded ahead (`diffusion.stats`
`encoded_ahead`: done, stopped). Fills run to their end (`deadlineMs` 30000), so that the
times are what the fills cost. Never asserted in tests.

    python bench/idle_encoding.py --model .weights-cache/qwen2.5-coder-0.5b-int8 --workspace DIR \\
        --files lsp_server/service.py,lsp_server/actions.py,engine/local/generator.py
    python bench/idle_encoding.py --model .weights-cache/qwen2.5-coder-0.5b-int8 --part-cost 1000

`--part-cost TOKENS`: in-process, a context of TOKENS tokens encoded whole (as a fill
encodes it) and in the warm's parts, and how long one part takes (what a keystroke that
comes during a warm waits at most).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KEYS = 4  # characters typed at a place before the pause
MIN_CHARS = 12  # a place is a line with at least this much code after its indentation
MODES = {
    "none": {"repositoryContext": False},
    "encoded_by_the_keystroke": {"repositoryContext": True, "encodeWhenIdle": False},
    "encoded_when_idle": {"repositoryContext": True, "encodeWhenIdle": True},
}


def places(text: str, count: int) -> list[tuple[int, int]]:
    """(line, column) of `count` lines of code spread evenly over `text` (column: after the
    indentation), each with MIN_CHARS of code at least."""
    lines = text.split("\n")
    good = [
        (i, len(line) - len(line.lstrip()))
        for i, line in enumerate(lines)
        if len(line.strip()) >= MIN_CHARS and not line.lstrip().startswith(("#", '"', "'", "from ", "import "))
    ]
    if len(good) <= count:
        return good
    step = len(good) / count
    return [good[int(k * step + step / 2)] for k in range(count)]


def cut(text: str, line: int, col: int, typed: int) -> str:
    """`text` with the rest of `line` after `col` + `typed` characters removed."""
    lines = text.split("\n")
    lines[line] = lines[line][: col + typed]
    return "\n".join(lines)


async def _run(
    settings: dict[str, Any], workspace: Path, files: list[str], count: int, pause_s: float
) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "bench"))
    from lsp_bench import start_server  # noqa: E402 (bench/ on the path)
    from lsprotocol import types

    client = await start_server(settings, [workspace])
    times: dict[str, list[float]] = {"after_pause": [], "first_key": [], "other_keys": []}
    try:
        for name in files:
            path = (workspace / name).resolve()
            text = path.read_text(encoding="utf-8")
            uri = path.as_uri()
            version = 1
            opened = False
            for line, col in places(text, count):
                for k in range(KEYS + 1):
                    doc = cut(text, line, col, k + 1)
                    version += 1
                    if not opened:
                        item = types.TextDocumentItem(uri=uri, language_id="python", version=version, text=doc)
                        client.text_document_did_open(types.DidOpenTextDocumentParams(item))
                        opened = True
                    else:
                        await client.workspace_execute_command_async(
                            types.ExecuteCommandParams("diffusion.dismiss", [uri])
                        )
                        change = types.TextDocumentContentChangeWholeDocument(text=doc)
                        client.text_document_did_change(
                            types.DidChangeTextDocumentParams(
                                types.VersionedTextDocumentIdentifier(version=version, uri=uri), [change]
                            )
                        )
                    t = time.perf_counter()
                    await _ask(client, uri, line, col + k + 1)
                    ms = (time.perf_counter() - t) * 1000
                    times["after_pause" if k == KEYS else "first_key" if k == 0 else "other_keys"].append(ms)
                    if k == KEYS - 1:
                        await asyncio.sleep(pause_s)
                print(f"{name}:{line + 1}: after the pause {times['after_pause'][-1]:.0f} ms", file=sys.stderr)
            client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri)))
        stats = await client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
    finally:
        await client.shutdown_session()
    out: dict[str, Any] = {}
    for key, values in times.items():
        ordered = sorted(values)
        out[key] = {
            "n": len(values),
            "p50_ms": round(statistics.median(values), 1),
            "p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 1),
        }
    out["encoded_ahead"] = (stats or {}).get("encoded_ahead")
    out["after_pause_ms"] = [round(v, 1) for v in times["after_pause"]]
    return out


async def _ask(client: Any, uri: str, line: int, col: int) -> Any:
    from lsprotocol import types

    params = types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri),
        position=types.Position(line, col),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
    )
    return await client.text_document_inline_completion_async(params)


def part_cost(model: Path, tokens: int, runs: int) -> dict[str, Any]:
    """In-process: encoding a context of `tokens` tokens (this file's text, one layout's
    sequence) whole, as a fill does (engine.denoisers.kv ENCODE_CHUNK a pass), and in
    WARM_CHUNK parts, as a warm does, the cancel flag looked at between parts; medians of
    `runs`, and the longest a fill that comes meanwhile waits (one part)."""
    from engine.denoisers.loading import load_model
    from engine.fill import FillOptions, InfillRequest
    from engine.local.generator import WARM_CHUNK, local_engine

    loaded = load_model(model)
    text = Path(__file__).read_text(encoding="utf-8")
    ids = loaded.tokenizer.encode(text)[:tokens]
    prefix = loaded.tokenizer.decode(ids)
    req = InfillRequest(prefix=prefix, suffix="\n")
    opts = FillOptions(canvas_tokens=1, context_tokens=tokens + 16, middle_priming=False)
    whole, parts, part = [], [], []
    for _ in range(runs):
        engine = local_engine(loaded, opts)
        whole.append(engine.fill(req).encode_ms / 1000)
        engine = local_engine(loaded, opts)
        looks: list[float] = []

        def look(looks: list[float] = looks) -> bool:
            looks.append(time.perf_counter())
            return False

        t = time.perf_counter()
        engine.warm(req, cancel=look)
        parts.append(time.perf_counter() - t)
        part += [b - a for a, b in zip(looks, looks[1:], strict=False)]
    return {
        "tokens": len(ids),
        "part_tokens": WARM_CHUNK,
        "whole_s_p50": round(statistics.median(whole), 3),
        "in_parts_s_p50": round(statistics.median(parts), 3),
        "one_part_s_p50": round(statistics.median(part), 3),
        "one_part_s_max": round(max(part), 3),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True, help="model directory (the server's model setting)")
    p.add_argument("--workspace", type=Path, default=ROOT, help="the project (its workspace folder)")
    p.add_argument("--files", default="lsp_server/service.py", help="files of the project, comma-separated")
    p.add_argument("--places", type=int, default=5, help="places per file")
    p.add_argument("--pause-s", type=float, default=10.0, help="the pause before the last key")
    p.add_argument("--modes", default=",".join(MODES), help="of " + ", ".join(MODES))
    p.add_argument("--settings", type=json.loads, default={}, help="more diffusionLsp settings (JSON)")
    p.add_argument("--part-cost", type=int, metavar="TOKENS", help="measure encoding whole and in parts instead")
    p.add_argument("--runs", type=int, default=3, help="runs of --part-cost")
    args = p.parse_args()
    if args.part_cost:
        cost = {"when": time.strftime("%Y-%m-%d %H:%M"), "model": str(args.model)}
        json.dump({**cost, **part_cost(args.model, args.part_cost, args.runs)}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    files = args.files.split(",")
    report: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "model": str(args.model),
        "workspace": str(args.workspace),
        "files": files,
        "places_per_file": args.places,
        "keys_before_pause": KEYS,
        "pause_s": args.pause_s,
        "settings": args.settings,
    }
    base = {"model": str(args.model), "deadlineMs": 30000, **args.settings}
    for mode in args.modes.split(","):
        report[mode] = asyncio.run(_run({**base, **MODES[mode]}, args.workspace, files, args.places, args.pause_s))
    if "encoded_when_idle" in report and "encoded_by_the_keystroke" in report:
        on, off = report["encoded_when_idle"], report["encoded_by_the_keystroke"]
        report["after_pause_ratio"] = round(on["after_pause"]["p50_ms"] / off["after_pause"]["p50_ms"], 3)
    if "encoded_when_idle" in report and "none" in report:
        on, none = report["encoded_when_idle"], report["none"]
        report["after_pause_ratio_to_none"] = round(on["after_pause"]["p50_ms"] / none["after_pause"]["p50_ms"], 3)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
