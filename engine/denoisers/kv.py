"""Shared encode/denoise bookkeeping for backends that keep the context as key/value arrays.

The onnx and torch backends of the embedded model hold the encoded context as keys and
values per layer: stacked (L, 1, H, P, D) tensors (torch) or one (1, H, P, D) array per
layer (onnx). Reusing a cached state is the same for both: keep the longest common token
prefix (`_keep`: a slice, never a copy of the rest) and encode only what follows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from engine.denoisers.base import DenoiserInfo, EncodedContext, Prompt, PromptLayout, as_prompt
from engine.denoisers.loading import LoadedModel
from engine.models.directory import TOKENIZER_FILE, check_embedded, check_tokenizer, languages, require
from engine.models.tokenizer import Tokenizer

# New context tokens go through the encoder this many at a time. Causal attention over T
# new tokens computes a (T, P + T) block of scores of which the kernel then masks half;
# in chunks each call's block is smaller, and the total work drops towards the causal
# triangle. 1,024 tokens, shipped model, this project's 2-core CPU: 188 ms in one call,
# 152 in chunks of 512, 145 of 256, 159 of 128 (per-call overhead takes over).
ENCODE_CHUNK = 256


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class Encoded(NamedTuple):
    """What one run of the context encoder gives."""

    keys: Any  # per layer, the backend's layout (see the module)
    values: Any
    logits: Any | None = None  # (1, T', V): next-token logits of new_ids[logits_from:], when asked for
    length: Any | None = None  # (1, K): the length head at the last new token, when asked for and present


class KVPayload(NamedTuple):
    """The payload of a KVDenoiser's EncodedContext."""

    keys: Any
    values: Any
    next_logits: Any | None  # (V,) after the last context token (the autoregressive mode), else None
    length: Any | None  # (K,) the length head at the last context token (the middle marker), else None


class KVDenoiser(ABC):
    """Base of the embedded-model backends: payload is a KVPayload (keys and values per
    layer, the next-token logits after the last context token when the model has the
    autoregressive mode, the length head's logits there when it has one)."""

    info: DenoiserInfo
    layout: PromptLayout

    @abstractmethod
    def _empty(self) -> tuple[Any, Any]: ...

    @abstractmethod
    def _encode(
        self, new_ids: Sequence[int], keys: Any, values: Any, logits_from: int | None, length: bool = False
    ) -> Encoded:
        """Run the context encoder over new_ids after the cached (keys, values); with
        `logits_from`, also the next-token logits of new_ids[logits_from:] (T', V); with
        `length`, the length head at the last new token."""

    @abstractmethod
    def _denoise(self, canvas_ids: Any, keys: Any, values: Any) -> Any: ...

    @abstractmethod
    def _nbytes(self, keys: Any) -> int: ...

    def _keep(self, kv: Any, keep: int) -> Any:
        """The first `keep` positions of cached keys or values (stacked layout)."""
        return kv[:, :, :, :keep]

    def prefill(self, prompt: Prompt | Sequence[int], state: EncodedContext | None = None) -> EncodedContext:
        ids = self.layout.ids(as_prompt(prompt))
        ar, lengths = self.info.autoregressive, self.info.length_classes > 0
        next_logits = length = None
        if state is not None:
            keep = common_prefix_len(state.token_ids, ids)
            keys, values, next_logits, length = state.payload
            keys, values = self._keep(keys, keep), self._keep(values, keep)
            if keep < len(state.token_ids):  # cut: the cached outputs were a later token's
                next_logits = length = None  # (asked for, they are computed again: `_last_outputs`)
        else:
            keep = 0
            keys, values = self._empty()
        for start in range(keep, len(ids), ENCODE_CHUNK):
            chunk = ids[start : start + ENCODE_CHUNK]
            out = self._encode(chunk, keys, values, len(chunk) - 1 if ar else None, lengths)
            keys, values = out.keys, out.values
            next_logits = out.logits[0, -1] if out.logits is not None else None
            length = out.length[0] if out.length is not None else None
        payload = KVPayload(keys, values, next_logits, length)
        return EncodedContext(token_ids=ids, payload=payload, nbytes=2 * self._nbytes(keys))

    def _last_outputs(self, state: EncodedContext) -> KVPayload:
        """The payload with the last token's outputs (next-token and length logits): those
        cached, or, for a state cut from a longer one (which costs nothing), the last
        token run again."""
        pay: KVPayload = state.payload
        stale = (self.info.autoregressive and pay.next_logits is None) or (
            self.info.length_classes > 0 and pay.length is None
        )
        if not stale or not state.token_ids:
            return pay
        *head, last = state.token_ids
        ar = self.info.autoregressive
        out = self._encode(
            [last], self._keep(pay.keys, len(head)), self._keep(pay.values, len(head)), 0 if ar else None, True
        )
        return KVPayload(
            pay.keys,
            pay.values,
            out.logits[0, -1] if out.logits is not None else None,
            out.length[0] if out.length is not None else None,
        )

    def denoise(self, state: EncodedContext, canvas_ids: Any, self_cond: Any | None = None) -> Any:
        return self._denoise(canvas_ids, state.payload.keys, state.payload.values)

    def length_logits(self, state: EncodedContext) -> Any | None:
        """(K,) the length head's logits at the state's last token (the middle marker):
        class k is a fill of k tokens (the last class: that many or more); None when the
        model has no length head."""
        return self._last_outputs(state).length if self.info.length_classes > 0 else None

    # ------------------------------------------------ the autoregressive mode (Autoregressive)

    def next_logits(self, state: EncodedContext) -> Any:
        """(V,) next-token logits after the state's last token."""
        if not self.info.autoregressive:
            raise NotImplementedError("this model has no autoregressive mode (export it again)")
        logits = self._last_outputs(state).next_logits
        if logits is None:  # an empty context: nothing predicts the first token
            raise ValueError("an empty context has no next-token logits")
        return logits

    def extend(self, state: EncodedContext, new_ids: Sequence[int]) -> tuple[EncodedContext, Any]:
        """`state` followed by `new_ids` (at least one), and the next-token logits after
        each of them, (T, V): row i predicts the token after new_ids[i]."""
        if not self.info.autoregressive:
            raise NotImplementedError("this model has no autoregressive mode (export it again)")
        if not new_ids:
            raise ValueError("extend needs at least one token")
        out = self._encode(list(new_ids), state.payload.keys, state.payload.values, 0)
        assert out.logits is not None
        ids = (*state.token_ids, *(int(i) for i in new_ids))
        payload = KVPayload(out.keys, out.values, out.logits[0, -1], None)  # the length head is the middle marker's
        return EncodedContext(ids, payload, nbytes=2 * self._nbytes(out.keys)), out.logits[0]

    def cut(self, state: EncodedContext, length: int) -> EncodedContext:
        """The state's first `length` tokens: a slice of its keys and values; the last
        token's outputs are computed again when asked for (`_last_outputs`)."""
        if length >= len(state.token_ids):
            return state
        pay: KVPayload = state.payload
        keys, values = self._keep(pay.keys, length), self._keep(pay.values, length)
        return EncodedContext(state.token_ids[:length], KVPayload(keys, values, None, None), 2 * self._nbytes(keys))


