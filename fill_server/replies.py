"""An `Outcome` as each endpoint's clients read it: whole JSON replies and the events of
a stream.

- `/v1/completions`: OpenAI's text completion (`choices[].text`, `finish_reason`, `usage`).
- `/v1/fim/completions`: the same, each choice also as Mistral's chat-shaped
  `message.content` (stream: `delta.content`), so clients of either form read it.
- `/infill`: llama.cpp's (`content`, `index`, `stop`, `stop_type`, `tokens_predicted`);
  a list of objects for n > 1, as the project's llama-infill dialect reads it.

Streams: the final text of each choice comes in one event, when the engine has checked
it. The engine's candidates are not a left-to-right stream of tokens (a canvas locks
positions anywhere, and the syntax check may cut a fill at the end), so a delta sent
early could not be taken back. A client that wants to watch the fill form asks for
`drafts`: each draft is then an event with the whole text so far in `draft` (and no
`text`/`content`, so a client that reads only those sees nothing of it).
Every reply carries the engine's own account in a `diffusion` object (span, steps,
stop reason, fill time, warnings). Asked for (`logprobs`, `n_probs`), each choice carries
its tokens' log-probabilities: OpenAI's legacy `logprobs` object, or llama.cpp's
`completion_probabilities` (fill_server.logprobs), in the event with its text.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fill_server import logprobs
from fill_server.filling import Outcome
from fill_server.schema import Dialect

STOP_TYPES = {"stop": "eos", "length": "limit"}  # OpenAI's finish_reason -> llama.cpp's stop_type


def completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex[:24]}"


def _usage(o: Outcome) -> dict[str, int]:
    return {
        "prompt_tokens": o.prompt_tokens,
        "completion_tokens": o.completion_tokens,
        "total_tokens": o.prompt_tokens + o.completion_tokens,
    }


def _head(dialect: Dialect, rid: str, model: str, chunk: bool) -> dict[str, Any]:
    kind = "text_completion" if dialect == "completions" else "chat.completion.chunk" if chunk else "chat.completion"
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model}


def _choice(dialect: Dialect, o: Outcome, i: int, chunk: bool) -> dict[str, Any]:
    text = o.texts[i]
    lp = logprobs.openai(o.logprobs[i]) if o.logprobs is not None else None
    choice: dict[str, Any] = {"index": i, "text": text, "finish_reason": o.finish[i], "logprobs": lp}
    if dialect == "fim":
        choice["delta" if chunk else "message"] = {"role": "assistant", "content": text}
    return choice


def _infill(o: Outcome, i: int, model: str) -> dict[str, Any]:
    lp = o.logprobs[i] if o.logprobs is not None else None
    probs = {"completion_probabilities": logprobs.llama(lp)} if lp is not None else {}
    return {
        "index": i,
        "content": o.texts[i],
        "stop": True,
        "stop_type": STOP_TYPES[o.finish[i]],
        "model": model,
        "tokens_predicted": o.completion_tokens if len(o.texts) == 1 else None,
        "tokens_evaluated": o.prompt_tokens,
        "truncated": False,
        **probs,
        "diffusion": o.extension(),
    }


def whole(dialect: Dialect, o: Outcome, model: str, rid: str) -> Any:
    """The whole reply's JSON value."""
    if dialect == "infill":
        items = [_infill(o, i, model) for i in range(len(o.texts))]
        return items[0] if len(items) == 1 else items
    choices = [_choice(dialect, o, i, chunk=False) for i in range(len(o.texts))]
    return {
        **_head(dialect, rid, model, chunk=False),
        "choices": choices,
        "usage": _usage(o),
        "diffusion": o.extension(),
    }


def final_events(dialect: Dialect, o: Outcome, model: str, rid: str) -> list[Any]:
    """A stream's last events: each choice's text with its end (and [DONE] for OpenAI's forms)."""
    if dialect == "infill":
        return [_infill(o, i, model) for i in range(len(o.texts))]
    events: list[Any] = [
        {**_head(dialect, rid, model, chunk=True), "choices": [_choice(dialect, o, i, chunk=True)]}
        for i in range(len(o.texts))
    ]
    events[-1] = {**events[-1], "usage": _usage(o), "diffusion": o.extension()}
    return [*events, "[DONE]"]


def draft_event(dialect: Dialect, step: int, texts: list[str], model: str, rid: str) -> list[Any]:
    """The events of one draft: each candidate's whole text so far, as `draft`."""
    if dialect == "infill":
        return [{"index": i, "draft": t, "step": step, "stop": False} for i, t in enumerate(texts)]
    choices = [{"index": i, "draft": t, "step": step, "finish_reason": None} for i, t in enumerate(texts)]
    return [{**_head(dialect, rid, model, chunk=True), "object": "text_completion.draft", "choices": choices}]
