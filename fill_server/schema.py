"""The request bodies of the three fill endpoints, validated into one `FillAsk`.

Each endpoint has a table of the fields it reads (name -> parser) and a list of fields
that its usual clients send and this server accepts without using (sampling knobs of
other servers: `top_p`, `cache_prompt`, ...). Any other field is refused with a 400 that
names it, as OpenAI refuses one, unless the server runs with --allow-unknown-fields.
Every parser checks the JSON type and range and raises a 400 naming the field; nothing
here reads a file, a path or a URL: `filename` only names a language by its extension.

`logprobs` (OpenAI's legacy integer) and llama.cpp's `n_probs` ask for the tokens'
log-probabilities (fill_server.logprobs). Extensions to the OpenAI and llama.cpp forms
(docs/serve.md): `language` (an LSP language
id or name) or `filename` choose the span by the tree-sitter rules; `drafts` streams the
canvas as it locks; `min_tokens` (Mistral's) bars the end of the fill before that many
tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fill_server.errors import bad_request

Dialect = Literal["completions", "fim", "infill"]
MAX_TOKENS = 4096  # the most a request may ask for; the model's own limit clamps it further
MAX_CANDIDATES = 16  # n: a batch of B canvases costs B times the memory of one
MAX_STOPS = 16  # stop strings per request ...
MAX_STOP_CHARS = 256  # ... each at most this long
MAX_EXTRA_FILES = 64  # llama.cpp's input_extra chunks
MAX_NAME_CHARS = 1024  # a file or language name, a user or document key
MAX_DEADLINE_MS = 600_000
MAX_LOGPROBS = 5  # OpenAI's limit for `logprobs`; the engine keeps no alternatives, so any k lists the chosen token


@dataclass(frozen=True)
class FillAsk:
    """One fill as every endpoint asks for it."""

    prefix: str
    suffix: str = ""
    max_tokens: int | None = None  # None: the span's budget (or the model's default)
    min_tokens: int | None = None
    temperature: float = 0.0  # how hot the alternatives (n > 1) are sampled; the first is greedy
    n: int = 1
    stop: tuple[str, ...] = ()
    stream: bool = False
    drafts: bool = False  # stream the canvas drafts as they lock
    language: str | None = None
    filename: str | None = None
    user: str | None = None  # OpenAI's `user`: a newer request with the same one supersedes this
    seed: int | None = None
    extra_files: tuple[tuple[str, str], ...] = ()  # llama.cpp's input_extra: (filename, text)
    deadline_ms: int | None = None  # llama.cpp's t_max_predict_ms: stop with what there is
    logprobs: int | None = None  # OpenAI's logprobs, llama.cpp's n_probs: return the tokens' (None: not asked)


# ------------------------------------------------------------------ field parsers

Parser = Callable[[str, Any], Any]


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise bad_request(f"'{name}' must be a string", name)
    return value


def _text_or_none(name: str, value: Any) -> str:
    return "" if value is None else _text(name, value)


def _name(name: str, value: Any) -> str | None:
    if value is None:
        return None
    text = _text(name, value)
    if len(text) > MAX_NAME_CHARS:
        raise bad_request(f"'{name}' is longer than {MAX_NAME_CHARS} characters", name)
    return text


def _bool(name: str, value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be true or false", name)
    return value


def _int(lo: int, hi: int) -> Parser:
    def parse(name: str, value: Any) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad_request(f"'{name}' must be an integer", name)
        if not lo <= value <= hi:
            raise bad_request(f"'{name}' must be in {lo}..{hi}; got {value}", name)
        return value

    return parse


def _clamped(lo: int, hi: int) -> Parser:
    """An integer from `lo` up, any above `hi` taken as `hi` (a field whose client may ask for
    more than is kept, and loses nothing by getting less)."""
    at_least = _int(lo, 2**63 - 1)

    def parse(name: str, value: Any) -> int | None:
        got = at_least(name, value)
        return None if got is None else min(got, hi)

    return parse


def _number(lo: float, hi: float) -> Parser:
    def parse(name: str, value: Any) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise bad_request(f"'{name}' must be a number", name)
        if not lo <= value <= hi:
            raise bad_request(f"'{name}' must be in {lo:g}..{hi:g}; got {value:g}", name)
        return float(value)

    return parse


def _stop(name: str, value: Any) -> tuple[str, ...]:
    items = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise bad_request(f"'{name}' must be a string or a list of strings", name)
    if len(items) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in items):
        raise bad_request(f"'{name}' takes at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters", name)
    return tuple(s for s in items if s)


def _extra(name: str, value: Any) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    ok = isinstance(value, list) and len(value) <= MAX_EXTRA_FILES
    ok = ok and all(isinstance(c, dict) and isinstance(c.get("text", ""), str) for c in value)
    ok = ok and all(isinstance(c.get("filename", ""), str) for c in value)
    if not ok:
        raise bad_request(f"'{name}' must be a list of at most {MAX_EXTRA_FILES} {{filename, text}} objects", name)
    return tuple((str(c.get("filename", "")), str(c.get("text", ""))) for c in value)


def _default_only(default: Any, what: str) -> Parser:
    """A field this server accepts only at its default (what it does not implement)."""

    def parse(name: str, value: Any) -> None:
        if value is not None and value != default:
            raise bad_request(f"'{name}' is not supported by this server ({what})", name)

    return parse


# ------------------------------------------------------------------ the endpoints' tables

# the fields every fill endpoint reads: FillAsk's name -> parser
SHARED: dict[str, Parser] = {
    "model": _name,  # any name: one model is served (GET /v1/models names it)
    "temperature": _number(0.0, 2.0),
    "n": _int(1, MAX_CANDIDATES),
    "stop": _stop,
    "stream": _bool,
    "user": _name,
    "seed": _int(0, 2**63 - 1),
    "language": _name,
    "filename": _name,
    "drafts": _bool,
    "min_tokens": _int(0, MAX_TOKENS),
}
OPENAI: dict[str, Parser] = {
    **SHARED,
    "prompt": _text,
    "suffix": _text_or_none,
    "max_tokens": _int(1, MAX_TOKENS),
    "echo": _default_only(False, "the prompt is not echoed"),
    "logprobs": _int(0, MAX_LOGPROBS),
    "best_of": _default_only(1, "no server-side best-of"),
}
FIELDS: dict[Dialect, dict[str, Parser]] = {
    "completions": OPENAI,
    "fim": {**OPENAI, "random_seed": _int(0, 2**63 - 1)},  # Mistral's name for the seed
    "infill": {
        **SHARED,
        "input_prefix": _text_or_none,
        "input_suffix": _text_or_none,
        "input_extra": _extra,
        "prompt": _text_or_none,  # llama.cpp: the start of the middle, after input_prefix
        "n_predict": _int(-1, MAX_TOKENS),  # -1: no limit of the client's (the span's budget)
        "max_tokens": _int(1, MAX_TOKENS),
        "t_max_predict_ms": _int(0, MAX_DEADLINE_MS),
        "n_probs": _clamped(0, MAX_LOGPROBS),  # 0: none (llama.cpp's meaning); llama.cpp takes more
    },
}
# sent by the clients docs/serve.md names (Continue, Zed, minuet-ai.nvim, llama.vscode,
# the openai package) and accepted without effect
IGNORED: dict[Dialect, frozenset[str]] = {
    "completions": frozenset(
        {"top_p", "frequency_penalty", "presence_penalty", "logit_bias", "stream_options", "metadata", "store"}
    ),
    "fim": frozenset({"top_p", "frequency_penalty", "presence_penalty", "stream_options", "metadata"}),
    "infill": frozenset(
        [
            "cache_prompt",
            "samplers",
            "top_k",
            "top_p",
            "min_p",
            "typical_p",
            "t_max_prompt_ms",
            "response_fields",
            "n_indent",
            "id_slot",
            "repeat_penalty",
            "repeat_last_n",
            "presence_penalty",
            "frequency_penalty",
            "dry_multiplier",
            "xtc_probability",
            "return_tokens",
            "timings_per_token",
            "post_sampling_probs",
            "n_keep",
            "tokens",
        ]
    ),
}
REQUIRED: dict[Dialect, tuple[str, ...]] = {"completions": ("prompt",), "fim": ("prompt",), "infill": ()}


def parse_fields(body: Any, dialect: Dialect, allow_unknown: bool = False) -> dict[str, Any]:
    """The fields of `body` that `dialect` reads, each checked (a 400 names the first
    field at fault); unknown fields refused unless `allow_unknown`."""
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    table, ignored = FIELDS[dialect], IGNORED[dialect]
    unknown = sorted(k for k in body if k not in table and k not in ignored)
    if unknown and not allow_unknown:
        raise bad_request(f"unknown field '{unknown[0]}'", unknown[0])
    for name in REQUIRED[dialect]:
        if name not in body:
            raise bad_request(f"'{name}' is required", name)
    return {name: parse(name, body.get(name)) for name, parse in table.items()}


def fill_ask(body: Any, dialect: Dialect, allow_unknown: bool = False) -> FillAsk:
    """The `FillAsk` a request's JSON body makes, or a 400 naming the field at fault."""
    f = parse_fields(body, dialect, allow_unknown)
    if dialect == "infill":
        prefix, suffix = f["input_prefix"] + f["prompt"], f["input_suffix"]
        budget = f["max_tokens"] if f["n_predict"] in (None, -1) else f["n_predict"]
        if budget == 0:
            raise bad_request("'n_predict' must be -1 or at least 1", "n_predict")
        logprobs = f["n_probs"] or None
    else:
        prefix, suffix, budget, logprobs = f["prompt"], f["suffix"], f["max_tokens"], f["logprobs"]
    if f["min_tokens"] is not None and budget is not None and f["min_tokens"] > budget:
        raise bad_request("'min_tokens' is more than the fill's budget", "min_tokens")
    seed = f.get("random_seed") if f["seed"] is None else f["seed"]
    return FillAsk(
        prefix=prefix,
        suffix=suffix,
        max_tokens=budget,
        min_tokens=f["min_tokens"],
        temperature=f["temperature"] or 0.0,
        n=f["n"] or 1,
        stop=f["stop"],
        stream=f["stream"],
        drafts=f["drafts"],
        language=f["language"],
        filename=f["filename"],
        user=f["user"],
        seed=seed,
        extra_files=f.get("input_extra", ()),
        deadline_ms=f.get("t_max_predict_ms"),
        logprobs=logprobs,
    )


def known_fields(dialect: Dialect) -> Mapping[str, Parser]:
    """The fields `dialect` reads (for the docs and tests)."""
    return FIELDS[dialect]
