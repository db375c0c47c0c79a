"""The queue, supersession, disconnects, loading and the key, on a scripted generator
behind the real engine frame (fills of known steps; a gate keeps the worker busy), over
real HTTP on 127.0.0.1."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import threading
import time
from typing import Any

import httpx
import pytest

from engine.errors import InputError
from fill_server.auth import ApiKey, check_bind, is_loopback
from fill_server.config import ServeConfig
from tests.serve.harness import Running, Scripted, fill_body, running, scripted

WAIT_S = 10.0


def until(check: Any, what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def post(server: Running, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", json=body, timeout=30, **kw)


@pytest.fixture()
def gated() -> Any:
    """A server of queue size 2 whose fills wait at a gate; the gate opens at the end."""
    gate = threading.Event()
    gen = Scripted(gate=gate)
    with running(scripted(gen), ServeConfig(port=0, queue_size=2)) as server:
        pool = concurrent.futures.ThreadPoolExecutor(8)
        try:
            yield server, gen, gate, pool
        finally:
            gate.set()
            pool.shutdown(wait=True)


def test_a_full_queue_answers_429_with_retry_after_and_loses_nothing(gated: Any) -> None:
    server, gen, gate, pool = gated
    running_one = pool.submit(post, server, fill_body("first"))
    until(lambda: gen.prefixes == ["first"], "the first fill to start")
    queued = []
    for i in range(2):  # one after the other, so that the queue's order is known
        queued.append(pool.submit(post, server, fill_body(f"q{i}")))
        until(lambda n=i + 1: server.metric("diffusion_serve_queue_depth") == n, f"{i + 1} queued")
    refused = post(server, fill_body("one too many"))
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["type"] == "rate_limit_error"
    gate.set()
    answers = [f.result(timeout=WAIT_S) for f in [running_one, *queued]]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.json()["choices"][0]["text"] for a in answers] == ["x" * 8] * 3  # the scripted fill: 8 steps
    assert gen.prefixes == ["first", "q0", "q1"]  # in order; the refused one never computed


@pytest.mark.parametrize("how", ["user", "header"])
def test_a_newer_request_from_the_same_client_supersedes_a_queued_one_before_it_computes(gated: Any, how: str) -> None:
    server, gen, gate, pool = gated
    pool.submit(post, server, fill_body("busy"))
    until(lambda: gen.prefixes == ["busy"], "the worker to be busy")

    def ask(prefix: str) -> httpx.Response:
        if how == "user":
            return post(server, fill_body(prefix, user="alice"))
        return post(server, fill_body(prefix), headers={"X-Diffusion-Document": "file:///a.py"})

    older = pool.submit(ask, "older")
    until(lambda: server.metric("diffusion_serve_queue_depth") == 1, "the older request to queue")
    newer = pool.submit(ask, "newer")
    superseded = older.result(timeout=WAIT_S)  # answered at once, while the worker is still busy
    assert superseded.status_code == 409 and superseded.json()["error"]["type"] == "superseded"
    gate.set()
    assert newer.result(timeout=WAIT_S).status_code == 200
    assert "older" not in gen.prefixes and gen.prefixes[-1] == "newer"
    assert server.metric('diffusion_serve_cancelled_total{reason="superseded"}') == 1


def test_a_running_fill_is_stopped_by_a_newer_one_from_the_same_user() -> None:
    gen = Scripted(step_s=0.05)
    with running(scripted(gen)) as server, concurrent.futures.ThreadPoolExecutor(2) as pool:
        body = {**fill_body("long", user="bob"), "max_tokens": 200}  # 10 s if it ran to the end
        older = pool.submit(post, server, body)
        until(lambda: gen.steps >= 2, "the older fill to run")
        newer = post(server, {**fill_body("short", user="bob"), "max_tokens": 2})
        assert older.result(timeout=WAIT_S).status_code == 409 and newer.status_code == 200
        assert gen.steps < 100  # the older fill stopped at a step, not at its end


def test_a_client_that_leaves_a_queued_fill_takes_it_out_of_the_queue(gated: Any) -> None:
    server, gen, gate, pool = gated
    pool.submit(post, server, fill_body("busy"))
    until(lambda: gen.prefixes == ["busy"], "the worker to be busy")
    raw = json.dumps(fill_body("leaver")).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(raw)}\r\n\r\n".encode()
            + raw
        )
        until(lambda: server.metric("diffusion_serve_queue_depth") == 1, "the request to queue")
    until(lambda: server.metric("diffusion_serve_queue_depth") == 0, "the queue to drop it")
    assert server.metric('diffusion_serve_cancelled_total{reason="disconnected"}') == 1
    gate.set()
    assert post(server, fill_body("after")).status_code == 200
    assert gen.prefixes == ["busy", "after"]  # the leaver never computed


def test_while_the_model_loads_fills_get_503_with_retry_after_and_health_says_so() -> None:
    loaded = threading.Event()

    def slow_loader() -> Any:
        assert loaded.wait(timeout=30)
        return scripted(Scripted())()

    with running(slow_loader, wait=False) as server:
        health = httpx.get(server.url + "/health")
        assert health.status_code == 503 and health.json()["status"] == "loading"
        refused = post(server, fill_body())
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        loaded.set()
        until(lambda: httpx.get(server.url + "/health").status_code == 200, "the model to load")
        assert post(server, fill_body()).status_code == 200


def test_a_model_that_fails_to_load_is_reported_not_hung() -> None:
    def broken() -> Any:
        raise InputError("model directory not found: /nowhere")

    with running(broken, wait=False) as server:
        until(lambda: server.server.scheduler.state == "error", "the load to fail")
        health = httpx.get(server.url + "/health")
        assert health.status_code == 503 and "/nowhere" in health.json()["error"]
        refused = post(server, fill_body())
        assert refused.status_code == 503 and "/nowhere" in refused.json()["error"]["message"]


def test_the_api_key_is_required_where_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVE_TEST_KEY", "s3cret-key")
    key = ApiKey.from_env("SERVE_TEST_KEY")
    with running(scripted(Scripted()), key=key) as server:
        assert post(server, fill_body()).status_code == 401
        wrong = post(server, fill_body(), headers={"Authorization": "Bearer s3cret-kez"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        assert post(server, fill_body(), headers={"Authorization": "Basic s3cret-key"}).status_code == 401
        assert post(server, fill_body(), headers={"Authorization": "Bearer s3cret-key"}).status_code == 200
        assert httpx.get(server.url + "/metrics").status_code == 401
        assert httpx.get(server.url + "/v1/models").status_code == 401
        assert httpx.get(server.url + "/health").status_code == 200  # for load balancers: no key


def test_a_key_variable_that_is_not_set_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVE_TEST_UNSET", raising=False)
    with pytest.raises(InputError, match="SERVE_TEST_UNSET"):
        ApiKey.from_env("SERVE_TEST_UNSET")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True), ("localhost", True),
     ("0.0.0.0", False), ("::", False), ("192.168.1.5", False), ("gpu-box.example", False)],
)  # fmt: skip
def test_binding_beyond_loopback_needs_a_key_or_the_insecure_flag(host: str, loopback: bool) -> None:
    assert is_loopback(host) == loopback
    if loopback:
        check_bind(host, ApiKey(None), insecure_no_key=False)
    else:
        with pytest.raises(InputError, match="--insecure-no-key"):
            check_bind(host, ApiKey(None), insecure_no_key=False)
    check_bind(host, ApiKey("k"), insecure_no_key=False)
    check_bind(host, ApiKey(None), insecure_no_key=True)


def test_metrics_are_prometheus_text(gated: Any) -> None:
    server, gen, gate, pool = gated
    gate.set()
    assert post(server, fill_body()).status_code == 200
    reply = httpx.get(server.url + "/metrics")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = [line for line in reply.text.splitlines() if line and not line.startswith("#")]
    for line in samples:
        name, value = line.rsplit(" ", 1)
        assert name.startswith("diffusion_serve_") and float(value) >= 0, line
    names = {line.split("{")[0].split(" ")[0] for line in samples}
    for wanted in (
        "diffusion_serve_requests_total",
        "diffusion_serve_queue_depth",
        "diffusion_serve_fill_seconds_count",
        "diffusion_serve_tokens_per_second_count",
        "diffusion_serve_generated_tokens_total",
    ):
        assert wanted in names
    assert server.metric("diffusion_serve_fill_seconds_count") == 1
    assert server.metric("diffusion_serve_generated_tokens_total") == 8
