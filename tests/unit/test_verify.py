"""Verified decoding (engine/local/verify.py) against a fake model with known logits in both modes."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import numpy as np
import pytest

from engine.decoding import SamplerConfig
from engine.denoisers.base import EncodedContext
from engine.denoisers.onnx import NumpyRandomSource
from engine.local.one_token import run_autoregressive
from engine.local.steering import Steering
from engine.local.verify import VerifyStats, run_verified
from tests.fakes import EOF, NL, PAD, PROMPT, STATE, TwoModes, V

TARGET = [5, 6, 7, 8, 9, 10, 11, 5]


def greedy(den: TwoModes, length: int = 12, **kw: Any) -> tuple[list[int], list[int], VerifyStats, int]:
    cfg = SamplerConfig(strategy="verified", **kw.pop("cfg", {}))
    ar_cfg = SamplerConfig(strategy="autoregressive", min_tokens=cfg.min_tokens)
    steer = Steering(stop_after=kw.pop("stop_after", frozenset()))
    ar = run_autoregressive(den, STATE, length, ar_cfg, NumpyRandomSource(0), steer=steer)
    stats = VerifyStats()
    ver = run_verified(den, STATE, PROMPT, length, cfg, NumpyRandomSource(0), steer=steer, stats=stats, **kw)
    return ver.tokens[0].tolist(), ar.tokens[0].tolist(), stats, ar.steps


@pytest.mark.parametrize(
    "draft",
    [
        TARGET,  # every draft right: one round
        [5, 6, 7, 2, 9, 10, 11, 5],  # wrong at 3: the mode's own token there, then a re-draft
        [9, 9, 9, 9, 9, 9, 9, 9],  # always wrong: one token per round
        [5, 6],  # too short: the mode goes on after the drafted end
        [*TARGET, 7, 7],  # too long: the mode ends the fill
    ],
)
def test_greedy_verification_gives_the_one_token_modes_fill(draft: list[int]) -> None:
    den = TwoModes(TARGET, draft)
    ver, ar, stats, _ = greedy(den)
    assert ver == ar == [*TARGET, EOF, PAD, PAD, PAD]
    assert stats.rounds >= 1 and stats.accepted <= stats.drafted


def test_good_drafts_take_fewer_passes_than_one_token_at_a_time() -> None:
    good = TwoModes(TARGET, TARGET)
    ver, ar, stats, ar_passes = greedy(good)
    assert ver == ar
    # the context, one draft step, one verification: 3 passes for 9 tokens (with end-of-fill)
    assert (stats.rounds, stats.accepted, stats.passes) == (1, len(TARGET) + 1, 3)
    assert ar_passes == len(TARGET) + 1 > stats.passes
    bad = TwoModes(TARGET, [2] * 8)
    _, _, worse, _ = greedy(bad)
    assert worse.accepted == 1 and worse.rounds  # only the end-of-fill == len(TARGET) + 1 and worse.passes > ar_passes


def test_a_draft_takes_its_draft_steps_whatever_the_block_length() -> None:
    """A model's block length (its generation_config.json, its defaults) is for its own
    canvas fills; a verified fill's draft is draft_steps passes over the whole canvas."""
    plain = greedy(TwoModes(TARGET, TARGET))
    blocked = greedy(TwoModes(TARGET, TARGET), cfg={"block_length": 2})
    assert blocked[0] == plain[0] == [*TARGET, EOF, PAD, PAD, PAD]
    assert blocked[2].passes == plain[2].passes == 3  # the context, one draft step, one verification


def test_a_wrong_token_costs_one_round() -> None:
    den = TwoModes(TARGET, [5, 6, 7, 2, 9, 10, 11, 5])
    ver, ar, stats, _ = greedy(den)
    assert ver == ar
    # round 1 keeps 5 6 7 and adds 8 itself; round 2 tries the rest of the draft as it
    # stands (9 10 11 5 <eof>), all kept: no second draft, only its verification
    assert (stats.rounds, stats.accepted) == (2, 3 + 5)
    assert stats.passes == 1 + 2 + 1 and den.denoise_calls == 1


def test_a_leftover_that_fails_at_once_gets_a_new_draft() -> None:
    # the draft is off by one from its third token: the rest fails at once after the
    # replaced token, so the canvas drafts again (and that draft is right)
    den = TwoModes(TARGET, [5, 6, 8, 9, 9, 10, 11, 5])
    ver, ar, stats, _ = greedy(den)
    assert ver == ar
    assert den.denoise_calls == 2 and stats.rounds == 3  # draft, leftover (fails at once), draft


def test_one_line_min_tokens_and_the_length_cap_match_the_one_token_mode() -> None:
    with_break = [5, 6, NL, 7, 8]
    den = TwoModes(with_break, with_break)
    ver, ar, _, _ = greedy(den, stop_after=frozenset({NL}))
    assert ver == ar and ver[:3] == [5, 6, NL] and ver[3:] == [PAD] * 9
    empty = TwoModes([], [])
    ver, ar, _, _ = greedy(empty, cfg={"min_tokens": 1})
    assert ver == ar and ver[0] not in (EOF, PAD)  # end-of-fill barred at the first token
    ver, ar, _, _ = greedy(TwoModes(TARGET, TARGET), length=4)
    assert ver == ar == TARGET[:4]


