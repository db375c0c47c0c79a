"""A fill's tokens' log-probabilities as the replies carry them (`logprobs` on the OpenAI
forms, `n_probs` on /infill; docs/serve.md).

The values are the engine's own: the candidate's `token_logprobs`, the numbers its
confidence was made from (engine.candidate.scored: one per token of the fill as the
model wrote it, end-of-fill's last when it ended there). So a client that takes the
minimum of them, as the project's remote dialects do, gets the confidence the engine
gave the fill, and gates it as the local engine would. Each token's text is the
tokenizer's text of its id; an entry past the tokens the candidate still holds (the
end-of-fill token, or tokens the syntax check cut away) has the text "" (and on /infill
the id -1). A fill cut at a `stop` string keeps the tokens up to the one the stop
string starts in, as vLLM's and llama.cpp's streams do; the end-of-fill token is then
not among them. The engine keeps no alternatives: `top_logprobs` carries the chosen
token only (null on the OpenAI forms when `logprobs` is 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from engine.candidate import Candidate
from engine.models.tokenizer import Tokenizer


@dataclass(frozen=True)
class TokenLogprobs:
    """One choice's tokens: their ids (None: not known), texts, log-probabilities and
    where each starts in the choice's text; `top`: whether the reply lists the chosen
    token as its only alternative."""

    ids: list[int | None]
    tokens: list[str]
    logprobs: list[float]
    offsets: list[int]
    top: bool


def token_logprobs(cand: Candidate, tok: Tokenizer | None, text: str, top: bool) -> TokenLogprobs | None:
    """The tokens of `cand` (as the engine gave it) for a choice whose text is `text`
    (`cand.text`, or its start where a stop string cut it); None: the engine gave no
    log-probabilities."""
    values = cand.token_logprobs
    if values is None:
        return None
    ids: list[int | None] = list(cand.token_ids[: len(values)])
    tokens = [tok.decode([i]) if tok is not None and i is not None else "" for i in ids]
    ids += [None] * (len(values) - len(ids))
    tokens += [""] * (len(values) - len(tokens))
    ends = list(accumulate(len(t) for t in tokens))
    written = "".join(tokens)
    # the indentation the engine's fit dropped from the fill's start (engine.fill.fit_indent)
    lead = max(0, _indent(written) - _indent(cand.text))
    ends = [e - lead for e in ends]
    keep = len(values)
    if len(text) < len(cand.text):  # cut at a stop string: up to the token it starts in
        keep = next((k + 1 for k, e in enumerate(ends) if e > len(text)), keep)
    starts = [min(len(text), max(0, e - len(t))) for e, t in zip(ends[:keep], tokens[:keep], strict=True)]
    return TokenLogprobs(ids[:keep], tokens[:keep], list(values[:keep]), starts, top)


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip(" \t"))


def openai(lp: TokenLogprobs | None) -> dict[str, Any] | None:
    """OpenAI's legacy completions `logprobs` object (None: null)."""
    if lp is None:
        return None
    top = [{t: v} for t, v in zip(lp.tokens, lp.logprobs, strict=True)] if lp.top else None
    return {"tokens": lp.tokens, "token_logprobs": lp.logprobs, "top_logprobs": top, "text_offset": lp.offsets}


def llama(lp: TokenLogprobs) -> list[dict[str, Any]]:
    """llama.cpp's `completion_probabilities`: each token's `logprob` and its top list."""
    out = []
    for i, t, v in zip(lp.ids, lp.tokens, lp.logprobs, strict=True):
        entry: dict[str, Any] = {"id": -1 if i is None else i, "token": t, "bytes": list(t.encode()), "logprob": v}
        out.append({**entry, "top_logprobs": [dict(entry)] if lp.top else []})
    return out
