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

A keystroke at the cursor changes the end of P, and in the prefix-suffix-middle order
everything after it, the whole suffix, would be encoded again. Instead (`shift_suffix`,
on by default), the suffix's cached keys and values are kept and moved to their new
positions (the keys rotated by the change in P's length, as llama.cpp's context shift
does), and only P's new tokens and the middle marker are run. The suffix's keys and
values then miss what was typed since they were computed: `stale` counts those tokens,
and past MAX_STALE_TOKENS (or when the suffix or the fill so far changed) the sequence
is encoded exactly again. docs/models.md gives the measured cost of the approximation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.denoisers.base import DenoiserInfo, EncodedContext, Prompt, RandomSource, as_prompt, host_array
from engine.denoisers.kv import ENCODE_CHUNK, common_prefix_len
from engine.denoisers.layouts import DreamLayout, Parts, Specials, dream_tokens
from engine.denoisers.onnx import NumpyRandomSource, kv_names, providers, session
from engine.errors import ModelLoadError
from engine.models.directory import LM_GRAPH_FILE, TOKENIZER_FILE, require
from engine.models.loading import LoadedModel
from engine.models.table import AUTOREGRESSIVE_MODEL_TYPES

MASKED = np.float32(-1.0e9)  # an attention bias no score survives (finite: no NaN on a row of them)
MAX_STALE_TOKENS = 32  # prefix tokens the moved suffix may not have seen before it is encoded again


@dataclass(frozen=True)
class Cached:
    """The payload of a state: the layouts, and the one-token mode's keys and values over
    `parts.causal` (one (1, Hkv, P, D) array each per layer) with its next-token logits."""

    parts: Parts
    kv: tuple[np.ndarray, ...]  # past_key.0, past_value.0, past_key.1, ...
    next_logits: np.ndarray | None  # (V,)
    prompt: Prompt | None = None  # what was laid out (None: a plain prompt), the tokens `extend` added in its middle
    stale: int = 0  # prefix tokens the suffix's keys and values did not see (moved, not recomputed)


