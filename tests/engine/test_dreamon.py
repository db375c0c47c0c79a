"""DreamOn's variable length on a tiny random Dream checkpoint whose tokenizer has
`<|expand|>` and `<|delete|>`: detection, rows of different lengths laid out with their
padding after the suffix, and fills through the engine with the canvas changing length
(lengths and mechanics only: random weights write no meaningful text)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine.denoisers.base import Prompt  # noqa: E402
from engine.denoisers.layouts import DELETE_TOKEN, DREAMON_START, EXPAND_TOKEN  # noqa: E402
from engine.denoisers.loading import load_model  # noqa: E402
from engine.fill import FillOptions, InfillRequest  # noqa: E402
from engine.local.generator import local_engine  # noqa: E402
from tests import dream_checkpoint  # noqa: E402

PREFIX = "def add(a, b):\n    return "
SUFFIX = "\n\nfor i in range(10):\n    print(i)\n"
BUDGET = 12


def write_dreamon(root: Path, **own: Any) -> Path:
    """A tiny Dream checkpoint whose tokenizer also has DreamOn's two tokens (in rows the
    model already has: its vocabulary is padded past the tokenizer's)."""
    from tokenizers import AddedToken, Tokenizer

    dream_checkpoint.write(root, **own)
    hf = Tokenizer.from_file(str(root / "tokenizer.json"))
    hf.add_special_tokens([AddedToken(EXPAND_TOKEN, special=True), AddedToken(DELETE_TOKEN, special=True)])
    hf.save(str(root / "tokenizer.json"))
    return root


@pytest.fixture(scope="module")
def dreamon_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dreamon(tmp_path_factory.mktemp("dreamon") / "tiny-dreamon")


@pytest.fixture(scope="module")
def loaded(dreamon_dir: Path) -> Any:
    torch.set_num_threads(1)
    return load_model(dreamon_dir)


@pytest.fixture
def widths(loaded: Any, monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Each denoising pass's canvas: each row's length before its trailing padding."""
    den = loaded.denoiser
    seen: list[list[int]] = []
    denoise = den.denoise

    def spy(state: Any, canvas: Any, self_cond: Any = None) -> Any:
        seen.append([int(n) for n in den._row_lengths(torch.as_tensor(canvas))])
        return denoise(state, canvas, self_cond)

    monkeypatch.setattr(den, "denoise", spy)
    return seen


@pytest.fixture
def biased(loaded: Any) -> Iterator[Any]:
    """Set a logit bias on the output head (taken off afterwards)."""
    head = loaded.denoiser.model.lm_head
    head.bias = torch.nn.Parameter(torch.zeros(head.out_features))
    yield head.bias
    head.bias = None


def fill(loaded: Any, candidates: int = 1) -> Any:
    engine = local_engine(loaded, FillOptions(canvas_tokens=BUDGET, use_drafter=False))
    return engine.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX, candidates=candidates))


def test_detected_by_the_tokenizers_two_tokens(loaded: Any, tmp_path: Path) -> None:
    tok, den = loaded.tokenizer.hf, loaded.denoiser
    edits = den.length_edits
    assert edits is not None and edits.start == DREAMON_START
    assert (edits.expand, edits.delete) == (tok.token_to_id(EXPAND_TOKEN), tok.token_to_id(DELETE_TOKEN))
    assert edits.expand not in den.info.suppress_ids and edits.delete not in den.info.suppress_ids
    plain = load_model(dream_checkpoint.write(tmp_path / "dream"))
    assert plain.denoiser.length_edits is None  # a Dream checkpoint without them never expands
    off = load_model(write_dreamon(tmp_path / "off", length_edits=False))
    assert off.denoiser.length_edits is None
    assert off.denoiser.info.suppress_ids.count(edits.expand) == 1  # unwritten, as any special token


def test_detected_by_config_fields(tmp_path: Path) -> None:
    root = dream_checkpoint.write(tmp_path / "fields", length_edits={"start_tokens": 6})
    cfg = json.loads((root / "config.json").read_text())
    cfg.update(expand_token_id=cfg["vocab_size"] - 2, delete_token_id=cfg["vocab_size"] - 1)
    (root / "config.json").write_text(json.dumps(cfg))
    edits = load_model(root).denoiser.length_edits
    vocab = cfg["vocab_size"]
    assert edits is not None and (edits.expand, edits.delete, edits.start) == (vocab - 2, vocab - 1, 6)


def test_a_shorter_rows_padding_is_unseen(loaded: Any) -> None:
    den, tok = loaded.denoiser, loaded.tokenizer
    state = den.prefill(Prompt(prefix=tuple(tok.encode(PREFIX)), suffix=tuple(tok.encode(SUFFIX))))
    mask, pad = den.info.mask_id, den.info.pad_id
    row = [tok.encode("a + b")[0], mask, mask]
    batch = torch.tensor([[*row, mask, mask], [*row, pad, pad]])
    alone = den.denoise(state, torch.tensor([row]))[0]  # (3, V)
    both = den.denoise(state, batch)
    assert torch.allclose(both[1, :3], alone, atol=1e-4)  # the row as if it were alone
    assert not torch.allclose(both[0, :3], alone, atol=1e-4)  # a longer canvas is seen differently


def test_fills_with_the_canvas_starting_short(loaded: Any, widths: list[list[int]]) -> None:
    r = fill(loaded)
    assert widths[0] == [DREAMON_START]  # DreamOn's start, not the budget's
    assert all(0 <= w <= BUDGET for step in widths for w in step)
    assert r.candidates is not None
    for cand in r.candidates:
        assert EXPAND_TOKEN not in cand.text and DELETE_TOKEN not in cand.text
        assert len(cand.token_ids) <= BUDGET


def test_expand_grows_the_canvas_to_the_budget_never_past_it(loaded: Any, widths: list[list[int]], biased: Any) -> None:
    biased.data[loaded.denoiser.length_edits.expand] = 50.0
    fill(loaded)
    lengths = [step[0] for step in widths]
    assert lengths[0] == DREAMON_START and max(lengths) == BUDGET
    assert lengths[: lengths.index(BUDGET)] == sorted(lengths[: lengths.index(BUDGET)])  # it grew, step by step


def test_delete_shrinks_the_canvas(loaded: Any, widths: list[list[int]], biased: Any) -> None:
    biased.data[loaded.denoiser.length_edits.delete] = 50.0
    r = fill(loaded)
    assert widths[0] == [DREAMON_START]
    assert len(widths) == 1  # the first step's <|delete|> took the row's masks: nothing was left to denoise
    assert all(not c.text for c in r.candidates)


def test_candidates_of_different_lengths_fill_in_one_batch(loaded: Any, widths: list[list[int]]) -> None:
    r = fill(loaded, candidates=3)
    assert all(len(step) == 3 for step in widths)
    for cand in r.candidates:
        assert EXPAND_TOKEN not in cand.text and DELETE_TOKEN not in cand.text
