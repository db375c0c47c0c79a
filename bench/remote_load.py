"""Load test of the remote backend on the loopback interface: N simulated editors type
against one engine, each through its own diffusion-lsp server (stdio, the real server
with `endpoint` set, vLLM dialect). Prints JSON; never asserted in tests.

    python bench/remote_load.py [--editors 8] [--keystrokes 40] [--compute-ms 120]
    python bench/remote_load.py --engine llama [--editors 8] [--keystrokes 40]

The engine stands for one GPU: a loopback HTTP server (OpenAI completions, as vLLM)
that computes one request at a time for `compute-ms`, in 5 ms slices, and aborts a
request whose client closed the connection (as vLLM aborts a request on disconnect),
whether it was still waiting for the GPU or being computed. Its answer names the
prompt it was computed for (a hash of the prompt's last characters), so each editor
checks that an answer belongs to its own request and position.

Each editor opens a Python file, then types a comment one character at a time (every
`--pace-ms`, with jitter), sending didChange and an Automatic inline completion request
per keystroke (as VS Code and Neovim do while typing), never waiting for answers; then
it stops and waits for the last answer. Reported:

  latency_ms          request sent to non-empty answer, p50 and p95 (all requests answered
                      with a suggestion)
  last_answer_ms      after each editor's final keystroke, until its suggestion: p50, p95
  engine              requests received, computed in full, aborted while queued, aborted
                      while computing, GPU milliseconds spent on requests whose client had
                      already gone (at most one slice each when cancellation works)
  computed_after_cancel  requests the engine computed in full although they had been
                      superseded more than 25 ms before it finished (the cancel never
                      reached it): the goal is none
  answer_crossed_cancel  computed in full, superseded while the answer was on its way
  misplaced           answers shown for another request's text: must be 0
  lost                editors whose final request got no suggestion: must be 0

`--engine llama` puts a real engine in the GPU's place: llama.cpp's server (xllamacpp,
tests/real_engine.py) with one slot, on a GGUF written for the run (`--width`, `--layers`
set the time a token costs), spoken to in the `llama-infill` dialect. Its fills never end
by themselves, so each costs the span's whole budget (32 tokens for this line), and its
own counters say what it computed: `engine` then holds the requests the servers sent, the
prompts evaluated and the tokens decoded, and `tokens_for_superseded` the tokens decoded
beyond the fills that were shown (work for requests whose client had gone). Its text does
not depend on the prompt, so `misplaced` cannot be checked (null).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lsprotocol import types
from pytest_lsp import client_capabilities
from pytest_lsp.client import make_test_lsp_client

SLICE_S = 0.005
CANCEL_SLACK_S = 0.025  # a cancel takes the server's hop and one engine slice to land
HEAD = '"""A file being written."""\n\n\ndef total(items):\n    '
TYPED = "add up the prices of every item in the basket and return it"


def tag(prompt_prefix: str) -> str:
    """What the engine writes for a prompt: names its last 200 characters (all of this
    test's short file before the cursor)."""
    return "~" + hashlib.sha1(prompt_prefix[-200:].encode()).hexdigest()[:8]


@dataclass
class EngineStats:
    received: int = 0
    completed: int = 0
    aborted_queued: int = 0
    aborted_computing: int = 0
    ms_after_disconnect: float = 0.0
    completed_at: dict[str, float] = field(default_factory=dict)  # tag -> when computed


def gone(sock: socket.socket) -> bool:
    """The client closed its side (a readable socket with nothing to read)."""
    try:
        ready, _, _ = select.select([sock], [], [], 0)
        return bool(ready) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def start_engine(compute_s: float) -> tuple[ThreadingHTTPServer, EngineStats]:
    stats = EngineStats()
    gpu = threading.Lock()
    count = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's server

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            with count:
                stats.received += 1
            prompt = body.get("prompt", "")
            prefix = prompt.split("<|fim_prefix|>")[-1].split("<|fim_middle|>")[0]
            while not gpu.acquire(timeout=SLICE_S):  # waiting for the GPU
                if gone(self.connection):
                    with count:
                        stats.aborted_queued += 1
                    self.close_connection = True
                    return
            try:
                spent, t_gone = 0.0, None
                while spent < compute_s:
                    if gone(self.connection):
                        t_gone = t_gone or time.perf_counter()
                        with count:
                            stats.aborted_computing += 1
                            stats.ms_after_disconnect += SLICE_S * 1000  # the slice it noticed in
                        self.close_connection = True
                        return
                    time.sleep(SLICE_S)
                    spent += SLICE_S
            finally:
                gpu.release()
            text = tag(prefix)
            with count:
                stats.completed += 1
                stats.completed_at[text] = time.perf_counter()
            if body.get("stream"):
                events = [{"choices": [{"index": 0, "text": text, "finish_reason": "stop"}]}]
                data = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
                ctype = "text/event-stream"
            else:
                data = json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": "stop"}]}).encode()
                ctype = "application/json"
            try:
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                self.close_connection = True

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, stats


@dataclass
class Sent:
    version: int
    prefix: str
    at: float
    answered_at: float | None = None
    superseded_at: float | None = None  # the next keystroke was sent
    text: str | None = None


async def editor(i: int, url: str, keystrokes: int, pace_s: float, seed: int, dialect: str = "vllm") -> dict[str, Any]:
    rng = random.Random(seed + i)
    uri = f"file:///load/editor{i}.py"
    client = make_test_lsp_client()
    await client.start_io(sys.executable, "-m", "lsp_server")
    caps = client_capabilities("visual_studio_code")
    assert caps.text_document is not None
    caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    options = {"diffusionLsp": {"endpoint": url, "dialect": dialect, "remoteModel": "load-test", "drafts": False}}
    await client.initialize_session(types.InitializeParams(capabilities=caps, initialization_options=options))
    version = 1
    text = HEAD
    client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "python", version, text)))
    line = text.count("\n")
    sent: list[Sent] = []
    pending: list[asyncio.Task[None]] = []

    async def ask(s: Sent, col: int) -> None:
        result = await client.text_document_inline_completion_async(
            types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(uri),
                position=types.Position(line, col),
                context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
            )
        )
        s.answered_at = time.perf_counter()
        if result is not None and result.items:
            item = result.items[0].insert_text
            s.text = item if isinstance(item, str) else item.value

    for k in range(keystrokes):
        typed = f"# editor {i}: {TYPED}"  # each editor's own text: prompts (and tags) never collide
        ch = typed[k % len(typed)]
        col = len(text) - text.rfind("\n") - 1
        version += 1
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                types.VersionedTextDocumentIdentifier(version=version, uri=uri),
                [
                    types.TextDocumentContentChangePartial(
                        range=types.Range(types.Position(line, col), types.Position(line, col)), text=ch
                    )
                ],
            )
        )
        text += ch
        now = time.perf_counter()
        if sent:
            sent[-1].superseded_at = now
        s = Sent(version, text, now)
        sent.append(s)
        pending.append(asyncio.ensure_future(ask(s, col + 1)))
        await asyncio.sleep(pace_s * rng.uniform(0.5, 1.5))
    await asyncio.gather(*pending)
    calls = await client.workspace_execute_command_async(types.ExecuteCommandParams("diffusion.stats"))
    await client.shutdown_session()
    shown = [s for s in sent if s.text is not None]
    return {
        "sent": len(sent),
        "latency_ms": [(s.answered_at - s.at) * 1000 for s in shown if s.answered_at is not None],
        "shown_tags": [s.text for s in shown],
        "superseded_at": {tag(s.prefix): s.superseded_at for s in sent if s.superseded_at is not None},
        # a suggestion for another request's text (its prompt ended differently)
        "misplaced": sum(not (s.text or "").startswith(tag(s.prefix)) for s in shown),
        "last_ms": (sent[-1].answered_at - sent[-1].at) * 1000 if sent[-1].text and sent[-1].answered_at else None,
        "lost": sent[-1].text is None,
        "engine_calls": calls["engine_calls"] if isinstance(calls, dict) else None,
    }


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    return round(sorted(xs)[int(q * (len(xs) - 1))], 1)


