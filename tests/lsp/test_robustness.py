"""Bad input over the wire, sent as raw JSON-RPC (a typed client cannot send most of it):
every request gets an answer (a result or a clear error), the server keeps serving, and a
hypothesis fuzz of 1,000 random and malformed messages changes none of that.

The server is the real one with a scripted model (tests/lsp/scripted_server.py), so that
"still serving" (a known fill at a known place) does not depend on what the shipped
weights happen to write; two tests start the server on real weights: one whose denoising
graph is broken, and a smoke test of the shipped model whose assertions hold for any
model."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lsp_server.client import StdioClient
from tests.lsp.helpers import REAL_SERVER, ROOT, SAMPLE, SAMPLE_URI, answered, inline_params
from tests.lsp.scripted_server import scripted_command

URI = SAMPLE_URI
COUNT = "    def count(self) -> int:\n        return len(self.items)\n"  # the fill at line 26, a blank line
COBOL = "       AUTHOR. DIFFUSION."
SCRIPT = {
    "rules": [
        {"after": 'GREETING = "😀😀"', "fill": " * 2"},  # the end of line 0 of emoji.py
        {"contains": 'GREETING = "', "fill": "hi "},  # elsewhere in emoji.py (inside the string)
        {"after": "PROGRAM-ID. REPORT.\n", "fill": COBOL},
    ],
    "default": COUNT,
}
SERVER = scripted_command(SCRIPT)
INVALID_PARAMS = -32602


def alive(client: StdioClient) -> bool:
    """The server still fills at a known-good place, with the scripted fill."""
    response = client.request_raw("textDocument/inlineCompletion", inline_params(URI, 26, 0), timeout=60)
    return answered(response) and texts(response) == [COUNT]


def texts(response: dict[str, Any]) -> list[str]:
    """The insert texts of an inline completion response (none for a null result)."""
    return [item["insertText"] for item in (response.get("result") or {}).get("items", [])]


@pytest.fixture(scope="module")
def client() -> Iterator[StdioClient]:
    c = StdioClient(SERVER)
    c.initialize({"alternatives": 1})
    c.open(URI, SAMPLE)
    assert alive(c)
    yield c
    assert c.close() == 0


def test_malformed_params_get_invalid_params(client: StdioClient) -> None:
    for params in (
        {"textDocument": {"uri": URI}},  # no position
        {"textDocument": {"uri": URI}, "position": {"line": "one", "character": 0}, "context": {"triggerKind": 1}},
        {"position": {"line": 0, "character": 0}},
        [1, 2, 3],
    ):
        response = client.request_raw("textDocument/inlineCompletion", params)
        assert response.get("error", {}).get("code") == INVALID_PARAMS, response
    response = client.request_raw("diffusion/inlineEdit", {"textDocument": {}, "position": {"line": -1}})
    assert response.get("error", {}).get("code") == INVALID_PARAMS, response
    assert alive(client)


def test_a_position_past_lsp_s_uinteger_is_invalid_params(client: StdioClient) -> None:
    for method in ("diffusion/inlineEdit", "textDocument/inlineCompletion", "textDocument/completion"):
        params = inline_params(URI, 0, 2**40)
        response = client.request_raw(method, params)
        assert answered(response), response
    response = client.request_raw("diffusion/inlineEdit", inline_params(URI, 2**40, 0))
    assert response.get("error", {}).get("code") == INVALID_PARAMS, response
    for command, arguments in (
        ("diffusion.fillHole", [URI, 2**40, 0]),
        ("diffusion.fillHole", [URI, 0, -1]),
        ("diffusion.regenerateSelection", [URI, 0, 0, 2**40, 0]),
        ("diffusion.refineSelection", [URI, 0, 0, 0, 2**33]),
    ):
        response = client.request_raw("workspace/executeCommand", {"command": command, "arguments": arguments})
        assert response.get("error", {}).get("code") == INVALID_PARAMS, (command, arguments, response)
    assert alive(client)


def test_a_document_with_a_lone_surrogate_gets_answers_not_errors(client: StdioClient) -> None:
    """Text that is not valid Unicode (a "\\ud800" escape in the JSON) reaches every request."""
    uri = "file:///work/surrogate.py"
    client.notify(
        "textDocument/didOpen",
        {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": 'x = "\ud800"\ny = \n'}},
    )
    position = {"line": 1, "character": 4}
    everywhere = {"textDocument": {"uri": uri}, "position": position}
    for method, params in (
        ("textDocument/inlineCompletion", inline_params(uri, 1, 4)),
        ("textDocument/completion", everywhere),
        ("diffusion/inlineEdit", everywhere),
        (
            "textDocument/codeAction",
            {**everywhere, "range": {"start": position, "end": position}, "context": {"diagnostics": []}},
        ),
    ):
        response = client.request_raw(method, params)
        assert answered(response), (method, response)
    client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    assert alive(client)


def test_positions_past_the_end_and_unknown_documents(client: StdioClient) -> None:
    for line, character in ((10_000, 0), (1, 500), (0, 10_000)):
        response = client.request_raw("textDocument/inlineCompletion", inline_params(URI, line, character))
        assert answered(response), response
    response = client.request_raw("textDocument/inlineCompletion", inline_params("file:///nowhere.py", 0, 0))
    assert response == {"jsonrpc": "2.0", "id": response["id"], "result": None}
    response = client.request_raw(
        "textDocument/completion",
        {"textDocument": {"uri": "file:///nowhere.py"}, "position": {"line": 0, "character": 0}},
    )
    assert response.get("result") is None
    assert alive(client)


def test_characters_outside_the_bmp_count_as_two_utf16_units(client: StdioClient) -> None:
    uri = "file:///work/emoji.py"
    text = 'GREETING = "😀😀"\n\n\ndef greet(name):\n    return GREETING + name\n'
    client.open(uri, text)
    # the cursor at the end of line 0: 15 code points, 17 UTF-16 units
    response = client.request_raw("textDocument/inlineCompletion", inline_params(uri, 0, 17))
    assert answered(response) and texts(response) == [" * 2"], response
    (item,) = response["result"]["items"]
    assert item["range"]["start"] == item["range"]["end"] == {"line": 0, "character": 17}
    # a position inside the surrogate pair is clamped, never split
    response = client.request_raw("textDocument/inlineCompletion", inline_params(uri, 0, 13))
    assert answered(response) and texts(response) == ["hi "], response
    (item,) = response["result"]["items"]
    assert item["range"]["start"]["character"] in (12, 14)


def test_binary_content_and_nul_bytes(client: StdioClient) -> None:
    uri = "file:///work/blob.py"
    text = "x = 1\x00\x00\n" + bytes(range(256)).decode("latin-1") + "\ndef f():\n    \n"
    client.open(uri, text)
    response = client.request_raw("textDocument/inlineCompletion", inline_params(uri, 3, 4))
    assert answered(response)
    assert alive(client)


def test_a_language_without_a_grammar_gets_a_line_based_fill(client: StdioClient) -> None:
    uri = "file:///work/report.cob"
    text = "       IDENTIFICATION DIVISION.\n       PROGRAM-ID. REPORT.\n\n       PROCEDURE DIVISION.\n"
    client.notify(
        "textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "cobol", "version": 1, "text": text}}
    )
    response = client.request_raw("textDocument/inlineCompletion", inline_params(uri, 2, 0))
    assert answered(response) and "error" not in response
    assert texts(response) == [COBOL]  # no parser to check or cut it: the fill as written


def test_a_ten_megabyte_document_is_trimmed_to_the_context_budget(client: StdioClient) -> None:
    uri = "file:///work/huge.py"
    block = SAMPLE + "\n\n"
    text = block * (10_000_000 // len(block) + 1)
    assert len(text) >= 10_000_000
    client.open(uri, text)
    middle = text.count("\n") // 2
    response = client.request_raw("textDocument/inlineCompletion", inline_params(uri, middle, 0), timeout=120)
    assert answered(response) and "error" not in response
    client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    assert alive(client)


def test_an_exception_inside_the_engine_is_an_empty_answer_and_the_next_request_is_served(tmp_path: Path) -> None:
    """A model directory whose context-encoding graph is the wrong graph (the denoising
    one, which takes the same cache inputs) loads, and then fails inside the engine at
    every fill, whichever way the model decodes."""
    broken = tmp_path / "model"
    shutil.copytree(ROOT / "engine" / "weights", broken)
    shutil.copy(broken / "denoise.onnx", broken / "encode.onnx")
    c = StdioClient([*REAL_SERVER, "--model", str(broken)])
    try:
        c.initialize({"backend": "onnx"})
        c.open(URI, SAMPLE)
        for _ in range(2):
            response = c.request_raw("textDocument/inlineCompletion", inline_params(URI, 26, 0))
            assert answered(response) and response.get("result") is None, response
        logs = [n["params"]["message"] for n in c.notifications if n.get("method") == "window/logMessage"]
        assert any("fill failed" in m for m in logs), logs
    finally:
        assert c.close() == 0


def test_the_shipped_model_serves_over_stdio() -> None:
    """A smoke test of the real weights behind the server: whatever the shipped model
    writes, the request is answered and any items it gives sit at the cursor."""
    c = StdioClient(REAL_SERVER)
    try:
        c.initialize({"alternatives": 2})
        c.open(URI, SAMPLE)
        response = c.request_raw("textDocument/inlineCompletion", inline_params(URI, 26, 0), timeout=120)
        assert answered(response) and "error" not in response, response
        for item in (response.get("result") or {}).get("items", []):  # may be none: any model
            assert item["range"]["start"] == item["range"]["end"] == {"line": 26, "character": 0}
            assert isinstance(item["insertText"], str) and item["insertText"].strip()
        stats = c.request_raw("workspace/executeCommand", {"command": "diffusion.stats"})
        assert stats["result"]["model_loaded"] is True and stats["result"]["load_error"] is None
    finally:
        assert c.close() == 0


# -- the fuzz: random methods, random params, random framing
METHODS = [
    "textDocument/inlineCompletion",
    "textDocument/completion",
    "textDocument/codeAction",
    "diffusion/inlineEdit",
    "workspace/executeCommand",
    "textDocument/didOpen",
    "textDocument/didChange",
    "textDocument/didClose",
    "workspace/didChangeConfiguration",
    "$/cancelRequest",
    "textDocument/hover",
    "no/suchMethod",
]
# text with lone surrogates too (JSON "\\ud800" escapes): not valid Unicode, but what a broken client sends
json_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=20)
json_leaf = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | json_text
json_value = st.recursive(
    json_leaf,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)
position = st.fixed_dictionaries(
    {"line": st.integers(-3, 200) | json_leaf, "character": st.integers(-3, 200) | json_leaf}
)
uri = st.sampled_from([URI, "file:///work/other.py", "file:///nowhere.py", "", "not a uri"]) | st.text(max_size=30)
plausible = st.fixed_dictionaries(
    {
        "textDocument": st.fixed_dictionaries({"uri": uri}, optional={"version": json_leaf}),
        "position": position,
    },
    optional={
        "context": st.fixed_dictionaries({"triggerKind": st.integers(0, 3) | json_leaf}),
        "range": st.fixed_dictionaries({"start": position, "end": position}),
        "command": st.sampled_from(
            [
                "diffusion.fillHole",
                "diffusion.fillAllHoles",
                "diffusion.regenerateSelection",
                "diffusion.refineSelection",
                "diffusion.stats",
                "nope",
            ]
        ),
        "arguments": st.lists(json_value, max_size=5),
        "settings": json_value,
        "contentChanges": st.lists(json_value, max_size=3),
        "id": json_leaf,
    },
)
message = st.fixed_dictionaries(
    {
        "method": st.sampled_from(METHODS) | st.text(max_size=20),
        "params": plausible | json_value,
        "request": st.booleans(),
    }
)
garbage = st.binary(max_size=64).filter(lambda b: b"\r\n\r\n" not in b)


@settings(
    max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(msg=message | garbage)
def test_fuzz_every_request_is_answered(client: StdioClient, msg: dict[str, Any] | bytes) -> None:
    if isinstance(msg, bytes):  # a body that is not JSON, or not a message
        client.send(msg)
        return
    if msg["request"]:
        response = client.request_raw(msg["method"], msg["params"], timeout=60)
        assert answered(response), json.dumps(response)[:500]
    else:
        client.notify(msg["method"], msg["params"])


def test_the_server_is_well_after_the_fuzz(client: StdioClient) -> None:
    # the fuzz may have changed settings (languages, model) at random: put them back
    defaults = {
        "model": None,
        "backend": "auto",
        "device": "cpu",
        "strategy": None,
        "maxSteps": None,
        "maxFillTokens": None,
        "contextTokens": None,
        "debounceMs": 0,
        "deadlineMs": 2000,
        "alternatives": 1,
        "languages": [],
        "drafts": False,
    }
    client.notify("workspace/didChangeConfiguration", {"settings": {"diffusionLsp": defaults}})
    client.open(URI, SAMPLE, version=10_000)
    assert alive(client)


def test_shutdown_with_a_command_still_running_is_answered() -> None:
    """pygls cancels pending requests at shutdown while iterating the table that a
    cancelled command removes itself from; the shutdown must still get its result."""
    import threading
    import time

    slow = scripted_command({"rules": [{"contains": "slow holes", "fill": "return 1", "delay_ms": 1500}]})
    c = StdioClient(slow)
    try:
        c.initialize()
        uri = "file:///work/slow_holes.py"
        c.open(uri, '"""slow holes"""\n\n\ndef f():\n    pass\n')
        got: list[dict[str, Any]] = []
        command = {"command": "diffusion.fillAllHoles", "arguments": [uri]}
        worker = threading.Thread(target=lambda: got.append(c.request_raw("workspace/executeCommand", command)))
        worker.start()
        time.sleep(0.5)  # the fill is running (1.5 s a step)
        response = c.request_raw("shutdown", timeout=30)
        assert "result" in response and "error" not in response, response
        worker.join(timeout=30)
        assert got and answered(got[0]), got
    finally:
        c.notify("exit")
        c.proc.wait(timeout=30)
