"""Real clients against the server on the shipped model: the `openai` package (with a
suffix, whole and streamed), the project's own remote dialects through engine/remote's
generator (openai-fim on both OpenAI paths, llama-infill with repository context and
alternatives), the span chosen by language or file name, /v1/models and /health.
The assertions are about shape and status, never the text the tiny model writes."""

from __future__ import annotations

import httpx
import pytest

from engine.fill import InfillRequest
from engine.remote.generator import RemoteConfig, remote_engine
from tests.serve.harness import Running

openai = pytest.importorskip("openai")

PREFIX = "def total(items):\n    count = 0\n    for item in items:\n        count += item\n    return "
SUFFIX = "\n\n\nprint(total([1, 2]))\n"


def requests(server: Running, route: str, status: int = 200) -> float:
    return server.metric(f'diffusion_serve_requests_total{{route="{route}",status="{status}"}}')


def test_the_openai_client_fills_with_a_suffix(shipped: Running) -> None:
    client = openai.OpenAI(base_url=shipped.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    reply = client.completions.create(model="diffusion-lsp", prompt=PREFIX, suffix=SUFFIX, max_tokens=16, n=1)
    assert len(reply.choices) == 1 and isinstance(reply.choices[0].text, str)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.model == "diffusion-lsp" and reply.object == "text_completion"


def test_the_openai_client_streams(shipped: Running) -> None:
    client = openai.OpenAI(base_url=shipped.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    chunks = list(client.completions.create(model="m", prompt=PREFIX, suffix=SUFFIX, max_tokens=16, stream=True))
    assert chunks and all(c.object == "text_completion" for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert isinstance("".join(c.choices[0].text for c in chunks), str)


def test_alternatives_are_n_choices_each_once(shipped: Running) -> None:
    client = openai.OpenAI(base_url=shipped.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    reply = client.completions.create(model="m", prompt=PREFIX, suffix=SUFFIX, max_tokens=8, n=4, temperature=0.8)
    texts = [c.text for c in reply.choices]
    assert 1 <= len(texts) <= 4 and len(set(texts)) == len(texts)  # duplicates dropped
    assert [c.index for c in reply.choices] == list(range(len(texts)))


@pytest.mark.parametrize(
    ("dialect", "path", "route"),
    [
        ("openai-fim", None, "/v1/completions"),
        ("openai-fim", "/v1/fim/completions", "/v1/fim/completions"),
        ("llama-infill", None, "/infill"),
    ],
)
def test_the_projects_remote_dialects_fill_through_the_server(
    shipped: Running, dialect: str, path: str | None, route: str
) -> None:
    before = requests(shipped, route)
    engine = remote_engine(RemoteConfig(endpoint=shipped.url, dialect=dialect, path=path, timeout_s=30))  # type: ignore[arg-type]
    try:
        for candidates in (1, 3):
            request = InfillRequest(prefix=PREFIX, suffix=SUFFIX, language="python", candidates=candidates)
            if dialect == "llama-infill":
                request.extra_files = [("util.py", "def helper():\n    return 1\n")]
            result = engine.fill(request)
            assert result.error is None and result.stop_reason not in ("error", "cancelled"), result.warnings
            assert all(isinstance(c.text, str) for c in result.candidates)
    finally:
        engine.close()
    assert requests(shipped, route) == before + 2  # both went through, streamed (the dialects always stream)


@pytest.mark.parametrize(
    ("extra", "has_span"),
    [({"language": "python"}, True), ({"filename": "src/pkg/total.py"}, True), ({}, False)],
)
def test_the_span_follows_the_language_or_file_name(shipped: Running, extra: dict[str, str], has_span: bool) -> None:
    body = {"prompt": PREFIX, "suffix": SUFFIX, **extra}
    reply = httpx.post(shipped.url + "/v1/completions", json=body, timeout=30).json()
    assert (reply["diffusion"]["span"] is not None) == has_span


def test_a_language_the_model_does_not_know_gets_an_empty_fill_and_says_why(shipped: Running) -> None:
    body = {"prompt": "fn main() {\n    let x = ", "suffix": ";\n}\n", "language": "rust"}
    reply = httpx.post(shipped.url + "/v1/completions", json=body, timeout=30).json()
    assert reply["choices"][0]["text"] == "" and reply["diffusion"]["stop_reason"] == "language"
    assert any("rust" in w for w in reply["diffusion"]["warnings"])


def test_infill_takes_llama_cpps_fields(shipped: Running) -> None:
    body = {
        "input_prefix": PREFIX[:-7],
        "prompt": "return ",  # llama.cpp: the middle's start, after input_prefix
        "input_suffix": SUFFIX,
        "input_extra": [{"filename": "util.py", "text": "X = 1\n"}],
        "n_predict": 12,
        "cache_prompt": True,
        "t_max_predict_ms": 5000,
    }
    reply = httpx.post(shipped.url + "/infill", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert isinstance(data["content"], str) and data["stop"] is True and data["stop_type"] in ("eos", "limit")
    assert data["tokens_evaluated"] > 0


def test_stop_strings_cut_the_fill(shipped: Running) -> None:
    body = {"prompt": "def f(x):\n    ", "suffix": "\n", "max_tokens": 32, "min_tokens": 12, "stop": ["\n", "("]}
    text = httpx.post(shipped.url + "/v1/completions", json=body, timeout=30).json()["choices"][0]["text"]
    assert "\n" not in text and "(" not in text


def test_models_and_health(shipped: Running) -> None:
    models = httpx.get(shipped.url + "/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["diffusion-lsp"]
    health = httpx.get(shipped.url + "/health")
    assert health.status_code == 200 and health.json()["loaded"] is True
