"""A GGUF file of a Qwen2 or Llama model, read with the `gguf` package (numpy only): its
configuration as a transformers config.json would say it, its byte-level BPE tokenizer as a
tokenizer.json, and its weights one tensor at a time, dequantized to float32 (F32, F16,
BF16, Q8_0, Q5_0, Q5_1, Q4_0, Q4_1 and the K-quants: whatever `gguf.quants` dequantizes).

The file is memory-mapped and only read: no code from it or from its source runs. A tensor
is dequantized when asked for and not kept, so a whole model is never in memory at once.

llama.cpp's converter writes a Llama model's q and k projections with the rows of each head
permuted for its rotary embedding (pairs interleaved); they are permuted back here, so the
weights are the transformers model's. Qwen2's are written as they are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import ModelLoadError
from engine.models.table import GGUF_ARCHITECTURES

# the pre-tokenizer splits of the byte-level vocabularies read here (tokenizer.ggml.pre):
# each vocabulary's merges were learned on text split this way
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPLITS = {
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
}
UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4  # llama.cpp's token types: <unk>, special tokens, added plain ones
PLACEHOLDER = re.compile(r"\[PAD\d+\]")  # llama.cpp's names for the rows past a tokenizer's vocabulary


def mask_row(vocab: Mapping[str, int], rows: int) -> int | None:
    """The id a canvas mask takes in a model of `rows` embedding rows without one:
    `<|mask|>` when the vocabulary has it, else the first row it never produces (a GGUF
    vocabulary names those rows [PADn]), else the first row past the vocabulary; None when
    every row is a token (convert-gguf and the export then add one)."""
    if "<|mask|>" in vocab:
        return int(vocab["<|mask|>"])
    placeholders = [i for t, i in vocab.items() if PLACEHOLDER.fullmatch(t)]
    if placeholders:
        return int(min(placeholders))
    return len(vocab) if len(vocab) < rows else None


def byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of the 256 bytes, in which byte-level vocabularies are written."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in spelling:
            spelling[b] = chr(256 + extra)
            extra += 1
    return spelling


@dataclass(frozen=True)
class _Tensor:
    shape: tuple[int, ...]  # as numpy has it: (rows, columns), the reverse of GGUF's order
    kind: Any  # gguf.GGMLQuantizationType
    data: np.ndarray  # the raw (memory-mapped) data


class GGUFSource:
    """One GGUF file (see the module). Raises ModelLoadError for what it cannot read."""

    def __init__(self, path: Path) -> None:
        try:
            import gguf
        except ImportError as exc:  # a base-install dependency: only a broken install lacks it
            raise ModelLoadError(f"reading GGUF needs the gguf package: pip install gguf ({exc})") from exc
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        try:
            self._reader = gguf.GGUFReader(str(path), "r")
        except (ValueError, OSError, KeyError) as exc:
            raise ModelLoadError(f"{path} is not a GGUF file gguf can read: {exc}") from exc
        self.path = path
        self.arch = str(self._value("general.architecture", ""))
        if self.arch not in GGUF_ARCHITECTURES:
            raise ModelLoadError(
                f"{path} holds a {self.arch!r} model; a GGUF export takes {', '.join(GGUF_ARCHITECTURES)}"
            )
        self._tensors = {
            t.name: _Tensor(tuple(int(d) for d in reversed(t.shape)), t.tensor_type, t.data)
            for t in self._reader.tensors
        }

    # -- metadata ------------------------------------------------------------------

    def _value(self, key: str, default: Any = None) -> Any:
        field = self._reader.fields.get(key)
        return default if field is None else field.contents()

    def _arch_value(self, key: str, default: Any = None) -> Any:
        return self._value(f"{self.arch}.{key}", default)

    @cached_property
    def tokens(self) -> list[str]:
        tokens = self._value("tokenizer.ggml.tokens")
        if not tokens:
            raise ModelLoadError(f"{self.path} has no tokenizer (tokenizer.ggml.tokens)")
        return [str(t) for t in tokens]

    @cached_property
    def config(self) -> dict[str, Any]:
        """config.json as transformers writes it for this model (the keys the engine reads),
        with `mask_token_id` (`mask_row`'s, else a row added past the last) and `vocab_size` counting the row added for it."""
        heads = int(self._arch_value("attention.head_count"))
        width = int(self._arch_value("embedding_length"))
        scaling = self._arch_value("rope.scaling.type")
        if scaling not in (None, "none"):
            raise ModelLoadError(f"{self.path}: rotary embedding scaling {scaling!r} is not exported yet")
        rows = self.shape("token_embd.weight")[0]
        first = {t: i for i, t in reversed(list(enumerate(self.tokens)))}  # a repeated token: its first id
        found = mask_row(first, rows)
        mask = rows if found is None else found  # every row a token: the export adds one
        cfg: dict[str, Any] = {
            "model_type": self.arch,
            "architectures": ["Qwen2ForCausalLM" if self.arch == "qwen2" else "LlamaForCausalLM"],
            "vocab_size": rows if mask < rows else rows + 1,
            "hidden_size": width,
            "intermediate_size": int(self._arch_value("feed_forward_length")),
            "num_hidden_layers": int(self._arch_value("block_count")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(self._arch_value("attention.head_count_kv", heads)),
            "head_dim": int(self._arch_value("attention.key_length", width // heads)),
            "hidden_act": "silu",
            "max_position_embeddings": int(self._arch_value("context_length", 4096)),
            "rms_norm_eps": float(self._arch_value("attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_parameters": {
                "rope_theta": float(self._arch_value("rope.freq_base", 10000.0)),
                "rope_type": "default",
            },
            "tie_word_embeddings": "output.weight" not in self._tensors,
            "mask_token_id": mask,
        }
        for name, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("pad", "padding_token_id")):
            value = self._value(f"tokenizer.ggml.{key}")
            if value is not None:
                cfg[f"{name}_token_id"] = int(value)
        if "eos_token_id" not in cfg:
            raise ModelLoadError(f"{self.path} names no end-of-text token (tokenizer.ggml.eos_token_id)")
        name = self._value("general.name")
        if name:
            cfg["_model_name_or_path"] = str(name)
        return cfg

    # -- the tokenizer -------------------------------------------------------------

    def tokenizer(self) -> Any:
        """The tokenizers.Tokenizer the file's lists describe (tokenizer.ggml.model): a
        byte-level BPE ("gpt2": Qwen2, Llama 3) or a sentencepiece BPE ("llama": Llama 2,
        CodeLlama), with the file's control tokens as special tokens."""
        kind = self._value("tokenizer.ggml.model")
        if kind == "gpt2":
            return self._byte_level()
        if kind == "llama":
            return self._sentencepiece()
        raise ModelLoadError(
            f"{self.path} has a {kind!r} tokenizer; the export without torch reads byte-level BPE ('gpt2') and "
            "sentencepiece BPE ('llama'): convert this file with `diffusion-infill convert-gguf` (the torch extra)"
        )

    def _vocabulary(self) -> tuple[list[str], list[int]]:
        """The tokens and their types, without llama.cpp's trailing [PADn] rows (the engine
        never samples a row the tokenizer does not have)."""
        count = len(self.tokens)
        while count > 0 and PLACEHOLDER.fullmatch(self.tokens[count - 1]):
            count -= 1
        types = [int(t) for t in list(self._value("tokenizer.ggml.token_type", []) or [])[:count]]
        return self.tokens[:count], types

    def _byte_level(self) -> Any:
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

        spelling = byte_alphabet()
        alphabet = set(spelling.values())
        tokens, types = self._vocabulary()
        vocab = {
            t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
            for i, t in enumerate(tokens)
        }
        merges = [tuple(m.split(" ", 1)) for m in self._value("tokenizer.ggml.merges", [])]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        split = SPLITS.get(str(self._value("tokenizer.ggml.pre", "")))
        if split is None:  # GPT-2's own split, as transformers' GPT2Tokenizer
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        else:
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(split), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        tok.decoder = decoders.ByteLevel()
        control = [t for t, k in zip(tokens, types, strict=False) if k == CONTROL and set(t) <= alphabet]
        return _with_added(
            tok, control, [t for t, k in zip(tokens, types, strict=False) if k == USER_DEFINED and t in vocab]
        )

    def _sentencepiece(self) -> Any:
        """Llama's sentencepiece vocabulary as a BPE over "▁"-marked pieces with byte
        fallback (<0xNN> tokens), as transformers' LlamaTokenizer builds it; the merges
        from the file, else from the pieces' scores (a piece made of two pieces is a merge,
        ranked by its score)."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        tokens, types = self._vocabulary()
        vocab = {t: i for i, t in enumerate(tokens)}
        listed = self._value("tokenizer.ggml.merges")
        if listed:
            merges = [tuple(m.split(" ", 1)) for m in listed]
        else:
            scores = [float(x) for x in self._value("tokenizer.ggml.scores", [0.0] * len(tokens))]
            merges = merges_from_scores(vocab, dict(zip(tokens, scores, strict=False)))
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True))
        prepend = "first" if self._value("tokenizer.ggml.add_space_prefix", True) else "never"
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=prepend, split=False)
        steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
        if prepend != "never":
            steps.append(decoders.Strip(content=" ", left=1, right=0))
        tok.decoder = decoders.Sequence(steps)
        special = [t for t, k in zip(tokens, types, strict=False) if k in (CONTROL, UNKNOWN)]
        return _with_added(tok, special, [t for t, k in zip(tokens, types, strict=False) if k == USER_DEFINED])

    # -- the weights ---------------------------------------------------------------

    def has(self, name: str) -> bool:
        return name in self._tensors

    def shape(self, name: str) -> tuple[int, ...]:
        try:
            return self._tensors[name].shape
        except KeyError:
            raise ModelLoadError(f"{self.path} has no tensor {name}") from None

    def tensor(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """The tensor `name` (llama.cpp's name: blk.0.attn_q.weight) in float32, a matrix as
        transformers has it (out, in), or its rows `start:stop` only (a large matrix is read
        in parts); a Llama model's q and k rows in transformers' order."""
        from gguf import quants

        t = self._tensors.get(name)
        if t is None:
            raise ModelLoadError(f"{self.path} has no tensor {name}")
        rows = t.data[start:stop] if len(t.shape) > 1 else t.data
        shape = (rows.shape[0], *t.shape[1:]) if len(t.shape) > 1 else t.shape
        try:
            dense = np.asarray(quants.dequantize(rows, t.kind), dtype=np.float32).reshape(shape)
        except NotImplementedError as exc:
            raise ModelLoadError(f"{self.path}: {name} is of type {t.kind.name}, which gguf cannot dequantize") from exc
        if self.arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            if (start, stop) != (0, None):
                raise ModelLoadError(f"{name} is read whole")  # its rows are permuted by head
            kv = ".attn_k." in name
            dense = unpermute(dense, self.config["num_key_value_heads" if kv else "num_attention_heads"])
        return dense


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary permutation of a Llama q or k projection's rows, undone: each
    head's rows (pairs interleaved there) back to halves."""
    shape = w.shape
    return w.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def merges_from_scores(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """A sentencepiece vocabulary's BPE merges: every way a piece splits into two pieces of
    the vocabulary is a merge, ranked as transformers ranks them for a file that lists
    none: the higher-scored piece's first, then the longer left part, then the longer right
    part; ties in the vocabulary's order (the piece's, then the parts' ids)."""
    found: list[tuple[tuple[float, int, int, int, int, int], str, str]] = []
    for order, (piece, score) in enumerate(scores.items()):
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                found.append(((-score, -len(left), -len(right), order, vocab[left], vocab[right]), left, right))
    found.sort(key=lambda m: m[0])
    return [(left, right) for _, left, right in found]


def _with_added(tok: Any, special: list[str], plain: list[str]) -> Any:
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in plain])
    return tok
