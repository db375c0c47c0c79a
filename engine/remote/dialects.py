"""What each inference server speaks: one small object per dialect, and the table of them.

A dialect says how a fill is asked for (the request body and the default path), how its
candidates are read back (a whole reply's JSON, and a streamed event's pieces, each with
the log-probabilities of its tokens where the server sends them), what it takes (`n`
candidates, a `stop`, repository context, a field that asks for log-probabilities) and
how an answer becomes the fill (chat answers are taken apart). It holds no I/O: engine.remote.wire moves the bytes, and
engine.remote.generator puts the two together. docs/remote.md says what each one sends.

Adding a dialect is one class here and one row in `BY_NAME` (and its name in
`DialectName`, the type checker's list, which an import-time check keeps equal to the
table).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Literal, get_args

from engine.decoding import CANDIDATE_TEMPERATURE
from engine.remote import chat
from engine.remote.wire import BadReply, Piece, Written
from engine.spans import language_for

DialectName = Literal["vllm", "openai-fim", "llama-infill", "chat"]
CHAT_SLACK_TOKENS = 16  # a chat answer's code fence and language tag, on top of the fill's budget
# DiffusionGemma's infill tokens (engine.models.directory.DG_SPECIAL_TOKENS), in the order infill puts them
FIM_TOKENS = ("<|fim_suffix|>", "<|fim_prefix|>", "<|fim_middle|>")


@dataclass(frozen=True)
class Ask:
    """One fill as every dialect asks for it: the code around the cursor (already cut to
    the context budget), the token budget, how many candidates, and what else is known."""

    prefix: str
    suffix: str
    budget: int  # tokens the fill may take (the span's)
    n: int = 1  # candidates
    single_line: bool = False  # the span is (the rest of) one line
    language: str | None = None
    span: str | None = None  # the span's kind (engine.spans), for a dialect that says it in words
    extra_files: list[tuple[str, str]] = field(default_factory=list)  # (name, text): repository context
    deadline: float | None = None  # time.monotonic() by which the fill must be back
    model: str | None = None  # the served model's name, sent as `model`
    fim_tokens: tuple[str, str, str] = FIM_TOKENS  # suffix, prefix, middle: for a prompt rendered here
    logprobs: bool = False  # ask for the tokens' log-probabilities (the fill's confidence)

    @property
    def stop(self) -> list[str] | None:
        """A one-line span ends at the line's end (unless the cursor is at a line start)."""
        return ["\n"] if self.single_line and not self.prefix.endswith(("\n", "\r")) else None

    @property
    def temperature(self) -> float:
        """Alternatives are sampled; a single fill is greedy."""
        return CANDIDATE_TEMPERATURE if self.n > 1 else 0.0


