"""The default backend: the embedded model's two ONNX graphs run by onnxruntime (no torch).

`encode.onnx`: input_ids (1, T), past_keys/past_values (L, 1, H, P, D), logits_from ()
               -> present_keys/present_values (L, 1, H, P+T, D), logits (1, T - logits_from, V)
               (graphs exported before the autoregressive mode have neither logits_from
               nor logits: the model then has no autoregressive mode)
`denoise.onnx`: canvas_ids (B, C), past_keys/past_values -> logits (B, C, V)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from engine.denoisers.base import DenoiserInfo, RandomSource, host_array
from engine.denoisers.kv import KVDenoiser
from engine.errors import ModelLoadError


class NumpyRandomSource:
    """numpy's PCG64 generator behind the RandomSource protocol."""

    def __init__(self, seed: int | None) -> None:
        self.gen = np.random.default_rng(seed)

    def uniform_tokens(self, shape: tuple[int, int], vocab_size: int) -> np.ndarray:
        return self.gen.integers(0, vocab_size, size=shape, dtype=np.int64)

    def categorical(self, probs: np.ndarray) -> np.ndarray:
        cdf = np.cumsum(probs, axis=-1)  # (B, C, V)
        u = self.gen.random(probs.shape[:-1] + (1,)) * cdf[..., -1:]
        return np.minimum((cdf < u).sum(axis=-1), probs.shape[-1] - 1).astype(np.int64)


def _session(path: Path, providers: list[Any] | None) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    threads = os.environ.get("DIFFUSION_LSP_THREADS")
    if threads:
        opts.intra_op_num_threads = int(threads)
    opts.log_severity_level = 3  # errors only: keep stderr quiet for editors
    try:
        return ort.InferenceSession(str(path), sess_options=opts, providers=providers or ["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        raise ModelLoadError(f"cannot load ONNX graph {path}: {exc}") from exc


class OnnxDenoiser(KVDenoiser):
    def __init__(
        self,
        encode_path: Path,
        denoise_path: Path,
        info: DenoiserInfo,
        shape: tuple[int, int, int],
        providers: list[Any] | None = None,
    ) -> None:
        self.info = info
        self.layers, self.heads, self.head_dim = shape
        self.encoder = _session(encode_path, providers)
        self.denoiser = _session(denoise_path, providers)
        self.has_logits = "logits" in {o.name for o in self.encoder.get_outputs()}
        # the mode needs weights trained for it (config.json) and a graph that gives logits
        self.info = replace(info, autoregressive=info.autoregressive and self.has_logits)

    def _empty(self) -> tuple[np.ndarray, np.ndarray]:
        z = np.zeros((self.layers, 1, self.heads, 0, self.head_dim), dtype=np.float32)
        return z, z

    def _encode(
        self, new_ids: Sequence[int], keys: np.ndarray, values: np.ndarray, logits_from: int | None
    ) -> tuple[np.ndarray, ...]:
        feeds = {
            "input_ids": np.asarray([new_ids], dtype=np.int64),
            "past_keys": np.ascontiguousarray(keys),
            "past_values": np.ascontiguousarray(values),
        }
        if not self.has_logits:  # a graph exported before the autoregressive mode
            k, v = self.encoder.run(["present_keys", "present_values"], feeds)
            return k, v
        # the graph always takes logits_from; T - 1 (the last token's) costs one row
        feeds["logits_from"] = np.asarray(len(new_ids) - 1 if logits_from is None else logits_from, dtype=np.int64)
        k, v, logits = self.encoder.run(["present_keys", "present_values", "logits"], feeds)
        return (k, v, logits) if logits_from is not None else (k, v)

    def _denoise(self, canvas_ids: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        feeds = {
            "canvas_ids": np.asarray(canvas_ids, dtype=np.int64),
            "past_keys": np.ascontiguousarray(keys),
            "past_values": np.ascontiguousarray(values),
        }
        (logits,) = self.denoiser.run(["logits"], feeds)
        return logits

    def _nbytes(self, keys: np.ndarray) -> int:
        return int(keys.nbytes)

    def as_array(self, values: Any) -> np.ndarray:
        return host_array(values)

    def random_source(self, seed: int | None) -> RandomSource:
        return NumpyRandomSource(seed)
