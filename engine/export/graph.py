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
FLOAT = 1  # onnx.TensorProto.FLOAT
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
        """A node of one output, named from `hint`; returns the output."""
        return self.op_to(op, inputs, self.name(hint or op.lower()), **attrs)

    def op_to(self, op: str, inputs: list[str], out: str, **attrs: Any) -> str:
        """A node whose output is `out` (a graph output's name)."""
        from onnx import helper

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

    data = DataFile(dest.with_name(dest.name + ".data"))
    try:
        model = _Writer(source, quantize, data).model(progress)
    finally:
        data.close()
    tmp = dest.with_name(dest.name + ".tmp")
    onnx.save(model, str(tmp))
    os.replace(tmp, dest)


BIG = ("token_embd.weight", "output.weight")  # (vocab, E): read, quantized and written in parts


class _Writer:
    """The graph's nodes, its weights written to `data` as they come (the module's docstring
    has the computation)."""

    def __init__(self, source: WeightSource, quantize: str, data: DataFile) -> None:
        cfg = source.config
        self.source, self.quantize, self.data = source, quantize, data
        self.layers, self.heads = int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
        self.kv_heads, self.d = int(cfg["num_key_value_heads"]), int(cfg["head_dim"])
        self.eps, self.vocab = float(cfg["rms_norm_eps"]), int(cfg["vocab_size"])
        self.theta = float(cfg["rope_parameters"]["rope_theta"])
        self.g = _Builder()
        self.products = IntegerProducts(data.store)
        self.stored: set[str] = set()

    # -- weights ---------------------------------------------------------------------

    def plain(self, name: str, array: Callable[[], np.ndarray]) -> str:
        """A float32 initializer, written the first time it is asked for."""
        if name not in self.stored:
            self.data.store(name, array())
            self.stored.add(name)
        return name

    def parts(self, name: str, rows: int) -> Iterator[np.ndarray]:
        """The embedding's or the head's rows, PART_ROWS at a time, with zero rows past the
        source's up to `rows` (the mask's row, where the export adds it); another matrix whole."""
        if name not in BIG:
            yield self.source.tensor(name)
            return
        have, tail = self.source.shape(name)[0], self.source.shape(name)[1:]
        for start in range(0, rows, PART_ROWS):
            stop = min(start + PART_ROWS, rows)
            part = (
                self.source.tensor(name, start, min(stop, have)) if start < have else np.zeros((0, *tail), np.float32)
            )
            if part.shape[0] < stop - start:
                part = np.concatenate([part, np.zeros((stop - start - part.shape[0], *tail), np.float32)])
            yield part

    def product(self, x: str, name: str, bits: int | None = None) -> str:
        """x (..., K) times the transposed matrix `name` (N, K), in the export's quantization
        (`bits`: MatMulNBits of that many bits whatever it is)."""
        g, out = self.g, self.g.name(name.replace(".", "/"))
        n, k = self.source.shape(name)
        n = self.vocab if name in BIG else n
        bits = bits or (4 if self.quantize == "int4" else None)
        if bits is None and self.quantize == "int8":
            levels = self.products.weight(name, lambda: self.source.tensor(name).T)
            self.products.product(g.nodes, x, levels, out)
        elif bits is not None:  # each output column's blocks alone: the rows are quantized in parts
            scales: list[np.ndarray] = []

            def packed() -> Iterator[np.ndarray]:
                for part in self.parts(name, n):
                    blocks, part_scales = nbits_blocks(part.T, bits)
                    scales.append(part_scales)
                    yield blocks

            self.data.store_parts(name + "_Q", packed())
            self.data.store(name + "_scales", np.concatenate(scales))
            g.nodes.append(matmul_nbits(x, name + "_Q", name + "_scales", out, k, n, bits, name=out))
        else:  # float32: the whole matrix transposed at once (a reference export, not the default)
            whole = self.plain(name, lambda: np.concatenate(list(self.parts(name, n))).T)
            g.op_to("MatMul", [x, whole], out)
        return out

    # -- the blocks ------------------------------------------------------------------

    def linear(self, x: str, name: str) -> str:
        y = self.product(x, name + ".weight")
        bias = name + ".bias"
        if not self.source.has(bias):
            return y
        return self.g.op("Add", [self.plain(bias, lambda: self.source.tensor(bias)), y], "add")

    def rms(self, x: str, name: str) -> str:
        g = self.g
        mean = g.op("ReduceMean", [g.op("Pow", [x, g.const(2.0)], "pow")], "mean", axes=[-1], keepdims=1)
        root = g.op("Sqrt", [g.op("Add", [mean, g.const(self.eps)], "add")], "sqrt")
        normed = g.op("Mul", [x, g.op("Div", [g.const(1.0), root], "div")], "mul")
        return g.op("Mul", [self.plain(name, lambda: self.source.tensor(name)), normed], "mul")

    def heads_of(self, x: str, count: int) -> str:
        """(B, T, count*D) -> (B, count, T, D)"""
        shaped = self.g.op("Reshape", [x, self.g.const([0, 0, count, self.d], np.int64)], "reshape")
        return self.g.op("Transpose", [shaped], "transpose", perm=[0, 2, 1, 3])

    def rotate(self, x: str, cos: str, sin: str) -> str:
        g, half, d = self.g, self.d // 2, self.d
        first = g.op("Slice", [x, g.const([0], np.int64), g.const([half], np.int64), g.const([-1], np.int64)])
        second = g.op("Slice", [x, g.const([half], np.int64), g.const([d], np.int64), g.const([-1], np.int64)])
        rotated = g.op("Concat", [g.op("Neg", [second]), first], "concat", axis=-1)
        return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rotated, sin])], "rope")

    def rotary(self) -> tuple[str, str]:
        """cos, sin (B|1, 1, T, D) of the default rotary embedding at position_ids."""
        g, d = self.g, self.d
        # 1 / theta^(2i/d): the power rounded from float64, then divided in float32, which is
        # the torch exporter's float32 constant to the bit (numpy's float32 power differs in
        # the last bit, and a keystroke's result would not be the torch export's)
        powers = (self.theta ** (np.arange(0, d, 2, dtype=np.float32) / d).astype(np.float64)).astype(np.float32)
        positions = g.op("Cast", ["position_ids"], "cast", to=FLOAT)
        freqs = g.op("Mul", [g.op("Unsqueeze", [positions, g.const([-1], np.int64)]), g.const(1 / powers)], "freqs")
        angles = g.op("Unsqueeze", [g.op("Concat", [freqs, freqs], "concat", axis=-1), g.const([1], np.int64)])
        return g.op("Cos", [angles]), g.op("Sin", [angles])

    def attention(self, i: int, x: str, cos: str, sin: str, bias: str) -> str:
        """Layer i's attention block, its keys and values after the past ones as the
        layer's present_key.i and present_value.i; returns the block's output."""
        g, d, heads, kv_heads, b = self.g, self.d, self.heads, self.kv_heads, f"blk.{i}."
        h = self.rms(x, b + "attn_norm.weight")
        q = self.rotate(self.heads_of(self.linear(h, b + "attn_q"), heads), cos, sin)
        k = self.rotate(self.heads_of(self.linear(h, b + "attn_k"), kv_heads), cos, sin)
        v = self.heads_of(self.linear(h, b + "attn_v"), kv_heads)
        past_k, past_v = kv_names("past", self.layers)[2 * i : 2 * i + 2]
        present_k, present_v = kv_names("present", self.layers)[2 * i : 2 * i + 2]
        g.op_to("Concat", [past_k, k], present_k, axis=2)
        g.op_to("Concat", [past_v, v], present_v, axis=2)
        # grouped-query attention without copies: query head h reads key/value head h // group
        qg = g.op("Reshape", [q, g.const([0, kv_heads, heads // kv_heads, -1, d], np.int64)], "reshape")
        keys = g.op("Transpose", [g.op("Unsqueeze", [present_k, g.const([2], np.int64)])], perm=[0, 1, 2, 4, 3])
        scores = g.op("Mul", [g.op("MatMul", [qg, keys], "scores"), g.const(d**-0.5)], "scale")
        probs = g.op("Softmax", [g.op("Add", [scores, bias], "masked")], "softmax", axis=-1)
        att = g.op("MatMul", [probs, g.op("Unsqueeze", [present_v, g.const([2], np.int64)])], "attend")
        att = g.op("Reshape", [att, g.const([0, heads, -1, d], np.int64)], "reshape")
        att = g.op("Transpose", [att], "transpose", perm=[0, 2, 1, 3])
        att = g.op("Reshape", [att, g.const([0, 0, heads * d], np.int64)], "reshape")
        return self.linear(att, b + "attn_output")

    def mlp(self, i: int, x: str) -> str:
        g, b = self.g, f"blk.{i}."
        h = self.rms(x, b + "ffn_norm.weight")
        gate = self.linear(h, b + "ffn_gate")
        act = g.op("Mul", [gate, g.op("Sigmoid", [gate])], "silu")
        return self.linear(g.op("Mul", [act, self.linear(h, b + "ffn_up")], "mul"), b + "ffn_down")

    # -- the whole ---------------------------------------------------------------------

    def model(self, progress: Callable[[str], None] | None) -> Any:
        from onnx import TensorProto, helper

        g = self.g
        self.data.store_parts("embed.weight", self.parts("token_embd.weight", self.vocab))
        x = g.op("Gather", ["embed.weight", "input_ids"], "embed")
        cos, sin = self.rotary()
        bias = g.op("Unsqueeze", ["attention_bias", g.const([1], np.int64)], "bias")  # (B|1, 1, 1, T, P+T)
        for i in range(self.layers):
            if progress is not None:
                progress(f"layer {i + 1} of {self.layers}")
            x = g.op("Add", [x, self.attention(i, x, cos, sin, bias)], "residual")
            x = g.op("Add", [x, self.mlp(i, x)], "residual")
        picked = g.op("Gather", [self.rms(x, "output_norm.weight"), "logits_at"], "picked", axis=1)
        head = "output.weight" if self.source.has("output.weight") else "token_embd.weight"
        g.op_to("Identity", [self.product(picked, head, bits=8 if self.quantize == "int8" else None)], "logits")

        f32, i64, kv, d = TensorProto.FLOAT, TensorProto.INT64, self.kv_heads, self.d
        inputs = [
            helper.make_tensor_value_info("input_ids", i64, ["batch", "new"]),
            helper.make_tensor_value_info("position_ids", i64, ["pbatch", "new"]),
            helper.make_tensor_value_info("attention_bias", f32, ["bbatch", 1, "new", "total"]),
            helper.make_tensor_value_info("logits_at", i64, ["picked"]),
            *(helper.make_tensor_value_info(n, f32, ["batch", kv, "past", d]) for n in kv_names("past", self.layers)),
        ]
        outputs = [
            helper.make_tensor_value_info("logits", f32, ["batch", "picked", self.vocab]),
            *(
                helper.make_tensor_value_info(n, f32, ["batch", kv, "total", d])
                for n in kv_names("present", self.layers)
            ),
        ]
        constants = [*g.constants, *(self.products.constants() if self.quantize == "int8" else [])]
        graph = helper.make_graph(g.nodes, "onnx_lm", inputs, outputs, [*self.data.initializers, *constants])
        opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
        return helper.make_model(graph, opset_imports=opsets, producer_name="diffusion-lsp")


def export_version(path: Path) -> int:
    """The graph version of the export in `path` (1: made before versions were written;
    0: no finished export there)."""
    try:
        own = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8")).get("diffusion_lsp", {})
    except (OSError, ValueError, AttributeError):
        return 0
    version = own.get("export_version", 1) if isinstance(own, dict) else 1
    return version if isinstance(version, int) and not isinstance(version, bool) else 1
