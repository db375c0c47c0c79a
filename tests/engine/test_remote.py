"""Remote engines over the wire: a local HTTP server that behaves as each engine documents
(vLLM's 400 on `suffix`, OpenAI-style JSON and SSE, llama-server's /infill, error bodies),
and every fault the issue lists (contract tests against tests/fake_engine.py)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from engine import fill
from engine.fill import FillControl, InfillRequest
from engine.remote.chat import HOLE
from engine.remote.generator import RemoteConfig, RemoteError, RemoteGenerator, remote_engine
from tests.fake_engine import Engine, chat, json_reply, serve, sse, vllm

PREFIX = "def total(items):\n    count = 0\n    for item in items:\n        count += item\n    return "
SUFFIX = "\n\n\nprint(total([1, 2]))\n"


@pytest.fixture()
def engine_server() -> Iterator[Engine]:
    with serve() as state:
        yield state


def remote(url: str, **kw: Any) -> fill.Engine:
    return remote_engine(RemoteConfig(endpoint=url, **{"timeout_s": 2.0, **kw}))


def wire(eng: fill.Engine) -> RemoteGenerator:
    """The engine's remote generator (its connection, backoff and request count)."""
    assert isinstance(eng.generator, RemoteGenerator)
    return eng.generator


def testvllm_gets_the_rendered_prompt_and_the_spans_budget(engine_server: Engine) -> None:
    engine_server.reply = vllm
    eng = remote(engine_server.url, dialect="vllm", model="google/diffusiongemma")
    r = eng.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX, language="python"))
    assert r.error is None and r.text == "count"
    sent = engine_server.seen[-1]
    assert sent.path == "/v1/completions" and "suffix" not in sent.body
    assert sent.body["prompt"] == f"<|fim_suffix|>{SUFFIX}<|fim_prefix|>{PREFIX}<|fim_middle|>"
    assert sent.body["max_tokens"] == r.canvas_tokens == 32  # mid-line: one line, the line's budget
    assert sent.body["model"] == "google/diffusiongemma" and sent.body["stop"] == ["\n"]
    body = eng.fill(InfillRequest(prefix="def f(x):\n    ", suffix="\n", language="python"))
    assert body.span == "block" and engine_server.seen[-1].body["max_tokens"] == 128
    capped = eng.configured(max_canvas_tokens=50).fill(
        InfillRequest(prefix="def f(x):\n    ", suffix="\n", language="python")
    )
    assert capped.canvas_tokens == engine_server.seen[-1].body["max_tokens"] == 50


def test_alternatives_come_from_n_choices_and_are_validated(engine_server: Engine) -> None:
    engine_server.reply = lambda h, b: json_reply(
        h, 200, {"choices": [{"index": i, "text": t} for i, t in enumerate(["count", "count +", "sum(items)"])]}
    )
    r = remote(engine_server.url).fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX, language="python", candidates=3))
    assert engine_server.seen[-1].body["n"] == 3 and engine_server.seen[-1].body["temperature"] > 0
    assert [c.text for c in r.candidates] == ["count", "sum(items)"]  # `count +` does not parse: dropped


def test_openai_fim_sends_prompt_and_suffix_to_the_configured_path(engine_server: Engine) -> None:
    engine_server.reply = lambda h, b: json_reply(h, 200, {"choices": [{"text": "count", "index": 0}]})
    eng = remote(engine_server.url + "/api", dialect="openai-fim", path="/v1/fim/completions", model="mercury-coder")
    r = eng.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX, language="python"))
    sent = engine_server.seen[-1]
    assert sent.path == "/api/v1/fim/completions" and r.text == "count"
    assert (sent.body["prompt"], sent.body["suffix"], sent.body["model"]) == (PREFIX, SUFFIX, "mercury-coder")


def test_llama_infill_sends_its_fields_and_reads_content(engine_server: Engine) -> None:
    engine_server.reply = lambda h, b: json_reply(h, 200, {"content": "count", "tokens_cached": 10})
    r = remote(engine_server.url, dialect="llama-infill").fill(
        InfillRequest(
            prefix=PREFIX,
            suffix=SUFFIX,
            language="python",
            extra_files=[("/work/util.py", "def helper():\n    return 1\n")],
        ),
        FillControl(deadline=time.monotonic() + 5),
    )
    sent = engine_server.seen[-1]
    assert sent.path == "/infill" and r.text == "count"
    assert (sent.body["input_prefix"], sent.body["input_suffix"]) == (PREFIX, SUFFIX)
    assert sent.body["n_predict"] == 32 and sent.body["cache_prompt"] is True
    assert 0 < sent.body["t_max_predict_ms"] <= 5000 and "model" not in sent.body
    assert sent.body["input_extra"] == [{"filename": "/work/util.py", "text": "def helper():\n    return 1\n"}]


