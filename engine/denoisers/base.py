"""The Denoiser protocol: the only thing that differs between model backends.

A backend lays out a `Prompt` (the token ids of the code before and after the fill, and of
the fill accepted so far) in its own format (its `layout`, as transformers leaves the
prompt format to each model's processor), turns it into a reusable state (`prefill`) and
predicts logits for a canvas against that state (`denoise`). Everything above it (sampler, drafter, infill)
is shared by all backends. Arrays are the backend's native type: numpy for onnx, torch
tensors (on the model's device) for torch and diffusion_gemma; code above the protocol
is written against the array API (array-api-compat), never against one library.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

Regime = Literal["absorbing", "uniform"]


@dataclass(frozen=True)
class DenoiserInfo:
    """What the sampler and infill need to know about a backend's model."""

    vocab_size: int
    regime: Regime  # "absorbing": canvas starts as mask tokens; "uniform": random tokens
    eof_id: int  # end-of-fill token: the fill ends here
    pad_id: int  # fills the canvas after end-of-fill
    mask_id: int | None  # absorbing regime only
    max_positions: int  # context + canvas must fit
    uses_self_conditioning: bool = False  # denoise() wants the previous step's logits
    suppress_ids: tuple[int, ...] = ()  # never sampled (mask, context sentinels)
    autoregressive: bool = False  # the backend also decodes one token at a time (Autoregressive)
    length_classes: int = 0  # the backend predicts the fill's token count (LengthPredictor) in this many classes
    # block-causal models (engine.denoisers.block_causal): attention in blocks of this many
    # positions, counted from the start of the sequence, in which the canvas begins at
    # position len(state.token_ids); the sampler's blocks count from there too. None: none.
    block_size: int | None = None
    # with block_size, a shifted model (the hidden state at i predicts token i + 1): the
    # first position of a block is predicted from the block before, so once that block has
    # no mask its prediction is settled (the sampler takes it first, alone)
    block_start_settled: bool = False


@dataclass(frozen=True)
class Prompt:
    """What the generator hands a backend to lay out: token ids, no markers. Each backend
    puts them in the order its model was trained on (`PromptLayout`); nothing is parsed
    back out of a laid-out sequence."""

    prefix: tuple[int, ...] = ()  # the code before the fill, nearest the cursor last
    suffix: tuple[int, ...] = ()  # the code after the fill
    # the fill's given start: what is accepted so far (verified decoding's drafts continue
    # it), or the line typed so far (middle priming, engine.local.heal)
    middle: tuple[int, ...] = ()
    plain: bool = False  # a bare prompt: `prefix` (then `middle`) as it is, no fill-in-the-middle markers
    # repository context, laid out already (`PromptLayout.repository`): first in the sequence,
    # where it changes rarely and stays cached across keystrokes
    context: tuple[int, ...] = ()

    def extended(self, ids: Sequence[int]) -> Prompt:
        """The same prompt with `ids` accepted into the fill."""
        return replace(self, middle=(*self.middle, *(int(t) for t in ids)))


def as_prompt(context: Prompt | Sequence[int]) -> Prompt:
    """A Prompt as it is; token ids as a plain prompt."""
    return context if isinstance(context, Prompt) else Prompt(prefix=tuple(int(t) for t in context), plain=True)


class PromptLayout(Protocol):
    """A backend's prompt format: the token sequence its encoder runs for a prompt (what
    a cached state covers, so what the context cache matches on)."""

    @property
    def overhead(self) -> int:
        """Tokens it adds to the prompt's own (the context budget leaves room for them)."""
        ...

    @property
    def primes(self) -> bool:
        """Whether the fill's given start (`Prompt.middle`) comes after the suffix, so that
        moving the cursor's line there (middle priming, engine.local.heal) turns typing
        on the line into appending to the cached sequence."""
        ...

    def ids(self, prompt: Prompt) -> tuple[int, ...]: ...

    def repository(
        self, encode: Callable[[str], list[int]], files: Sequence[tuple[str, str]], name: str, path: str
    ) -> tuple[int, ...]:
        """Repository context in the model's own format: the (path, text) pieces of other
        files, the repository's `name` and the current file's `path`; () where the model
        has no format for it (it then gets none)."""
        ...


@dataclass
class EncodedContext:
    """Cached result of encoding a context: the token ids it covers and backend data.

    `payload` is opaque to everything but the backend that made it (numpy key/value
    arrays for onnx, a transformers Cache for diffusion_gemma, ...).
    """

    token_ids: tuple[int, ...]
    payload: Any
    nbytes: int = 0  # approximate memory held, for the bounded cache


