"""An exported Qwen2, Llama or Dream-family checkpoint run by onnxruntime (backend onnx,
model_type "onnx_lm"): the base install, no torch, on the CPU or through onnxruntime-gpu.

`diffusion-infill export-onnx --model DIR` writes the directory (engine/training/export_lm.py:
one graph with the attention mask and the cache as inputs, weights in 4 or 8 bits). This
backend does what the dream backend does (engine/denoisers/dream.py), with the same
layouts (`DreamLayout`): the one-token mode runs causally in Qwen2.5-Coder's
prefix-suffix-middle order with an exact cache reused across keystrokes (the longest
common prefix of the causal sequence, sliced, never copied); the canvas runs the whole
`start P M [canvas] S eos` sequence under full attention at every step, its logits read
one position earlier (the shift).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.denoisers.base import DenoiserInfo, EncodedContext, Prompt, RandomSource, as_prompt, host_array
from engine.denoisers.kv import ENCODE_CHUNK, common_prefix_len
from engine.denoisers.layouts import (
    ONE_TOKEN_OFF,
    DreamLayout,
    Parts,
    Specials,
    decoding_type,
    dream_mode,
    dream_tokens,
)
from engine.denoisers.loading import LoadedModel
from engine.denoisers.onnx import NumpyRandomSource, kv_names, providers, session
from engine.errors import ModelLoadError
from engine.models.directory import LM_GRAPH_FILE, TOKENIZER_FILE, decoding_defaults, require

MASKED = np.float32(-1.0e9)  # an attention bias no score survives (finite: no NaN on a row of them)


@dataclass(frozen=True)
class Cached:
    """The payload of a state: the layouts, and the one-token mode's keys and values over
    `parts.causal` (one (1, Hkv, P, D) array each per layer) with its next-token logits."""

    parts: Parts
    kv: tuple[np.ndarray, ...]  # past_key.0, past_value.0, past_key.1, ...
    next_logits: np.ndarray | None  # (V,)


class OnnxLMDenoiser:
    """Denoiser and Autoregressive over an exported causal LM graph."""

    def __init__(
        self,
        graph: Path,
        specials: Specials,
        info: DenoiserInfo,
        shape: tuple[int, int, int],
        provider_list: list[Any] | None = None,
    ) -> None:
        self.session = session(graph, provider_list)
        self.sp = specials
        self.layout = DreamLayout(specials)
        self.info = info
        self.layers, self.kv_heads, self.head_dim = shape
        self.past = kv_names("past", self.layers)
        self.present = kv_names("present", self.layers)

    # ------------------------------------------------------------------ protocol

    def prefill(self, prompt: Prompt | Sequence[int], state: EncodedContext | None = None) -> EncodedContext:
        """Lay the prompt out; with the one-token mode, run its causal sequence after the
        longest common prefix of `state`'s."""
        parts = self.layout.parts(as_prompt(prompt))
        longest = max(len(parts.before) + len(parts.after), len(parts.causal))
        if longest >= self.info.max_positions:
            raise ValueError(f"context of {longest} tokens exceeds max_positions={self.info.max_positions}")
        kv: tuple[np.ndarray, ...] = ()
        logits = None
        if self.info.autoregressive:
            old = state.payload if state is not None and isinstance(state.payload, Cached) else None
            kv, logits = self._causal(parts.causal, old)
        return EncodedContext(parts.causal, Cached(parts, kv, logits), nbytes=_nbytes(kv))

    def prefill_part(self, ids: Sequence[int], state: EncodedContext | None = None) -> EncodedContext:
        """The one-token mode's cache over `ids`, the start of a causal sequence (PartEncoder);
        nothing to cache without that mode."""
        seq = tuple(int(t) for t in ids)
        if len(seq) >= self.info.max_positions:
            raise ValueError(f"context of {len(seq)} tokens exceeds max_positions={self.info.max_positions}")
        if not self.info.autoregressive or not seq:
            return EncodedContext(seq, Cached(Parts((), (), seq), (), None), nbytes=0)
        old = state.payload if state is not None and isinstance(state.payload, Cached) else None
        kv, logits = self._causal(seq, old)
        return EncodedContext(seq, Cached(Parts((), (), seq), kv, logits), nbytes=_nbytes(kv))

    def denoise(self, state: EncodedContext, canvas_ids: Any, self_cond: Any | None = None) -> np.ndarray:
        """One full-attention pass of `before canvas after` for each canvas row: (B, C, V)."""
        parts = self._payload(state).parts
        canvas = np.asarray(canvas_ids, dtype=np.int64)
        b, c = canvas.shape
        before = np.broadcast_to(np.asarray(parts.before, dtype=np.int64), (b, len(parts.before)))
        after = np.broadcast_to(np.asarray(parts.after, dtype=np.int64), (b, len(parts.after)))
        ids = np.concatenate([before, canvas, after], axis=1)  # (B, T)
        t = ids.shape[1]
        if t > self.info.max_positions:
            raise ValueError(f"context and canvas ({t} tokens) exceed max_positions={self.info.max_positions}")
        first = len(parts.before) - 1  # the hidden state before canvas position 0 (the shift)
        logits, _ = self._run(ids, 0, np.zeros((1, 1, t, t), dtype=np.float32), np.arange(first, first + c), b)
        return logits

    def as_array(self, values: Any) -> np.ndarray:
        return host_array(values)

    def random_source(self, seed: int | None) -> RandomSource:
        return NumpyRandomSource(seed)

    # ------------------------------------------------ the one-token mode (Autoregressive)

    def next_logits(self, state: EncodedContext) -> np.ndarray:
        pay = self._payload(state)
        if pay.next_logits is None:
            raise NotImplementedError(ONE_TOKEN_OFF)
        return pay.next_logits

    def extend(self, state: EncodedContext, new_ids: Sequence[int]) -> tuple[EncodedContext, np.ndarray]:
        """`state` with `new_ids` appended to the fill, and the logits after each (T, V)."""
        pay = self._payload(state)
        if pay.next_logits is None:
            raise NotImplementedError(ONE_TOKEN_OFF)
        new = tuple(int(t) for t in new_ids)
        if not new:
            raise ValueError("extend needs at least one token")
        kv, logits = self._step(pay.kv, new, len(pay.parts.causal), every=True)
        parts = pay.parts.extended(new)
        return EncodedContext(parts.causal, Cached(parts, kv, logits[-1]), _nbytes(kv)), logits

    def cut(self, state: EncodedContext, length: int) -> EncodedContext:
        """The state without the tokens `extend` appended after its first `length`."""
        pay = self._payload(state)
        if length >= len(pay.parts.causal):
            return state
        parts = pay.parts.cut(length)
        kv, logits = self._causal(parts.causal, pay)
        return EncodedContext(parts.causal, Cached(parts, kv, logits), _nbytes(kv))

    # ------------------------------------------------------------------ internals

    def _payload(self, state: EncodedContext) -> Cached:
        if not isinstance(state.payload, Cached):
            raise TypeError("state was not made by OnnxLMDenoiser.prefill")
        return state.payload

    def _causal(self, seq: tuple[int, ...], old: Cached | None) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
        """Keys and values over `seq` and the next-token logits after it, reusing `old`'s
        longest common prefix (at least the last token is run, for its logits)."""
        keep = 0
        kv = self._empty()
        if old is not None and old.kv:
            keep = min(common_prefix_len(old.parts.causal, seq), len(seq) - 1)
            kv = tuple(a[:, :, :keep] for a in old.kv)
        logits: np.ndarray | None = None
        for start in range(keep, len(seq), ENCODE_CHUNK):
            kv, out = self._step(kv, seq[start : start + ENCODE_CHUNK], start, every=False)
            logits = out[-1]
        assert logits is not None
        return kv, logits

    def _step(
        self, kv: tuple[np.ndarray, ...], new: Sequence[int], start: int, every: bool
    ) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
        """Run `new` causally after the `start` cached tokens: the grown cache, and the
        logits (T, V) after each new token (`every`) or after the last (1, V)."""
        t = len(new)
        bias = np.zeros((1, 1, t, start + t), dtype=np.float32)
        bias[0, 0, :, start:] = np.triu(np.full((t, t), MASKED, dtype=np.float32), k=1)  # causal among the new
        at = np.arange(t) if every else np.asarray([t - 1])
        logits, present = self._run(np.asarray([new], dtype=np.int64), start, bias, at, 1, kv)
        return present, logits[0]

    def _run(
        self,
        ids: np.ndarray,
        start: int,
        bias: np.ndarray,
        at: np.ndarray,
        batch: int,
        kv: tuple[np.ndarray, ...] | None = None,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """One pass of the graph: logits (B, N, V) at positions `at`, and the present cache."""
        past = kv if kv is not None else self._empty(batch)
        feeds: dict[str, np.ndarray] = {
            "input_ids": ids,
            "position_ids": np.arange(start, start + ids.shape[1], dtype=np.int64)[None],
            "attention_bias": bias,
            "logits_at": at.astype(np.int64),
        }
        feeds.update(zip(self.past, (np.ascontiguousarray(a) for a in past), strict=True))
        out = self.session.run(["logits", *self.present], feeds)
        return out[0], tuple(out[1:])

    def _empty(self, batch: int = 1) -> tuple[np.ndarray, ...]:
        z = np.zeros((batch, self.kv_heads, 0, self.head_dim), dtype=np.float32)
        return (z,) * (2 * self.layers)


def _nbytes(kv: tuple[np.ndarray, ...]) -> int:
    return int(sum(a.nbytes for a in kv))


def load_dir(path: Path, cfg: dict[str, Any], *, device: str = "cpu", quantization: str = "none") -> LoadedModel:
    """An exported directory: config.json (the source checkpoint's, model_type "onnx_lm"),
    tokenizer.json and the graph."""
    own = cfg.get("diffusion_lsp", {})
    graph = own.get("graph", LM_GRAPH_FILE)
    require(path, TOKENIZER_FILE, graph)
    tok, specials, suppress = dream_tokens(path, cfg, own)
    autoregressive, defaults = dream_mode(decoding_type(path, own.get("source_model_type"), cfg, tok), own)
    defaults = {**decoding_defaults(path).defaults, **defaults}  # as the dream backend: config.json's own win
    try:
        layers, kv_heads = int(cfg["num_hidden_layers"]), int(cfg["num_key_value_heads"])
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // int(cfg["num_attention_heads"]))
        info = specials.info(int(cfg["vocab_size"]), int(cfg["max_position_embeddings"]), suppress, autoregressive)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{path}: config.json lacks what the exported graph needs ({exc})") from exc
    den = OnnxLMDenoiser(path / graph, specials, info, (layers, kv_heads, head_dim), providers(device))
    return LoadedModel(path=path, tokenizer=tok, denoiser=den, backend="onnx", defaults=defaults)