def test_a_streamed_fill_sends_drafts_as_it_forms(engine_server: Engine) -> None:
    engine_server.reply = vllm
    drafts: list[tuple[int, list[str]]] = []
    r = remote(engine_server.url).fill(
        InfillRequest(
            prefix=PREFIX,
            suffix=SUFFIX,
            language="python",
        ),
        FillControl(on_draft=lambda s, t: drafts.append((s, t))),
    )
    assert engine_server.seen[-1].body["stream"] is True
    assert drafts == [(1, ["co"]), (2, ["count"])] and r.text == "count"  # its end changes nothing: no draft


def llama_stream(h: Any, body: dict[str, Any]) -> None:
    """llama-server's /infill stream: the n candidates' pieces interleaved by `index`, each
    ended by its own `stop`, no [DONE] (a server without `n` gives index 0 only)."""
    texts = ["count", "sum(items)", "len(items)"][: body.get("n", 1)]
    events = [
        {"index": i, "content": t[k : k + 3], "stop": False} for k in range(0, 12, 3) for i, t in enumerate(texts)
    ]
    sse(h, [*events, *({"index": i, "content": "", "stop": True} for i in range(len(texts)))], done=False)
    h.wfile.write(b"0\r\n\r\n")


def test_llama_infill_streams_n_candidates_by_index_on_one_connection(engine_server: Engine) -> None:
    engine_server.reply = llama_stream
    eng = remote(engine_server.url, dialect="llama-infill")
    for _ in range(2):  # the second fill reuses the connection the first left clean
        r = eng.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX, language="python", candidates=3))
        assert r.error is None and [c.text for c in r.candidates] == ["count", "sum(items)", "len(items)"]
    assert engine_server.seen[-1].body["n"] == 3 and len({s.port for s in engine_server.seen}) == 1
    # a server that ignores `n` streams one candidate: that one, not "a cut stream"
    engine_server.reply = lambda h, b: llama_stream(h, {**b, "n": 1})
    r = eng.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX, language="python", candidates=3))
    assert r.error is None and [c.text for c in r.candidates] == ["count"]

    # one whose stream stops before a candidate ends is cut
    def cut_short(h: Any, b: dict[str, Any]) -> None:
        sse(h, [{"index": 0, "content": "cou", "stop": False}], done=False)
        h.wfile.write(b"0\r\n\r\n")  # the reply ends there

    engine_server.reply = cut_short
    cut = eng.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX, language="python"))
    assert cut.candidates == [] and cut.error is not None and "cut the stream" in cut.error


def test_the_connection_is_kept_alive_between_fills(engine_server: Engine) -> None:
    engine_server.reply = vllm
    eng = remote(engine_server.url)
    for _ in range(3):
        assert eng.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX)).text == "count"
    drafts: list[Any] = []
    eng.fill(
        InfillRequest(prefix=PREFIX, suffix=SUFFIX), FillControl(on_draft=lambda s, t: drafts.append(t))
    )  # a stream too
    eng.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX))
    assert len({s.port for s in engine_server.seen}) == 1 and len(engine_server.seen) == 5


def test_a_cancelled_fill_closes_its_request_at_once(engine_server: Engine) -> None:
    events = [{"choices": [{"index": 0, "text": "x", "finish_reason": None}]}] * 200
    engine_server.reply = lambda h, b: sse(h, events, pause=0.02)
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    t0 = time.monotonic()
    r = remote(engine_server.url).fill(
        InfillRequest(prefix=PREFIX, suffix=SUFFIX), FillControl(cancel=cancel.is_set, on_draft=lambda s, t: None)
    )
    assert r.stop_reason == "cancelled" and not r.candidates and r.error is None
    assert time.monotonic() - t0 < 1.5  # the stream would take 4 s
    deadline = time.monotonic() + 3
    while engine_server.disconnects == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine_server.disconnects == 1  # the engine saw the client go: it stops computing


def test_the_deadline_ends_a_slow_request(engine_server: Engine) -> None:
    engine_server.reply = lambda h, b: (time.sleep(1.5), json_reply(h, 200, {"choices": [{"text": "late"}]}))
    t0 = time.monotonic()
    r = remote(engine_server.url, timeout_s=5).fill(
        InfillRequest(prefix=PREFIX, suffix=SUFFIX), FillControl(deadline=time.monotonic() + 0.3)
    )
    assert r.stop_reason == "deadline" and not r.candidates and time.monotonic() - t0 < 1.2