def host_array(values: Any) -> np.ndarray:
    """A numpy array with the dtypes the backends use: integers as int64, floats as
    float32, booleans as bool."""
    arr = np.asarray(values)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64, copy=False)
    if arr.dtype.kind == "f":
        return arr.astype(np.float32, copy=False)
    return arr


@runtime_checkable
class Denoiser(Protocol):
    """A bidirectional denoiser with a cached causal context encoder."""

    info: DenoiserInfo

    @property
    def layout(self) -> PromptLayout:
        """The backend's prompt format."""
        ...

    def prefill(self, prompt: Prompt | Sequence[int], state: EncodedContext | None = None) -> EncodedContext:
        """Encode the prompt laid out by `layout` (token ids: a plain prompt), reusing the
        longest common token prefix of `state`; the result's `token_ids` are the laid-out
        sequence.

        Never mutates `state`: a cached state may be shared by several requests.
        """
        ...

    def denoise(self, state: EncodedContext, canvas_ids: Any, self_cond: Any | None = None) -> Any:
        """One forward pass of the canvas: (B, C) int ids -> (B, C, V) float logits.

        Positions of the canvas follow the context (len(state.token_ids) onwards).
        `self_cond` is the previous step's processed logits (B, C, V) or None.
        """
        ...

    def as_array(self, values: Any) -> Any:
        """A nested list or numpy array as this backend's array type (see `host_array`)."""
        ...

    def random_source(self, seed: int | None) -> RandomSource:
        """The random number source for sampling on this backend's device."""
        ...


@runtime_checkable
class Autoregressive(Protocol):
    """The same weights decoding one token at a time through the causal context encoder
    (the embedded model is trained for it; DiffusionGemma can do it too). A backend
    offers it when `info.autoregressive` is true."""

    def next_logits(self, state: EncodedContext) -> Any:
        """(V,) logits of the token after the state's last one."""
        ...

    def extend(self, state: EncodedContext, new_ids: Sequence[int]) -> tuple[EncodedContext, Any]:
        """The state with `new_ids` appended, and the next-token logits after each new
        token (T, V). Never mutates `state`."""
        ...

    def cut(self, state: EncodedContext, length: int) -> EncodedContext:
        """The state's first `length` tokens (a prefix of its cache; tokens `extend`
        appended are dropped). Never mutates `state`."""
        ...


@runtime_checkable
class StepReuse(Protocol):
    """A denoiser that reuses, within one fill, what a denoising step computed in the next
    (the block_causal backend: the keys and values of the canvas's blocks that no longer
    change). The canvas loop asks it for the fill's own state before the first step, hands
    that to every `denoise` of the fill, and drops it after the last, which frees what it
    held; a caller that does not (a wrapping denoiser) only loses the reuse."""

    def fill_state(self, state: EncodedContext) -> EncodedContext:
        """A state for one fill against `state`'s context (never written), holding what the
        fill's steps leave for the next."""
        ...


@runtime_checkable
class LengthPredictor(Protocol):
    """A length head: how many tokens the fill after a context holds, predicted from the
    context alone (a backend offers it when `info.length_classes` > 0)."""

    def length_logits(self, state: EncodedContext) -> Any | None:
        """(K,) logits over the fill's token count 0..K-1 (the last class: K-1 or more)
        at the state's last token, the middle marker; None when there are none."""
        ...


@runtime_checkable
class PartEncoder(Protocol):
    """A denoiser whose cached state can cover the first tokens of a laid-out sequence, so
    that a context can be encoded ahead of the fill that needs it, a part at a time,
    stopping between parts (idle time: LocalGenerator.warm)."""

    def prefill_part(self, ids: Sequence[int], state: EncodedContext | None = None) -> EncodedContext:
        """A state over `ids`, the start of a sequence `layout.ids` laid out, reusing the
        longest common prefix of `state`'s. For the context cache only: `prefill` of a
        prompt whose sequence starts with `ids` then encodes only what follows. Never
        handed to `denoise` or `next_logits`; never mutates `state`."""
        ...


class RandomSource(Protocol):
    """Random numbers in the backend's array type, drawn in a fixed order.

    The torch source calls torch.randint and torch.multinomial in the same order as
    transformers' DiffusionGemma generate(), so that a seeded run reproduces it.
    """

    def uniform_tokens(self, shape: tuple[int, int], vocab_size: int) -> Any:
        """(B, C) token ids drawn uniformly from [0, vocab_size)."""
        ...

    def categorical(self, probs: Any) -> Any:
        """(B, C, V) float32 probabilities -> (B, C) sampled ids."""
        ...