async def llama_load(args: argparse.Namespace) -> dict[str, Any]:
    """The load test against llama.cpp's server (see the module's docstring)."""
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.real_engine import llama_server, write_gguf

    with tempfile.TemporaryDirectory() as tmp:
        model = write_gguf(Path(tmp) / "load.gguf", width=args.width, layers=args.layers)
        with llama_server(model, slots=1, threads=args.threads) as engine:
            before = engine.metrics()
            t0 = time.perf_counter()
            results = await asyncio.wait_for(
                asyncio.gather(
                    *(
                        editor(i, engine.url, args.keystrokes, args.pace_ms / 1000, args.seed, "llama-infill")
                        for i in range(args.editors)
                    )
                ),
                timeout=args.timeout_s,
            )
            wall = time.perf_counter() - t0
            after = engine.wait_idle()
    delta = {k: after[k] - before[k] for k in ("prompt_tokens_total", "tokens_predicted_total")}
    latency = [x for r in results for x in r["latency_ms"]]
    last = [r["last_ms"] for r in results if r["last_ms"] is not None]
    shown = sum(len(r["shown_tags"]) for r in results)
    budget = 32  # the span's budget at the typing cursor (a one-line comment)
    return {
        "benchmark": "remote_load",
        "engine_kind": "llama.cpp server (xllamacpp), 1 slot",
        "model": {"width": args.width, "layers": args.layers, "threads": args.threads},
        "editors": args.editors,
        "keystrokes_per_editor": args.keystrokes,
        "pace_ms": args.pace_ms,
        "wall_s": round(wall, 1),
        "requests_sent": sum(r["sent"] for r in results),
        "suggestions_shown": shown,
        "latency_ms": {"p50": pct(latency, 0.5), "p95": pct(latency, 0.95)},
        "last_answer_ms": {"p50": pct(last, 0.5), "p95": pct(last, 0.95)},
        "engine": {
            "requests_from_servers": sum(r["engine_calls"] or 0 for r in results),
            "prompt_tokens": delta["prompt_tokens_total"],
            "tokens_decoded": delta["tokens_predicted_total"],
        },
        "tokens_for_superseded": delta["tokens_predicted_total"] - shown * budget,
        "misplaced": None,
        "lost": sum(r["lost"] for r in results),
        "python": sys.version.split()[0],
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    if args.engine == "llama":
        return await llama_load(args)
    server, stats = start_engine(args.compute_ms / 1000)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    t0 = time.perf_counter()
    results = await asyncio.wait_for(
        asyncio.gather(*(editor(i, url, args.keystrokes, args.pace_ms / 1000, args.seed) for i in range(args.editors))),
        timeout=args.timeout_s,
    )
    wall = time.perf_counter() - t0
    server.shutdown()
    latency = [x for r in results for x in r["latency_ms"]]
    last = [r["last_ms"] for r in results if r["last_ms"] is not None]
    shown = [t for r in results for t in r["shown_tags"]]
    superseded = {k: v for r in results for k, v in r["superseded_at"].items()}
    # computed in full although the request had been superseded well before the engine
    # finished (the cancel did not reach it), against those whose answer crossed the cancel
    late = [stats.completed_at[k] - superseded[k] for k in stats.completed_at if k in superseded]
    after_cancel = sum(d > CANCEL_SLACK_S for d in late)
    return {
        "benchmark": "remote_load",
        "editors": args.editors,
        "keystrokes_per_editor": args.keystrokes,
        "pace_ms": args.pace_ms,
        "compute_ms": args.compute_ms,
        "wall_s": round(wall, 1),
        "requests_sent": sum(r["sent"] for r in results),
        "suggestions_shown": len(shown),
        "dropped_by_the_server": sum(r["sent"] for r in results) - stats.received,  # superseded before sending
        "latency_ms": {"p50": pct(latency, 0.5), "p95": pct(latency, 0.95)},
        "last_answer_ms": {"p50": pct(last, 0.5), "p95": pct(last, 0.95)},
        "engine": {
            "received": stats.received,
            "completed": stats.completed,
            "aborted_queued": stats.aborted_queued,
            "aborted_computing": stats.aborted_computing,
            "gpu_ms_after_disconnect": round(stats.ms_after_disconnect, 1),
            "gpu_busy_share": round(stats.completed * args.compute_ms / 1000 / wall, 2),
        },
        "computed_after_cancel": after_cancel,
        "after_cancel_ms": sorted(round(d * 1000, 1) for d in late if d > CANCEL_SLACK_S),
        "answer_crossed_cancel": len(late) - after_cancel,
        "misplaced": sum(r["misplaced"] for r in results),
        "lost": sum(r["lost"] for r in results),
        "python": sys.version.split()[0],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--editors", type=int, default=8)
    p.add_argument("--keystrokes", type=int, default=40)
    p.add_argument("--pace-ms", type=float, default=120.0, help="mean time between keystrokes")
    p.add_argument("--compute-ms", type=float, default=120.0, help="engine time per fill (one at a time)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="the whole test's bound")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--engine", choices=("fake", "llama"), default="fake", help="the scripted GPU, or llama.cpp's server"
    )
    p.add_argument("--width", type=int, default=512, help="llama: the test model's width")
    p.add_argument("--layers", type=int, default=4, help="llama: the test model's layers")
    p.add_argument("--threads", type=int, default=1, help="llama: the engine's threads")
    args = p.parse_args()
    print(json.dumps(asyncio.run(main_async(args)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
