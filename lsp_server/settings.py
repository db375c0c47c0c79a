"""Server settings: nested, fully defaulted dataclasses read from initializationOptions and
workspace/configuration (section `diffusionLsp`). An invalid value is reported (by name)
and its default used; unknown keys are ignored.

`OPTIONS` is the one description of every setting: its key on the wire, its type, its
range or choices and its meaning. Validation is derived from it; `SCHEMA` is it as JSON
Schema, built once at import from `schema_property`, which VS Code's package.json uses too;
and `python -m lsp_server.gen_settings` writes every editor client's copy from it (VS
Code's package.json and config.ts, the Emacs defcustoms, the Neovim help) and the settings
tables of the docs; `--check` (in CI and tests/unit/test_settings_schema.py) fails
when one is stale. A new setting is a field of `Settings` and an `Option` here, then that
command.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from engine.decoding import STRATEGIES
from engine.models.table import BACKENDS, QUANTIZATIONS, kinds, quantized_rows
from engine.remote.generator import DIALECTS


@dataclass(frozen=True)
class Settings:
    model: str | None = None  # model directory; None: the shipped model
    backend: str = "auto"
    device: str = "cpu"
    strategy: str | None = None  # None: the model's default
    max_steps: int | None = None
    max_fill_tokens: int | None = None  # cap on the canvas, whose length comes from the span
    context_tokens: int | None = None
    debounce_ms: int = 0
    deadline_ms: int = 2000  # a fill stops denoising this long after it starts and returns what it has
    alternatives: int = 3  # candidates when the user asks (triggerKind Invoked)
    min_confidence: float | str = "auto"  # Automatic ghost text below this is held back; "auto": the model's
    edit_margin: float | str = "auto"  # nats an in-line edit must make the text more likely by; "auto": engine.edits'
    languages: list[str] = field(default_factory=list)  # empty: all languages
    drafts: bool = False
    fill_ahead: bool = True  # while a suggestion is shown, fill as if it were accepted (Tab, Tab)
    one_line_while_typing: bool = True  # ghost text shown unasked is one line; the next comes after Tab
    end_where_unsure: bool = True  # ghost text shown unasked ends before its first token below minConfidence
    middle_priming: bool = True  # the cursor's line as the fill's start: a keystroke appends to the cached context
    repository_context: bool = True  # other open files and the files this one imports, in each fill
    encode_when_idle: bool = True  # repository context chosen at a pause is encoded then, not by the next keystroke
    quantization: str = "none"  # the transformers backends' checkpoints: "int8" or "4bit" weights
    # a remote engine (docs/remote.md): set `endpoint` and the fills come from it
    endpoint: str | None = None  # http(s) URL of the inference server; None: the local model
    dialect: str = "vllm"
    remote_model: str | None = None  # the served model's name
    endpoint_path: str | None = None  # None: the dialect's path
    api_key_env: str | None = None  # the environment variable holding the API key (never the key)
    logprobs: str = "auto"  # ask the endpoint for log-probabilities (a fill's confidence): auto, on, off
    request_timeout_ms: int = 10000
    tls_verify: bool = True


# settings whose change means loading the engine again
ENGINE_FIELDS = (
    "model",
    "backend",
    "device",
    "quantization",
    "endpoint",
    "dialect",
    "remote_model",
    "endpoint_path",
    "api_key_env",
    "logprobs",
    "request_timeout_ms",
    "tls_verify",
)


def engine_changed(old: Settings, new: Settings) -> bool:
    return any(getattr(old, f) != getattr(new, f) for f in ENGINE_FIELDS)


# the `logprobs` setting as the remote engine takes it (RemoteConfig.logprobs; None: the dialect's default)
LOGPROBS_SWITCH: dict[str, bool | None] = {"auto": None, "on": True, "off": False}


# "threshold": `auto` (the model's value) or a number in minimum..maximum
Kind = Literal["integer", "string", "boolean", "strings", "threshold"]
AUTO = "auto"
Client = Literal["vscode", "emacs", "nvim"]


@dataclass(frozen=True)
class Option:
    """One setting: `name` is the Settings field, `key` its name on the wire.

    The editor clients and the docs are generated from these (lsp_server/gen_settings.py):
    `description` is one or two sentences of plain text in which `code` may be quoted with
    backticks; it says neither the range, the choices nor what unset means, which every
    client words its own way from `minimum`, `maximum`, `choices` and `unset`."""

    name: str
    key: str
    kind: Kind
    nullable: bool = False  # None (unset) is allowed: the model's or the span's value
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] | None = None
    description: str = ""
    unset: str = ""  # what None means, a phrase after "unset:" (e.g. "the shipped model"); nullable options only
    remote: bool = False  # a setting of the remote engine (docs/remote.md)
    path: bool = False  # a directory on the user's machine: clients that can expand `~` do (Emacs)
    # a default a client chooses for its users on purpose, unlike the server's (VS Code shows drafts)
    client_defaults: tuple[tuple[Client, Any], ...] = ()


OPTIONS: tuple[Option, ...] = (
    Option(
        "model",
        "model",
        "string",
        nullable=True,
        description=f"Model directory, holding one of these checkpoints (the backend that runs it): {kinds()}.",
        unset="the shipped model",
        path=True,
    ),
    Option("backend", "backend", "string", choices=BACKENDS, description="Inference backend."),
    Option("device", "device", "string", description="Device: `cpu`, `cuda` or `cuda:N`."),
    Option(
        "quantization",
        "quantization",
        "string",
        choices=QUANTIZATIONS,
        description=(
            f"Weights in {' or '.join(f'`{q}`' for q in QUANTIZATIONS[1:])} (a mixture's experts included), for a GPU"
            f" that cannot hold the checkpoint in bfloat16. For these checkpoints: {kinds(quantized_rows(), False)}."
            " The memory needed is checked before loading (docs/gpu.md)."
        ),
    ),
    Option(
        "strategy",
        "strategy",
        "string",
        nullable=True,
        choices=STRATEGIES,
        description=(
            "Decoding strategy. `left_to_right` decodes one canvas token per step, `autoregressive` one token at"
            ' a time through the context encoder (for models trained for it: config.json `"autoregressive": true`),'
            " `verified` drafts on the canvas and keeps what the one-token mode of the same weights agrees with"
            " (its greedy fill, in fewer passes when the drafts are good)."
        ),
        unset="the model's default",
    ),
    Option(
        "max_steps",
        "maxSteps",
        "integer",
        True,
        1,
        1024,
        description="Most denoising steps per fill.",
        unset="the model's default",
    ),
    Option(
        "max_fill_tokens",
        "maxFillTokens",
        "integer",
        True,
        1,
        256,
        description=(
            "Cap on a fill's canvas (tokens). Its length comes from the syntax span: 32 for a line, 64 for"
            " prose, 128 for a body or a hole, enough for the text a rewrite replaces."
        ),
        unset="no cap",
    ),
    Option(
        "context_tokens",
        "contextTokens",
        "integer",
        True,
        16,
        1 << 20,
        description="Context tokens around the cursor given to the model (a remote engine gets about 4"
        " characters a token).",
        unset="the model's default",
    ),
    Option(
        "debounce_ms",
        "debounceMs",
        "integer",
        minimum=0,
        maximum=5000,
        description="Server-side wait (ms) before an automatic fill starts. A newer request in that time replaces it.",
    ),
    Option(
        "deadline_ms",
        "deadlineMs",
        "integer",
        minimum=50,
        maximum=60000,
        description=(
            "A completion stops denoising this long (ms) after it starts. It answers with what it has then;"
            " code-action commands run to their end."
        ),
    ),
    Option(
        "alternatives",
        "alternatives",
        "integer",
        minimum=1,
        maximum=8,
        description="Candidates asked for when you trigger a suggestion explicitly.",
    ),
    Option(
        "min_confidence",
        "minConfidence",
        "threshold",
        minimum=0,
        maximum=1,
        description=(
            "Ghost text that comes while you type is shown only as far as the model's confidence reaches this:"
            " it ends before its first token below it (`endWhereUnsure`; off: a fill below it is held back whole)."
            " `auto`: the model's calibrated threshold (docs/confidence.md); `0` shows every fill. A suggestion"
            " you ask for is always shown whole."
        ),
    ),
    Option(
        "edit_margin",
        "editMargin",
        "threshold",
        minimum=-100,
        maximum=100,
        description=(
            "How much more likely (in nats, natural-log units) the model must find the code with an in-line edit"
            " than without it before the edit is suggested (next edit, Refine selection). Higher: fewer, surer"
            " edits. `auto`: 3 for a fix the model finds itself, 1 for a change your last edit implies"
            " elsewhere (docs/server.md, Next edit). A negative number also shows edits the model does not prefer."
        ),
    ),
    Option("languages", "languages", "strings", description="Language ids the server fills; empty: all."),
    Option(
        "drafts",
        "drafts",
        "boolean",
        description=(
            "Show the fill as it forms. The server sends its intermediate denoising steps as `diffusion/draft`"
            " notifications, which the client shows as faded text at the cursor."
        ),
        client_defaults=(("vscode", True),),
    ),
    Option(
        "one_line_while_typing",
        "oneLineWhileTyping",
        "boolean",
        description=(
            "Ghost text that comes while you type is one line: it comes sooner, and is more often right to its"
            " end. The next line is made while it is on screen (`fillAhead`) and shown after Tab. Off: as many"
            " lines as the place allows. A suggestion you ask for is never cut."
        ),
    ),
    Option(
        "end_where_unsure",
        "endWhereUnsure",
        "boolean",
        description=(
            "Ghost text that comes while you type ends before its first token whose probability is below"
            " `minConfidence`, instead of being held back whole: what you see is what the model is sure of."
        ),
    ),
    Option(
        "middle_priming",
        "middlePriming",
        "boolean",
        description=(
            "Give the model the text typed on the cursor's line as the start of its fill, and let it spell the"
            " last, partial word its own way, so that a keystroke on the line re-reads only what was typed, not"
            " the code after the cursor: the ghost text comes several times sooner. For models that fill in the"
            " prefix-suffix-middle order one token at a time (Qwen2.5-Coder); off: the exact order, every"
            " keystroke."
        ),
    ),
    Option(
        "repository_context",
        "repositoryContext",
        "boolean",
        description=(
            "Give each fill pieces of your other files: the other open documents and the files the current one"
            " imports inside the workspace folders (never outside them, nothing ignored by `.gitignore`, binary or"
            " over 200 KB),"
            " the pieces most like the code around the cursor. For models with a format for it (Qwen2.5-Coder's"
            " repository layout) and remote engines that take it. Off: the current file alone."
        ),
    ),
    Option(
        "encode_when_idle",
        "encodeWhenIdle",
        "boolean",
        description=(
            "When you pause (2 seconds without typing), choose the repository context again for the cursor's place"
            " and encode it for the model then, in the idle time, so that no keystroke's suggestion waits for it"
            " (llama.vim does the same with its ring of chunks); the context changes once it is encoded, and"
            " typing stops the encoding at once. Off: the next keystroke's fill encodes it. For local models"
            " that take repository context, and for llama.cpp's server (dialect `llama-infill`), which is sent"
            " the pieces ahead in a request that writes nothing, for its prompt cache."
        ),
    ),
    Option(
        "fill_ahead",
        "fillAhead",
        "boolean",
        description=(
            "While a suggestion is on screen, make the next one in the idle time, as if it had been accepted,"
            " so that the suggestion after a Tab is there at once."
        ),
    ),
    Option(
        "endpoint",
        "endpoint",
        "string",
        nullable=True,
        description=(
            "URL of an inference server that the fills come from. A vLLM server, a hosted FIM API or llama-server,"
            " over `http://` or `https://`; a base path is kept (`https://host/api`). See docs/remote.md."
        ),
        unset="the local model",
        remote=True,
    ),
    Option(
        "dialect",
        "dialect",
        "string",
        choices=DIALECTS,
        description=(
            "What the endpoint speaks. `vllm`: a rendered prompt over /v1/completions; `openai-fim`: prompt and"
            " suffix; `llama-infill`: llama-server's /infill; `chat`: an OpenAI-compatible /v1/chat/completions"
            " (hosted endpoints that serve only chat), the fill asked for with a hole marker."
        ),
        remote=True,
    ),
    Option(
        "remote_model",
        "remoteModel",
        "string",
        nullable=True,
        description="The served model's name, sent as `model` with each request.",
        unset="no name sent",
        remote=True,
    ),
    Option(
        "endpoint_path",
        "endpointPath",
        "string",
        nullable=True,
        description="Request path on the endpoint, e.g. `/v1/fim/completions`.",
        unset="the dialect's (`/v1/completions`, `/infill`, `/v1/chat/completions`)",
        remote=True,
    ),
    Option(
        "api_key_env",
        "apiKeyEnv",
        "string",
        nullable=True,
        description=(
            "Name of the environment variable that holds the API key. It is sent as `Authorization: Bearer`; the"
            " key itself never goes in a settings file or a log."
        ),
        unset="no key",
        remote=True,
    ),
    Option(
        "logprobs",
        "logprobs",
        "string",
        choices=tuple(LOGPROBS_SWITCH),
        description=(
            "Ask the endpoint for the tokens' log-probabilities, which give a remote fill its confidence"
            " (minConfidence then holds back unsure ghost text, docs/confidence.md). `auto`: asked for until the"
            " endpoint refuses the field (then asked again without it, and never again); `on`: a refusal is an"
            " error; `chat` never asks."
        ),
        remote=True,
    ),
    Option(
        "request_timeout_ms",
        "requestTimeoutMs",
        "integer",
        minimum=100,
        maximum=600000,
        description="Wait (ms) for the endpoint to connect and for each piece of its reply.",
        remote=True,
    ),
    Option(
        "tls_verify",
        "tlsVerify",
        "boolean",
        description="Verify the endpoint's TLS certificate.",
        remote=True,
    ),
)
_BY_KEY = {o.key: o for o in OPTIONS}
_BY_NAME = {o.name: o for o in OPTIONS}
_DEFAULTS = Settings()


def _check(opt: Option, value: Any) -> str | None:
    """Why `value` is not valid for `opt`, or None."""
    if value is None and opt.nullable:
        return None
    if opt.kind == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool)
        ok = ok and (opt.minimum is None or value >= opt.minimum) and (opt.maximum is None or value <= opt.maximum)
        return None if ok else f"an integer in {opt.minimum}..{opt.maximum}"
    if opt.kind == "boolean":
        return None if isinstance(value, bool) else "true or false"
    if opt.kind == "threshold":
        ok = value == AUTO or (isinstance(value, (int, float)) and not isinstance(value, bool))
        ok = ok and (value == AUTO or opt.minimum is None or value >= opt.minimum)
        ok = ok and (value == AUTO or opt.maximum is None or value <= opt.maximum)
        return None if ok else f"`{AUTO}` or a number in {opt.minimum}..{opt.maximum}"
    if opt.kind == "strings":
        return None if isinstance(value, list) and all(isinstance(x, str) for x in value) else "a list of strings"
    if opt.choices is not None:
        return None if value in opt.choices else f"one of {', '.join(opt.choices)}"
    return None if isinstance(value, str) else "a string"


def schema_property(opt: Option, default: Any) -> dict[str, Any]:
    """One setting as a JSON Schema property (its type, choices, default and range; no
    description), with `default` as its default: the server's, or a client's own."""
    base = {"strings": "array"}.get(opt.kind, opt.kind)
    prop: dict[str, Any] = {"type": [base, "null"] if opt.nullable else base}
    if opt.kind == "threshold":  # JSON Schema: a pattern binds strings only, a range numbers only
        prop = {"type": ["string", "number"], "pattern": f"^{AUTO}$"}
    if opt.kind == "strings":
        prop["items"] = {"type": "string"}
    if opt.choices is not None:
        prop["enum"] = [*opt.choices, None] if opt.nullable else list(opt.choices)
    prop["default"] = list(default) if isinstance(default, list) else default
    if opt.minimum is not None:
        prop["minimum"] = opt.minimum
    if opt.maximum is not None:
        prop["maximum"] = opt.maximum
    return prop


# The settings as JSON Schema properties, keyed by their names on the wire; built once, here.
SCHEMA: dict[str, dict[str, Any]] = {
    opt.key: {**schema_property(opt, getattr(_DEFAULTS, opt.name)), "description": opt.description} for opt in OPTIONS
}


def parse_settings(raw: Any, base: Settings | None = None) -> tuple[Settings, list[str]]:
    """(settings, problems): each problem names the setting and what it should be.
    Keys are the wire names; the Settings field names are accepted too."""
    base = base or Settings()
    if raw is None:
        return base, []
    if not isinstance(raw, dict):
        return base, ["diffusionLsp settings must be an object; using the defaults"]
    raw = raw.get("diffusionLsp", raw)
    changes: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in raw.items():
        opt = _BY_KEY.get(key) or _BY_NAME.get(key)
        if opt is None:
            continue
        why = _check(opt, value)
        if why is not None:
            problems.append(f"diffusionLsp.{key} must be {why} (got {value!r}); using the default")
        else:
            changes[opt.name] = value
    return replace(base, **changes), problems
