"""Token healing (engine/local/heal.py): which tokens may spell the characters a primed
fill must write first, the one-token loop held to them, and where the cursor's line is
split between the prompt and those characters."""

from __future__ import annotations

import numpy as np

from engine.decoding import SamplerConfig
from engine.denoisers.base import EncodedContext
from engine.denoisers.onnx import NumpyRandomSource
from engine.local.heal import Heal, Spelling, primed, split_line
from engine.local.one_token import run_autoregressive
from engine.local.steering import Steering
from engine.models.tokenizer import train_tokenizer
from tests.fakes import FakeAutoregressive

# a vocabulary by text: pad, end-of-fill, then pieces ("" is a special token, U+FFFD part of a character)
TEXTS = ["", "", "a", "ab", "abc", "b", "bc", "x", "y", "ab\ufffd", " ", "  ", " ret", " return", "urn", "u"]
PAD, EOF = 0, 1
A, AB, ABC, B, BC, X, Y = 2, 3, 4, 5, 6, 7, 8
V = len(TEXTS)


def test_the_tokens_that_may_spell_a_start_are_its_extensions_and_its_starts() -> None:
    sp = Spelling(TEXTS)
    assert sorted(sp.allowed("ab").tolist()) == [A, AB, ABC]  # "ab\ufffd" is never one: part of a character
    assert sorted(sp.allowed("b").tolist()) == [B, BC]
    # " ret" (then "u") and " return"; not " ", after which no token writes "retu"
    assert sorted(sp.allowed(" retu").tolist()) == [12, 13]
    assert sp.allowed("q").size == 0
    assert sp.spells(" retu") and not sp.spells("q") and not sp.spells("aq")
    narrow = Spelling(["", "", "ab", "a"])  # no token writes "c"
    assert narrow.allowed("abc").size == 0 and not narrow.spells("abc") and narrow.spells("aab")
    assert primed("x abc", 1, narrow) is None and primed("x ab", 1, Spelling(["", " ab"])) == ("x", " ab")


def test_a_step_says_what_is_left_and_whether_the_token_wrote_only_what_was_given() -> None:
    heal = Heal(" retu", Spelling(TEXTS))
    assert heal.step(" retu", 12) == ("u", True)  # " ret": within what was given
    assert heal.step("u", 14) == ("", False)  # "urn": the rest given, and "rn" of the fill's own
    assert heal.step(" retu", 13) == ("", False)
    logits = np.zeros(V, dtype=np.float32)
    masked = heal.masked(logits, "u")
    assert set(np.flatnonzero(masked > -1e29).tolist()) == {14, 15}


def _row(want: list[int], heal: Heal | None, min_tokens: int = 0) -> tuple[list[int], list[float]]:
    den = FakeAutoregressive(want, vocab_size=V, mask=None, context=0)
    cfg = SamplerConfig(strategy="autoregressive", min_tokens=min_tokens)
    out = run_autoregressive(den, EncodedContext((), None), 6, cfg, NumpyRandomSource(0), steer=Steering(heal=heal))
    return out.tokens[0].tolist(), out.confidence[0].tolist()


def test_the_one_token_loop_spells_the_given_characters_first_then_goes_its_own_way() -> None:
    # the model would write x x y: held to "ab", it writes "ab" (the most likely of the
    # tokens that spell it: all tied), then what it wants
    row, conf = _row([X, X, Y, EOF, EOF, EOF, EOF], Heal("ab", Spelling(TEXTS)))
    assert row[:4] == [A, B, Y, EOF]  # ties go to the first id: "a", then "b" of "b", "bc"
    # the model's favourite is barred there: a choice's probability is among the allowed
    assert conf[0] == np.float32(1 / 3) and conf[1] == np.float32(1 / 2)
    free, _ = _row([X, X, Y, EOF, EOF, EOF, EOF], None)
    assert free[:4] == [X, X, Y, EOF]


def test_where_the_line_is_split() -> None:
    tok = train_tokenizer(["    return value\n", "x = foo(bar)\n"] * 20, 300)
    assert tok.last_piece_start("    retu") == 3  # the indentation's last space goes with the word
    assert tok.last_piece_start("x = foo") == 3
    assert tok.last_piece_start("") == 0
    assert split_line("    retu", 3) == ("   ", " retu")
    assert split_line("        ", 0) == ("       ", " ")  # blanks alone: the last goes with the word to come
    assert split_line("\t\t", 0) == ("\t", "\t")
    assert split_line("    s = 'é", 9) is None  # a piece with a character no token may spell alone


def test_end_of_fill_waits_for_the_given_characters_and_min_tokens_counts_after_them() -> None:
    heal = Heal("b", Spelling(TEXTS))
    # wants to end at once: it must spell "b" first (B or BC), and may end after
    row, _ = _row([EOF] * 7, heal)
    assert row[0] in (B, BC) and row[1] == EOF
    # a line is wanted (min_tokens 1): the token that only spelled "b" is not the fill's,
    # so the fill's own first token is not end-of-fill
    row, _ = _row([EOF] * 7, heal, min_tokens=1)
    assert row[0] == B and row[1] not in (EOF, PAD)


def test_the_setting_turns_priming_off_or_leaves_it_to_the_model() -> None:
    from lsp_server.service import options_from
    from lsp_server.settings import Settings

    assert options_from(Settings(middle_priming=False)).middle_priming is False
    assert options_from(Settings()).middle_priming is None  # on: the model's default, MIDDLE_PRIMING
