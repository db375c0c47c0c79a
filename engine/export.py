"""ONNX export of the embedded model: one graph to encode context, one denoising step.

encode.onnx also gives the next-token logits of the new tokens from `logits_from` on
(the autoregressive mode); graphs exported before it had no such output, and the onnx
backend then reports the model as not autoregressive."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from engine.model import DiffusionCoder

OPSET = 17
ENCODE_FILE = "encode.onnx"
DENOISE_FILE = "denoise.onnx"


class _Encode(nn.Module):
    def __init__(self, model: DiffusionCoder) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, past_keys: torch.Tensor, past_values: torch.Tensor, logits_from: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        return self.model.encode(input_ids, past_keys, past_values, logits_from)


class _Denoise(nn.Module):
    def __init__(self, model: DiffusionCoder) -> None:
        super().__init__()
        self.model = model

    def forward(self, canvas_ids: torch.Tensor, past_keys: torch.Tensor, past_values: torch.Tensor) -> torch.Tensor:
        return self.model.denoise(canvas_ids, past_keys, past_values)


def export_onnx(model: DiffusionCoder, out_dir: Path) -> tuple[Path, Path]:
    """Write encode.onnx and denoise.onnx for `model` into out_dir (fp32, CPU)."""
    model = model.float().cpu().eval()
    cfg = model.cfg
    out_dir.mkdir(parents=True, exist_ok=True)
    kv = (cfg.n_layers, 1, cfg.n_heads, 5, cfg.head_dim)
    past = (torch.randn(kv), torch.randn(kv))
    kv_axes = {3: "past"}
    enc_path, den_path = out_dir / ENCODE_FILE, out_dir / DENOISE_FILE
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _Encode(model),
            (torch.ones(1, 3, dtype=torch.long), *past, torch.tensor(2, dtype=torch.long)),
            str(enc_path),
            input_names=["input_ids", "past_keys", "past_values", "logits_from"],
            output_names=["present_keys", "present_values", "logits"],
            dynamic_axes={
                "input_ids": {1: "new"},
                "past_keys": kv_axes,
                "past_values": kv_axes,
                "present_keys": {3: "total"},
                "present_values": {3: "total"},
                "logits": {1: "scored"},
            },
            opset_version=OPSET,
            dynamo=False,
        )
        torch.onnx.export(
            _Denoise(model),
            (torch.ones(2, 4, dtype=torch.long), *past),
            str(den_path),
            input_names=["canvas_ids", "past_keys", "past_values"],
            output_names=["logits"],
            dynamic_axes={
                "canvas_ids": {0: "batch", 1: "canvas"},
                "past_keys": kv_axes,
                "past_values": kv_axes,
                "logits": {0: "batch", 1: "canvas"},
            },
            opset_version=OPSET,
            dynamo=False,
        )
    return enc_path, den_path
