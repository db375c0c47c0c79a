"""Remote engines over the wire: a local HTTP server that behaves as each engine documents
(vLLM's 400 on `suffix`, OpenAI-style JSON and SSE, llama-server's /infill, error bodies),
and every fault the issue lists (contract tests against tests/fake_engine.py)."""

from __future__ import annotations

import json
import math
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


@pytest.mark.parametrize(("language", "mark"), [("python", "#"), ("javascript", "//"), (None, "#")])
def test_openai_fim_carries_repository_context_before_the_prefix(
    engine_server: Engine, language: str | None, mark: str
) -> None:
    engine_server.reply = lambda h, b: json_reply(h, 200, {"choices": [{"text": "count", "index": 0}]})
    eng = remote(engine_server.url, dialect="openai-fim")
    assert eng.takes_extra_files
    files = [("util.py", "def helper():\n    return 1\n"), ("b/c.py", "X = 2")]
    eng.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX, language=language, extra_files=files))
    sent = engine_server.seen[-1].body
    want = f"{mark} util.py\ndef helper():\n    return 1\n\n{mark} b/c.py\nX = 2\n\n"
    assert (sent["prompt"], sent["suffix"]) == (want + PREFIX, SUFFIX)


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


# ---------------------------------------------------------------- log-probabilities: a remote fill's confidence

LP = [-0.1, -0.5, -0.2]  # "co", "un", "t": the fill "count"'s tokens


def answers(h: Any, body: dict[str, Any]) -> None:
    """Any dialect's request answered with "count" (its own shape), whole, no logprobs."""
    if "messages" in body:
        chat(h, {**body, "stream": False})
    elif "input_prefix" in body:
        json_reply(h, 200, {"content": "count"})
    else:
        json_reply(h, 200, {"choices": [{"index": 0, "text": "count"}]})


ASKED = {  # (dialect, the `logprobs` switch) -> the fields that ask for log-probabilities; others: none
    ("vllm", None): {"logprobs": 1},
    ("vllm", True): {"logprobs": 1},
    ("openai-fim", None): {"logprobs": 1},
    ("openai-fim", True): {"logprobs": 1},
    ("llama-infill", None): {"n_probs": 1},
    ("llama-infill", True): {"n_probs": 1},
}


@pytest.mark.parametrize("switch", [None, True, False], ids=["auto", "on", "off"])
@pytest.mark.parametrize("dialect", ["vllm", "openai-fim", "llama-infill", "chat"])
def test_each_dialect_asks_for_logprobs_as_its_switch_says(
    engine_server: Engine, dialect: str, switch: bool | None
) -> None:
    """auto and on ask, off does not; chat never asks."""
    engine_server.reply = answers
    eng = remote(engine_server.url, dialect=dialect, logprobs=switch)
    r = eng.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX, language="python"))
    assert r.error is None and r.text == "count"
    body = engine_server.seen[-1].body
    assert {k: body[k] for k in ("logprobs", "n_probs", "top_logprobs") if k in body} == ASKED.get(
        (dialect, switch), {}
    )
    assert r.candidates[0].score is None  # the reply carried none: shown as before


def openai_stream(h: Any, body: dict[str, Any]) -> None:
    """vLLM's stream with `logprobs`: each chunk carries its own tokens' (two candidates
    interleaved), the last one per candidate none (its finish_reason only)."""
    events = [
        {"choices": [{"index": i, "text": t, "logprobs": {"tokens": [t], "token_logprobs": [lp - i]}}]}
        for t, lp in zip(["co", "un", "t"], LP, strict=True)
        for i in range(body.get("n", 1))
    ]
    sse(h, [*events, *({"choices": [{"index": i, "text": "", "finish_reason": "stop"}]} for i in range(2))])


def llama_probs_stream(h: Any, body: dict[str, Any]) -> None:
    """llama-server's /infill stream with `n_probs`: each token's `completion_probabilities`,
    end-of-sequence's (content "") last, then `stop`."""
    events = [
        {"index": 0, "content": t, "stop": False, "completion_probabilities": [{"token": t, "logprob": lp}]}
        for t, lp in [*zip(["co", "un", "t"], LP, strict=True), ("", -0.7)]
    ]
    sse(h, [*events, {"index": 0, "content": "", "stop": True}], done=False)
    h.wfile.write(b"0\r\n\r\n")


SCORED_REPLIES: dict[str, tuple[str, Callable[[Any, dict[str, Any]], None], list[float]]] = {
    "openai whole": (
        "vllm",
        lambda h, b: json_reply(
            h, 200, {"choices": [{"index": 0, "text": "count", "logprobs": {"token_logprobs": [None, *LP]}}]}
        ),
        LP,  # a None first (a server that sends one for a prompt token) is no token of the fill
    ),
    "openai whole, llama.cpp's content list": (
        "openai-fim",
        lambda h, b: json_reply(
            h, 200, {"choices": [{"text": "count", "logprobs": {"content": [{"logprob": x} for x in LP]}}]}
        ),
        LP,
    ),
    "openai stream": ("vllm", openai_stream, LP),
    "llama whole": (
        "llama-infill",
        lambda h, b: json_reply(
            h, 200, {"content": "count", "completion_probabilities": [{"logprob": x} for x in [*LP, -0.7]]}
        ),
        [*LP, -0.7],
    ),
    "llama whole, older builds' probs": (
        "llama-infill",
        lambda h, b: json_reply(
            h,
            200,
            {
                "content": "count",
                "completion_probabilities": [
                    {"content": t, "probs": [{"tok_str": "z", "prob": 0.01}, {"tok_str": t, "prob": math.exp(x)}]}
                    for t, x in zip(["co", "un", "t"], LP, strict=True)
                ],
            },
        ),
        LP,
    ),
    "llama stream": ("llama-infill", llama_probs_stream, [*LP, -0.7]),
}


