"""ONNX export of a Qwen2, Llama or Dream-family checkpoint, for the base install
(onnxruntime, no torch): `diffusion-infill export-onnx --model DIR --out OUT [--quantize int8|int4|none]`.

One graph, `model.onnx`, serves both attention modes, because the attention mask is an
input: the one-token mode runs new tokens causally after cached keys and values, and the
canvas (Dream, or a checkpoint adapted by `diffusion-infill adapt`) runs the whole
sequence under full attention. onnxruntime-genai's model builder was measured first
(docs/models.md): its GroupQueryAttention is causal only, so it cannot run a canvas; this
exporter keeps the project's own graph, built from the checkpoint's own transformers
modules (the norms, projections and MLPs), with attention and the rotary embedding
written out so that they trace to plain ONNX operators.

    inputs   input_ids (B, T), position_ids (B|1, T), attention_bias (B|1, 1, T, P+T)
             (additive: 0 where a query sees a key, a large negative number where not),
             logits_at (N,) (the positions whose logits are wanted), past_key.{i} and
             past_value.{i} (B, Hkv, P, D) for each layer i
    outputs  logits (B, N, V), present_key.{i} and present_value.{i} (B, Hkv, P+T, D)

Quantization (engine/export/quantize.py, shared with the GGUF exporter): `int4` puts every
weight product, the output head included, in onnxruntime's MatMulNBits (weight-only, blocks
of 32 along the input, symmetric, int8 arithmetic for the activations). `int8` puts every projection of every layer (attention's q, k, v and
o, the MLPs' gate, up and down) in integer products with each token's activations
quantized by their own scale (`_integer_products`), and the head in 8-bit MatMulNBits
(one token's logits read its weights once: a product bound by memory, where 8-bit
MatMulNBits is as fast). The embedding table stays float32 (a lookup of a few rows costs
nothing; its memory is the price). 8 bits is the default: on the held-out eval it keeps
float32's exact fills, about 2 points of edit similarity below it; 4 bits lose more
(docs/models.md).
"""

from __future__ import annotations

import gc
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.denoisers.onnx import kv_names
from engine.errors import ModelLoadError
from engine.export.graph import EXPORT_VERSION
from engine.export.quantize import PREFIX, IntegerProducts, matmul_nbits, nbits_blocks
from engine.models.directory import CONFIG_FILE, GENERATION_FILE, LM_GRAPH_FILE, TOKENIZER_FILE, read_config, require
from engine.models.table import EXPORTED, ONNX_LM_MODEL_TYPE

OPSET = 17
QUANTIZE = ("int4", "int8", "none")
# int8's products that stay MatMulNBits (by the traced module name: LMGraph's `head`)
INTEGER_KEEPS = re.compile(r"^/head/")