FAULTS: dict[str, tuple[Callable[[Any, dict[str, Any]], None], str]] = {
    "http 400 with vLLM's message": (
        lambda h, b: json_reply(h, 400, {"error": {"message": "suffix is not currently supported"}}),
        "HTTP 400: suffix is not currently supported",
    ),
    "http 503 with a text body": (lambda h, b: json_reply(h, 503, None, raw=b"overloaded\n"), "HTTP 503: overloaded"),
    "malformed json": (lambda h, b: json_reply(h, 200, None, raw=b'{"choices": [{"text": '), "not JSON"),
    "truncated body": (
        lambda h, b: (
            h.send_response(200),
            h.send_header("Content-Type", "application/json"),
            h.send_header("Content-Length", "500"),
            h.end_headers(),
            h.wfile.write(b'{"choices": '),
            h.wfile.flush(),
            setattr(h, "close_connection", True),
        ),
        "cut its reply short",
    ),
    "empty choice list": (lambda h, b: json_reply(h, 200, {"choices": []}), "no choices"),
    "a choice without text": (lambda h, b: json_reply(h, 200, {"choices": [{"index": 0}]}), "without text"),
    "stream cut mid-way": (
        lambda h, b: (
            sse(h, [{"choices": [{"index": 0, "text": "co"}]}], done=False),
            setattr(h, "close_connection", True),
        ),
        "cut the stream",
    ),
    "slow first byte": (lambda h, b: time.sleep(1.5), "did not answer in 0.5 s"),
}


@pytest.mark.parametrize("dialect", ["vllm", "chat"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fault_is_a_clear_message_and_an_empty_answer(engine_server: Engine, fault: str, dialect: str) -> None:
    reply, message = FAULTS[fault]
    engine_server.reply = reply
    stream = fault.startswith("stream")
    eng = remote(engine_server.url, timeout_s=0.5, dialect=dialect)
    r = eng.fill(
        InfillRequest(prefix=PREFIX, suffix=SUFFIX), FillControl(on_draft=(lambda s, t: None) if stream else None)
    )
    assert not r.candidates and r.error is not None and message in r.error, r.error
    assert "Traceback" not in r.error
    engine_server.reply = vllm if dialect == "vllm" else chat  # and the next request is served (after any backoff)
    wire(eng)._backoff.ok()
    assert eng.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX)).text == "count"


def test_chat_asks_with_a_hole_and_takes_the_code_out_of_the_answers(engine_server: Engine) -> None:
    engine_server.reply = chat
    eng = remote(engine_server.url, dialect="chat", model="meta/llama-3.1-8b-instruct", api_key_env="CHAT_TEST_KEY")
    os.environ["CHAT_TEST_KEY"] = "sk-test"
    try:
        drafts: list[list[str]] = []
        r = eng.fill(
            InfillRequest(prefix=PREFIX, suffix=SUFFIX, language="python", candidates=3),
            FillControl(on_draft=lambda step, texts: drafts.append(texts)),
        )
    finally:
        del os.environ["CHAT_TEST_KEY"]
    sent = engine_server.seen[-1]
    assert sent.path == "/v1/chat/completions" and sent.headers["Authorization"] == "Bearer sk-test"
    body = sent.body
    assert body["model"] == "meta/llama-3.1-8b-instruct" and body["n"] == 3 and body["stream"] is True
    user = body["messages"][-1]["content"]
    assert f"{PREFIX}{HOLE}{SUFFIX}" in user and "prompt" not in body and "suffix" not in body
    assert body["max_tokens"] > r.canvas_tokens  # room for a fence around the fill
    # a fence with the line again, a sentence and a fence, a bare answer: three clean fills
    assert [c.text for c in r.candidates] == ["count", "count + 0", "sum(items)"]
    assert drafts and "```" not in "".join(drafts[-1])  # drafts show the code, not the markdown
    whole = remote(engine_server.url, dialect="chat").fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX))
    assert whole.text == "count" and engine_server.seen[-1].body["stream"] is True


def test_an_unreachable_endpoint_is_not_hammered() -> None:
    eng = remote("http://127.0.0.1:9")  # discard port: nothing listens
    first = eng.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX))
    assert first.error is not None and "connection refused" in first.error
    for _ in range(5):
        again = eng.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX))
        assert again.error == first.error  # the same message (told once), no new connection
    assert wire(eng).requests == 1


def test_a_name_that_does_not_resolve_is_said_so() -> None:
    r = remote("http://no-such-host.invalid:8000").fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX))
    assert r.error is not None and "does not resolve" in r.error


def test_the_api_key_comes_from_the_environment_and_is_never_shown(
    engine_server: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine_server.reply = lambda h, b: json_reply(h, 401, {"error": {"message": "bad key"}})
    monkeypatch.setenv("DIFFUSION_TEST_KEY", "sk-secret-123")
    r = remote(engine_server.url, api_key_env="DIFFUSION_TEST_KEY").fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX))
    assert engine_server.seen[-1].headers["Authorization"] == "Bearer sk-secret-123"
    assert r.error is not None and "bad key" in r.error and "sk-secret" not in r.error
    monkeypatch.delenv("DIFFUSION_TEST_KEY")
    r = remote(engine_server.url, api_key_env="DIFFUSION_TEST_KEY").fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX))
    assert r.error is not None and "DIFFUSION_TEST_KEY is not set" in r.error


def test_a_bad_configuration_is_refused_with_a_message() -> None:
    with pytest.raises(RemoteError, match="not an http"):
        remote("localhost:8000")
    with pytest.raises(RemoteError, match="unknown dialect"):
        remote("http://localhost:8000", dialect="grpc")
