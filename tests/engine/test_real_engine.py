"""The remote backend against a real inference engine: llama.cpp's server (xllamacpp, in
process) on a GGUF written at test time (tests/real_engine.py). Its fills are strings of
x and y that never end by themselves, so how many tokens the engine computed says what
reached it: the span's budget, and whether a cancelled fill stopped."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from engine.fill import Engine, FillControl, InfillRequest
from engine.remote.generator import CHAT_SLACK_TOKENS, RemoteConfig, RemoteGenerator, remote_engine
from tests.real_engine import RunningEngine, llama_server, write_gguf

pytest.importorskip("xllamacpp")

PREFIX = "def total(items):\n    count = 0\n    for item in items:\n        count += item\n    return "
SUFFIX = "\n\n\nprint(total([1, 2]))\n"
DIALECTS = ("llama-infill", "openai-fim", "vllm", "chat")


def remote(engine: RunningEngine, dialect: str, **kw: object) -> Engine:
    return remote_engine(RemoteConfig(endpoint=engine.url, dialect=dialect, **{"timeout_s": 20.0, **kw}))  # type: ignore[arg-type]


def wire(eng: Engine) -> RemoteGenerator:
    """The engine's remote generator (its request count)."""
    assert isinstance(eng.generator, RemoteGenerator)
    return eng.generator


@pytest.mark.parametrize("dialect", DIALECTS)
def test_each_dialect_fills_from_the_engine_within_the_spans_budget(real_engine: RunningEngine, dialect: str) -> None:
    eng = remote(real_engine, dialect)
    slack = CHAT_SLACK_TOKENS if dialect == "chat" else 0  # a chat answer may hold a code fence too
    before = real_engine.wait_idle()["tokens_predicted_total"]
    r = eng.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX, language="python"))
    assert r.error is None and r.text and set(r.text) <= {"x", "y"}
    # the model never ends a fill: it computed exactly the span's budget (one line: 32)
    assert real_engine.wait_idle()["tokens_predicted_total"] - before == r.canvas_tokens + slack == 32 + slack
    body = eng.configured(max_canvas_tokens=50).fill(
        InfillRequest(prefix="def f(x):\n    ", suffix="\n", language="python")
    )
    assert body.error is None and body.canvas_tokens == 50
    assert real_engine.wait_idle()["tokens_predicted_total"] - before == 32 + 50 + 2 * slack


@pytest.mark.parametrize("dialect", ["llama-infill", "openai-fim", "chat"])
def test_alternatives_come_back_from_the_engine(real_engine: RunningEngine, dialect: str) -> None:
    """n candidates in one request: llama.cpp's /infill answers n > 1 with an indexed stream
    and no [DONE], its OpenAI endpoints with indexed choices."""
    r = remote(real_engine, dialect).fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX, language="python", candidates=3))
    assert r.error is None, r.error
    texts = [c.text for c in r.candidates]
    size = 32 + (CHAT_SLACK_TOKENS if dialect == "chat" else 0)
    assert len(texts) == 3 and len(set(texts)) == 3 and all(set(t) <= {"x", "y"} and len(t) == size for t in texts)


@pytest.mark.parametrize("dialect", ["llama-infill", "chat"])
def test_drafts_stream_from_the_engine_as_the_fill_forms(real_engine: RunningEngine, dialect: str) -> None:
    drafts: list[str] = []
    r = remote(real_engine, dialect).fill(
        InfillRequest(
            prefix=PREFIX,
            suffix=SUFFIX,
            language="python",
        ),
        FillControl(on_draft=lambda step, texts: drafts.append(texts[0])),
    )
    assert r.error is None and len(drafts) >= 10
    assert all(b.startswith(a) for a, b in zip(drafts, drafts[1:], strict=False)) and drafts[-1] == r.text


def test_a_model_without_fim_tokens_gets_the_engines_own_message(tmp_path: Path) -> None:
    with llama_server(write_gguf(tmp_path / "no-fim.gguf", fim=False)) as plain:
        r = remote(plain, "llama-infill").fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX, language="python"))
    assert r.candidates == [] and r.error is not None and "HTTP 501" in r.error


