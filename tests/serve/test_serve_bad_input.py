"""Bad input gets a 4xx with a message, never a 500, and the server stays up: malformed
and non-object bodies, bodies past the limit (declared and chunked), wrong types, out of
range values, unknown fields, deep nesting, invalid UTF-8, unknown routes and methods,
bytes that are not HTTP; and a bounded fuzz of field values over real HTTP."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fill_server.config import ServeConfig
from fill_server.schema import FIELDS, fill_ask
from tests.serve.harness import Running, Scripted, running, scripted

LIMIT = 64 * 1024  # the test server's --max-body-bytes


@pytest.fixture(scope="module")
def server() -> Iterator[Running]:
    with running(scripted(Scripted(step_s=0)), ServeConfig(port=0, max_body_bytes=LIMIT)) as s:
        yield s


def raw_request(server: Running, data: bytes) -> bytes:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
            if b"\r\n\r\n" in out:
                break
        return out


BAD_BODIES: list[tuple[str, bytes, str | None]] = [
    ("not JSON", b"{prompt: 1", None),
    ("empty", b"", None),
    ("an array", b'["prompt"]', None),
    ("a string", b'"prompt"', None),
    ("invalid UTF-8", b'{"prompt": "\xff\xfe"}', None),
    ("nested too deep", b"[" * 20_000 + b"]" * 20_000, None),
    ("prompt missing", b'{"suffix": "x"}', "prompt"),
    ("prompt a number", b'{"prompt": 1}', "prompt"),
    ("prompt a list", b'{"prompt": ["a", "b"]}', "prompt"),
    ("suffix an object", b'{"prompt": "a", "suffix": {}}', "suffix"),
    ("max_tokens a string", b'{"prompt": "a", "max_tokens": "16"}', "max_tokens"),
    ("max_tokens zero", b'{"prompt": "a", "max_tokens": 0}', "max_tokens"),
    ("max_tokens huge", b'{"prompt": "a", "max_tokens": 100000000000000000000}', "max_tokens"),
    ("max_tokens a float", b'{"prompt": "a", "max_tokens": 1.5}', "max_tokens"),
    ("n a bool", b'{"prompt": "a", "n": true}', "n"),
    ("n too many", b'{"prompt": "a", "n": 17}', "n"),
    ("temperature NaN", b'{"prompt": "a", "temperature": NaN}', "temperature"),
    ("temperature too hot", b'{"prompt": "a", "temperature": 5}', "temperature"),
    ("stop a number", b'{"prompt": "a", "stop": 3}', "stop"),
    ("stop too many", json.dumps({"prompt": "a", "stop": ["x"] * 17}).encode(), "stop"),
    ("stream a string", b'{"prompt": "a", "stream": "yes"}', "stream"),
    ("an unknown field", b'{"prompt": "a", "prompt_file": "/etc/passwd"}', "prompt_file"),
    ("echo", b'{"prompt": "a", "echo": true}', "echo"),
    ("logprobs a bool (chat's form)", b'{"prompt": "a", "logprobs": true}', "logprobs"),
    ("logprobs too many", b'{"prompt": "a", "logprobs": 6}', "logprobs"),
    ("logprobs negative", b'{"prompt": "a", "logprobs": -1}', "logprobs"),
    ("min over max", b'{"prompt": "a", "max_tokens": 4, "min_tokens": 8}', "min_tokens"),
]


@pytest.mark.parametrize(("what", "raw", "param"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_a_bad_body_is_a_400_that_names_the_field(server: Running, what: str, raw: bytes, param: str | None) -> None:
    reply = httpx.post(server.url + "/v1/completions", content=raw, timeout=10)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"] and error["param"] == param


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/infill", {"input_prefix": 3}, "input_prefix"),
        ("/infill", {"input_prefix": "a", "input_extra": [{"filename": 1, "text": "x"}]}, "input_extra"),
        ("/infill", {"input_prefix": "a", "input_extra": "not a list"}, "input_extra"),
        ("/infill", {"input_prefix": "a", "n_predict": 0}, "n_predict"),
        ("/infill", {"input_prefix": "a", "t_max_predict_ms": -1}, "t_max_predict_ms"),
        ("/infill", {"input_prefix": "a", "n_probs": -1}, "n_probs"),
        ("/infill", {"input_prefix": "a", "n_probs": "1"}, "n_probs"),
        ("/infill", {"input_prefix": "a", "logprobs": 1}, "logprobs"),  # OpenAI's name: not llama.cpp's
        ("/v1/fim/completions", {"prompt": "a", "random_seed": "x"}, "random_seed"),
        ("/v1/fim/completions", {"prompt": "a", "input_prefix": "b"}, "input_prefix"),  # another endpoint's field
    ],
)
def test_each_endpoint_checks_its_own_fields(server: Running, path: str, body: dict[str, Any], param: str) -> None:
    reply = httpx.post(server.url + path, json=body, timeout=10)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text


def test_fields_other_servers_take_are_accepted_and_ignored(server: Running) -> None:
    continue_like = {"prompt": "a", "suffix": "b", "top_p": 0.9, "presence_penalty": 0, "model": "m", "stop": []}
    assert httpx.post(server.url + "/v1/completions", json=continue_like, timeout=10).status_code == 200
    vscode_like = {"input_prefix": "a", "input_suffix": "b", "samplers": ["top_k"], "cache_prompt": True, "top_k": 40}
    assert httpx.post(server.url + "/infill", json=vscode_like, timeout=10).status_code == 200


def test_unknown_fields_can_be_allowed() -> None:
    ask = fill_ask({"prompt": "a", "brand_new_field": 1}, "completions", allow_unknown=True)
    assert ask.prefix == "a"
    assert set(FIELDS["completions"]) >= {"prompt", "suffix", "max_tokens", "temperature", "n", "stop", "stream"}


def test_a_body_past_the_limit_is_413_declared_or_chunked(server: Running) -> None:
    big = json.dumps({"prompt": "x" * (LIMIT + 1)}).encode()
    reply = httpx.post(server.url + "/v1/completions", content=big, timeout=10)
    assert reply.status_code == 413 and "bytes" in reply.json()["error"]["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        for i in range(0, len(big), 8192):
            yield big[i : i + 8192]

    chunked = httpx.post(server.url + "/v1/completions", content=chunks(), timeout=10)
    assert chunked.status_code == 413


def test_routes_and_methods_that_do_not_exist(server: Running) -> None:
    missing = httpx.post(server.url + "/v1/chat/completions", json={"messages": []}, timeout=10)
    assert missing.status_code == 404 and "error" in missing.json()
    assert httpx.get(server.url + "/v1/completions", timeout=10).status_code == 405
    assert httpx.post(server.url + "/health", timeout=10).status_code == 405


def test_bytes_that_are_not_http_get_a_400_or_a_closed_connection(server: Running) -> None:
    for junk in (
        b"\x00\x01\x02garbage\r\n\r\n",
        b"POST /v1/completions HTTP/9.9\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad\r\n\r\n",
    ):
        reply = raw_request(server, junk)
        assert reply == b"" or reply.startswith(b"HTTP/1.1 4"), reply[:80]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    field=st.sampled_from(sorted(FIELDS["completions"])),
    value=st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False, allow_infinity=False),  # JSON has neither
        st.text(max_size=20),
        st.lists(st.one_of(st.integers(), st.text(max_size=5)), max_size=4),
        st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    ),
)
def test_any_value_of_any_field_is_a_fill_or_a_400(server: Running, field: str, value: Any) -> None:
    body = {"prompt": "a = ", "suffix": "\n", "max_tokens": 4, field: value}
    reply = httpx.post(server.url + "/v1/completions", json=body, timeout=10)
    assert reply.status_code in (200, 400), (field, value, reply.text)
    if reply.status_code == 200 and not body.get("stream"):
        assert reply.json()["choices"]


def test_after_all_that_the_server_is_up_and_answered_no_500(server: Running) -> None:
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.post(server.url + "/v1/completions", json={"prompt": "a"}, timeout=10).status_code == 200
    text = server.server.metrics.render()
    statuses = [line for line in text.splitlines() if line.startswith("diffusion_serve_requests_total{")]
    assert statuses and not [s for s in statuses if 'status="5' in s]
