"""The default backend: the embedded model's two ONNX graphs run by onnxruntime (no torch).

`encode.onnx`: input_ids (1, T), logits_from (), past_key.{i} / past_value.{i} (1, H, P, D)
               for each layer i -> present_key.{i} / present_value.{i} (1, H, P+T, D),
               logits (1, T - logits_from, V), and for a model with a length head
               length (1, K) at the last new token
`denoise.onnx`: canvas_ids (B, C), past_key.{i} / past_value.{i} -> logits (B, C, V)

The cached context is a tuple of per-layer arrays, fed to the graphs as they are: no step
splits, stacks or (for denoising) concatenates the whole cache. Graphs exported before this
contract (one stacked past_keys input) are refused with the command that re-exports them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.denoisers.base import DenoiserInfo, PromptLayout, RandomSource, host_array
from engine.denoisers.kv import Encoded, KVDenoiser, embedded_model, embedded_parts
from engine.denoisers.layouts import suffix_first
from engine.denoisers.loading import LoadedModel
from engine.errors import ModelLoadError
from engine.models.directory import DENOISE_FILE, ENCODE_FILE, require


def kv_names(prefix: str, layers: int) -> list[str]:
    """[f"{prefix}_key.0", f"{prefix}_value.0", f"{prefix}_key.1", ...]: the graphs' cache inputs
    ("past") and outputs ("present"), keys and values of each layer in turn."""
    return [f"{prefix}_{kind}.{i}" for i in range(layers) for kind in ("key", "value")]


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


def session(path: Path, providers: list[Any] | None) -> Any:
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
        layout: PromptLayout,
        providers: list[Any] | None = None,
    ) -> None:
        self.info = info
        self.layout = layout
        self.layers, self.heads, self.head_dim = shape
        self.encoder = session(encode_path, providers)
        self.denoiser = session(denoise_path, providers)
        self.past = kv_names("past", self.layers)
        self.present = kv_names("present", self.layers)
        for graph, path in ((self.encoder, encode_path), (self.denoiser, denoise_path)):
            if [i.name for i in graph.get_inputs()][-len(self.past) :] != self.past:
                raise ModelLoadError(
                    f"{path} was exported by an older version of diffusion-lsp (its cache inputs are not "
                    f"per layer); export it again: diffusion-infill export-onnx --model {path.parent}"
                )
        if info.length_classes and "length" not in {o.name for o in self.encoder.get_outputs()}:
            raise ModelLoadError(
                f"{encode_path} has no length output though config.json gives the model a length head; "
                f"export it again: diffusion-infill export-onnx --model {encode_path.parent}"
            )

    def _empty(self) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
        z = np.zeros((1, self.heads, 0, self.head_dim), dtype=np.float32)
        return (z,) * self.layers, (z,) * self.layers

    def _feeds(self, keys: Sequence[np.ndarray], values: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        arrays = (np.ascontiguousarray(a) for kv in zip(keys, values, strict=True) for a in kv)  # no copy unless sliced
        return dict(zip(self.past, arrays, strict=True))

    def _encode(
        self,
        new_ids: Sequence[int],
        keys: Sequence[np.ndarray],
        values: Sequence[np.ndarray],
        logits_from: int | None,
        length: bool = False,
    ) -> Encoded:
        feeds = self._feeds(keys, values)
        feeds["input_ids"] = np.asarray([new_ids], dtype=np.int64)
        # the graph always takes logits_from; T - 1 (the last token's) costs one row
        feeds["logits_from"] = np.asarray(len(new_ids) - 1 if logits_from is None else logits_from, dtype=np.int64)
        length = length and self.info.length_classes > 0
        out = self.encoder.run([*self.present, "logits", *(["length"] if length else [])], feeds)
        present = out[: len(self.present)]
        return Encoded(
            tuple(present[0::2]),
            tuple(present[1::2]),
            out[len(self.present)] if logits_from is not None else None,
            out[-1] if length else None,
        )

    def _denoise(self, canvas_ids: np.ndarray, keys: Sequence[np.ndarray], values: Sequence[np.ndarray]) -> np.ndarray:
        feeds = self._feeds(keys, values)
        feeds["canvas_ids"] = np.asarray(canvas_ids, dtype=np.int64)
        (logits,) = self.denoiser.run(["logits"], feeds)
        return logits

    def _keep(self, kv: Sequence[np.ndarray], keep: int) -> tuple[np.ndarray, ...]:
        return tuple(a[:, :, :keep] for a in kv)

    def _nbytes(self, keys: Sequence[np.ndarray]) -> int:
        return int(sum(a.nbytes for a in keys))

    def as_array(self, values: Any) -> np.ndarray:
        return host_array(values)

    def random_source(self, seed: int | None) -> RandomSource:
        return NumpyRandomSource(seed)


def load_dir(path: Path, cfg: dict[str, Any], *, device: str = "cpu", quantization: str = "none") -> LoadedModel:
    """An embedded-architecture directory's ONNX graphs, on the CPU or through
    onnxruntime-gpu's CUDA provider."""
    tok, info = embedded_parts(path, cfg)
    require(path, ENCODE_FILE, DENOISE_FILE)
    arch = cfg["architecture"]
    shape = (int(arch["n_layers"]), int(arch["n_heads"]), int(arch["d_model"]) // int(arch["n_heads"]))
    den = OnnxDenoiser(path / ENCODE_FILE, path / DENOISE_FILE, info, shape, suffix_first(tok), providers(device))
    return embedded_model(path, cfg, tok, den, "onnx")


def providers(device: str) -> list[Any] | None:
    """onnxruntime execution providers for a device; CUDA needs onnxruntime-gpu."""
    if not device.startswith("cuda"):
        return None
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise ModelLoadError(
            f"device {device} needs onnxruntime's CUDA provider: pip install 'diffusion-lsp[gpu]' "
            "(and uninstall the CPU-only onnxruntime)"
        )
    index = device.partition(":")[2] or "0"
    return [("CUDAExecutionProvider", {"device_id": int(index)}), "CPUExecutionProvider"]