@pytest.mark.parametrize("dialect", ["llama-infill", "chat"])
def test_a_cancelled_fill_stops_the_engine(tmp_path: Path, dialect: str) -> None:
    """The fill is cancelled 100 ms into a 2,000-token request: the engine stops within a
    few tokens (streamed, it notices the client leave at its next token). A request left
    to run, or not streamed, computes all 2,000 (llama.cpp finishes a non-streamed fill
    whose client has gone)."""
    with llama_server(write_gguf(tmp_path / "slow.gguf", width=512, layers=4)) as slow:
        eng = remote(slow, dialect)
        before = slow.wait_idle()["tokens_predicted_total"]
        cancelled = threading.Event()
        threading.Timer(0.1, cancelled.set).start()
        r = eng.configured(canvas_tokens=2000).fill(
            InfillRequest(prefix="x = ", suffix="\n"), FillControl(cancel=cancelled.is_set)
        )
        assert r.stop_reason == "cancelled" and r.candidates == []
        time.sleep(0.3)
        computed = slow.wait_idle()["tokens_predicted_total"] - before
        assert 0 < computed < 200, computed
        # and the next request is served on a fresh connection
        again = eng.configured(canvas_tokens=5).fill(InfillRequest(prefix="x = ", suffix="\n"))
        assert again.error is None and again.text == "x" * (5 + (CHAT_SLACK_TOKENS if dialect == "chat" else 0))


def test_an_engine_that_went_away_is_said_so_and_not_hammered(tmp_path: Path) -> None:
    with llama_server(write_gguf(tmp_path / "gone.gguf")) as gone:
        eng = remote(gone, "llama-infill", timeout_s=2.0).configured(canvas_tokens=3)
        assert eng.fill(InfillRequest(prefix="x = ", suffix="\n")).text == "xxx"
    first = eng.fill(InfillRequest(prefix="x = ", suffix="\n"))
    assert first.candidates == [] and first.error is not None and gone.url.split("//")[1] in first.error
    sent = wire(eng).requests
    second = eng.fill(InfillRequest(prefix="x = ", suffix="\n"))
    assert second.error == first.error and wire(eng).requests == sent  # the backoff answers without a request


def test_repository_context_sent_ahead_is_cached_by_the_engine_for_the_next_fill(tmp_path: Path) -> None:
    """`Engine.warm` with llama-infill (engine/remote/generator.py), as llama.vim warms its
    ring of chunks: a request that writes nothing, with the pieces and no prefix or suffix;
    the fill after it finds them in the engine's prompt cache and encodes only its own
    prefix and suffix. Another dialect, or a request without pieces, sends nothing."""
    extra = [("util.py", "def helper(a, b):\n    return a * b + 1\n" * 30)]
    req = InfillRequest(prefix="def f(x):\n    return ", suffix="\n", language="python", extra_files=extra)
    with llama_server(write_gguf(tmp_path / "one.gguf")) as one:
        eng = remote(one, "llama-infill")
        before = one.wait_idle()
        assert eng.warm(req) is True and wire(eng).requests == 1
        warmed = one.wait_idle()
        encoded = warmed["prompt_tokens_total"] - before["prompt_tokens_total"]
        assert encoded > 500  # the 30 repeated lines of util.py
        assert warmed["tokens_predicted_total"] - before["tokens_predicted_total"] <= 1  # nothing written
        r = eng.fill(req)
        after = one.wait_idle()
        assert r.error is None and r.text
        assert after["prompt_tokens_cached_total"] - warmed["prompt_tokens_cached_total"] >= encoded - 2
        assert after["prompt_tokens_total"] - warmed["prompt_tokens_total"] < 50  # the prefix and suffix only
        for other, asked in ((remote(one, "openai-fim"), req), (eng, InfillRequest(prefix="x = ", suffix="\n"))):
            sent = wire(other).requests
            assert other.warm(asked) is True and wire(other).requests == sent
