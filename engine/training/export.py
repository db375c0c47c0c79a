"""ONNX export of the embedded model: one graph to encode context, one denoising step.

Both graphs take the cached context as one key and one value input per layer
(`past_key.{i}`, `past_value.{i}`: (1, H, P, D)), so no step splits or stacks the whole
cache. encode.onnx appends the new tokens with onnxruntime's fused GroupQueryAttention
(com.microsoft; causal attention over the cache and the new tokens in one kernel) and
returns `present_key.{i}` / `present_value.{i}` (1, H, P+T, D), and the next-token logits
of the new tokens from `logits_from` on (the autoregressive mode), and for a model with a
length head `length` (1, K): its logits at the last new token (the middle marker, when
the whole context was encoded). denoise.onnx reads the context without copying it
(model.attend_with_context)."""

from __future__ import annotations

import json
import struct
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.denoisers.onnx import kv_names
from engine.models.embedded import DiffusionCoder, ModelConfig, Rotation, cached_causal_attention, rope_tables

OPSET = 17
ENCODE_FILE = "encode.onnx"
DENOISE_FILE = "denoise.onnx"


class _FusedCausalAttention(torch.autograd.Function):
    """`model.cached_causal_attention` in torch, com.microsoft GroupQueryAttention in ONNX
    (the rotation done inside the kernel from cos/sin tables of every position)."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        past_k: torch.Tensor,
        past_v: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cos_all: torch.Tensor,
        sin_all: torch.Tensor,
        heads: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return cached_causal_attention(q, k, v, past_k, past_v, (cos, sin))

    @staticmethod
    def symbolic(
        g: Any,
        q: Any,
        k: Any,
        v: Any,
        past_k: Any,
        past_v: Any,
        cos: Any,
        sin: Any,
        cos_all: Any,
        sin_all: Any,
        heads: int,
    ) -> tuple[Any, Any, Any]:
        head_dim = 2 * int(cos_all.type().sizes()[1])

        def const(values: list[int]) -> Any:
            return g.op("Constant", value_t=torch.tensor(values, dtype=torch.long))

        def flat(x: Any) -> Any:  # (1, H, T, D) -> (1, T, H * D)
            return g.op("Reshape", g.op("Transpose", x, perm_i=[0, 2, 1, 3]), const([0, -1, heads * head_dim]))

        total = g.op("Add", g.op("Shape", past_k, start_i=2, end_i=3), g.op("Shape", q, start_i=2, end_i=3))  # (1,)
        seqlens_k = g.op("Cast", g.op("Sub", total, const([1])), to_i=6)  # int32 (batch,): last index
        total_len = g.op("Cast", g.op("Reshape", total, const([])), to_i=6)  # int32 scalar
        out, present_k, present_v = g.op(
            "com.microsoft::GroupQueryAttention",
            flat(q),
            flat(k),
            flat(v),
            past_k,
            past_v,
            seqlens_k,
            total_len,
            cos_all,
            sin_all,
            num_heads_i=heads,
            kv_num_heads_i=heads,
            do_rotary_i=1,
            rotary_interleaved_i=1,  # model.rope rotates the pairs (x[2i], x[2i+1])
            outputs=3,
        )
        out = g.op("Transpose", g.op("Reshape", out, const([0, -1, heads, head_dim])), perm_i=[0, 2, 1, 3])
        return out, present_k, present_v


class FusedCausalAttention:
    """`model.CausalAttention` that exports as one GroupQueryAttention node; `tables`: the
    rotation of every position the model takes (rope_tables over max_positions)."""

    def __init__(self, cfg: ModelConfig) -> None:
        positions = torch.arange(cfg.max_positions, dtype=torch.float32)
        self.tables = rope_tables(positions, cfg.head_dim, cfg.rope_theta)
        self.heads = cfg.n_heads

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        past_k: torch.Tensor,
        past_v: torch.Tensor,
        rot: Rotation,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out, keys, values = _FusedCausalAttention.apply(q, k, v, past_k, past_v, *rot, *self.tables, self.heads)
        return out, keys, values


class _Encode(nn.Module):
    def __init__(self, model: DiffusionCoder) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, logits_from: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        keys, values, *outputs = self.model.encode(
            input_ids, past[0::2], past[1::2], logits_from, attention=FusedCausalAttention(self.model.cfg), length=True
        )
        return (*(t for kv in zip(keys, values, strict=True) for t in kv), *outputs)


class _Denoise(nn.Module):
    def __init__(self, model: DiffusionCoder) -> None:
        super().__init__()
        self.model = model

    def forward(self, canvas_ids: torch.Tensor, *past: torch.Tensor) -> torch.Tensor:
        return self.model.denoise(canvas_ids, past[0::2], past[1::2])


def export_onnx(model: DiffusionCoder, out_dir: Path, weights: Path | None = None) -> tuple[Path, Path]:
    """Write encode.onnx and denoise.onnx for `model` into out_dir (CPU).

    With `weights` (the model's safetensors file, in out_dir) the graphs hold no copy of
    the weights: each parameter is an ONNX external-data reference into that file
    (`link_weights`), so a model directory carries its weights once. Without it the
    graphs embed float32 weights."""
    model = model.float().cpu().eval()
    cfg = model.cfg
    out_dir.mkdir(parents=True, exist_ok=True)
    past = [torch.randn(1, cfg.n_heads, 5, cfg.head_dim) for _ in range(2 * cfg.n_layers)]
    past_names, present_names = kv_names("past", cfg.n_layers), kv_names("present", cfg.n_layers)
    enc_path, den_path = out_dir / ENCODE_FILE, out_dir / DENOISE_FILE
    length = ["length"] if model.length_head is not None else []
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _Encode(model),
            (torch.ones(1, 3, dtype=torch.long), torch.tensor(2, dtype=torch.long), *past),
            str(enc_path),
            input_names=["input_ids", "logits_from", *past_names],
            output_names=[*present_names, "logits", *length],
            dynamic_axes={
                "input_ids": {1: "new"},
                **{n: {2: "past"} for n in past_names},
                **{n: {2: "total"} for n in present_names},
                "logits": {1: "scored"},
            },
            opset_version=OPSET,
            custom_opsets={"com.microsoft": 1},
            dynamo=False,
            do_constant_folding=weights is None,  # linked weights: keep parameters as they are stored
        )
        torch.onnx.export(
            _Denoise(model),
            (torch.ones(2, 4, dtype=torch.long), *past),
            str(den_path),
            input_names=["canvas_ids", *past_names],
            output_names=["logits"],
            dynamic_axes={
                "canvas_ids": {0: "batch", 1: "canvas"},
                **{n: {2: "past"} for n in past_names},
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
