"""The prompt layouts: how each backend puts a `Prompt` (prefix, suffix, the fill so far)
in the order its model was trained on. Torch-free: the onnx backends use them too.

- `SuffixFirst`: `<suf> S <pre> P M <mid>`, the shipped model's order and DiffusionGemma's;
- `Plain`: no markers (a model without fill-in-the-middle tokens);
- `DreamLayout`: the Dream family's canvas in place and Qwen2.5-Coder's prefix-suffix-middle
  order for the one-token mode (engine/denoisers/dream.py says why), with `dream_tokens`,
  the ids it uses read from a checkpoint's config and tokenizer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.denoisers.base import DenoiserInfo, Prompt
from engine.errors import ModelLoadError
from engine.models.directory import (
    CONFIG_FILE,
    DG_SPECIAL_TOKENS,
    TOKENIZER_FILE,
    diffusion_signal,
    first_id,
    first_known,
)
from engine.models.table import AUTOREGRESSIVE_MODEL_TYPES, DREAM_MODEL_TYPES
from engine.models.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SuffixFirst:
    """`<suf> S <pre> P M <mid>` (suffix-prefix-middle): typing at the cursor only
    appends to P, so a keystroke re-encodes the new tokens and `<mid>` alone. The shipped
    model's training order; DiffusionGemma's with Gemma's markers. The fill accepted so
    far (M) joins the prefix, before the middle marker, so the canvas still follows it."""

    suffix: int
    prefix: int
    middle: int
    overhead: int = field(default=3, init=False)
    primes: bool = field(default=False, init=False)  # typing at the cursor already appends

    def ids(self, prompt: Prompt) -> tuple[int, ...]:
        if prompt.plain:
            return (*prompt.context, *prompt.prefix, *prompt.middle)
        return (
            *prompt.context,
            self.suffix,
            *prompt.suffix,
            self.prefix,
            *prompt.prefix,
            *prompt.middle,
            self.middle,
        )

    def repository(
        self, encode: Callable[[str], list[int]], files: Sequence[tuple[str, str]], name: str, path: str
    ) -> tuple[int, ...]:
        """None: the shipped model and DiffusionGemma were not trained with other files
        before the suffix (docs/server.md, Repository context)."""
        return ()


def suffix_first(tok: Tokenizer) -> SuffixFirst:
    """The suffix-prefix-middle layout with the tokenizer's markers."""
    sp = tok.special
    return SuffixFirst(suffix=sp.suffix, prefix=sp.prefix, middle=sp.middle)


@dataclass(frozen=True)
class Plain:
    """A model without fill-in-the-middle markers: the prefix and the fill so far, no suffix."""

    overhead: int = field(default=0, init=False)
    primes: bool = field(default=False, init=False)  # no suffix: typing at the cursor already appends

    def ids(self, prompt: Prompt) -> tuple[int, ...]:
        return (*prompt.context, *prompt.prefix, *prompt.middle)

    def repository(
        self, encode: Callable[[str], list[int]], files: Sequence[tuple[str, str]], name: str, path: str
    ) -> tuple[int, ...]:
        return ()


@dataclass(frozen=True)
class Specials:
    """The token ids the layouts and the sampler use (from the checkpoint's config and tokenizer)."""

    mask: int
    eof: int
    pad: int
    start: int  # before the prefix in the canvas layout
    fim_prefix: int
    fim_suffix: int
    fim_middle: int
    repo_name: int | None = None  # Qwen2.5-Coder's repository-level markers, where the tokenizer has them
    file_sep: int | None = None

    def info(
        self, vocab_size: int, max_positions: int, suppress_ids: Sequence[int], autoregressive: bool
    ) -> DenoiserInfo:
        """The facts of a model with these ids: an absorbing canvas of the mask token,
        which is never sampled."""
        return DenoiserInfo(
            vocab_size=vocab_size,
            regime="absorbing",
            eof_id=self.eof,
            pad_id=self.pad,
            mask_id=self.mask,
            max_positions=max_positions,
            suppress_ids=tuple(dict.fromkeys((self.mask, *suppress_ids))),
            autoregressive=autoregressive,
        )


