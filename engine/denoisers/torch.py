"""The embedded model run by torch: for training-time evaluation, parity checks and GPUs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from engine.denoisers.base import DenoiserInfo, RandomSource
from engine.denoisers.kv import KVDenoiser
from engine.model import DiffusionCoder


class TorchRandomSource:
    """torch.randint / torch.multinomial on one generator, in the order transformers'
    DiffusionGemma generate() draws them (canvas init, then per step: sample, renoise)."""

    def __init__(self, seed: int | None, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.gen = torch.Generator(device=self.device)
        if seed is None:
            self.gen.seed()
        else:
            self.gen.manual_seed(seed)

    def uniform_tokens(self, shape: tuple[int, int], vocab_size: int) -> torch.Tensor:
        return torch.randint(0, vocab_size, shape, generator=self.gen, device=self.device)

    def categorical(self, probs: torch.Tensor) -> torch.Tensor:
        b, c, v = probs.shape
        return torch.multinomial(probs.reshape(-1, v), num_samples=1, generator=self.gen).view(b, c)


class TorchDenoiser(KVDenoiser):
    def __init__(self, model: DiffusionCoder, info: DenoiserInfo, device: torch.device | str = "cpu") -> None:
        self.info = info
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()

    def _empty(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.empty_cache(self.device)

    @torch.inference_mode()
    def _encode(
        self, new_ids: Sequence[int], keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.tensor([list(new_ids)], dtype=torch.long, device=self.device)
        return self.model.encode(ids, keys, values)

    @torch.inference_mode()
    def _denoise(self, canvas_ids: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return self.model.denoise(canvas_ids.to(self.device), keys, values)

    def _nbytes(self, keys: torch.Tensor) -> int:
        return int(keys.numel() * keys.element_size())

    def as_array(self, values: Any) -> torch.Tensor:
        return torch.as_tensor(values, dtype=torch.long, device=self.device)

    def random_source(self, seed: int | None) -> RandomSource:
        return TorchRandomSource(seed, self.device)
