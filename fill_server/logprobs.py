"""A fill's tokens' log-probabilities as the replies carry them (`logprobs` on the OpenAI
forms, `n_probs` on /infill; docs/serve.md).

Everything here is the engine's, read off its candidate: the values are its
`token_logprobs`, the numbers its confidence was made from (engine.candidate.scored: one
per token, end-of-fill's last when the fill ended there); each token's text is its
`token_texts` entry, the part of the choice's text it writes, so the texts spell the text
and the offsets follow from them. The engine keeps these in step when it changes a fill
(engine.candidate.trimmed, rewritten): a fill it wrote anew (re-indented) carries no
values, and none are sent for it. End-of-fill's entry has the text "" (and on /infill the
id -1). A fill cut at a `stop` string is cut by the same rule (`trimmed`, `through`):
the tokens up to the one the stop string starts in (as vLLM's and llama.cpp's streams
give them), that one's text cut at the stop (llama.cpp's gives it as ""), so the texts
still spell the choice's text; end-of-fill is then not among them. The engine
keeps no alternatives: `top_logprobs` carries the chosen token only (null on the OpenAI
forms when `logprobs` is 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from engine.candidate import Candidate, trimmed


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


def token_logprobs(cand: Candidate, text: str, top: bool) -> TokenLogprobs | None:
    """The tokens of `cand` (as the engine gave it) for a choice whose text is `text`
    (`cand.text`, or its start where a stop string cut it); None: the engine gave no
    log-probabilities for it."""
    if len(text) < len(cand.text):
        cand = trimmed(cand, end=len(text), through=True)
    values = cand.token_logprobs
    if values is None:
        return None
    n = len(values)
    texts = cand.token_texts if cand.token_texts is not None else [""] * len(cand.token_ids)
    ids: list[int | None] = [*cand.token_ids[:n]]
    tokens = texts[:n]
    ids += [None] * (n - len(ids))  # end-of-fill
    tokens += [""] * (n - len(tokens))
    offsets = list(accumulate((len(t) for t in tokens), initial=0))[:n]
    return TokenLogprobs(ids, tokens, list(values), offsets, top)


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
