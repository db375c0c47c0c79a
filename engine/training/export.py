"""ONNX export of the embedded model: one graph to encode context, one denoising step.

encode.onnx also gives the next-token logits of the new tokens from `logits_from` on
(the autoregressive mode); graphs exported before it had no such output, and the onnx
backend then reports the model as not autoregressive."""

from __future__ import annotations

import json
import struct
import warnings
from pathlib import Path
from typing import Any

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


def export_onnx(model: DiffusionCoder, out_dir: Path, weights: Path | None = None) -> tuple[Path, Path]:
    """Write encode.onnx and denoise.onnx for `model` into out_dir (CPU).

    With `weights` (the model's safetensors file, in out_dir) the graphs hold no copy of
    the weights: each parameter is an ONNX external-data reference into that file
    (`link_weights`), so a model directory carries its weights once. Without it the
    graphs embed float32 weights."""
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
            do_constant_folding=weights is None,  # linked weights: keep parameters as they are stored
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
            do_constant_folding=weights is None,
        )
    if weights is not None:
        for path in (enc_path, den_path):
            link_weights(path, weights)
    return enc_path, den_path


def safetensors_index(path: Path) -> tuple[int, dict[str, Any]]:
    """(offset of the data, header) of a safetensors file: 8 bytes of header length,
    the JSON header (dtype, shape, data_offsets per tensor), then the raw tensors."""
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return 8 + n, header


def link_weights(graph: Path, weights: Path, prefix: str = "model.") -> int:
    """Turn every initializer of `graph` that is a parameter stored in `weights` into an
    external-data reference to its bytes in that file (ONNX external data: location,
    offset, length), so that onnxruntime reads the weights from the safetensors file at
    load. A float16 file gets a Cast to float32 after each weight (onnxruntime folds it
    once at load). Returns the number of initializers linked."""
    import onnx

    base, header = safetensors_index(weights)
    if weights.parent.resolve() != graph.parent.resolve():
        raise ValueError(f"{weights} must sit next to {graph}: external data is found relative to the graph")
    model = onnx.load(str(graph), load_external_data=False)
    casts = []
    linked = 0
    for init in model.graph.initializer:
        key = init.name[len(prefix) :] if init.name.startswith(prefix) else None
        meta = header.get(key) if key else None
        if meta is None:
            continue
        if list(meta["shape"]) != list(init.dims):
            raise ValueError(f"{init.name}: shape {list(init.dims)} in the graph, {meta['shape']} in {weights}")
        dtype = {"F32": onnx.TensorProto.FLOAT, "F16": onnx.TensorProto.FLOAT16}.get(meta["dtype"])
        if dtype is None:
            raise ValueError(f"{key}: dtype {meta['dtype']} cannot be linked (F32 or F16 only)")
        if dtype != init.data_type:
            stored = f"{init.name}.stored"
            casts.append(onnx.helper.make_node("Cast", [stored], [init.name], to=init.data_type))
            init.name = stored
            init.data_type = dtype
        start, end = meta["data_offsets"]
        init.ClearField("raw_data")
        del init.external_data[:]
        init.data_location = onnx.TensorProto.EXTERNAL
        for k, v in (("location", weights.name), ("offset", str(base + start)), ("length", str(end - start))):
            entry = init.external_data.add()
            entry.key, entry.value = k, v
        linked += 1
    for node in reversed(casts):
        model.graph.node.insert(0, node)
    onnx.save(model, str(graph))
    return linked