@pytest.mark.parametrize("case", list(SCORED_REPLIES))
def test_a_remote_fill_is_scored_from_the_servers_logprobs(engine_server: Engine, case: str) -> None:
    dialect, reply, logprobs = SCORED_REPLIES[case]
    engine_server.reply = reply
    stream = "stream" in case
    r = remote(engine_server.url, dialect=dialect, logprobs=True).fill(
        InfillRequest(prefix=PREFIX, suffix=SUFFIX, language="python"),
        FillControl(on_draft=(lambda s, t: None) if stream else None),
    )
    assert r.error is None and r.text == "count"
    cand = r.candidates[0]
    assert cand.token_logprobs == pytest.approx(logprobs)
    assert cand.score == pytest.approx(math.exp(min(logprobs)))
    assert cand.mean_logprob == pytest.approx(sum(logprobs) / len(logprobs))


def test_streamed_candidates_keep_their_own_logprobs(engine_server: Engine) -> None:
    engine_server.reply = openai_stream
    r = remote(engine_server.url, logprobs=True).fill(
        InfillRequest(prefix=PREFIX, suffix=SUFFIX, candidates=2), FillControl(on_draft=lambda s, t: None)
    )
    # both candidates wrote "count" (one is dropped as a repeat); the first keeps candidate 0's logprobs
    assert r.error is None and [c.token_logprobs for c in r.candidates] == [pytest.approx(LP)]


MALFORMED: dict[str, Any] = {
    "not an object": [0.1],
    "a string": {"token_logprobs": "high"},
    "a word among them": {"token_logprobs": [-0.1, "x"]},
    "a probability above 1": {"token_logprobs": [-0.1, 0.7]},
    "a bool": {"token_logprobs": [True]},
    "content without logprob": {"content": [{"token": "count"}]},
}


@pytest.mark.parametrize("what", list(MALFORMED))
def test_malformed_logprobs_give_no_confidence_and_no_fault(engine_server: Engine, what: str) -> None:
    choice = {"index": 0, "text": "count", "logprobs": MALFORMED[what]}
    engine_server.reply = lambda h, b: json_reply(h, 200, {"choices": [choice]})
    r = remote(engine_server.url).fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX, language="python"))
    assert r.error is None and r.text == "count" and r.candidates[0].score is None


def test_a_stream_with_a_piece_missing_its_logprobs_gives_no_confidence(engine_server: Engine) -> None:
    """A piece of text without its tokens' log-probabilities: a minimum over the rest
    would be a guess."""
    events = [
        {"choices": [{"index": 0, "text": "co", "logprobs": {"token_logprobs": [-0.1]}}]},
        {"choices": [{"index": 0, "text": "unt", "logprobs": None}]},
        {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]},
    ]
    engine_server.reply = lambda h, b: sse(h, events)
    r = remote(engine_server.url).fill(
        InfillRequest(prefix=PREFIX, suffix=SUFFIX), FillControl(on_draft=lambda s, t: None)
    )
    assert r.error is None and r.text == "count" and r.candidates[0].score is None


@pytest.mark.parametrize("dialect", ["openai-fim", "llama-infill"])
def test_an_endpoint_that_refuses_logprobs_is_asked_again_without_them_or_told_how_to_stop(
    engine_server: Engine, dialect: str
) -> None:
    field = "n_probs" if dialect == "llama-infill" else "logprobs"
    message = {"error": {"message": f"Extra inputs are not permitted: body.{field}"}}
    engine_server.reply = lambda h, b: json_reply(h, 400, message) if field in b else answers(h, b)
    r = remote(engine_server.url, dialect=dialect, logprobs=True).fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX))
    assert not r.candidates and r.error is not None and "Traceback" not in r.error
    assert f"HTTP 400: Extra inputs are not permitted: body.{field}" in r.error
    assert "set the `logprobs` setting to off" in r.error
    r = remote(engine_server.url, dialect=dialect, logprobs=False).fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX))
    assert r.error is None and r.text == "count"  # switched off: served, without a confidence
    # auto: asked again at once without the field, and the endpoint not asked for it again
    eng = remote(engine_server.url, dialect=dialect)
    asked = len(engine_server.seen)
    for _ in range(2):
        r = eng.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX))
        assert r.error is None and r.text == "count" and r.candidates[0].score is None
    sent = [field in seen.body for seen in engine_server.seen[asked:]]
    assert sent == [True, False, False]
    # another 400 is told as it is
    engine_server.reply = lambda h, b: json_reply(h, 400, {"error": {"message": "prompt is too long"}})
    r = remote(engine_server.url, dialect=dialect, logprobs=True).fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX))
    assert r.error is not None and r.error.endswith("HTTP 400: prompt is too long")


