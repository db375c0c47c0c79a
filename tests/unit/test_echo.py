"""A fill that writes the suffix again ends where the repeat starts (engine/local/echo.py),
in the one-token loop and through the engine."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

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
    # the repeat starts inside a token: that token is kept, and the fill's text ends where it starts
    inside = TOK.ids("x = 1", "\n\n", "    b = 2", "\n")
    assert echo(inside) == 2 and echo.text_end(inside[:2]) == len("x = 1\n")
    assert echo.text_end(row[:1]) is None  # ended between tokens: the text is theirs
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


def test_a_fill_whose_last_token_also_starts_the_repeat_keeps_its_own_characters() -> None:
    """Qwen writes `):` and the line break in one token before repeating the body that
    follows the cursor: the candidate ends with the `:` (it was dropped with the token, and
    the span check then refused the fill), its tokens kept in step."""
    from engine.denoisers.loading import LoadedModel
    from engine.local.generator import LocalGenerator

    pieces = ["<eof>", "<pad>", "<mask>", "def f(a", "):\n", "    return a\n", "x"]
    tok = Pieces(pieces)
    tok.special = SimpleNamespace(eof=0, pad=1, mask=2)  # type: ignore[attr-defined]
    suffix = "\n    return a\n"
    echo = Echo(tok, suffix)
    row = np.asarray(tok.ids("def f(a", "):\n", "    return a\n"), dtype=np.int64)
    keep = echo(row)
    assert keep == 2
    row[keep:] = [0]  # end-of-fill where the echo ended the row (Steering.ended_by_echo)
    model = LoadedModel(Path("fake"), tok, SimpleNamespace(), "fake", {})  # type: ignore[arg-type]
    gen = LocalGenerator(model)
    cand = gen._candidate(row, np.full(3, 0.9, dtype=np.float32), echo=echo)
    assert cand.text == "def f(a):" and cand.token_ids == tok.ids("def f(a", "):\n")
    assert cand.token_texts == ["def f(a", "):"] and len(cand.confidence) == 2
    assert gen._candidate(row, np.full(3, 0.9, dtype=np.float32)).text == "def f(a):\n"  # without the echo: as written
