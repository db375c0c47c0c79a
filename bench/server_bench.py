"""Server benchmark: request to response over stdio on CPU, with the shipped model or the
one `--model` names (e.g. an export of Qwen2.5-Coder-0.5B: `diffusion-infill export-onnx`).
Prints JSON; never asserted in tests.

    python bench/server_bench.py [--repeats N] [--model DIR] [--context-tokens N] [--deadline-ms N] [--llama GGUF]

`--llama GGUF`: then the same scenarios, at the same positions, through the same server
with llama.cpp's server (xllamacpp, the dev extra, 2 threads) serving the GGUF as its
remote engine (dialect llama-infill), and the ratios of the two in one run.

Scenarios, at N cursor positions (line ends) in a large held-out file, 1,024-token
context (contextTokens setting):
  first_completion_s   process start to the first inline completion answered
  cold     a new cursor position (fresh context)
  warm     the same position after one typed character that does not match the
           suggestion (cache reused, the fill denoised again)
  type_through         one typed character that matches the suggestion (no model call)
and the server's peak RSS (VmHWM), and how many answers of each scenario were empty (a
fill cut to nothing by the deadline shows here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import sysconfig
import time
from pathlib import Path

from lsp_bench import peak_rss_mb, start_server
from lsprotocol import types

URI = "file:///bench/big.py"


def source() -> str:
    path = Path(sysconfig.get_paths()["stdlib"]) / "email" / "_header_value_parser.py"
    return path.read_text(encoding="utf-8")


def p50(xs: list[float]) -> float:
    return round(statistics.median(xs), 2)


def p95(xs: list[float]) -> float:
    return round(sorted(xs)[int(0.95 * (len(xs) - 1))], 2)


async def run(
    repeats: int,
    model: str | None = None,
    context_tokens: int = 1024,
    remote: dict[str, object] | None = None,
    deadline_ms: int | None = None,
) -> dict[str, object]:
    text = source()
    lines = text.split("\n")
    settings: dict[str, object] = {"contextTokens": context_tokens}
    if deadline_ms:
        settings["deadlineMs"] = deadline_ms
    if model:
        settings["model"] = model
    settings.update(remote or {})
    t0 = time.perf_counter()
    client = await start_server(settings)
    version = 1
    client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(URI, "python", version, text)))

    async def ask(line: int, col: int) -> types.InlineCompletionList | None:
        return await client.text_document_inline_completion_async(
            types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(URI),
                position=types.Position(line, col),
                context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
            )
        )

    def type_char(line: int, col: int, ch: str) -> None:
        nonlocal version
        version += 1
        pos = types.Position(line, col)
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                types.VersionedTextDocumentIdentifier(version=version, uri=URI),
                [types.TextDocumentContentChangePartial(range=types.Range(pos, pos), text=ch)],
            )
        )

    def undo(line: int, col: int) -> None:
        nonlocal version
        version += 1
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                types.VersionedTextDocumentIdentifier(version=version, uri=URI),
                [
                    types.TextDocumentContentChangePartial(
                        range=types.Range(types.Position(line, col), types.Position(line, col + 1)), text=""
                    )
                ],
            )
        )

    first_line = len(lines) // 3
    await ask(first_line, len(lines[first_line]))
    first_s = time.perf_counter() - t0
    cold, warm, through = [], [], []
    empty = {"cold": 0, "warm": 0}
    step = max(1, (len(lines) - first_line - 10) // repeats)
    for i in range(repeats):
        line = first_line + 5 + i * step
        col = len(lines[line])
        t = time.perf_counter()
        shown = await ask(line, col)
        cold.append((time.perf_counter() - t) * 1000)
        suggestion = str(shown.items[0].insert_text) if shown and shown.items else ""
        empty["cold"] += not suggestion
        if suggestion and suggestion[0] not in "\r\n":  # type its first character: answered from it
            type_char(line, col, suggestion[0])
            t = time.perf_counter()
            await ask(line, col + 1)
            through.append((time.perf_counter() - t) * 1000)
            undo(line, col)
        other = "#" if not suggestion.startswith("#") else "@"  # a character that does not match
        type_char(line, col, other)
        t = time.perf_counter()
        again = await ask(line, col + 1)
        warm.append((time.perf_counter() - t) * 1000)
        empty["warm"] += not (again and again.items and str(again.items[0].insert_text))
        undo(line, col)
    stats = await client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
    rss_mb = peak_rss_mb(client)
    await client.shutdown_session()
    return {
        "first_completion_s": round(first_s, 2),
        "cold": {"p50_ms": p50(cold), "p95_ms": p95(cold), "n": len(cold)},
        "warm": {"p50_ms": p50(warm), "p95_ms": p95(warm), "n": len(warm)},
        "type_through": {"p50_ms": p50(through), "p95_ms": p95(through), "n": len(through)} if through else None,
        "server_peak_rss_mb": rss_mb,
        "engine_calls": stats["engine_calls"],
        "file_lines": len(lines),
        "context_tokens": context_tokens,
        "empty_answers": empty,
        "deadline_ms": deadline_ms or "the default",
        "model": (remote or {}).get("endpoint") or model or "shipped",
    }


def llama(args: argparse.Namespace) -> dict[str, object]:
    """The same scenarios with llama.cpp's server as the remote engine."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.real_engine import llama_server

    with llama_server(args.llama, threads=2, ctx=4096) as engine:
        remote = {"endpoint": engine.url, "dialect": "llama-infill"}
        return asyncio.run(run(args.repeats, None, args.context_tokens, remote, args.deadline_ms))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--model", help="model directory (the server's model setting; default: the shipped model)")
    p.add_argument("--context-tokens", type=int, default=1024)
    p.add_argument("--llama", type=Path, help="a GGUF to serve with llama.cpp beside, for the ratios")
    p.add_argument("--deadline-ms", type=int, help="the server's deadlineMs (default: the setting's default)")
    args = p.parse_args()
    report = asyncio.run(run(args.repeats, args.model, args.context_tokens, None, args.deadline_ms))
    if args.llama:
        report = {"ours": report, "llama_cpp": llama(args), "when": time.strftime("%Y-%m-%d")}
        for kind in ("cold", "warm"):
            report[f"{kind}_p50_ratio_ours_to_llama_cpp"] = round(
                report["ours"][kind]["p50_ms"] / max(report["llama_cpp"][kind]["p50_ms"], 1e-9), 2
            )
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
