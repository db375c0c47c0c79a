"""A candidate's per-token lists (ids, confidences, texts, log-probabilities) stay in step
with its text through every change the engine makes to it (engine.candidate: `spelled`,
`trimmed`, `rewritten`): the indentation fit, the syntax check's cut, a re-indentation,
a stop string's cut; and its confidence stays that of the fill as the model wrote it."""

from __future__ import annotations

import math

from engine.candidate import Candidate, confident_head, rewritten, scored, spelled, trimmed
from engine.fill import Engine, InfillRequest
from tests.unit.writes import TOK, Writes, written


def in_step(cand: Candidate) -> None:
    """The lists are as long as each other (log-probabilities: one more, end-of-fill's,
    or none) and the texts spell the text, each the text of its own token."""
    assert cand.token_texts is not None and "".join(cand.token_texts) == cand.text
    assert len(cand.token_ids) == len(cand.confidence) == len(cand.token_texts)
    if cand.token_logprobs is not None:
        assert len(cand.token_logprobs) - len(cand.token_ids) in (0, 1)


def filled(text: str, prefix: str, suffix: str) -> tuple[Candidate, Candidate]:
    """(the candidate the model wrote, the engine's answer) for a Python fill."""
    gen = Writes(text)
    result = Engine(gen).fill(InfillRequest(prefix, suffix, language="python"))  # type: ignore[arg-type]
    assert len(result.candidates) == 1
    return gen.cand, result.candidates[0]


def test_the_indentation_fit_then_the_syntax_cut_keep_each_token_with_its_own_value() -> None:
    """At a blank line the editor indented, the fill's own indentation is dropped and its
    last line cut to parse: the tokens kept are the model's first ones, with their own ids,
    values and confidences; the indentation's token writes ""; end-of-fill's value goes."""
    model, got = filled("        x = 1\n        y = 2\n    )\n", "def f(a):\n    if a:\n        ", "\n    return a\n")
    assert (got.text, got.syntax) == ("x = 1\n        y = 2\n", "truncated")
    in_step(got)
    n = len(got.token_ids)
    assert got.token_ids == model.token_ids[:n] and got.confidence == model.confidence[:n]
    assert got.token_logprobs == model.token_logprobs[:n]  # type: ignore[index]
    # each token's own text (all ASCII here): the first two wrote the indentation (7 spaces, " x"), the last
    # one "\n" and the next line's indentation, which the cut leaves out
    alone = [TOK.decode([i]) for i in got.token_ids]
    assert alone[:2] == ["       ", " x"] and alone[-1] == "\n   "
    assert got.token_texts == ["", "x", *alone[2:-1], "\n"]
    assert (got.min_logprob, got.mean_logprob) == (model.min_logprob, model.mean_logprob)  # the fill as written


def test_a_reindented_fill_has_its_own_tokens_and_no_values() -> None:
    """A line moved to the next line's indentation is tokens the model did not write: they
    are encoded again, with no log-probability of the model's paired with them."""
    model, got = filled("x = 1\n", "def f(a):\n    if a:\n        b = 1\n", "        return a\n")
    assert (got.text, got.syntax) == ("        x = 1\n", "truncated")
    in_step(got)
    assert got.token_ids == TOK.encode(got.text) and got.token_logprobs is None
    assert got.score == model.score and got.mean_logprob == model.mean_logprob


def test_a_character_of_several_byte_tokens_belongs_to_the_token_that_completes_it() -> None:
    cand = spelled(written("s = '漢'\n"), TOK)
    in_step(cand)
    texts = cand.token_texts or []
    assert "\ufffd" not in "".join(texts) and "漢" in texts
    first = texts.index("漢") - 2  # its two first byte tokens write ""
    assert (
        texts[first : first + 2] == ["", ""] and [TOK.decode([i]) for i in cand.token_ids[first:][:3]] == ["\ufffd"] * 3
    )
    cut = trimmed(cand, end=cand.text.index("漢"))  # no token of the character is kept: it is not split
    in_step(cut)
    assert cut.text == "s = '" and len(cut.token_ids) == first


def test_a_cut_through_keeps_the_token_it_falls_before() -> None:
    """serve's stop strings: up to the token that writes the first character cut away,
    writing "" (as llama.cpp's stream gives a stop string's tokens)."""
    cand = spelled(written("a = b + c\n"), TOK)
    at = cand.text.index(" +")
    plain, through = trimmed(cand, end=at), trimmed(cand, end=at, through=True)
    in_step(plain)
    in_step(through)
    assert len(through.token_ids) == len(plain.token_ids) + 1 and (through.token_texts or [])[-1] == ""
    assert through.token_logprobs == (cand.token_logprobs or [])[: len(through.token_ids)]


def test_without_token_texts_a_cut_keeps_no_values_and_a_dropped_start_keeps_them() -> None:
    """A remote engine's candidate: values without tokens, so a cut cannot say which are
    the kept text's; dropping indentation leaves every token the model wrote."""
    remote = scored(Candidate("    return x", [], []), [-0.1, -0.2, -0.3])
    assert trimmed(remote, end=len("    return")).token_logprobs is None
    assert trimmed(remote, start=4).token_logprobs == [-0.1, -0.2, -0.3]
    assert rewritten(remote, "        return x", None).token_logprobs is None
    assert rewritten(remote, "    return", None).score == remote.score


def test_the_confident_head_ends_before_the_first_unsure_token() -> None:
    texts = ["return", " w", " *", " h", "2"]
    probs = [0.9, 0.8, 0.7, 0.1, 0.6]
    cand = scored(Candidate("".join(texts), [1, 2, 3, 4, 5], probs, token_texts=texts), [math.log(p) for p in probs])
    head = confident_head(cand, 0.5)
    assert head is not None and head.text == "return w *" and head.token_ids == [1, 2, 3]
    assert head.score is not None and abs(head.score - 0.7) < 1e-6  # scored again over what is kept
    assert confident_head(cand, 0.05) is cand  # sure of every token: all of it
    assert confident_head(cand, 0.95) is None  # not even its first token
    sure_text = scored(Candidate("x = 1", [1], [0.9], token_texts=["x = 1"]), [math.log(0.9), math.log(0.2)])
    assert confident_head(sure_text, 0.5) is sure_text  # unsure only of ending there: the text stands
    no_texts = scored(Candidate("x = 1", [1], [0.9]), [math.log(0.2)])
    assert confident_head(no_texts, 0.5) is None  # nothing to cut by: held back, as before
