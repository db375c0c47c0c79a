"""`logprobs` (OpenAI's forms) and `n_probs` (/infill): each choice's tokens'
log-probabilities, the engine's own (the numbers its confidence was made from), whole and
streamed, cut with the text at a stop string; the tokens' texts spell the text where the
engine dropped indentation and cut the fill to parse, a character of several byte tokens
included; a fill the engine wrote anew carries none; and the project's remote dialects
reading them back get the confidence the local engine gives the same fill."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engine.candidate import Candidate, scored, spelled
from engine.fill import Engine, InfillRequest, fitted
from engine.remote.generator import RemoteConfig, remote_engine
from fill_server.logprobs import token_logprobs
from tests.serve.harness import Running, running
from tests.unit.writes import Writes

PREFIX = "def total(items):\n    count = 0\n    for item in items:\n        count += item\n    return "
SUFFIX = "\n\n\nprint(total([1, 2]))\n"
LONG = {"prompt": "def f(x):\n    ", "suffix": "\n", "max_tokens": 32, "min_tokens": 12}  # a fill of many tokens
# a cursor on a blank line indented by the editor, inside a block
INDENTED = {"prompt": "def f(a):\n    if a:\n        ", "suffix": "\n    return a\n", "language": "python"}


class Letters:
    """A tokenizer whose token i is VOCAB[i]."""

    VOCAB = ["    ", "ret", "urn", " x", ".", "va", "\n", "lue"]

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        return "".join(self.VOCAB[i] for i in ids)


def written(ids: list[int], logprobs: list[float]) -> Candidate:
    """A candidate as the engine gives it: its tokens spelled, their log-probabilities (one
    more: end-of-fill's)."""
    tok = Letters()
    return spelled(scored(Candidate(tok.decode(ids), ids, [0.5] * len(ids)), logprobs), tok)


def test_each_token_with_its_text_and_offset_end_of_fill_last() -> None:
    cand = written([1, 2, 3], [-0.1, -0.2, -0.3, -0.4])
    lp = token_logprobs(cand, cand.text, top=True)
    assert lp is not None and (lp.tokens, lp.offsets, lp.ids) == (
        ["ret", "urn", " x", ""],
        [0, 3, 6, 8],
        [1, 2, 3, None],
    )
    assert lp.logprobs == cand.token_logprobs == [-0.1, -0.2, -0.3, -0.4]


def test_a_stop_string_keeps_the_tokens_up_to_the_one_it_starts_in() -> None:
    cand = written([1, 2, 3, 4, 5, 7], [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6, -0.7])  # "return x.value" <eof>
    lp = token_logprobs(cand, "return x", top=False)
    # stop "." (or ".va"): the "." token is the last, writing "" (as llama.cpp's stream gives it); the tokens
    # after it and end-of-fill are not the reply's
    assert lp is not None and lp.tokens == ["ret", "urn", " x", ""] and lp.logprobs == [-0.1, -0.2, -0.3, -0.4]
    assert lp.ids == [1, 2, 3, 4] and lp.offsets == [0, 3, 6, 8]
    cut_mid_token = token_logprobs(cand, "return x.v", top=False)
    assert cut_mid_token is not None and cut_mid_token.ids[-1] == 5 and cut_mid_token.tokens[-2:] == [".", "v"]
    assert "".join(cut_mid_token.tokens) == "return x.v"


def test_offsets_follow_the_indentation_the_engine_dropped() -> None:
    """engine.fill.fit_indent drops the fill's indentation where the editor put it: the
    indentation's token stays, writing "", so the tokens spell the text and keep their values."""
    cand = fitted("def f():\n    ", written([0, 1, 2], [-0.1, -0.2, -0.3]))
    assert cand.text == "return"
    lp = token_logprobs(cand, "return", top=False)
    assert lp is not None and lp.offsets == [0, 0, 3] and lp.logprobs == [-0.1, -0.2, -0.3]
    assert lp.tokens == ["", "ret", "urn"] and "".join(lp.tokens) == cand.text


def test_a_candidate_without_logprobs_has_none() -> None:
    assert token_logprobs(Candidate("x", [1], [0.5]), "x", top=True) is None


def engine_of(server: Running) -> Engine:
    engine = server.server.scheduler.engine
    assert engine is not None
    return engine


def own_fill(server: Running, prefix: str, suffix: str, tokens: int) -> Candidate:
    """The engine's own best candidate for a fill without a language (the budget `tokens`),
    as serve computes it: the numbers a reply must carry."""
    return engine_of(server).configured(canvas_tokens=tokens).fill(InfillRequest(prefix, suffix)).candidates[0]


def post(server: Running, path: str, body: dict[str, Any]) -> Any:
    reply = httpx.post(server.url + path, json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def events(server: Running, path: str, body: dict[str, Any]) -> list[Any]:
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=60) as reply:
        lines = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    return [json.loads(x) for x in lines if x != "[DONE]"]


def test_openai_logprobs_are_the_engines_own(shipped: Running) -> None:
    own = own_fill(shipped, PREFIX, SUFFIX, 16)
    choice = post(shipped, "/v1/completions", {"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 16, "logprobs": 1})[
        "choices"
    ][0]
    lp = choice["logprobs"]
    assert choice["text"] == own.text and own.token_logprobs
    assert lp["token_logprobs"] == pytest.approx(own.token_logprobs, abs=1e-6)
    assert math.exp(min(lp["token_logprobs"])) == pytest.approx(own.score, abs=1e-6)
    assert "".join(lp["tokens"]) == choice["text"]  # end-of-fill (last, when the fill ended there) writes ""
    assert lp["text_offset"] == [len("".join(lp["tokens"][:k])) for k in range(len(lp["tokens"]))]
    assert lp["top_logprobs"] == [{t: v} for t, v in zip(lp["tokens"], lp["token_logprobs"], strict=True)]


def test_the_fim_route_streams_them_with_the_text_and_zero_lists_no_alternatives(shipped: Running) -> None:
    body = {"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 16, "logprobs": 0}
    whole = post(shipped, "/v1/fim/completions", body)["choices"][0]["logprobs"]
    streamed = [e for e in events(shipped, "/v1/fim/completions", body) if e["choices"][0].get("text") is not None]
    assert whole["top_logprobs"] is None and whole["token_logprobs"]
    assert [e["choices"][0]["logprobs"] for e in streamed] == [whole]
    plain = post(shipped, "/v1/fim/completions", {**body, "logprobs": None})["choices"][0]
    assert plain["logprobs"] is None  # not asked: null, as before


def test_infill_answers_n_probs_in_llama_cpps_format(shipped: Running) -> None:
    own = own_fill(shipped, PREFIX, SUFFIX, 16)
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 16, "n_probs": 1}
    whole = post(shipped, "/infill", body)
    probs = whole["completion_probabilities"]
    assert [p["logprob"] for p in probs] == pytest.approx(own.token_logprobs, abs=1e-6)
    assert all(p["top_logprobs"] == [{k: v for k, v in p.items() if k != "top_logprobs"}] for p in probs)
    assert [p["id"] for p in probs[: len(own.token_ids)]] == own.token_ids
    assert all(bytes(p["bytes"]).decode() == p["token"] for p in probs)
    streamed = [e for e in events(shipped, "/infill", body) if "content" in e]
    assert [e["completion_probabilities"] for e in streamed] == [probs]
    assert "completion_probabilities" not in post(shipped, "/infill", {**body, "n_probs": 0})
    # llama.cpp takes any count: more than the engine keeps gives what it keeps, not an error
    assert post(shipped, "/infill", {**body, "n_probs": 10})["completion_probabilities"] == probs


def test_a_stop_string_cuts_the_logprobs_with_the_text(shipped: Running) -> None:
    full = post(shipped, "/v1/completions", {**LONG, "logprobs": 1})["choices"][0]
    text, lp = full["text"], full["logprobs"]
    assert len(lp["tokens"]) > 3, text
    stop = text[len(text) // 2]  # a character in the middle: the fill is cut at its first place
    cut = post(shipped, "/v1/completions", {**LONG, "logprobs": 1, "stop": [stop]})["choices"][0]
    at = text.index(stop)
    assert cut["text"] == text[:at] and cut["finish_reason"] == "stop"
    kept = len(cut["logprobs"]["tokens"])
    assert cut["logprobs"]["token_logprobs"] == lp["token_logprobs"][:kept]
    # the last token kept is the one the stop string starts in
    assert len("".join(lp["tokens"][: kept - 1])) <= at < len("".join(lp["tokens"][:kept]))


@pytest.mark.parametrize("dialect", ["openai-fim", "llama-infill"])
def test_a_remote_dialect_reading_serve_gets_the_engines_confidence(shipped: Running, dialect: str) -> None:
    """The language server with serve as its remote engine gates a fill as the local
    engine would: the confidence it reads back is the one the engine gave."""
    config = RemoteConfig(endpoint=shipped.url, dialect=dialect, logprobs=True, timeout_s=60)  # type: ignore[arg-type]
    engine = remote_engine(config)
    try:
        got = engine.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX)).candidates[0]
    finally:
        engine.close()
    own = own_fill(shipped, PREFIX, SUFFIX, 64)  # the remote generator's budget without a span: 64
    assert got.text == own.text and got.score is not None
    assert got.score == pytest.approx(own.score, abs=1e-6)
    assert got.token_logprobs == pytest.approx(own.token_logprobs, abs=1e-6)


@pytest.fixture()
def writes(request: pytest.FixtureRequest) -> Iterator[tuple[Running, Writes]]:
    gen = Writes(request.param)
    with running(lambda: Engine(gen)) as server:  # type: ignore[arg-type]
        yield server, gen


@pytest.mark.parametrize("writes", ["        x = 1\n        y = 2\n    )\n"], indirect=True)
def test_an_indented_python_fill_cut_to_parse_keeps_its_tokens_and_values_together(
    writes: tuple[Running, Writes],
) -> None:
    """The editor's indentation dropped, then the last line cut to parse: each token kept
    is the model's own, with its own value; the tokens spell the text."""
    server, gen = writes
    model = gen.cand.token_logprobs or []
    choice = post(server, "/v1/completions", {**INDENTED, "logprobs": 1})["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"] == "x = 1\n        y = 2\n"
    assert "".join(lp["tokens"]) == choice["text"]
    kept = len(lp["tokens"])
    assert lp["token_logprobs"] == model[:kept]  # the model's values, no end-of-fill: the fill was cut
    assert lp["text_offset"] == [len("".join(lp["tokens"][:k])) for k in range(kept)]
    infill = {"input_prefix": INDENTED["prompt"], "input_suffix": INDENTED["suffix"], "language": "python"}
    probs = post(server, "/infill", {**infill, "n_probs": 1})["completion_probabilities"]
    assert [p["id"] for p in probs] == gen.cand.token_ids[:kept]
    assert [p["token"] for p in probs] == lp["tokens"] and [p["logprob"] for p in probs] == model[:kept]


@pytest.mark.parametrize("writes", ["x = 1\n"], indirect=True)
def test_a_fill_the_engine_wrote_anew_carries_no_values(writes: tuple[Running, Writes]) -> None:
    """A whole line moved to the next line's indentation to parse is tokens the model did
    not write: no value of its can be paired with them, so none are sent."""
    server, _ = writes
    body = {"prompt": "def f(a):\n    if a:\n        b = 1\n", "suffix": "        return a\n", "language": "python"}
    choice = post(server, "/v1/completions", {**body, "logprobs": 1})["choices"][0]
    assert choice["text"] == "        x = 1\n" and choice["logprobs"] is None
    infill = {"input_prefix": body["prompt"], "input_suffix": body["suffix"], "language": "python", "n_probs": 1}
    assert "completion_probabilities" not in post(server, "/infill", infill)


@pytest.mark.parametrize("writes", ["name = '漢字'\n"], indirect=True)
def test_a_character_of_several_byte_tokens_is_one_tokens_text(writes: tuple[Running, Writes]) -> None:
    """Each of 漢's three byte tokens decodes alone to U+FFFD: the tokens before the one
    that completes it write "", so the offsets hold and a stop cut splits no character."""
    server, gen = writes
    body = {"prompt": "x = 1\n", "suffix": "\n", "logprobs": 1}
    lp = post(server, "/v1/completions", body)["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == "name = '漢字'\n" and "\ufffd" not in "".join(lp["tokens"])
    assert lp["token_logprobs"] == gen.cand.token_logprobs  # not cut: every token's, end-of-fill's last
    assert lp["text_offset"] == [len("".join(lp["tokens"][:k])) for k in range(len(lp["tokens"]))]
    cut = post(server, "/v1/completions", {**body, "stop": ["字"]})["choices"][0]
    tokens = cut["logprobs"]["tokens"]
    assert cut["text"] == "name = '漢" and "".join(tokens) == cut["text"]
    assert tokens[-1] == ""  # the first byte token of 字, where the stop string starts
    assert cut["logprobs"]["token_logprobs"] == gen.cand.token_logprobs[: len(tokens)]


def test_an_indented_python_fill_of_the_shipped_model_spells_its_text(shipped: Running) -> None:
    """With a language the engine fits the indentation and checks the syntax (this fill,
    a line the shipped model runs on past its budget, is cut to parse): the reply's tokens
    still spell its text, and its values are the engine's candidate's (none where the
    engine wrote the fill anew)."""
    prefix, suffix = "def f(x):\n    try:\n        ", "\n    except ValueError:\n        pass\n"
    body = {"prompt": prefix, "suffix": suffix, "language": "python", "max_tokens": 24, "logprobs": 1}
    choice = post(shipped, "/v1/completions", body)["choices"][0]
    own = engine_of(shipped).configured(max_canvas_tokens=24).fill(InfillRequest(prefix, suffix, language="python"))
    cand = own.candidates[0]
    assert choice["text"] == cand.text
    lp = choice["logprobs"]
    if cand.token_logprobs is None:
        assert lp is None
        return
    assert "".join(lp["tokens"]) == choice["text"]
    assert lp["token_logprobs"] == pytest.approx(cand.token_logprobs, abs=1e-6)
    assert lp["tokens"][: len(cand.token_ids)] == cand.token_texts