class LMGraph(nn.Module):
    """A Qwen2/Llama causal LM's layers with the attention mask and the cache as inputs."""

    def __init__(self, hf: Any) -> None:
        super().__init__()
        cfg = hf.config
        rope = dict(getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default":
            raise ModelLoadError(f"rotary embedding {kind!r} is not exported yet (only the default one)")
        self.theta = float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.embed = hf.model.embed_tokens
        self.layers = hf.model.layers
        self.norm = hf.model.norm
        self.head = hf.lm_head

    def rotary(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (B|1, 1, T, D) of the default rotary embedding at these positions."""
        d = self.head_dim
        inv = 1.0 / (self.theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))  # (D/2,)
        freqs = position_ids.to(torch.float32)[..., None] * inv  # (B, T, D/2)
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # (B, 1, T, D)
        return emb.cos(), emb.sin()

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_bias: torch.Tensor,
        logits_at: torch.Tensor,
        *past: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        x = self.embed(input_ids)  # (B, T, E)
        cos, sin = self.rotary(position_ids)
        presents: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            out, k, v = self._attend(layer, layer.input_layernorm(x), cos, sin, attention_bias, past[2 * i : 2 * i + 2])
            presents += [k, v]
            x = x + out
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        hidden = self.norm(x).index_select(1, logits_at)  # (B, N, E)
        return (self.head(hidden), *presents)

    def _attend(
        self,
        layer: Any,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        bias: torch.Tensor,
        past: tuple[torch.Tensor, ...],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One attention block: (output (B, T, E), keys and values with the past (B, Hkv, P+T, D))."""
        a = layer.self_attn
        b, t = h.shape[0], h.shape[1]
        q = a.q_proj(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = a.k_proj(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        v = a.v_proj(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        k = torch.cat([past[0], k], dim=2)  # (B, Hkv, P+T, D)
        v = torch.cat([past[1], v], dim=2)
        # grouped-query attention without copying the keys and values for each query head:
        # query head h reads key/value head h // group, so the query heads are grouped beside
        # their key/value head and the product broadcasts over the group
        group = self.heads // self.kv_heads
        qg = q.reshape(b, self.kv_heads, group, t, self.head_dim)  # (B, Hkv, G, T, D)
        scores = torch.matmul(qg, k.unsqueeze(2).transpose(-1, -2)) * self.head_dim**-0.5  # (B, Hkv, G, T, P+T)
        scores = scores + bias.unsqueeze(1)  # bias (B|1, 1, T, P+T) -> (B|1, 1, 1, T, P+T)
        out = torch.matmul(torch.softmax(scores, dim=-1), v.unsqueeze(2))  # (B, Hkv, G, T, D)
        out = out.reshape(b, self.heads, t, self.head_dim).transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        return a.o_proj(out), k, v


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def export_lm(source: Path, out: Path, quantize: str = "int8") -> Path:
    """Export the checkpoint in `source` to an onnx model directory `out` (config.json,
    tokenizer.json, model.onnx and its weights file); returns `out`."""
    from engine.denoisers.dream import load_causal_model

    if quantize not in QUANTIZE:
        raise ModelLoadError(f"--quantize must be one of {', '.join(QUANTIZE)}; got {quantize!r}")
    cfg = read_config(source)
    model_type = cfg.get("model_type")
    if model_type not in EXPORTED:
        raise ModelLoadError(f"{source}: export-onnx takes model_type {', '.join(EXPORTED)}, not {model_type!r}")
    require(source, TOKENIZER_FILE)
    hf = load_causal_model(source, cfg, "cpu", torch.float32)
    graph = LMGraph(hf).eval()
    head_dim = graph.head_dim
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        plain = Path(tmp) / LM_GRAPH_FILE
        _trace(graph, len(hf.model.layers), plain)
        del graph, hf  # the float32 weights, freed before quantization loads the graph's copy
        gc.collect()
        _write_graph(plain, out / LM_GRAPH_FILE, quantize)
    shutil.copy(source / TOKENIZER_FILE, out / TOKENIZER_FILE)
    if (source / GENERATION_FILE).is_file():  # its decoding defaults and diffusion signs go along
        shutil.copy(source / GENERATION_FILE, out / GENERATION_FILE)
    own = dict(cfg.get("diffusion_lsp", {}))
    own.update(source_model_type=model_type, quantization=quantize, graph=LM_GRAPH_FILE, export_version=EXPORT_VERSION)
    exported = {**cfg, "model_type": ONNX_LM_MODEL_TYPE, "diffusion_lsp": own}
    exported.setdefault("head_dim", head_dim)
    (out / CONFIG_FILE).write_text(json.dumps(exported, indent=2) + "\n", encoding="utf-8")
    return out


def _trace(graph: LMGraph, layers: int, path: Path) -> None:
    """torch.onnx.export of the float32 graph, every size dynamic."""
    d, hkv = graph.head_dim, graph.kv_heads
    past = [torch.zeros(1, hkv, 2, d) for _ in range(2 * layers)]
    example = (
        torch.ones(1, 3, dtype=torch.long),
        torch.arange(2, 5).unsqueeze(0),
        torch.zeros(1, 1, 3, 5),
        torch.tensor([0, 2]),
        *past,
    )
    names_in = ["input_ids", "position_ids", "attention_bias", "logits_at", *kv_names("past", layers)]
    names_out = ["logits", *kv_names("present", layers)]
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "new"},
        "position_ids": {0: "pbatch", 1: "new"},
        "attention_bias": {0: "bbatch", 2: "new", 3: "total"},
        "logits_at": {0: "picked"},
        "logits": {0: "batch", 1: "picked"},
    }
    axes.update({n: {0: "batch", 2: "past"} for n in kv_names("past", layers)})
    axes.update({n: {0: "batch", 2: "total"} for n in kv_names("present", layers)})
    with torch.no_grad():
        torch.onnx.export(
            graph,
            example,
            str(path),
            input_names=names_in,
            output_names=names_out,
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
            external_data=True,
        )


def _write_graph(plain: Path, dest: Path, quantize: str) -> None:
    """The float32 graph, or its matrix products quantized, as `dest` with its weights in
    one file beside it."""
    import onnx

    model = onnx.load(str(plain), load_external_data=True)
    if quantize == "int8":
        _integer_products(model, INTEGER_KEEPS)
    if quantize != "none":  # (after int8's integer products: the head)
        _nbits_products(model, 4 if quantize == "int4" else 8)
    data = dest.name + ".data"
    (dest.parent / data).unlink(missing_ok=True)
    onnx.save(model, str(dest), save_as_external_data=True, all_tensors_to_one_file=True, location=data)


def _nbits_products(model: Any, bits: int) -> None:
    """Put `model`'s weight products (MatMul by a 2-D initializer) in `bits`-bit MatMulNBits,
    in place (engine/export/quantize.py)."""
    from onnx import numpy_helper

    g = model.graph
    weights = {t.name: t for t in g.initializer}
    added: list[Any] = []
    nodes: list[Any] = []
    for node in g.node:
        w = weights.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if w is None or len(w.dims) != 2:
            nodes.append(node)
            continue
        packed, scales = nbits_blocks(numpy_helper.to_array(w), bits)
        added += [
            numpy_helper.from_array(packed, w.name + f"_Q{bits}"),
            numpy_helper.from_array(scales, w.name + "_scales"),
        ]
        k, n = w.dims
        nodes.append(
            matmul_nbits(
                node.input[0],
                w.name + f"_Q{bits}",
                w.name + "_scales",
                node.output[0],
                k,
                n,
                bits,
                node.name + f"_Q{bits}",
            )
        )
    _replace_nodes(g, nodes, added)


def _integer_products(model: Any, keep: re.Pattern[str]) -> None:
    """Put `model`'s weight products (MatMul by a 2-D initializer), except those whose node
    name `keep` matches, in integer arithmetic, in place (engine/export/quantize.py)."""
    from onnx import numpy_helper

    g = model.graph
    weights = {t.name: t for t in g.initializer}
    taken = {n for node in g.node for n in [*node.input, *node.output]} | set(weights)
    if any(n.startswith(PREFIX) for n in taken):
        raise ModelLoadError(f"the graph already has names starting with {PREFIX}: not quantized twice")
    consts: list[Any] = []
    products = IntegerProducts(lambda name, array: consts.append(numpy_helper.from_array(array, name)))
    nodes: list[Any] = []
    for node in g.node:
        w = weights.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if w is None or len(w.dims) != 2 or keep.search(node.name):
            nodes.append(node)
            continue
        levels = products.weight(w.name, lambda: numpy_helper.to_array(w))  # noqa: B023 (called at once)
        products.product(nodes, node.input[0], levels, node.output[0])
    _replace_nodes(g, nodes, [*consts, *products.constants()])


def _replace_nodes(g: Any, nodes: list[Any], added: list[Any]) -> None:
    """`g`'s nodes are now `nodes`, its initializers the ones they still read (a float
    weight another node reads stays: a tied head) and `added`."""
    read = {name for n in nodes for name in n.input}
    left = [t for t in g.initializer if t.name in read]
    del g.initializer[:]
    g.initializer.extend([*left, *added])
    del g.node[:]
    g.node.extend(nodes)