@dataclass(frozen=True)
class Parts:
    """A context laid out for this family."""

    before: tuple[int, ...]  # start, prefix, fill so far: the canvas follows
    after: tuple[int, ...]  # the suffix and end-of-text: they follow the canvas
    causal: tuple[int, ...]  # the one-token mode's sequence (prefix-suffix-middle)

    def extended(self, new: tuple[int, ...]) -> Parts:
        """`new` tokens appended to the fill (the one-token mode's `extend`)."""
        return Parts(before=self.before + new, after=self.after, causal=self.causal + new)

    def cut(self, length: int) -> Parts:
        """The causal sequence's first `length` tokens: what `extended` added after them
        dropped from both layouts."""
        drop = len(self.causal) - length
        return Parts(before=self.before[: len(self.before) - drop], after=self.after, causal=self.causal[:length])


@dataclass(frozen=True)
class DreamLayout:
    """The family's two layouts of a prompt (see the module); `ids` is the one-token
    mode's causal sequence, what a cached state covers."""

    sp: Specials
    overhead: int = field(default=3, init=False)  # the causal layout's three markers (the canvas adds two)
    primes: bool = field(default=True, init=False)  # the middle follows the suffix (prefix-suffix-middle)

    def ids(self, prompt: Prompt) -> tuple[int, ...]:
        return self.parts(prompt).causal

    def parts(self, prompt: Prompt) -> Parts:
        sp = self.sp
        c = prompt.context
        if prompt.plain:
            plain = (sp.start, *c, *prompt.prefix, *prompt.middle)
            return Parts(before=plain, after=(), causal=plain)
        p, s, m = prompt.prefix, prompt.suffix, prompt.middle
        causal = (*c, sp.fim_prefix, *p, sp.fim_suffix, *s, sp.fim_middle, *m)
        return Parts(before=(sp.start, *c, *p, *m), after=(*s, sp.eof), causal=causal)

    def repository(
        self, encode: Callable[[str], list[int]], files: Sequence[tuple[str, str]], name: str, path: str
    ) -> tuple[int, ...]:
        """Qwen2.5-Coder's repository-level layout (its technical report, 3.2):
        `<|repo_name|>name\n<|file_sep|>path\ntext\n ... <|file_sep|>current path\n`, then
        the fill-in-the-middle prompt; () for a tokenizer without those markers."""
        sp = self.sp
        if sp.repo_name is None or sp.file_sep is None or not files:
            return ()
        out = [sp.repo_name, *encode(f"{name}\n")]
        for other, text in files:
            out += [sp.file_sep, *encode(f"{other}\n{text.rstrip(chr(10))}\n")]
        out += [sp.file_sep, *encode(f"{path}\n")]
        return tuple(out)


def dream_tokens(
    path: Path, cfg: dict[str, Any], own: dict[str, Any], mask_names: Sequence[str] = ("<|mask|>",)
) -> tuple[Tokenizer, Specials, list[int]]:
    """(tokenizer, the layouts' special ids, ids never sampled) of a checkpoint; the mask
    is config.json's mask_token_id, else the first of `mask_names` the tokenizer has."""
    hf = Tokenizer.read(path / TOKENIZER_FILE)
    vocab = int(cfg.get("vocab_size", 0))
    eos = first_id(cfg.get("eos_token_id"))
    if eos is None:
        raise ModelLoadError(f"{path / CONFIG_FILE} defines no eos_token_id")
    # DiffuCoder pads the canvas after the fill with its own token; the others with pad or eos
    pad = first_known(hf.token_to_id("<|dlm_pad|>"), first_id(cfg.get("pad_token_id")), fallback=eos)
    mask = first_id(cfg.get("mask_token_id"))
    if mask is None:
        mask = next((i for i in map(hf.token_to_id, mask_names) if i is not None), None)
    if mask is None and vocab > hf.get_vocab_size():
        mask = hf.get_vocab_size()  # an autoregressive checkpoint: its first unused row (adapt trains it)
    if mask is None:
        raise ModelLoadError(f"{path}: no mask token (config.json mask_token_id) and no unused row to use as one")
    names = {
        "pad": hf.id_to_token(pad) or "",
        "eof": hf.id_to_token(eos) or "",
        "mask": hf.id_to_token(mask) or "",
        **{k: DG_SPECIAL_TOKENS[k] for k in ("suffix", "prefix", "middle")},
        **own.get("special_tokens", {}),
    }
    tok = Tokenizer(hf, names)
    if tok.vocab_size > vocab:
        raise ModelLoadError(
            f"{path}: tokenizer.json has {tok.vocab_size} tokens but the model only {vocab}: "
            "the tokenizer does not belong to this checkpoint"
        )
    # Dream's evaluations and DreamOn put <|beginoftext|> first; Qwen2 configs name a bos
    start = first_known(hf.token_to_id("<|beginoftext|>"), first_id(cfg.get("bos_token_id")), fallback=eos)
    sp = tok.special
    specials = Specials(
        mask=mask,
        eof=sp.eof,
        pad=sp.pad,
        start=start,
        fim_prefix=sp.prefix,
        fim_suffix=sp.suffix,
        fim_middle=sp.middle,
        repo_name=hf.token_to_id("<|repo_name|>"),
        file_sep=hf.token_to_id("<|file_sep|>"),
    )
    # never sampled: the tokenizer's special tokens (but the ends) and the rows it never produces
    special = [i for i, t in hf.get_added_tokens_decoder().items() if t.special and i not in (sp.eof, sp.pad)]
    return tok, specials, [*special, *range(tok.vocab_size, vocab)]


