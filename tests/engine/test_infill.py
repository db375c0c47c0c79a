"""Infill: context budgets and order, cache reuse across keystrokes, warm start, candidates."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.candidate import Shown
from engine.denoisers.loading import load_model
from engine.fill import Engine, FillControl, FillOptions, InfillRequest
from engine.local.generator import LocalGenerator, local_engine, trim_prefix, trim_suffix

from ..conftest import FIXTURE_CODE

SOURCE = (FIXTURE_CODE / "inventory.py").read_text() * 6


@pytest.fixture()
def engine(tiny_model_dir: Path) -> Engine:
    return local_engine(load_model(tiny_model_dir))


def local(engine: Engine) -> LocalGenerator:
    """The engine's local generator (its tokenizer, denoiser, defaults and context)."""
    assert isinstance(engine.generator, LocalGenerator)
    return engine.generator


def test_context_is_suffix_prefix_middle_and_keeps_nearest_code(engine: Engine) -> None:
    cut = len(SOURCE) // 2
    req = InfillRequest(prefix=SOURCE[:cut], suffix=SOURCE[cut:])
    gen = local(engine)
    prompt, ctx = gen.build_context(FillOptions(context_tokens=200), req, [], 16)
    pre, suf = prompt.prefix, prompt.suffix
    sp = gen.tok.special
    assert ctx[0] == sp.suffix and ctx[-1] == sp.middle
    assert ctx[len(suf) + 1] == sp.prefix
    assert len(ctx) <= 200
    # the suffix takes at most a quarter, unless the prefix's line-aligned cut left room
    assert len(suf) <= 200 * 0.25 or len(pre) < 200 * 0.75 - 3
    # nearest code kept: the prefix tokens decode to the end of the prefix, the suffix to its start
    assert SOURCE[:cut].endswith(gen.tok.decode(pre))
    assert SOURCE[cut:].startswith(gen.tok.decode(suf))


def test_trims_snap_to_lines_so_typing_keeps_the_cut(engine: Engine) -> None:
    tok = local(engine).tok
    enc = tok.encode
    a = trim_prefix(enc, SOURCE, 150)
    b = trim_prefix(enc, SOURCE + "x", 150)
    assert b[: len(a) - 1] == a[:-1]  # the same start: typing appended
    kept = tok.decode(a)
    assert SOURCE.endswith(kept) and len(a) <= 150
    dropped = SOURCE[: len(SOURCE) - len(kept)]
    assert dropped.endswith("\n")  # the cut is at a line start ...
    assert dropped.count("\n") % 16 == 0  # ... of a line numbered in steps of 16
    s = trim_suffix(enc, SOURCE, 60)
    assert len(s) <= 60 and SOURCE.startswith(tok.decode(s))
    assert tok.decode(s).endswith("\n")  # whole lines


def test_a_keystroke_reuses_the_cached_context(engine: Engine) -> None:
    cut = SOURCE.index("return sum") + len("return ")
    first = engine.fill(InfillRequest(prefix=SOURCE[:cut], suffix=SOURCE[cut:]))
    second = engine.fill(InfillRequest(prefix=SOURCE[:cut] + "s", suffix=SOURCE[cut:]))
    assert first.reused_tokens == 0
    assert second.reused_tokens >= second.context_tokens - 4


def test_warm_start_continues_the_previous_fill(engine: Engine) -> None:
    prefix, suffix = "def f(items):\n    return ", "\n"
    shown = Shown(prefix=prefix, suffix=suffix, text="sum(items)")
    r = engine.fill(InfillRequest(prefix=prefix + "su", suffix=suffix, previous=shown))
    assert r.warm_start
    assert r.drafted == len(local(engine).tok.encode("m(items)"))
    # typing that diverges from the previous fill is no warm start, nor is another place
    assert not engine.fill(InfillRequest(prefix=prefix + "len", suffix=suffix, previous=shown)).warm_start
    assert not engine.fill(InfillRequest(prefix=prefix + "su", suffix="\n\n", previous=shown)).warm_start
    # the engine keeps nothing between fills: without `previous`, no warm start
    assert not engine.fill(InfillRequest(prefix=prefix + "su", suffix=suffix)).warm_start