class OnnxLMDenoiser:
    """Denoiser and Autoregressive over an exported causal LM graph."""

    def __init__(
        self,
        graph: Path,
        specials: Specials,
        info: DenoiserInfo,
        shape: tuple[int, int, int],
        provider_list: list[Any] | None = None,
        rope_theta: float | None = None,
    ) -> None:
        """rope_theta: the rotary embedding's base, to move cached keys (None: the suffix is
        always encoded again, exactly)."""
        self.session = session(graph, provider_list)
        self.shift_suffix = rope_theta is not None
        half = np.arange(0, shape[2], 2, dtype=np.float64) / shape[2]
        self.inv_freq = 1.0 / (float(rope_theta or 10000.0) ** half)  # (D/2,)
        self.sp = specials
        self.layout = DreamLayout(specials)
        self.info = info
        self.layers, self.kv_heads, self.head_dim = shape
        self.past = kv_names("past", self.layers)
        self.present = kv_names("present", self.layers)

    # ------------------------------------------------------------------ protocol

    def encode(self, prompt: Prompt | Sequence[int], state: EncodedContext | None = None) -> EncodedContext:
        """Lay the prompt out; with the one-token mode, run its causal sequence after the
        longest common prefix of `state`'s."""
        asked = as_prompt(prompt)
        parts = self.layout.parts(asked)
        longest = max(len(parts.before) + len(parts.after), len(parts.causal))
        if longest >= self.info.max_positions:
            raise ValueError(f"context of {longest} tokens exceeds max_positions={self.info.max_positions}")
        kept = None if asked.plain else asked
        if not self.info.autoregressive:
            return EncodedContext(parts.causal, Cached(parts, (), None, kept), nbytes=0)
        old = state.payload if state is not None and isinstance(state.payload, Cached) else None
        moved = self._moved(asked, old) if self.shift_suffix and kept is not None and old is not None else None
        if moved is not None:
            kv, logits, stale = moved
        else:  # exact; a moved suffix in `old` is reused only where nothing changed
            same = old is not None and old.parts.causal == parts.causal
            exact_upto = None
            if old is not None and old.stale and old.prompt is not None and not same:
                exact_upto = 1 + len(old.prompt.prefix)  # <fim_prefix> P: computed exactly
            kv, logits = self._causal(parts.causal, old, exact_upto)
            stale = old.stale if same and old is not None else 0
        return EncodedContext(parts.causal, Cached(parts, kv, logits, kept, stale), nbytes=_nbytes(kv))

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
            raise NotImplementedError(
                "this checkpoint's one-token mode is off (config.json diffusion_lsp.autoregressive)"
            )
        return pay.next_logits

    def extend(self, state: EncodedContext, new_ids: Sequence[int]) -> tuple[EncodedContext, np.ndarray]:
        """`state` with `new_ids` appended to the fill, and the logits after each (T, V)."""
        pay = self._payload(state)
        if pay.next_logits is None:
            raise NotImplementedError(
                "this checkpoint's one-token mode is off (config.json diffusion_lsp.autoregressive)"
            )
        new = tuple(int(t) for t in new_ids)
        if not new:
            raise ValueError("extend needs at least one token")
        kv, logits = self._step(pay.kv, new, len(pay.parts.causal), every=True)
        parts = Parts(before=pay.parts.before + new, after=pay.parts.after, causal=pay.parts.causal + new)
        prompt = pay.prompt.extended(new) if pay.prompt is not None else None
        return EncodedContext(parts.causal, Cached(parts, kv, logits[-1], prompt, pay.stale), _nbytes(kv)), logits

    def cut(self, state: EncodedContext, length: int) -> EncodedContext:
        """The state without the tokens `extend` appended after its first `length`."""
        pay = self._payload(state)
        drop = len(pay.parts.causal) - length
        if drop <= 0:
            return state
        before = pay.parts.before
        parts = Parts(before=before[: len(before) - drop], after=pay.parts.after, causal=pay.parts.causal[:length])
        kv, logits = self._causal(parts.causal, pay)
        prompt = pay.prompt
        if prompt is not None:
            prompt = Prompt(
                prefix=prompt.prefix, suffix=prompt.suffix, middle=prompt.middle[: len(prompt.middle) - drop]
            )
        return EncodedContext(parts.causal, Cached(parts, kv, logits, prompt, pay.stale), _nbytes(kv))

    # ------------------------------------------------------------------ internals

    def _payload(self, state: EncodedContext) -> Cached:
        if not isinstance(state.payload, Cached):
            raise TypeError("state was not made by OnnxLMDenoiser.encode")
        return state.payload

    def _causal(
        self, seq: tuple[int, ...], old: Cached | None, exact_upto: int | None = None
    ) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
        """Keys and values over `seq` and the next-token logits after it, reusing `old`'s
        longest common prefix, at most `exact_upto` tokens of it (at least the last token
        is run, for its logits)."""
        keep = 0
        kv = self._empty()
        if old is not None and old.kv:
            keep = min(common_prefix_len(old.parts.causal, seq), len(seq) - 1)
            keep = keep if exact_upto is None else min(keep, exact_upto)
            kv = tuple(a[:, :, :keep] for a in old.kv)
        logits: np.ndarray | None = None
        for start in range(keep, len(seq), ENCODE_CHUNK):
            kv, out = self._step(kv, seq[start : start + ENCODE_CHUNK], start, every=False)
            logits = out[-1]
        assert logits is not None
        return kv, logits

    def _moved(self, new: Prompt, old: Cached) -> tuple[tuple[np.ndarray, ...], np.ndarray, int] | None:
        """The cache for `new` built from `old`'s when only the end of the prefix changed:
        the kept prefix, its new tokens run, the suffix's keys and values moved, the middle
        marker run; None when that does not apply (then the sequence is encoded exactly)."""
        was = old.prompt
        if was is None or was.suffix != new.suffix or was.middle != new.middle or not old.kv:
            return None
        if len(old.parts.causal) != len(self.layout.parts(was).causal):  # tokens `extend` added: a fill's state
            return None
        keep = common_prefix_len(was.prefix, new.prefix)
        stale = old.stale + (len(was.prefix) - keep) + (len(new.prefix) - keep)
        if stale > MAX_STALE_TOKENS or (keep == len(was.prefix) == len(new.prefix)):
            return None  # too stale to move again, or nothing changed (the exact path reuses all of it)
        head = 1 + keep  # <fim_prefix> and the kept prefix
        kv = tuple(a[:, :, :head] for a in old.kv)
        if len(new.prefix) > keep:
            kv, _ = self._step(kv, new.prefix[keep:], head, every=False)
        start, length = 1 + len(was.prefix), 1 + len(was.suffix)  # <fim_suffix> S in the old cache
        delta = len(new.prefix) - len(was.prefix)
        block = [a[:, :, start : start + length] for a in old.kv]
        block[0::2] = [self._rotate(k, delta) for k in block[0::2]]  # keys move; values do not
        kv = tuple(np.concatenate([a, b], axis=2) for a, b in zip(kv, block, strict=True))
        kv, logits = self._step(kv, (self.sp.fim_middle, *new.middle), kv[0].shape[2], every=False)
        return kv, logits[-1], stale

    def _rotate(self, keys: np.ndarray, delta: int) -> np.ndarray:
        """Keys (1, Hkv, L, D) rotated as if `delta` positions later (rotate-half pairs)."""
        angle = delta * self.inv_freq  # (D/2,)
        cos = np.concatenate([np.cos(angle), np.cos(angle)]).astype(np.float32)
        sin = np.concatenate([np.sin(angle), np.sin(angle)]).astype(np.float32)
        half = keys.shape[-1] // 2
        rotated = np.concatenate([-keys[..., half:], keys[..., :half]], axis=-1)
        return keys * cos + rotated * sin

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
    source = own.get("source_model_type")
    try:
        layers, kv_heads = int(cfg["num_hidden_layers"]), int(cfg["num_key_value_heads"])
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // int(cfg["num_attention_heads"]))
        info = DenoiserInfo(
            vocab_size=int(cfg["vocab_size"]),
            regime="absorbing",
            eof_id=specials.eof,
            pad_id=specials.pad,
            mask_id=specials.mask,
            max_positions=int(cfg["max_position_embeddings"]),
            suppress_ids=tuple(dict.fromkeys((specials.mask, *suppress))),
            autoregressive=bool(own.get("autoregressive", source in AUTOREGRESSIVE_MODEL_TYPES)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{path}: config.json lacks what the exported graph needs ({exc})") from exc
    shift = own.get("suffix_reuse", "shift")
    if shift not in ("shift", "exact"):
        raise ModelLoadError(f"{path}: diffusion_lsp.suffix_reuse must be shift or exact, not {shift!r}")
    theta = _rope_theta(cfg) if shift == "shift" else None
    den = OnnxLMDenoiser(path / graph, specials, info, (layers, kv_heads, head_dim), providers(device), theta)
    defaults = {"strategy": "autoregressive"} if source in AUTOREGRESSIVE_MODEL_TYPES else {}
    defaults.update(own.get("defaults", {}))
    return LoadedModel(path=path, tokenizer=tok, denoiser=den, backend="onnx", defaults=defaults)


def _rope_theta(cfg: dict[str, Any]) -> float:
    """The rotary embedding's base from a Qwen2/Llama config (transformers 5 keeps it in
    rope_parameters, earlier versions at the top level)."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    return float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
