"""The embedded model run by torch: for training-time evaluation, parity checks and GPUs;
and the array side every torch backend shares (`OnModelDevice`, `TorchRandomSource`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from engine.denoisers.base import DenoiserInfo, PromptLayout, RandomSource, host_array
from engine.denoisers.kv import Encoded, KVDenoiser, embedded_model, embedded_parts
from engine.denoisers.layouts import suffix_first
from engine.denoisers.loading import LoadedModel
from engine.errors import ModelLoadError
from engine.models.directory import WEIGHTS_FILE, require
from engine.models.embedded import DiffusionCoder, ModelConfig


class TorchRandomSource:
    """Seeded torch random numbers drawn with the calls DiffusionGemma's generate() uses.

    `uniform_tokens` is `EntropyBoundSampler.initialize_canvas` (torch.randint) and
    `categorical` the torch.multinomial of `_denoising_step`, both on a private generator
    on `device`. On CPU, `Generator().manual_seed(s)` yields the same stream as the global
    generator after `torch.manual_seed(s)`, so a seeded run reproduces generate().
    """

    def __init__(self, seed: int | None, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(int(seed))

    def uniform_tokens(self, shape: tuple[int, int], vocab_size: int) -> torch.Tensor:
        """(B, C) int64 token ids drawn uniformly from [0, vocab_size)."""
        return torch.randint(0, int(vocab_size), tuple(shape), generator=self.generator, device=self.device)

    def categorical(self, probs: torch.Tensor) -> torch.Tensor:
        """(B, C, V) float32 probabilities -> (B, C) int64 ids (one multinomial call)."""
        b, c, v = probs.shape
        return torch.multinomial(probs.reshape(-1, v), num_samples=1, generator=self.generator).view(b, c)


class OnModelDevice:
    """The array side of the protocol for backends holding a transformers model: torch
    tensors on the model's device, torch's random numbers there."""

    model: Any
    info: DenoiserInfo

    @property
    def device(self) -> torch.device:
        return torch.device(self.model.device)

    def as_array(self, values: Any) -> torch.Tensor:
        """A nested list / numpy array -> a tensor on the model's device (see host_array)."""
        return torch.from_numpy(host_array(values)).to(self.device)

    def random_source(self, seed: int | None) -> TorchRandomSource:
        return TorchRandomSource(seed, self.device)

    def canvas_tensor(self, canvas_ids: Any, around: int) -> torch.Tensor:
        """`canvas_ids` as a (B, C) long tensor on the model's device, or a ValueError where
        it is not (B, C) or does not fit with the `around` context tokens in max_positions."""
        canvas = torch.as_tensor(canvas_ids, device=self.device).long()
        if canvas.ndim != 2:
            raise ValueError(f"canvas_ids must be (B, C); got shape {tuple(canvas.shape)}")
        limit = self.info.max_positions
        if around + canvas.shape[1] > limit:
            raise ValueError(f"context and canvas ({around + canvas.shape[1]} tokens) exceed max_positions={limit}")
        return canvas


class TorchDenoiser(KVDenoiser):
    def __init__(
        self, model: DiffusionCoder, info: DenoiserInfo, layout: PromptLayout, device: torch.device | str = "cpu"
    ) -> None:
        self.info = info
        self.layout = layout
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()

    def _empty(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.empty_cache(self.device)

    @torch.inference_mode()
    def _encode(
        self,
        new_ids: Sequence[int],
        keys: torch.Tensor,
        values: torch.Tensor,
        logits_from: int | None,
        length: bool = False,
    ) -> Encoded:
        ids = torch.tensor([list(new_ids)], dtype=torch.long, device=self.device)
        start = None if logits_from is None else torch.tensor(logits_from, device=self.device)
        k, v, *rest = self.model.encode(ids, keys, values, start, length=length)
        logits = rest.pop(0) if start is not None else None
        return Encoded(torch.stack(k), torch.stack(v), logits, rest[0] if rest else None)

    @torch.inference_mode()
    def _denoise(self, canvas_ids: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return self.model.denoise(canvas_ids.to(self.device), keys, values)

    def _nbytes(self, keys: torch.Tensor) -> int:
        return int(keys.numel() * keys.element_size())

    def as_array(self, values: Any) -> torch.Tensor:
        return torch.from_numpy(host_array(values)).to(self.device)

    def random_source(self, seed: int | None) -> RandomSource:
        return TorchRandomSource(seed, self.device)


def load_dir(path: Path, cfg: dict[str, Any], *, device: str = "cpu", quantization: str = "none") -> LoadedModel:
    """An embedded-architecture directory's safetensors weights, run by torch."""
    tok, info = embedded_parts(path, cfg)
    require(path, WEIGHTS_FILE)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device} requested, but torch sees no CUDA device")
    model = DiffusionCoder(ModelConfig(**cfg["architecture"]))
    load_weights(model, path / WEIGHTS_FILE)
    return embedded_model(path, cfg, tok, TorchDenoiser(model, info, suffix_first(tok), device), "torch")


def load_weights(model: Any, file: Path) -> None:
    """safetensors -> model, as float32; a shape or name mismatch is a clear error."""
    from safetensors.torch import load_file

    try:
        state = load_file(str(file))
    except Exception as exc:  # safetensors raises its own error types
        raise ModelLoadError(f"cannot read weights {file}: {exc}") from exc
    state = {k: v.float() for k, v in state.items()}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"weights in {file} do not fit the architecture in config.json: {exc}") from exc