def test_cancel_and_deadline_give_an_empty_answer_not_an_error(engine: Engine) -> None:
    r = engine.fill(InfillRequest(prefix="x = "), FillControl(cancel=lambda: True))
    assert r.stop_reason == "cancelled" and r.steps == 0 and r.text == ""
    r = engine.fill(InfillRequest(prefix="x = "), FillControl(deadline=0.0))
    assert r.stop_reason == "deadline" and r.text == ""


def test_candidates_are_batched_distinct_and_led_by_the_greedy_fill(engine: Engine) -> None:
    engine = engine.configured(use_drafter=False)
    req = InfillRequest(prefix="def area(w, h):\n    return ", suffix="\n")
    one = engine.fill(req)
    many = engine.fill(replace(req, candidates=4))
    texts = [c.text for c in many.candidates]
    assert 1 <= len(texts) <= 4 and len(set(texts)) == len(texts)
    assert texts[0] == one.text
    assert all(0.0 <= x <= 1.0 for c in many.candidates for x in c.confidence)


def test_drafts_are_reported_step_by_step(engine: Engine) -> None:
    seen: list[tuple[int, list[str]]] = []
    r = engine.fill(InfillRequest(prefix="x = "), FillControl(on_draft=lambda step, texts: seen.append((step, texts))))
    assert [s for s, _ in seen] == list(range(r.steps))
    assert all(len(t) == 1 for _, t in seen)


