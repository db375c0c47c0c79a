"""The `onnx_lm` graph of a Qwen2 or Llama model, written from its weights with numpy and onnx:
no torch, no tracing. The same graph, inputs, outputs and quantization as the torch
exporter's (engine/training/export_lm.py, whose docstring describes them), built from its
definition:

    x = embed[input_ids]; cos, sin of the default rotary embedding at position_ids
    each layer: h = rms(x); q, k, v = h Wq (+bq), h Wk (+bk), h Wv (+bv), rotated;
                k, v after the past ones (present_key.i, present_value.i);
                grouped-query attention under attention_bias; x += out Wo
                h = rms(x); x += (silu(h Wgate) * h Wup) Wdown
    logits = rms(x)[:, logits_at] Whead

The weights come from a source one tensor at a time (`WeightSource`: llama.cpp's tensor
names, matrices as (out, in)), and each is quantized and written to the weights file as
soon as it is read, so that memory holds about one matrix besides what was already written:
peak memory stays near the output's size whatever the source's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np

from engine.denoisers.onnx import kv_names
from engine.export.quantize import IntegerProducts, matmul_nbits, nbits_blocks
from engine.models.directory import CONFIG_FILE

OPSET = 17
# the graph's version, in an export's config.json (diffusion_lsp.export_version; none: 1):
# 2 is int8's integer products and grouped-query attention without copies; 3 is int8's
# integer products with a scale per token, the down projections among them. `pull` exports
# a model again where its export is older (engine/commands/pull.py)
EXPORT_VERSION = 3
ALIGN = 4096  # each weight's offset in the data file (onnxruntime maps large ones)
PART_ROWS = 16384  # rows of the embedding and the head read, quantized and written at a time


class WeightSource(Protocol):
    @property
    def config(self) -> dict[str, Any]: ...
    def has(self, name: str) -> bool: ...
    def shape(self, name: str) -> tuple[int, ...]: ...
    def tensor(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray: ...


class DataFile:
    """The weights file beside the graph: arrays appended as they come, each an initializer
    that points at its bytes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: BinaryIO = open(path, "wb")  # noqa: SIM115 (closed by close())
        self.initializers: list[Any] = []

    def store(self, name: str, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        self._initializer(name, array.dtype, array.shape, *self._write([array]))

    def store_parts(self, name: str, parts: Iterable[np.ndarray]) -> None:
        """One matrix whose rows come in parts, each written and dropped in turn."""
        rows, tail, dtype = 0, (), np.dtype(np.float32)

        def each() -> Iterator[np.ndarray]:
            nonlocal rows, tail, dtype
            for part in parts:
                rows, tail, dtype = rows + part.shape[0], part.shape[1:], part.dtype
                yield np.ascontiguousarray(part)

        offset, length = self._write(each())
        self._initializer(name, dtype, (rows, *tail), offset, length)

    def _write(self, parts: Iterable[np.ndarray]) -> tuple[int, int]:
        offset = -(-self._f.tell() // ALIGN) * ALIGN
        self._f.seek(offset)
        for part in parts:
            self._f.write(part.tobytes())
        return offset, self._f.tell() - offset

    def _initializer(self, name: str, dtype: np.dtype, dims: tuple[int, ...], offset: int, length: int) -> None:
        from onnx import TensorProto, helper

        t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(dtype), dims=dims)
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", str(offset)), ("length", str(length))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        self.initializers.append(t)

    def close(self) -> None:
        self._f.close()


class _Builder:
    """The nodes, named in order; small constants inline in the graph."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.constants: list[Any] = []
        self._count = 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"/{hint}_{self._count}"

    def op(self, op: str, inputs: list[str], hint: str = "", **attrs: Any) -> str:
        from onnx import helper

        out = self.name(hint or op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def const(self, value: Any, dtype: Any = np.float32) -> str:
        from onnx import numpy_helper

        name = f"/const_{len(self.constants)}"
        self.constants.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name


def write_graph(source: WeightSource, dest: Path, quantize: str, progress: Callable[[str], None] | None = None) -> None:
    """The graph of `source`'s model as `dest` (model.onnx) with its weights in `dest`.data;
    `quantize`: int8 (integer products, the head in 8-bit MatMulNBits), int4 (every product
    in 4-bit MatMulNBits) or none (float32)."""
    import onnx
    from onnx import TensorProto, helper

    cfg = source.config
    layers, heads, kv_heads = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d, eps, vocab = cfg["head_dim"], cfg["rms_norm_eps"], cfg["vocab_size"]
    theta = float(cfg["rope_parameters"]["rope_theta"])
    data = DataFile(dest.with_name(dest.name + ".data"))
    g = _Builder()
    products = IntegerProducts(data.store)
    stored: set[str] = set()

    def plain(name: str, array: Callable[[], np.ndarray]) -> str:
        if name not in stored:
            data.store(name, array())
            stored.add(name)
        return name

    def parts(name: str, rows: int) -> Iterator[np.ndarray]:
        """The embedding's or the head's rows, PART_ROWS at a time, with zero rows past the
        source's up to `rows` (the mask's row, where the export adds it); another matrix whole."""
        if name not in big:  # a layer's matrix: whole
            yield source.tensor(name)
            return
        have = source.shape(name)[0]
        for start in range(0, rows, PART_ROWS):
            stop = min(start + PART_ROWS, rows)
            part = (
                source.tensor(name, start, min(stop, have))
                if start < have
                else np.zeros((0, *source.shape(name)[1:]), np.float32)
            )
            if part.shape[0] < stop - start:
                part = np.concatenate([part, np.zeros((stop - start - part.shape[0], *part.shape[1:]), np.float32)])
            yield part

    def product(x: str, name: str, bits: int | None = None) -> str:
        """x (..., K) times the transposed matrix `name` (N, K): its quantization's nodes."""
        out = g.name(name.replace(".", "/"))
        n, k = source.shape(name)
        if name in big:
            n = vocab
        bits = bits or (4 if quantize == "int4" else None)
        if bits is None and quantize == "int8":
            products.product(g.nodes, x, products.weight(name, lambda: source.tensor(name).T), out)
        elif bits is not None:  # blocks of each output column alone: the rows are quantized in parts
            scales: list[np.ndarray] = []

            def packed() -> Iterator[np.ndarray]:
                for part in parts(name, n):
                    blocks, part_scales = nbits_blocks(part.T, bits)
                    scales.append(part_scales)
                    yield blocks

            data.store_parts(name + "_Q", packed())
            data.store(name + "_scales", np.concatenate(scales))
            g.nodes.append(matmul_nbits(x, name + "_Q", name + "_scales", out, k, n, bits, name=out))
        else:  # float32: the whole matrix transposed at once (a reference export; not the default)
            whole = np.concatenate(list(parts(name, n))).T
            g.nodes.append(helper.make_node("MatMul", [x, plain(name, lambda: whole)], [out], name=out))
        return out

    def linear(x: str, name: str) -> str:
        y = product(x, name + ".weight")
        bias = name + ".bias"
        return g.op("Add", [plain(bias, lambda: source.tensor(bias)), y], "add") if source.has(bias) else y

    def rms(x: str, name: str) -> str:
        square = g.op("Pow", [x, g.const(2.0)], "pow")
        mean = g.op("ReduceMean", [square], "mean", axes=[-1], keepdims=1)
        root = g.op("Sqrt", [g.op("Add", [mean, g.const(eps)], "add")], "sqrt")
        normed = g.op("Mul", [x, g.op("Div", [g.const(1.0), root], "div")], "mul")
        return g.op("Mul", [plain(name, lambda: source.tensor(name)), normed], "mul")

    def heads_of(x: str, count: int) -> str:  # (B, T, count*D) -> (B, count, T, D)
        shaped = g.op("Reshape", [x, g.const([0, 0, count, d], np.int64)], "reshape")
        return g.op("Transpose", [shaped], "transpose", perm=[0, 2, 1, 3])

    def rotate(x: str, cos: str, sin: str) -> str:
        half = d // 2
        first = g.op("Slice", [x, g.const([0], np.int64), g.const([half], np.int64), g.const([-1], np.int64)])
        second = g.op("Slice", [x, g.const([half], np.int64), g.const([d], np.int64), g.const([-1], np.int64)])
        rotated = g.op("Concat", [g.op("Neg", [second]), first], "concat", axis=-1)
        return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rotated, sin])], "rope")

    # the embedding, and the rotary embedding at the positions
    big = {"token_embd.weight", "output.weight"}  # (vocab, E): read in parts
    data.store_parts("embed.weight", parts("token_embd.weight", vocab))
    x = g.op("Gather", ["embed.weight", "input_ids"], "embed")
    # 1 / theta^(2i/d): the power rounded from float64, then divided in float32, which is the
    # torch exporter's float32 constant to the bit (numpy's float32 power differs in the last bit)
    powers = (theta ** (np.arange(0, d, 2, dtype=np.float32) / d).astype(np.float64)).astype(np.float32)
    inv = np.float32(1.0) / powers
    positions = g.op(
        "Unsqueeze", [g.op("Cast", ["position_ids"], "cast", to=TensorProto.FLOAT), g.const([-1], np.int64)]
    )
    freqs = g.op("Mul", [positions, g.const(inv)], "freqs")
    angles = g.op("Unsqueeze", [g.op("Concat", [freqs, freqs], "concat", axis=-1), g.const([1], np.int64)])
    cos, sin = g.op("Cos", [angles]), g.op("Sin", [angles])
    bias = g.op("Unsqueeze", ["attention_bias", g.const([1], np.int64)], "bias")  # (B|1, 1, 1, T, P+T)
    group = heads // kv_heads
    for i in range(layers):
        if progress is not None:
            progress(f"layer {i + 1} of {layers}")
        b = f"blk.{i}."
        h = rms(x, b + "attn_norm.weight")
        q = rotate(heads_of(linear(h, b + "attn_q"), heads), cos, sin)
        k = rotate(heads_of(linear(h, b + "attn_k"), kv_heads), cos, sin)
        v = heads_of(linear(h, b + "attn_v"), kv_heads)
        past_k, past_v, present_k, present_v = *kv_names("past", layers)[2 * i : 2 * i + 2], *kv_names("present", layers)[2 * i : 2 * i + 2]  # fmt: skip
        g.nodes.append(helper.make_node("Concat", [past_k, k], [present_k], name=f"/present_key_{i}", axis=2))
        g.nodes.append(helper.make_node("Concat", [past_v, v], [present_v], name=f"/present_value_{i}", axis=2))
        # grouped-query attention without copies: query head h reads key/value head h // group
        qg = g.op("Reshape", [q, g.const([0, kv_heads, group, -1, d], np.int64)], "reshape")
        keys = g.op("Transpose", [g.op("Unsqueeze", [present_k, g.const([2], np.int64)])], perm=[0, 1, 2, 4, 3])
        scores = g.op("Mul", [g.op("MatMul", [qg, keys], "scores"), g.const(d**-0.5)], "scale")
        probs = g.op("Softmax", [g.op("Add", [scores, bias], "masked")], "softmax", axis=-1)
        att = g.op("MatMul", [probs, g.op("Unsqueeze", [present_v, g.const([2], np.int64)])], "attend")
        att = g.op("Reshape", [att, g.const([0, heads, -1, d], np.int64)], "reshape")
        att = g.op("Transpose", [att], "transpose", perm=[0, 2, 1, 3])
        att = g.op("Reshape", [att, g.const([0, 0, heads * d], np.int64)], "reshape")
        x = g.op("Add", [x, linear(att, b + "attn_output")], "residual")
        h = rms(x, b + "ffn_norm.weight")
        gate = linear(h, b + "ffn_gate")
        act = g.op("Mul", [gate, g.op("Sigmoid", [gate])], "silu")
        x = g.op("Add", [x, linear(g.op("Mul", [act, linear(h, b + "ffn_up")], "mul"), b + "ffn_down")], "residual")
    picked = g.op("Gather", [rms(x, "output_norm.weight"), "logits_at"], "picked", axis=1)
    head = "output.weight" if source.has("output.weight") else "token_embd.weight"
    logits = product(picked, head, bits=8 if quantize == "int8" else None)
    g.nodes.append(helper.make_node("Identity", [logits], ["logits"], name="/logits"))
    data.close()

    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    inputs = [
        helper.make_tensor_value_info("input_ids", i64, ["batch", "new"]),
        helper.make_tensor_value_info("position_ids", i64, ["pbatch", "new"]),
        helper.make_tensor_value_info("attention_bias", f32, ["bbatch", 1, "new", "total"]),
        helper.make_tensor_value_info("logits_at", i64, ["picked"]),
        *(helper.make_tensor_value_info(n, f32, ["batch", kv_heads, "past", d]) for n in kv_names("past", layers)),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", f32, ["batch", "picked", vocab]),
        *(helper.make_tensor_value_info(n, f32, ["batch", kv_heads, "total", d]) for n in kv_names("present", layers)),
    ]
    constants = [*g.constants, *(products.constants() if quantize == "int8" else [])]
    graph = helper.make_graph(g.nodes, "onnx_lm", inputs, outputs, [*data.initializers, *constants])
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="diffusion-lsp")
    tmp = dest.with_name(dest.name + ".tmp")
    onnx.save(model, str(tmp))
    os.replace(tmp, dest)


def export_version(path: Path) -> int:
    """The graph version of the export in `path` (1: made before versions were written;
    0: no finished export there)."""
    try:
        own = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8")).get("diffusion_lsp", {})
    except (OSError, ValueError, AttributeError):
        return 0
    version = own.get("export_version", 1) if isinstance(own, dict) else 1
    return version if isinstance(version, int) and not isinstance(version, bool) else 1