class Dialect:
    """An OpenAI-style completions dialect; the others override what differs."""

    path: ClassVar[str] = "/v1/completions"  # the request path when the settings name none
    budget_field: ClassVar[str] = "max_tokens"
    budget_slack: ClassVar[int] = 0  # tokens asked for on top of the span's budget
    takes_n: ClassVar[bool] = True  # asks for several candidates with `n`
    takes_stop: ClassVar[bool] = True  # sends `stop` for a one-line span
    takes_extra_files: ClassVar[bool] = False  # sends other files as repository context
    # ... and may send them ahead, in a request that writes nothing, for the server's prompt
    # cache (llama.cpp's server, as llama.vim does; not an API that bills a request)
    warms: ClassVar[bool] = False
    whole_when_all_stopped: ClassVar[bool] = False  # its stream sends no [DONE]
    # the fields that ask for the tokens' log-probabilities (empty: the dialect never asks;
    # docs/confidence.md)
    logprobs_fields: ClassVar[Mapping[str, Any]] = MappingProxyType({"logprobs": 1})

    def asks_logprobs(self, switch: bool | None) -> bool:
        """Whether a request asks for log-probabilities: as the endpoint's switch says
        (None: `auto`, yes until the endpoint refuses the field: engine.remote.generator),
        never where the dialect cannot."""
        return bool(self.logprobs_fields) and switch is not False

    def prompt(self, ask: Ask) -> dict[str, Any]:
        """The fields that carry the code around the cursor."""
        raise NotImplementedError

    def options(self, ask: Ask) -> dict[str, Any]:
        """Fields of the dialect's own, after the shared ones."""
        return {}

    def body(self, ask: Ask) -> dict[str, Any]:
        """The request's JSON body; every request streams (engine.remote.wire says why)."""
        body = self.prompt(ask)
        body[self.budget_field] = ask.budget + self.budget_slack
        body.update(temperature=ask.temperature, stream=True)
        if self.takes_n and ask.n > 1:
            body["n"] = ask.n
        if ask.logprobs:
            body.update(self.logprobs_fields)
        body.update(self.options(ask))
        if self.takes_stop and ask.stop:
            body["stop"] = ask.stop
        if ask.model:
            body["model"] = ask.model
        return body

    def written(self, reply: Any, n: int) -> list[Written]:
        """The candidates of a whole reply: its `choices`, placed by their `index`."""
        choices = reply.get("choices") if isinstance(reply, dict) else None
        return _choices_written(choices, n, self.choice_text, self.choice_logprobs)

    def choice_text(self, choice: Any) -> str | None:
        """A whole reply's choice's text (None: it has none)."""
        return choice["text"] if isinstance(choice, dict) and isinstance(choice.get("text"), str) else None

    def delta_text(self, choice: dict[str, Any]) -> Any:
        """A streamed choice's piece of text (None or "": none)."""
        return choice.get("text")

    def choice_logprobs(self, choice: Any) -> list[float] | None:
        """A choice's tokens' log-probabilities (a streamed choice's: its own tokens'):
        OpenAI's `logprobs.token_logprobs` (vLLM's too), or `logprobs.content[].logprob`
        as llama.cpp's OpenAI route sends them; None: none, or not readable."""
        lp = choice.get("logprobs") if isinstance(choice, dict) else None
        if not isinstance(lp, dict):
            return None
        if "token_logprobs" in lp:
            return logprob_values(lp["token_logprobs"])
        content = lp.get("content")
        if not isinstance(content, list) or not all(isinstance(e, dict) and "logprob" in e for e in content):
            return None
        return logprob_values([e["logprob"] for e in content])

    def pieces(self, chunk: dict[str, Any]) -> Iterator[Piece]:
        """The pieces of one streamed event: its choices, ended at their finish_reason."""
        for k, c in enumerate(chunk.get("choices") or []):
            if isinstance(c, dict):
                i = c.get("index", k)
                text, ended = str(self.delta_text(c) or ""), c.get("finish_reason") is not None
                yield Piece((i if isinstance(i, int) else k), text, ended, self.choice_logprobs(c))

    def answer(self, text: str, ask: Ask) -> str:
        """The fill a candidate's text holds (a draft's too)."""
        return text


class Vllm(Dialect):
    """vLLM serving DiffusionGemma: the prompt rendered as the local path renders it,
    suffix first (vLLM refuses a `suffix` field for diffusion models)."""

    def prompt(self, ask: Ask) -> dict[str, Any]:
        suf, pre, mid = ask.fim_tokens
        return {"prompt": f"{suf}{ask.suffix}{pre}{ask.prefix}{mid}"}


class OpenAIFim(Dialect):
    """OpenAI-style FIM: `prompt` and `suffix` (`/v1/completions`, or a hosted FIM path);
    repository context goes before the prefix in the prompt, each piece after a comment
    line that names its file (`labelled`), as hosted FIM APIs take it (they have no field
    for it)."""

    takes_extra_files = True

    def prompt(self, ask: Ask) -> dict[str, Any]:
        return {"prompt": labelled(ask.extra_files, ask.language) + ask.prefix, "suffix": ask.suffix}


def labelled(files: Sequence[tuple[str, str]], language: str | None) -> str:
    """Repository context as code: each piece after a line comment naming its file (in the
    language's comment syntax; `#` where it has none)."""
    mark = (language_for(language).line_comment if language else "") or "#"
    return "".join(f"{mark} {path}\n{text.rstrip(chr(10))}\n\n" for path, text in files)


class LlamaInfill(Dialect):
    """llama.cpp's `llama-server` `/infill`: its own fields, repository context, a time
    limit; replies carry `content`, and its stream interleaves the `n` candidates by
    `index`, each ended by its own `stop`, with no [DONE]. `n_probs` asks for each
    token's probability (`completion_probabilities`)."""

    path = "/infill"
    budget_field = "n_predict"
    takes_extra_files = True
    warms = True
    whole_when_all_stopped = True
    logprobs_fields = MappingProxyType({"n_probs": 1})

    def prompt(self, ask: Ask) -> dict[str, Any]:
        return {
            "input_prefix": ask.prefix,
            "input_suffix": ask.suffix,
            "input_extra": [{"filename": name, "text": text} for name, text in ask.extra_files],
        }

    def options(self, ask: Ask) -> dict[str, Any]:
        options: dict[str, Any] = {"cache_prompt": True}
        if ask.deadline is not None:
            options["t_max_predict_ms"] = max(1, int((ask.deadline - time.monotonic()) * 1000))
        return options

    def written(self, reply: Any, n: int) -> list[Written]:
        """One object, or a list of them (n > 1), with `content`."""
        items = reply if isinstance(reply, list) else [reply]
        if not items or not all(isinstance(r, dict) and isinstance(r.get("content"), str) for r in items):
            raise BadReply("sent a reply without content")
        return super().written(
            {"choices": [{**r, "index": r.get("index", k), "text": r["content"]} for k, r in enumerate(items)]}, n
        )

    def choice_logprobs(self, choice: Any) -> list[float] | None:
        """`completion_probabilities`: each token's `logprob` (llama.cpp's format since
        late 2024), its `prob` (with `post_sampling_probs`), or, from older builds, the
        `prob` of the chosen token (`content`) among its `probs`."""
        probs = choice.get("completion_probabilities") if isinstance(choice, dict) else None
        if not isinstance(probs, list) or not all(isinstance(e, dict) for e in probs):
            return None
        return logprob_values([_llama_logprob(e) for e in probs])

    def pieces(self, chunk: dict[str, Any]) -> Iterator[Piece]:
        i = chunk.get("index", 0)
        text, ended = str(chunk.get("content", "")), bool(chunk.get("stop", False))
        yield Piece((i if isinstance(i, int) else 0), text, ended, self.choice_logprobs(chunk))


