"""Byte-level BPE tokenizer for code, with the special tokens of the infill format.

The context is assembled in suffix-prefix-middle order:
    <|fim_suffix|> suffix <|fim_prefix|> prefix <|fim_middle|>  [canvas]
and the canvas ends with <|eof|> followed by <|pad|>. The absorbing regime uses <|mask|>.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from engine.errors import ModelLoadError

# Names of the special tokens, in the id order a freshly trained tokenizer gives them.
SPECIAL_TOKENS: dict[str, str] = {
    "pad": "<|pad|>",
    "eof": "<|eof|>",
    "mask": "<|mask|>",
    "suffix": "<|fim_suffix|>",
    "prefix": "<|fim_prefix|>",
    "middle": "<|fim_middle|>",
}


@dataclass(frozen=True)
class SpecialIds:
    pad: int
    eof: int
    mask: int | None
    suffix: int
    prefix: int
    middle: int


class Tokenizer:
    """A tokenizers.Tokenizer plus the ids of the special tokens."""

    def __init__(self, hf: HFTokenizer, names: dict[str, str] | None = None) -> None:
        self.hf = hf
        names = {**SPECIAL_TOKENS, **(names or {})}
        ids: dict[str, int | None] = {}
        for key, tok in names.items():
            ids[key] = hf.token_to_id(tok) if tok else None
        missing = [names[k] for k, v in ids.items() if v is None and k != "mask"]
        if missing:
            raise ModelLoadError(f"tokenizer lacks special tokens: {', '.join(missing)}")
        self.special = SpecialIds(**ids)  # type: ignore[arg-type]

    @classmethod
    def from_file(cls, path: Path, names: dict[str, str] | None = None) -> Tokenizer:
        return cls(cls.read(path), names)

    @staticmethod
    def read(path: Path) -> HFTokenizer:
        """The tokenizers.Tokenizer in a tokenizer.json, or a ModelLoadError naming the file."""
        try:
            return HFTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises plain Exception on bad JSON
            raise ModelLoadError(f"cannot read tokenizer {path}: {exc}") from exc

    @property
    def vocab_size(self) -> int:
        return int(self.hf.get_vocab_size())

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False).ids)

    @functools.cached_property
    def token_texts(self) -> list[str]:
        """Each token's text alone (the whole vocabulary decoded once, on first use):
        "" for a special token, U+FFFD where a token holds part of a character."""
        return list(self.hf.decode_batch([[i] for i in range(self.vocab_size)], skip_special_tokens=True))

    def last_piece_start(self, text: str) -> int:
        """Where the last piece of `text` starts, as the tokenizer splits text before it
        merges (its pre-tokenizer: a word with the space before it, a run of spaces, ...):
        no token spans that offset, so the tokens of `text[:offset]` are those of `text`
        up to it. Without a pre-tokenizer: where the last token starts."""
        if not text:
            return 0
        pre = self.hf.pre_tokenizer
        if pre is not None:
            pieces = pre.pre_tokenize_str(text)
            if pieces:
                return int(pieces[-1][1][0])
        offsets = self.hf.encode(text, add_special_tokens=False).offsets
        return int(offsets[-1][0]) if offsets else 0

    @functools.cached_property
    def line_break_ids(self) -> frozenset[int]:
        """Ids of the tokens whose text holds a line break."""
        return frozenset(i for i, text in enumerate(self.token_texts) if "\n" in text)

    @functools.cached_property
    def blank_ids(self) -> frozenset[int]:
        """Ids of the tokens whose text is white space only (line breaks included)."""
        return frozenset(i for i, text in enumerate(self.token_texts) if text and not text.strip())

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=True))


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE on `texts`; special tokens take ids 0..5."""
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(texts, trainer=trainer)
    return Tokenizer(hf)