@given(
    text=st.lists(st.sampled_from([*"ab (x)=:\n\t\r", "é", "→", "if ", "return "]), max_size=150).map("".join),
    budget=st.integers(min_value=1, max_value=80),
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_trims_stay_within_budget_and_keep_the_nearest_text(engine: Engine, text: str, budget: int) -> None:
    enc, dec = local(engine).tok.encode, local(engine).tok.decode
    pre = trim_prefix(enc, text, budget)
    suf = trim_suffix(enc, text, budget)
    assert len(pre) <= budget and len(suf) <= budget
    if len(enc(text)) <= budget:
        assert pre == suf == enc(text)
    assert text.endswith(dec(pre)) or len(pre) == budget  # a cut inside one huge line keeps its end


@pytest.fixture(scope="module")
def shipped() -> Engine:
    """The shipped model: unlike the random tiny one, its predictions are peaked."""
    return local_engine(load_model())


CURSORS = [SOURCE.index(s) + len(s) for s in ("return sum(", "def names(self) -> ", "if quantity > ", "inventory.add(")]


@pytest.mark.parametrize("cut", CURSORS)
def test_the_first_of_several_candidates_is_the_single_fill(shipped: Engine, cut: int) -> None:
    req = InfillRequest(prefix=SOURCE[:cut], suffix=SOURCE[cut:])
    one = shipped.fill(req)
    many = shipped.fill(replace(req, candidates=4))
    assert many.candidates[0].token_ids == one.candidates[0].token_ids
    assert many.candidates[0].confidence == pytest.approx(one.candidates[0].confidence, abs=1e-5)


@pytest.mark.parametrize("cut", CURSORS)
def test_fills_stop_at_the_end_and_carry_a_confidence_per_token(shipped: Engine, cut: int) -> None:
    r = shipped.fill(InfillRequest(prefix=SOURCE[:cut], suffix=SOURCE[cut:], candidates=3))
    tok = local(shipped).tok
    sp = tok.special
    for c in r.candidates:
        assert not {sp.eof, sp.pad, sp.mask} & set(c.token_ids)
        assert len(c.confidence) == len(c.token_ids)
        assert tok.decode(c.token_ids) == c.text
    assert all(c.text.strip() for c in r.candidates[1:])  # empty alternatives are dropped


def test_typing_the_start_of_the_fill_starts_warm(shipped: Engine) -> None:
    for cut in CURSORS:  # a cursor where the shipped model proposes something
        shipped.reset()
        first = shipped.fill(InfillRequest(prefix=SOURCE[:cut], suffix=SOURCE[cut:]))
        if len(first.text) > 1:
            break
    assert len(first.text) > 1, "the shipped model proposes nothing at any of the cursors"
    typed = first.text[0]
    shown = Shown(SOURCE[:cut], SOURCE[cut:], first.text)
    again = shipped.fill(InfillRequest(prefix=SOURCE[:cut] + typed, suffix=SOURCE[cut:], previous=shown))
    assert again.warm_start and again.drafted > 0
    assert again.reused_tokens >= again.context_tokens - 4


def test_a_short_prefix_leaves_its_budget_to_the_suffix(engine: Engine) -> None:
    req = InfillRequest(prefix="import os\n", suffix=SOURCE)
    gen = local(engine)
    prompt, ctx = gen.build_context(FillOptions(context_tokens=200), req, [], 16)
    suf = prompt.suffix
    assert len(suf) > 200 * 0.25  # more than the suffix's usual share
    assert len(ctx) <= 200
    assert SOURCE.startswith(gen.tok.decode(suf))


def test_typing_keeps_the_context_an_append(engine: Engine) -> None:
    """Keystroke after keystroke, the context keeps its tokens but the last few, so the
    cache reuses nearly all of it (trims move only in steps of whole line groups)."""
    text = SOURCE * 5
    lines = text.split("\n")
    gen = local(engine)
    breaks = 0
    keystrokes = 0
    for line_no in range(3, len(lines), 97):  # cursors at line ends, top to bottom
        cut = sum(len(x) + 1 for x in lines[:line_no]) - 1
        before, after = text[:cut], text[cut:]
        previous: list[int] | None = None
        for typed in (" = compute(x)"[: n + 1] for n in range(13)):
            _, ctx = gen.build_context(engine.options, InfillRequest(prefix=before + typed, suffix=after), [], 16)
            if previous is not None:
                shared = next(
                    (i for i, (a, b) in enumerate(zip(previous, ctx, strict=False)) if a != b),
                    min(len(previous), len(ctx)),
                )
                keystrokes += 1
                breaks += shared < len(previous) - 4
            previous = ctx
    assert keystrokes > 100
    assert breaks <= keystrokes // 20, (breaks, keystrokes)


def test_a_context_budget_of_zero_is_raised_with_a_warning(engine: Engine) -> None:
    warnings: list[str] = []
    _, ctx = local(engine).build_context(
        FillOptions(context_tokens=0), InfillRequest(prefix=SOURCE, suffix=SOURCE), warnings, 16
    )
    assert len(ctx) <= 16 and any("context budget 0 is below 16" in w for w in warnings)


def test_refine_keeps_the_tokens_the_model_finds_likely(shipped: Engine) -> None:
    import numpy as np

    from engine.local.generator import REFINE_KEEP
    from engine.local.steering import log_softmax

    a = SOURCE.index("return sum(")
    b = SOURCE.index("\n", a)
    prefix, middle, suffix = SOURCE[:a], SOURCE[a:b], SOURCE[b:]
    shipped.reset()
    result = shipped.fill(InfillRequest(prefix=prefix, suffix=suffix, region=middle, refine=True))
    # score the middle independently, as the engine does
    gen = local(shipped)
    _, ctx = gen.build_context(shipped.options, InfillRequest(prefix=prefix, suffix=suffix), [], 32)
    state = gen.den.prefill(ctx)
    ids = gen.tok.encode(middle)
    sp = gen.tok.special
    visible = np.full((1, 32), sp.pad)
    visible[0, : len(ids)] = ids
    visible[0, len(ids)] = sp.eof
    probs = np.exp(log_softmax(gen.den.denoise(state, visible))[0, np.arange(len(ids)), ids])
    kept = [i for i, p in enumerate(probs) if p >= REFINE_KEEP]
    assert 0 < len(kept) < len(ids)  # some kept, some re-filled: the test means something
    tokens = result.candidates[0].token_ids if result.candidates else []
    assert all(i < len(tokens) and tokens[i] == ids[i] for i in kept)


def test_a_blank_line_asks_for_a_line() -> None:
    from engine.local.generator import on_blank_line

    assert on_blank_line("def f():\n    ", "\n    return 1\n")
    assert on_blank_line("x = 1\n", "")
    assert on_blank_line("x = 1\r\n\t", "\r\n")
    assert not on_blank_line("def f():\n    return ", "\n")  # typing inside a line
    assert not on_blank_line("def f():\n", "    return 1\n")  # code after the cursor on its line


BODY_PREFIX = "def total(items):\n    count = 0\n    "
BODY_SUFFIX = "\n    return count\n"


def test_the_span_sizes_the_canvas_before_sampling(engine: Engine) -> None:
    block = engine.fill(InfillRequest(prefix=BODY_PREFIX, suffix=BODY_SUFFIX, language="python"))
    line = engine.fill(InfillRequest(prefix="def f(x):\n    return x +", suffix=" 1\n", language="python"))
    plain = engine.fill(InfillRequest(prefix=BODY_PREFIX, suffix=BODY_SUFFIX))  # no language: the model's
    assert (block.span, block.canvas_tokens) == ("block", 128)
    assert line.canvas_tokens == 32 and line.span != "block"
    assert (plain.span, plain.canvas_tokens) == (None, 16)


def test_the_users_cap_bounds_the_span_and_an_explicit_length_wins(engine: Engine) -> None:
    body = InfillRequest(prefix=BODY_PREFIX, suffix=BODY_SUFFIX, language="python")
    capped = engine.configured(max_canvas_tokens=40).fill(body)
    given = engine.configured(canvas_tokens=24).fill(body)
    small = engine.configured(max_canvas_tokens=64).fill(InfillRequest(prefix="x = ", suffix="\n", language="python"))
    assert capped.canvas_tokens == 40
    assert given.canvas_tokens == 24
    assert small.canvas_tokens == 32  # a cap never raises the span's budget


def test_a_region_fill_gets_a_canvas_that_holds_the_text_it_replaces(engine: Engine) -> None:
    old = "".join(f"    total = total + values[{i}] * weights[{i}]\n" for i in range(6))
    prefix, suffix = "def f(values, weights):\n    total = 0\n", "    return total\n"
    r = engine.fill(InfillRequest(prefix=prefix, suffix=suffix, language="python", region=old))
    assert r.canvas_tokens >= len(local(engine).tok.encode(old)) > 128
    huge = engine.fill(InfillRequest(prefix=prefix, suffix=suffix, language="python", region=old * 4))
    assert huge.canvas_tokens == 256 and not huge.warnings  # as long as a canvas can be, quietly


def test_the_span_budget_stays_within_the_canvas_the_model_was_trained_on(engine: Engine) -> None:
    gen = local(engine)
    gen.defaults = {**gen.defaults, "max_canvas_tokens": 48}
    block = engine.fill(InfillRequest(prefix=BODY_PREFIX, suffix=BODY_SUFFIX, language="python"))
    assert (block.span, block.canvas_tokens) == ("block", 48)
    old = "".join(f"    total = total + values[{i}]\n" for i in range(6))
    region = engine.fill(
        InfillRequest(
            prefix="def f(values):\n    total = 0\n", suffix="    return total\n", language="python", region=old
        )
    )
    assert region.canvas_tokens > 48  # a rewrite is never cut short to the trained length


def test_a_model_may_decode_multi_line_spans_its_own_way(engine: Engine) -> None:
    """`multiline_strategy` in the model's defaults applies to spans of several lines, and
    only when the engine's options bring no sampler of their own."""
    gen = local(engine)
    # random weights: compare the raw fills, not what survives the syntax check
    engine = engine.configured(seed=0)
    body = InfillRequest(prefix=BODY_PREFIX, suffix=BODY_SUFFIX, language="python", check_syntax=False)
    line = InfillRequest(prefix="def f(x):\n    return x +", suffix=" 1\n", language="python", check_syntax=False)
    ar = replace(gen.default_sampler(), strategy="autoregressive")
    assert gen.default_sampler().strategy != "autoregressive"
    gen.defaults = {**gen.defaults, "multiline_strategy": "autoregressive"}
    assert gen.default_sampler(multiline=True).strategy == "autoregressive"
    assert gen.default_sampler().strategy != "autoregressive"

    def same(req: InfillRequest, **options: Any) -> bool:
        """The fill of `req` by the engine as it is and by one with these options."""
        ra, rb = engine.fill(req), engine.configured(**options).fill(req)
        return (ra.steps, ra.candidates[0].token_ids) == (rb.steps, rb.candidates[0].token_ids)

    assert same(body, sampler=ar)
    assert same(line, sampler=gen.default_sampler())
    assert not same(line, sampler=ar)  # the rule is not blind: a line decodes on the canvas
    explicit = replace(gen.default_sampler(), max_steps=5)
    assert engine.configured(sampler=explicit).fill(body).steps <= 5  # the options' own sampler wins
    # a model without an autoregressive mode keeps its one strategy
    gen.den.info = replace(gen.den.info, autoregressive=False)
    assert gen.default_sampler(multiline=True).strategy != "autoregressive"


def test_the_length_head_sizes_the_canvas_within_the_budget(engine: Engine) -> None:
    body = InfillRequest(prefix=BODY_PREFIX, suffix=BODY_SUFFIX, language="python")
    fitted = engine.fill(body)
    gen = local(engine)
    state = gen.den.prefill(gen.build_context(engine.options, body, [], 128)[0])
    logits = gen.den.length_logits(state)  # type: ignore[attr-defined]
    from engine.local.length import fitted_length

    assert fitted.canvas_tokens == 128  # the budget is the span's ...
    assert fitted.fitted_tokens == fitted_length(logits, 128)  # ... the canvas the head's
    assert 1 <= fitted.fitted_tokens <= 128
    fixed = engine.configured(fit_canvas=False).fill(body)
    assert fixed.fitted_tokens == 0 and fixed.canvas_tokens == 128
    one_token = engine.configured(strategy="autoregressive").fill(body)
    assert one_token.fitted_tokens == 0  # one token at a time stops by itself


def test_several_canvas_lengths_are_filled_at_once_and_ranked_by_the_one_token_mode(engine: Engine) -> None:
    """`length_quantiles`: one greedy canvas per fitted length in one batch (a shorter
    row's fill ends within its length), the answers ordered by the one-token mode's
    likelihood per token; one quantile is the single fitted canvas, as before."""
    from engine.local.length import fitted_length
    from engine.local.one_token import sequence_logprob

    gen = local(engine)
    body = InfillRequest(prefix=BODY_PREFIX, suffix=BODY_SUFFIX, language="python", check_syntax=False)
    state = gen.den.prefill(gen.build_context(engine.options, body, [], 128)[0])
    logits = gen.den.length_logits(state)  # type: ignore[attr-defined]
    quantiles = [0.05, 0.5, 1.0]
    lengths = list(dict.fromkeys(fitted_length(logits, 128, q) for q in quantiles))
    assert len(lengths) >= 2  # the head's distribution gives the rows different lengths
    gen.defaults = {**gen.defaults, "length_quantiles": quantiles}
    engine = engine.configured(use_drafter=False)
    r = engine.fill(body)
    assert r.fitted_tokens == max(lengths)
    assert 1 <= len(r.candidates) <= len(lengths)
    assert min(len(c.token_ids) for c in r.candidates) <= min(lengths)  # the short row ends in time
    scores = [sequence_logprob(gen.den, state, c.token_ids, gen.tok.special.eof) for c in r.candidates]
    per_token = [lp / n for lp, n in scores]
    assert per_token == sorted(per_token, reverse=True)  # the likeliest fill first
    assert r.passes >= r.steps + 1 + (len(r.candidates) if len(r.candidates) > 1 else 0)  # scoring counted
    gen.defaults = {**gen.defaults, "length_quantiles": [0.9]}
    single = engine.fill(body)
    assert single.fitted_tokens == fitted_length(logits, 128, 0.9) and len(single.candidates) == 1


@pytest.mark.parametrize("model", ["tiny", "shipped"])
@pytest.mark.parametrize("cut", CURSORS)
def test_verified_greedy_decoding_is_the_one_token_modes_fill(
    engine: Engine, shipped: Engine, model: str, cut: int
) -> None:
    e = engine if model == "tiny" else shipped
    req = InfillRequest(prefix=SOURCE[:cut], suffix=SOURCE[cut:], language="python", check_syntax=False)
    one = e.configured(strategy="autoregressive").fill(req)
    ver = e.configured(strategy="verified").fill(req)
    assert ver.candidates[0].token_ids == one.candidates[0].token_ids
    assert ver.rounds >= 1 and ver.accepted >= 0 and ver.passes >= 2
    assert one.passes == one.steps