def test_the_draft_is_sized_by_fit() -> None:
    den = TwoModes(TARGET, TARGET)
    sizes: list[int] = []

    def fit(state: EncodedContext, room: int) -> int:
        sizes.append(room)
        return 3

    ver, ar, stats, _ = greedy(den, fit=fit)
    assert ver == ar
    # drafts of 3 tokens: 3 kept and a bonus token per round
    assert stats.rounds == 3 and sizes[:2] == [12, 8]


def test_cancel_and_deadline_stop_between_rounds() -> None:
    den = TwoModes(TARGET, [9] * 8)
    calls = iter(range(100))
    cut = run_verified(
        den, STATE, PROMPT, 12, SamplerConfig(strategy="verified"), NumpyRandomSource(0),
        steer=Steering(cancel=lambda: next(calls) >= 2),
    )  # fmt: skip
    assert cut.stop_reason == "cancelled" and cut.tokens[0].tolist()[:2] == [5, 6] and cut.tokens[0][2] == PAD
    late = run_verified(
        den, STATE, PROMPT, 12, SamplerConfig(strategy="verified"), NumpyRandomSource(0),
        steer=Steering(deadline=time.monotonic() - 1),
    )  # fmt: skip
    assert late.stop_reason == "deadline" and late.tokens[0].tolist() == [PAD] * 12


def test_sampled_rows_are_distributed_as_the_one_token_mode() -> None:
    # first token: 5 (logit 3.0) or 9 (2.5); the canvas always drafts 9, the less likely one
    target = [5, 6]
    p9 = np.exp(2.5) / (np.exp(3.0) + np.exp(2.5) + (V - 4) * 1.0)  # 4 barred: mask, marker; eof/pad open
    runs = 600
    firsts: Counter[int] = Counter()
    for seed in range(runs):
        den = TwoModes(target, [9, 6], second={0: 9})
        out = run_verified(
            den, STATE, PROMPT, 4, SamplerConfig(strategy="verified", greedy=False), NumpyRandomSource(seed)
        )
        firsts[int(out.tokens[0, 0])] += 1
    ar_firsts: Counter[int] = Counter()
    for seed in range(runs):
        out = run_autoregressive(
            TwoModes(target, [], second={0: 9}), STATE, 1, SamplerConfig(greedy=False), NumpyRandomSource(seed)
        )
        ar_firsts[int(out.tokens[0, 0])] += 1
    for tok in (5, 9):
        # binomial standard error at p <= 0.5 and n = 600 is at most 0.021: allow 4 of them
        assert abs(firsts[tok] - ar_firsts[tok]) / runs < 0.085, (firsts, ar_firsts)
    assert abs(firsts[9] / runs - p9) < 0.085
    # the draft is not simply taken: 9 is drafted every time but drawn far less often
    assert firsts[9] < 0.6 * runs


# -- drafts from another source: `propose` (the prompt-lookup drafter's place)


def lookup_of(source: list[int]) -> Any:
    """A `propose` that drafts what follows the accepted tokens in `source` (a known
    continuation), as the prompt-lookup drafter does where the code repeats."""
    calls: list[tuple[int, int]] = []

    def propose(accepted: list[int], room: int) -> list[int]:
        calls.append((len(accepted), room))
        return source[len(accepted) : len(accepted) + min(room, 4)]

    propose.calls = calls  # type: ignore[attr-defined]
    return propose


@pytest.mark.parametrize("source", [TARGET, [5, 6, 2, 2, 9, 10, 11, 5], [2] * 8, []])
def test_proposed_drafts_give_the_one_token_modes_fill_without_the_canvas(source: list[int]) -> None:
    den = TwoModes(TARGET, [2] * 8)  # the canvas drafts garbage: it must not be asked
    propose = lookup_of(source)
    ver, ar, stats, ar_passes = greedy(den, propose=propose)
    assert ver == ar == [*TARGET, EOF, PAD, PAD, PAD]
    assert den.denoise_calls == 0 and propose.calls  # type: ignore[attr-defined]
    assert all(room >= 1 for _, room in propose.calls)  # type: ignore[attr-defined]
    if source == TARGET:  # drafts of 4 right tokens, each verification adds the mode's own next one:
        # 5 6 7 8 (+9), then 10 11 5 (+end-of-fill): the context and 2 verifications for 9 tokens
        assert (stats.rounds, stats.accepted, stats.passes) == (2, 7, 3) and ar_passes == len(TARGET) + 1
    if not source:  # no drafts: one token a round, as many passes as the one-token mode
        assert stats.accepted == 0 and stats.passes == ar_passes


def test_a_verified_fill_that_repeats_the_suffix_ends_there() -> None:
    den = TwoModes(TARGET, TARGET)
    echo_at = {4: 2}  # after 4 tokens, the fill is found to repeat the suffix from token 2 on

    def echo(row: Any) -> int | None:
        return echo_at.get(len(row))

    cfg = SamplerConfig(strategy="verified")
    res = run_verified(den, STATE, PROMPT, 12, cfg, NumpyRandomSource(0), steer=Steering(echo=echo))
    assert res.tokens[0].tolist() == [5, 6, EOF] + [PAD] * 9