# ---------------------------------------------------------------------------- loading


def embedded_parts(path: Path, cfg: dict[str, Any]) -> tuple[Tokenizer, DenoiserInfo]:
    """An embedded-architecture directory's tokenizer and model facts, checked against
    each other (the onnx and torch backends load the same directory)."""
    check_embedded(path, cfg)
    require(path, TOKENIZER_FILE)
    tok = Tokenizer.from_file(path / TOKENIZER_FILE)
    check_tokenizer(path, cfg, tok)
    return tok, denoiser_info(cfg)


def embedded_model(path: Path, cfg: dict[str, Any], tok: Tokenizer, den: Any, backend: str) -> LoadedModel:
    """The loaded embedded model with its directory's defaults and languages."""
    return LoadedModel(
        path=path,
        tokenizer=tok,
        denoiser=den,
        backend=backend,
        defaults=dict(cfg.get("defaults", {})),
        languages=languages(cfg, path),
    )


def denoiser_info(cfg: dict[str, Any]) -> DenoiserInfo:
    """The model facts an embedded config.json gives."""
    ids = cfg["special_ids"]
    return DenoiserInfo(
        vocab_size=int(cfg["architecture"]["vocab_size"]),
        regime=cfg["regime"],
        eof_id=int(ids["eof"]),
        pad_id=int(ids["pad"]),
        mask_id=int(ids["mask"]) if ids.get("mask") is not None else None,
        max_positions=int(cfg["architecture"]["max_positions"]),
        suppress_ids=tuple(int(ids[k]) for k in ("mask", "suffix", "prefix", "middle") if ids.get(k) is not None),
        # trained with the next-token loss (the dual objective): the backend may then
        # decode one token at a time; a model trained on the canvas alone has no such head
        autoregressive=bool(cfg.get("autoregressive", False)),
        length_classes=int(cfg["architecture"].get("length_classes", 0)),
    )