@pytest.mark.parametrize(
    ("dialect", "switch"), [("llama-infill", None), ("vllm", None), ("openai-fim", True), ("llama-infill", False)]
)
def test_a_real_engines_logprobs_are_the_fills_confidence(real_engine: Any, dialect: str, switch: bool | None) -> None:
    """llama.cpp's server (tests/real_engine.py): the model's logits are fixed, so every
    token of a greedy fill is x, at the probability its log-softmax gives; the fill never
    ends by itself, so no end-of-fill token is among them."""
    pytest.importorskip("xllamacpp")
    from tests.real_engine import letter_logprobs

    r = remote(real_engine.url, dialect=dialect, logprobs=switch, timeout_s=20.0).fill(
        InfillRequest(prefix=PREFIX, suffix=SUFFIX, language="python")
    )
    assert r.error is None and r.text == "x" * 32
    cand = r.candidates[0]
    if switch is False:
        assert cand.score is None and cand.token_logprobs is None
        return
    assert cand.token_logprobs is not None and len(cand.token_logprobs) == 32
    assert cand.token_logprobs == pytest.approx([letter_logprobs()["x"]] * 32, rel=1e-4)
    assert cand.score == pytest.approx(math.exp(letter_logprobs()["x"]), rel=1e-4)


EOS_LOGIT = 5.5  # below x's (6): a sampled fill ends at end-of-sequence after a few letters


def llama_cpp(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """llama.cpp's reply to `body` at `path`: [the whole reply], or a stream's events."""
    import httpx

    if not body.get("stream"):
        reply = httpx.post(url + path, json=body, timeout=30)
        assert reply.status_code == 200, reply.text
        return [reply.json()]
    with httpx.stream("POST", url + path, json=body, timeout=30) as reply:
        lines = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    return [json.loads(x) for x in lines if x != "[DONE]"]


def llama_cpp_tokens(path: str, replies: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """(text, log-probability) of each token a reply (or a stream's events) carries."""
    if path == "/infill":
        probs = [p for r in replies for p in r.get("completion_probabilities") or []]
    else:
        probs = [p for r in replies for c in r["choices"] for p in (c.get("logprobs") or {}).get("content") or []]
    return [(p["token"], p["logprob"]) for p in probs]


def test_llama_cpps_end_of_sequence_and_stop_strings_as_docs_confidence_says(tmp_path: Any) -> None:
    """What docs/confidence.md says llama.cpp's server sends, on a model whose fills end by
    themselves (tests/real_engine.py, `eos_logit`): a fill that ends at end-of-sequence
    carries that token's log-probability last, text "", on /infill and its OpenAI route,
    whole and streamed; cut at a stop string, a stream carries the stop string's token
    (text "") and no end-of-sequence, and a whole reply no log-probabilities at all."""
    pytest.importorskip("xllamacpp")
    from tests.real_engine import letter_logprobs, llama_server, write_gguf

    lp = letter_logprobs(eos_logit=EOS_LOGIT)
    infill = {"input_prefix": "a = ", "input_suffix": "\n", "n_predict": 16, "n_probs": 1, "temperature": 1.0}
    openai = {"prompt": "a = ", "max_tokens": 16, "logprobs": 1, "temperature": 1.0}
    with llama_server(write_gguf(tmp_path / "ends.gguf", eos_logit=EOS_LOGIT)) as eng:
        seed = next(s for s in range(50) if "y" in llama_cpp(eng.url, "/infill", {**infill, "seed": s})[0]["content"])
        for path, body in (("/infill", infill), ("/v1/completions", openai)):
            for stream in (False, True):
                got = llama_cpp_tokens(path, llama_cpp(eng.url, path, {**body, "seed": seed, "stream": stream}))
                text = "".join(t for t, _ in got)
                assert got[-1] == ("", pytest.approx(lp["</s>"], abs=1e-4)), (path, stream)
                assert got[:-1] == [(ch, pytest.approx(lp[ch], abs=1e-4)) for ch in text] and "y" in text
        stop = {**infill, "seed": seed, "stop": ["y"]}
        whole = llama_cpp(eng.url, "/infill", stop)[0]
        assert whole["stop_type"] == "word" and "y" not in whole["content"]
        assert not whole.get("completion_probabilities")
        streamed = llama_cpp_tokens("/infill", llama_cpp(eng.url, "/infill", {**stop, "stream": True}))
        assert streamed == [
            *((ch, pytest.approx(lp["x"], abs=1e-4)) for ch in whole["content"]),
            ("", pytest.approx(lp["y"], abs=1e-4)),
        ]
        assert (
            llama_cpp(eng.url, "/v1/completions", {**openai, "seed": seed, "stop": ["y"]})[0]["choices"][0]["logprobs"]
            is None
        )
