"""Server-sent events on the shipped model: drafts as the fill forms (when asked), the
final event and [DONE] (OpenAI's forms) or llama.cpp's stop event; and a client that
leaves mid-stream stops its fill: the engine computes under half of the tokens it would
have (the same request run to its end is the control)."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx

from tests.serve.harness import Running

PREFIX = "def total(items):\n    count = 0\n    for item in items:\n        count += item\n    return "
LONG = 128  # tokens a fill is made to take: min_tokens bars its end before them
STATED_SHARE = 0.5  # a disconnected fill computes less than this share of them


def events(server: Running, path: str, body: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    with httpx.stream("POST", server.url + path, json=body, timeout=30) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        for line in reply.iter_lines():
            if line.startswith("data: "):
                data = line[6:]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_a_stream_with_drafts_shows_the_fill_forming_then_ends(shipped: Running) -> None:
    body = {"prompt": PREFIX, "suffix": "\n", "stream": True, "drafts": True, "max_tokens": 24, "min_tokens": 6}
    got = events(shipped, "/v1/completions", body)
    assert got[-1] == "[DONE]"
    drafts = [e for e in got[:-1] if e["object"] == "text_completion.draft"]
    finals = [e for e in got[:-1] if e["object"] == "text_completion"]
    assert len(drafts) >= 6  # one a step; min_tokens made at least six
    assert [d["choices"][0]["step"] for d in drafts] == list(range(1, len(drafts) + 1))
    assert all("text" not in d["choices"][0] for d in drafts)  # a text-only reader sees no draft
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] in ("stop", "length")
    assert finals[0]["usage"]["completion_tokens"] >= 0 and finals[0]["diffusion"]["steps"] >= 6


def test_a_stream_without_drafts_is_the_final_text_only(shipped: Running) -> None:
    got = events(shipped, "/v1/fim/completions", {"prompt": PREFIX, "suffix": "\n", "stream": True})
    assert got[-1] == "[DONE]" and len(got) == 2
    choice = got[0]["choices"][0]
    assert choice["delta"]["content"] == choice["text"] and got[0]["object"] == "chat.completion.chunk"


def test_infill_streams_as_llama_cpp_does(shipped: Running) -> None:
    body = {"input_prefix": PREFIX, "input_suffix": "\n", "stream": True, "n": 2, "temperature": 0.8}
    got = events(shipped, "/infill", body)
    assert "[DONE]" not in got and got and all(e["stop"] is True for e in got)
    assert [e["index"] for e in got] == list(range(len(got))) and 1 <= len(got) <= 2


def steps_of_fill(server: Running, start: float) -> float:
    """The engine's steps since `start` (a reading of the steps counter), once no fill runs."""
    end = time.monotonic() + 30
    while server.metric("diffusion_serve_running") or server.metric("diffusion_serve_queue_depth"):
        assert time.monotonic() < end
        time.sleep(0.01)
    return server.metric("diffusion_serve_steps_total") - start


def test_a_client_that_disconnects_stops_its_fill(shipped: Running) -> None:
    body = {"prompt": PREFIX, "suffix": "\n", "max_tokens": LONG, "min_tokens": LONG, "stream": True, "drafts": True}
    start = steps_of_fill(shipped, 0)
    events(shipped, "/v1/completions", body)  # the control: run to its end
    full = steps_of_fill(shipped, start)
    assert full >= LONG  # the fill did take that long when nobody left

    cancelled = shipped.metric('diffusion_serve_cancelled_total{reason="disconnected"}')
    start = steps_of_fill(shipped, 0)
    raw = json.dumps(body).encode()
    host, port = shipped.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw
        )
        seen = b""
        while b"draft" not in seen:  # the first draft: the fill is running
            chunk = sock.recv(4096)
            assert chunk, "the server closed the stream"
            seen += chunk
    computed = steps_of_fill(shipped, start)
    assert computed < STATED_SHARE * full, (computed, full)
    assert shipped.metric('diffusion_serve_cancelled_total{reason="disconnected"}') == cancelled + 1
    assert httpx.get(shipped.url + "/health").status_code == 200