ONE_TOKEN_OFF = "this checkpoint's one-token mode is off (config.json diffusion_lsp.autoregressive)"


def dream_mode(model_type: object, own: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """(the one-token mode on, the sampler defaults) of a checkpoint in the Dream layouts:
    a plain Qwen2/Llama checkpoint's canvas is untrained, so it decodes one token at a
    time; config.json's diffusion_lsp `autoregressive` and `defaults` say otherwise."""
    plain = model_type in AUTOREGRESSIVE_MODEL_TYPES
    defaults: dict[str, Any] = {"strategy": "autoregressive"} if plain else {}
    defaults.update(own.get("defaults", {}))
    return bool(own.get("autoregressive", plain)), defaults


def decoding_type(path: Path, model_type: object, cfg: dict[str, Any], tok: Tokenizer) -> object:
    """The model type whose decoding a checkpoint gets (for `dream_mode`): a Qwen2 or
    Llama checkpoint trained for diffusion (`diffusion_signal`) is decoded as a Dream one,
    on the canvas, and the log says why; any other as its own type. The dream backend
    asks for a checkpoint, the onnx backend for an export (its source's model type).
    config.json's diffusion_lsp `autoregressive`, where it is set, decides instead."""
    own = cfg.get("diffusion_lsp")
    if model_type not in AUTOREGRESSIVE_MODEL_TYPES or (isinstance(own, dict) and "autoregressive" in own):
        return model_type
    why = diffusion_signal(path, cfg, tok.hf.token_to_id)
    if why is None:
        return model_type
    log.info("%s: a %s checkpoint trained for diffusion (%s): decoded on the canvas", path, model_type, why)
    return DREAM_MODEL_TYPES[0]


EXPAND_TOKEN, DELETE_TOKEN = "<|expand|>", "<|delete|>"  # DreamOn's length tokens
DREAMON_START = 4  # masks DreamOn's published generation starts a fill with (its quickstart and eval)


@dataclass(frozen=True)
class LengthEdits:
    """A model that changes its canvas's length as it denoises (DreamOn): a position
    decided as `expand` becomes two masks, one decided as `delete` is removed; a fill's
    canvas starts with `start` masks (engine/local/resize.py applies them)."""

    expand: int
    delete: int
    start: int = DREAMON_START


def length_edits(hf: Any, cfg: dict[str, Any], own: dict[str, Any]) -> LengthEdits | None:
    """DreamOn's length tokens, where a checkpoint has both: config.json's
    `expand_token_id`/`delete_token_id`, else the tokenizer's `<|expand|>`/`<|delete|>`;
    config.json's diffusion_lsp `length_edits` turns them off (false) or sets the
    canvas's start (`{"start_tokens": N}`). Other checkpoints: None (a fixed canvas)."""
    setting = own.get("length_edits", True)
    if setting is False:
        return None
    expand = first_id(cfg.get("expand_token_id"))
    expand = hf.token_to_id(EXPAND_TOKEN) if expand is None else expand
    delete = first_id(cfg.get("delete_token_id"))
    delete = hf.token_to_id(DELETE_TOKEN) if delete is None else delete
    if expand is None or delete is None:
        return None
    start = setting.get("start_tokens", DREAMON_START) if isinstance(setting, dict) else DREAMON_START
    return LengthEdits(expand=expand, delete=delete, start=max(1, int(start)))
