"""A fill that writes the suffix again ends where the repeat starts (engine/local/echo.py),
in the one-token loop and through the engine."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.decoding import SamplerConfig
from engine.denoisers.base import EncodedContext
from engine.denoisers.onnx import NumpyRandomSource
from engine.local.echo import Echo
from engine.local.one_token import run_autoregressive
from engine.local.steering import Steering
from tests.fakes import EOF, PAD, FakeAutoregressive


class Pieces:
    """A tokenizer whose token i is PIECES[i]."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    @property
    def line_break_ids(self) -> frozenset[int]:
        return frozenset(i for i, p in enumerate(self.pieces) if "\n" in p)

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.pieces[i] for i in ids)

    def ids(self, *pieces: str) -> list[int]:
        return [self.pieces.index(p) for p in pieces]


TOK = Pieces(["x = 1", "\n", "    b = 2", "\n\n", "    c = 3", "\n    b = 2\n", "z"])
SUFFIX = "\n    b = 2\n    c = 3\n"


def test_the_row_ends_before_the_suffix_s_first_whole_line() -> None:
    echo = Echo(TOK, SUFFIX)
    row = TOK.ids("x = 1", "\n", "    b = 2", "\n")
    assert echo(row[:1]) is None  # no line break: not asked
    assert echo(row[:2]) is None  # a blank line is no repeat
    assert echo(row) == 1  # "x = 1" kept
    assert echo(TOK.ids("x = 1", "\n    b = 2\n")) == 1
    # the repeat starts inside a token: the tokens whose text is all before it are kept
    assert echo(TOK.ids("x = 1", "\n\n", "    b = 2", "\n")) == 1
    assert echo(TOK.ids("\n", "    b = 2", "\n")) == 0  # all of it a repeat: an empty fill
    assert echo(TOK.ids("x = 1", "\n", "    c = 3", "\n")) is None  # another line
    assert Echo(TOK, "")(row) is None and Echo(TOK, "\n\n  \n")(row) is None


def test_the_one_token_loop_stops_at_the_repeat() -> None:
    # token ids of the fake model: 5 "x = 1", 6 "\n", 7 "    b = 2", 8 "\n", then more
    pieces = ["", "", "", "", "", "x = 1", "\n", "    b = 2", "\n", "more", "more"] + [""] * 10
    tok = Pieces(pieces)
    den = FakeAutoregressive([5, 6, 7, 8, 9, 10, EOF])
    st = EncodedContext(token_ids=(2, 3), payload=None)
    cfg = SamplerConfig(strategy="autoregressive")
    res = run_autoregressive(den, st, 8, cfg, NumpyRandomSource(0), steer=Steering(echo=Echo(tok, SUFFIX)))
    assert res.stop_reason == "complete"
    assert res.tokens[0].tolist() == [5, EOF] + [PAD] * 6
    assert res.row_steps[0] == 4  # nothing decoded past the repeat's first line
    free = run_autoregressive(den, st, 8, cfg, NumpyRandomSource(0), steer=Steering(echo=Echo(tok, "\nelse\n")))
    assert free.tokens[0].tolist()[:6] == [5, 6, 7, 8, 9, 10]


def test_echo_takes_numpy_rows() -> None:
    assert Echo(TOK, SUFFIX)(np.asarray(TOK.ids("x = 1", "\n    b = 2\n"), dtype=np.int64)) == 1