class Chat(Dialect):
    """OpenAI-compatible `/v1/chat/completions`: the fill asked for in words with a hole
    marker (engine.remote.chat), the answer's `message` / streamed `delta` content taken
    apart to the code for the hole. No `stop`: a chat answer may open with a fence. No
    log-probabilities: the fill is cut out of an answer, whose tokens' are not the fill's."""

    path = "/v1/chat/completions"
    budget_slack = CHAT_SLACK_TOKENS
    takes_stop = False
    logprobs_fields: ClassVar[Mapping[str, Any]] = MappingProxyType({})

    def choice_logprobs(self, choice: Any) -> list[float] | None:
        return None

    def prompt(self, ask: Ask) -> dict[str, Any]:
        return {"messages": chat.messages(ask.prefix, ask.suffix, ask.language, ask.span, ask.single_line)}

    def choice_text(self, choice: Any) -> str | None:
        """The message's `content` (None, as a model that says nothing sends it, is an empty answer)."""
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            return None
        content = message.get("content")
        return content if isinstance(content, str) else "" if content is None else None

    def delta_text(self, choice: dict[str, Any]) -> Any:
        """The message's piece: `delta.content`."""
        delta = choice.get("delta")
        return delta.get("content") if isinstance(delta, dict) else None

    def answer(self, text: str, ask: Ask) -> str:
        return chat.extract_fill(text, ask.prefix, ask.suffix)


BY_NAME: dict[DialectName, Dialect] = {
    "vllm": Vllm(),
    "openai-fim": OpenAIFim(),
    "llama-infill": LlamaInfill(),
    "chat": Chat(),
}
DIALECTS: tuple[DialectName, ...] = tuple(BY_NAME)  # the names, in the order the settings list them
assert set(get_args(DialectName)) == set(BY_NAME), "DialectName and BY_NAME name different dialects"


def _choices_written(
    choices: Any, n: int, text_of: Callable[[Any], str | None], logprobs_of: Callable[[Any], list[float] | None]
) -> list[Written]:
    """The first `n` choices, each at its `index` (its place in the list without one)."""
    if not isinstance(choices, list):
        raise BadReply("sent a reply without choices")
    if not choices:
        raise BadReply("sent no choices")
    written = [Written("")] * len(choices)
    for k, c in enumerate(choices):
        text = text_of(c)
        if text is None:
            raise BadReply("sent a choice without text")
        i = c.get("index", k)
        written[i if isinstance(i, int) and 0 <= i < len(written) else k] = Written(text, logprobs_of(c))
    return written[:n]


LOGPROB_SLACK = 1e-3  # a log-probability this far above 0 is rounding (read as 0); further is not one


def logprob_values(values: Any) -> list[float] | None:
    """Log-probabilities as a server sent them: numbers up to 0 (-inf included; a None, a
    prompt token's that some servers send first, skipped); None when the list holds
    anything else (a malformed reply gives no confidence, never a fault)."""
    if not isinstance(values, list):
        return None
    out: list[float] = []
    for v in values:
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v) or v > LOGPROB_SLACK:
            return None
        out.append(min(0.0, float(v)))
    return out


def _llama_logprob(entry: dict[str, Any]) -> Any:
    """One `completion_probabilities` entry's log-probability (NaN: none there)."""
    if "logprob" in entry:
        return entry["logprob"]
    prob: Any = entry.get("prob")
    top = entry.get("probs")
    if prob is None and isinstance(top, list):  # an older build: the chosen token among the top `probs`
        chosen = [p.get("prob") for p in top if isinstance(p, dict) and p.get("tok_str") == entry.get("content")]
        prob = chosen[0] if chosen else None
    if isinstance(prob, bool) or not isinstance(prob, int | float) or not 0 <= prob <= 1:
        return math.nan
    return math.log(prob) if prob > 0 else -math.inf
