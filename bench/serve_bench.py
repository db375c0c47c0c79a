"""Fill server benchmark: throughput at 1, 4 and 16 concurrent clients against the same
fills one at a time without the server, in one run. Prints JSON; never asserted in tests.

    python bench/serve_bench.py [--model DIR] [--requests N] [--repeats R] [--clients 1 4 16] [--out FILE]

The server is the real command (`diffusion-infill serve --port 0`, a subprocess, with a
queue long enough that no request is refused). The workload is N cursor positions (line
ends) in held-out code (the standard library's email/_header_value_parser.py), each a
fill of the rest of its line's span (`language: python`), sent as OpenAI completions
with prompt and suffix. Every scenario runs the same N requests once before timing, so
the engine's context cache is warm in all of them.

Scenarios:
  one_at_a_time   the engine in this process (fill_server.filling.run_fill, the same
                  mapping of the request), one fill after another, no HTTP: the baseline
  clients_C       C client threads (keep-alive httpx connections) share the N requests
For each: wall seconds for the N fills, fills/s, generated tokens/s, and per-request
latency p50/p95 (medians over R repeats), and the ratio of fills/s to the baseline's.
The server runs one fill at a time (fill_server/scheduler.py): more clients cannot raise
throughput above the baseline's, only queue; the figures say what HTTP costs and how
latency grows with the queue. `sgemm_gflops` (numpy, timed in the same run) places the
machine: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import re
import statistics
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONTEXT_CHARS = 3000  # characters of code before the cursor sent (about 1,000 tokens after the suffix's share)
SUFFIX_CHARS = 1000


def positions(n: int) -> list[dict[str, Any]]:
    """N request bodies: cursor at line ends spread over a held-out file."""
    text = (Path(sysconfig.get_paths()["stdlib"]) / "email" / "_header_value_parser.py").read_text(encoding="utf-8")
    ends = [m.start() for m in re.finditer(r"\n", text) if m.start() > CONTEXT_CHARS]
    picks = [ends[i * len(ends) // n] for i in range(n)]
    return [
        {
            "prompt": text[max(0, at - CONTEXT_CHARS) : at],
            "suffix": text[at : at + SUFFIX_CHARS],
            "language": "python",
            "model": "bench",
        }
        for at in picks
    ]


def sgemm_gflops() -> float:
    a = np.random.default_rng(0).standard_normal((512, 512), dtype=np.float32)
    a @ a
    t0 = time.perf_counter()
    for _ in range(20):
        a @ a
    return round(20 * 2 * 512**3 / (time.perf_counter() - t0) / 1e9, 1)


def one_at_a_time(engine: Any, bodies: list[dict[str, Any]]) -> dict[str, float]:
    from engine.fill import FillControl
    from fill_server.filling import run_fill
    from fill_server.schema import fill_ask

    asks = [fill_ask(b, "completions") for b in bodies]
    latencies, tokens = [], 0
    t0 = time.perf_counter()
    for ask in asks:
        s = time.perf_counter()
        tokens += run_fill(engine, ask, FillControl()).completion_tokens
        latencies.append(time.perf_counter() - s)
    return summary(time.perf_counter() - t0, latencies, tokens, len(asks))


def with_clients(url: str, bodies: list[dict[str, Any]], clients: int) -> dict[str, float]:
    work: queue.Queue[dict[str, Any]] = queue.Queue()
    for b in bodies:
        work.put(b)
    latencies: list[float] = []
    tokens = [0]
    failures: list[str] = []
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(timeout=120) as http:
            while True:
                try:
                    body = work.get_nowait()
                except queue.Empty:
                    return
                s = time.perf_counter()
                reply = http.post(url + "/v1/completions", json=body)
                took = time.perf_counter() - s
                with lock:
                    if reply.status_code != 200:
                        failures.append(f"HTTP {reply.status_code}: {reply.text[:200]}")
                        continue
                    latencies.append(took)
                    tokens[0] += reply.json()["usage"]["completion_tokens"]

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise RuntimeError(f"{len(failures)} requests failed, e.g. {failures[0]}")
    return summary(time.perf_counter() - t0, latencies, tokens[0], len(bodies))


def summary(wall: float, latencies: list[float], tokens: int, n: int) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "wall_s": wall,
        "fills_per_s": n / wall,
        "tokens_per_s": tokens / wall,
        "latency_p50_ms": 1000 * statistics.median(ordered),
        "latency_p95_ms": 1000 * ordered[int(0.95 * (len(ordered) - 1))],
    }


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}


def start_server(model: str | None) -> tuple[str, subprocess.Popen[str]]:
    args = [sys.executable, "-m", "engine.commands.cli", "serve", "--port", "0", "--queue-size", "4096"]
    args += ["--model", model] if model else []
    proc = subprocess.Popen(args, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    found = re.search(r"listening on (http://\S+)", proc.stderr.readline())
    if not found:
        proc.kill()
        raise RuntimeError("the server did not start")
    url = found.group(1)
    while httpx.get(url + "/health").status_code != 200:
        if proc.poll() is not None:
            raise RuntimeError("the server exited while loading")
        time.sleep(0.1)
    return url, proc


def run(model: str | None, n: int, repeats: int, clients: list[int]) -> dict[str, Any]:
    from engine.denoisers.loading import load_model
    from engine.local.generator import local_engine

    bodies = positions(n)
    engine = local_engine(load_model(Path(model) if model else None))
    url, proc = start_server(model)
    try:
        scenarios: dict[str, list[dict[str, float]]] = {"one_at_a_time": []}
        scenarios.update({f"clients_{c}": [] for c in clients})
        one_at_a_time(engine, bodies)  # warm: every context cached, in both processes
        with_clients(url, bodies, 1)
        for _ in range(repeats):  # interleaved, so drift on a shared machine hits all alike
            scenarios["one_at_a_time"].append(one_at_a_time(engine, bodies))
            for c in clients:
                scenarios[f"clients_{c}"].append(with_clients(url, bodies, c))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    out = {name: medians(runs) for name, runs in scenarios.items()}
    base = out["one_at_a_time"]["fills_per_s"]
    for name in out:
        out[name]["throughput_vs_one_at_a_time"] = round(out[name]["fills_per_s"] / base, 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model directory (default: the shipped model)")
    p.add_argument("--requests", type=int, default=48, help="fills per scenario and repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--out", type=Path, help="also write the JSON here")
    args = p.parse_args()
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    scenarios = run(args.model, args.requests, args.repeats, args.clients)
    report = {
        "benchmark": "serve_bench",
        "date": started,
        "command": "python bench/serve_bench.py " + " ".join(sys.argv[1:]),
        "model": args.model or "shipped (engine/weights)",
        "requests": args.requests,
        "repeats": args.repeats,
        "machine": {
            "platform": platform.platform(),
            "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "python": platform.python_version(),
            "sgemm_gflops": sgemm_gflops(),
        },
        "serving": "one worker on the model: concurrent fills queue (fill_server/scheduler.py)",
        "scenarios": scenarios,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
